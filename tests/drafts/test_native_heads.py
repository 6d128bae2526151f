"""The heads draft's step through the native kernels (drafts.heads.NativeHeads): the same logits as the torch
step within bfloat16 round-off, picked by default only where it serves (a bfloat16 net on the CPU), rebuilt
when the head is cut, and greedy SpS with it still equals greedy ArS."""
import pytest
import torch

import specrepro as sr
from helpers import EOS, PROMPT
from specrepro.algorithm.sampling import SamplingConfig
from specrepro.drafts import HeadsDraft
from specrepro.engines import native
from specrepro.stats.toy import tiny_llama

pytestmark = pytest.mark.skipif(native.unavailable_reason(torch.bfloat16, "cpu") is not None,
                                reason="the native module cannot be built here")


def bf16_heads(target, seed=5, **kw):
    draft = HeadsDraft.init_for(target, {"heads": 3}, seed=seed)
    draft.net.to(torch.bfloat16)
    draft.net.attach(target, torch.bfloat16)
    return HeadsDraft(draft.net, target, **kw)


def logits_of(draft, seq, hidden):
    return draft._logits(seq, hidden, expand=False)


def test_native_step_matches_the_torch_step_and_is_the_default_for_bfloat16():
    target = tiny_llama(0, vocab=50, layers=2)
    seq = torch.tensor([0, 7, 3, 9])
    hidden = torch.randn(3, target.config.hidden_size, generator=torch.Generator().manual_seed(0))
    fast, slow = bf16_heads(target), bf16_heads(target, native=False)
    a, b = logits_of(fast, seq, hidden), logits_of(slow, seq, hidden)
    assert fast._native is not None and slow._native is None  # the default chose the native step
    assert a.shape == b.shape == (3, 50)
    assert torch.allclose(a, b, atol=0.05, rtol=0.02), (a - b).abs().max()
    # float32 nets keep the torch step
    f32 = HeadsDraft.init_for(target, {"heads": 3}, seed=5)
    logits_of(f32, seq, hidden.float())
    assert f32._native is None and f32.native is False


def test_cutting_the_head_rebuilds_the_packed_copy():
    target = tiny_llama(0, vocab=50, layers=2)
    seq, hidden = torch.tensor([0, 7, 3, 9]), torch.randn(3, target.config.hidden_size)
    fast, slow = bf16_heads(target), bf16_heads(target, native=False)
    logits_of(fast, seq, hidden)
    counts = torch.arange(50, dtype=torch.float64)  # keep the 8 highest ids, EOS always
    for d in (fast, slow):
        d.net.restrict(8, counts, special=[EOS])
    a, b = logits_of(fast, seq, hidden), logits_of(slow, seq, hidden)
    assert a.shape == b.shape == (3, 8) and torch.allclose(a, b, atol=0.05, rtol=0.02)
    # a weight replaced by another parameter at the same version: its identity alone tells the copy is stale
    for d in (fast, slow):
        old = d.net.inp[0].weight
        noise = torch.randn(old.shape, generator=torch.Generator().manual_seed(1))
        new = torch.nn.Parameter(old.detach() + noise.to(old.dtype))
        with torch.no_grad():
            while new._version < old._version:
                new.add_(0)
        d.net.inp[0].weight = new
    a, b = logits_of(fast, seq, hidden), logits_of(slow, seq, hidden)
    assert torch.allclose(a, b, atol=0.05, rtol=0.02), (a - b).abs().max()


def test_greedy_sps_with_the_native_heads_step_equals_ars():
    target = tiny_llama(0, layers=2)
    kw = dict(max_new_tokens=12, temperature=0.0, eos_token_id=EOS)
    ars = sr.autoregressive_generate(target, PROMPT, **kw).tokens
    for k in (1, 3):
        draft = bf16_heads(target)
        assert torch.equal(sr.speculative_generate(target, draft, PROMPT, lookahead=k, **kw).tokens, ars)
        assert draft._native is not None


def test_sampled_proposals_come_with_the_rows_they_were_drawn_from():
    target = tiny_llama(0, layers=2)
    draft = bf16_heads(target)
    sampling = SamplingConfig(1.0)
    hidden = torch.randn(1, target.config.hidden_size)
    tokens, rows = draft.propose(PROMPT, 3, sampling, torch.Generator().manual_seed(0), target_hidden=hidden)
    assert rows.shape == (3, draft.vocab_size) and torch.allclose(rows.sum(-1), torch.ones(3), atol=1e-5)
    assert (rows[torch.arange(3), tokens] > 0).all()


@pytest.mark.slow
def test_step_cost_cli_times_each_way_a_draft_step_runs(tmp_path, smollm):
    import json
    import os

    from specrepro.experiments import step_cost

    out = tmp_path / "step_cost.json"
    rows = step_cost.main(["--drafts", "heads:1024", "small", "--reps", "3", "--threads", "1", "--out", str(out)])
    assert [(r["draft"], r["step"]) for r in rows] == [("heads:1024", "native"), ("heads:1024", "torch"),
                                                       ("small", "native"), ("small", "torch")]
    assert all(r["draft_ms"] > 0 and r["c"] == pytest.approx(r["draft_ms"] / r["target_one_token_ms"]) for r in rows)
    for r in rows:  # proposals of 3 tokens too, per drafted token
        assert set(r["proposal_ms"]) == {1, 3} and r["proposal_ms"][1] == r["draft_ms"]
        assert r["c_per_token"][3] == pytest.approx(r["proposal_ms"][3] / 3 / r["target_one_token_ms"])
    meta = json.loads(out.read_text())["meta"]
    assert {"commit", "dirty", "code_digest"} <= set(meta["provenance"]) and meta["machine"]["cpu_count"] >= 1
    assert not os.path.isabs(meta["args"]["out"])
    with pytest.raises(SystemExit):
        step_cost.main(["--reps", "1"])
    with pytest.raises(SystemExit):
        step_cost.main(["--proposals", "1"])
