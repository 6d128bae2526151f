"""The per-op profile of a one-token pass (specrepro.bench.ops) on a tiny model: shapes of the result only."""
import pytest
import torch

from helpers import llama
from specrepro.bench import ops
from specrepro.engines.lean import LeanRunner


def test_profile_groups_every_op_of_a_one_token_pass():
    runner = LeanRunner(llama(0, vocab=64), dtype=torch.float32)
    runner.prefill(torch.arange(20) % 64)
    out = ops.profile_ops(runner, 20, passes=3)
    assert out["groups"]["linear"] > 0 and out["groups"]["attention"] > 0
    assert out["profiled_ms"] == pytest.approx(sum(v["ms"] for v in out["ops"].values()))
    # 2 layers x (q/k/v, o, gate/up, down) + the LM head, each pass: 7 x 2 + 1 = 15 F.linear calls (eager)
    assert out["ops"]["aten::linear"]["calls"] == 15
    assert runner.length == 21 and ops.one_token_ms(runner, 20, reps=3) > 0
    assert ops.one_token_ms(runner, 20, reps=3, n=4) > 0 and runner.length == 24  # a pass over 4 tokens (v(3))
    assert ops.group_of("aten::bmm") == "attention" and ops.group_of("aten::something_new") == "other"


def test_bad_context_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        ops.main(["--context", "0"])
    assert "--context must be >= 1" in capsys.readouterr().err
