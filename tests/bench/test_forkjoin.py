"""python -m specrepro.bench.forkjoin: the native module's probe of what an empty parallel region and a barrier
cost, and the file it writes."""
import json
import shutil

import pytest
import torch

from specrepro.bench import forkjoin
from specrepro.engines import native

REASON = native.unavailable_reason(torch.bfloat16, "cpu") if shutil.which("g++") is None else None
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no native build here: {REASON}")


def test_the_probe_times_regions_and_barriers():
    region, barrier = native.load().fork_join_cost(200)
    assert 0 < region < 1e4 and 0 < barrier < 1e4
    with pytest.raises(RuntimeError, match="rounds"):
        native.load().fork_join_cost(0)


def test_the_cli_writes_its_record(tmp_path, capsys):
    out = tmp_path / "fj.json"
    result = forkjoin.main(["--rounds", "50", "--repeats", "2", "--target", "none", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["region_us"] == result["region_us"] > 0 and len(saved["repeats_us"]) == 2
    assert {"commit", "dirty", "code_digest"} <= set(saved["meta"]["provenance"]) and saved["meta"]["native"]
    assert "parallel region" in capsys.readouterr().out
    assert forkjoin.regions_per_pass(30) == 151  # the offline target's 30 layers: 5 regions each and the head
    with pytest.raises(SystemExit):
        forkjoin.main(["--rounds", "0"])
