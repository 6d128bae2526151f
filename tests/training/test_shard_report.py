"""The shard build's records gathered: totals, per-kind quiet medians, and a clear error for an empty folder."""
import json

import pytest

from specrepro.training.shard_report import main, shard_rates


def record(folder, index, tokens, seconds, load):
    (folder / f"shard-{index:04d}.json").write_text(json.dumps(
        {"target_written_tokens": tokens, "seconds": seconds, "batch": 32, "threads": 2, "loadavg_before": [load]}))


def test_totals_and_quiet_medians(tmp_path):
    record(tmp_path, 0, 4000, 400.0, 2.6)  # news beside another job: left out of the quiet median
    record(tmp_path, 1, 24000, 60.0, 1.8)
    record(tmp_path, 2, 9000, 45.0, 1.7)
    record(tmp_path, 3, 24000, 57.0, 2.0)
    out = shard_rates(tmp_path)
    assert out["total"] == {"shards": 4, "target_written_tokens": 61000, "seconds": 562.0,
                            "tokens_per_hour": round(3600 * 61000 / 562.0)}
    assert out["quiet_median_tokens_per_second"]["news"] == {"median": 200.0, "n": 1}
    assert out["quiet_median_tokens_per_second"]["code"]["n"] == 2
    assert [r["kind"] for r in out["shards"]] == ["news", "code", "news", "code"]
    assert [r["sampled"] for r in out["shards"]] == [False, False, True, True]


def test_the_cli_writes_a_record_and_refuses_an_empty_folder(tmp_path):
    record(tmp_path, 0, 100, 10.0, 1.0)
    out = tmp_path / "r.json"
    assert main(["--folder", str(tmp_path), "--out", str(out)]) == 0
    meta = json.loads(out.read_text())["meta"]
    assert {"commit", "code_digest"} <= set(meta["provenance"]) and meta["machine"]["cpu_flags"]
    with pytest.raises(SystemExit):
        main(["--folder", str(tmp_path / "none"), "--out", str(out)])
