"""Run every notebook with the smoke profile through the real runner and check what it writes.

Slow (minutes): marked `notebooks`; outputs go to a temporary figures dir, never to the committed figures/.
"""
import math

import pytest

from specrepro.experiments import reproduce
from specrepro.experiments.results import read_csv

pytestmark = pytest.mark.notebooks


@pytest.fixture(scope="module")
def smoke_outputs(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    results = tmp_path_factory.mktemp("results")
    original = reproduce.output_dirs
    reproduce.output_dirs = lambda profile: {"out_dir": str(out), "results_dir": str(results)}
    try:
        reproduce.run("smoke", force=True)
    finally:
        reproduce.output_dirs = original
    return out


def test_losslessness_outputs(smoke_outputs):
    rows = read_csv(smoke_outputs / "losslessness.csv")
    assert rows and (smoke_outputs / "losslessness.png").exists() and (smoke_outputs / "losslessness.pdf").exists()
    for r in rows:
        assert r["alpha_corrected"] == pytest.approx(r["alpha"] / len(rows))
        if r["expected_to_pass"] == "True":
            assert r["pvalue"] > r["alpha_corrected"], r
        else:
            assert r["pvalue"] < r["alpha_corrected"], r
    assert any(r["expected_to_pass"] == "False" for r in rows)


def test_lookahead_outputs(smoke_outputs):
    rows = read_csv(smoke_outputs / "lookahead_sweep.csv")
    assert {r["task"] for r in rows} == {"news", "code"}
    for r in rows:
        assert r["ms_per_token"] > 0 and r["total_seconds"] > 0
        assert 0 < r["tau_over_K1"] <= 1
        assert r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"]
        assert 0 <= r["a"] <= 1 and r["c"] > 0 and r["v"] > 0 and r["speedup"] > 0
        if r["tree"]:  # the notebook's default tree, beside the chains: no i.i.d. prediction for a tree
            assert r["tree"] == "2x2" and r["K"] == 2 and r["nodes"] == 6 and math.isnan(r["predicted_speedup"])
        else:
            assert r["predicted_speedup"] > 0
        if r["K"] == 0:
            assert r["speedup"] == 1.0 and r["tau"] == 1.0
    assert {r["task"] for r in rows if r["tree"]} == {"news", "code"}


def test_table1_outputs(smoke_outputs):
    rows = read_csv(smoke_outputs / "table1.csv")
    keys = {(r["benchmark"], r["decoding"], r["method"]) for r in rows}
    assert keys == {(b, d, m) for b, d in [("news", "nucleus"), ("news", "greedy"), ("humaneval", "greedy"),
                                                    ("humaneval", "nucleus")]
                    for m in ("ArS", "SpS")}
    for r in rows:
        assert r["ms_per_token"] > 0
        if (r["benchmark"], r["decoding"]) != ("humaneval", "greedy"):  # the paper has no greedy HumanEval row
            assert r["paper_result"] is not None and r["paper_speedup"] > 0
        if r["benchmark"] == "news":
            assert 0 <= r["result"] <= 1
        elif not (isinstance(r["result"], float) and math.isnan(r["result"])):
            assert 0 <= r["result"] <= 1
    assert {r["tree"] for r in rows if r["method"] == "SpS"} == {"2x2"}  # the smoke profile's SpS verifies a tree
    # greedy SpS must produce exactly the greedy ArS text, so the scores agree
    greedy = {r["method"]: r["result"] for r in rows if r["decoding"] == "greedy"}
    assert greedy["ArS"] == pytest.approx(greedy["SpS"])


def test_drafts_outputs(smoke_outputs):
    rows = read_csv(smoke_outputs / "drafts.csv")
    assert rows and all(r["tau"] >= 1 and r["c"] > 0 and r["v"] > 0 for r in rows)
    assert all(r["predicted_speedup"] > 0 for r in rows if not r["tree"])
    # every draft on both tasks at both temperatures and every K of the smoke profile
    assert {(r["draft"], r["task"], r["temperature"], r["K"]) for r in rows} == {
        (d, t, temp, k) for d in ("truncated:2", "lookup") for t in ("news", "code") for temp in (0.0, 1.0)
        for k in (1, 2, 4)}
    assert {(r["draft"], r["task"], r["temperature"]) for r in rows if r["tree"] == "2x2"} == {
        (d, t, temp) for d in ("truncated:2", "lookup") for t in ("news", "code") for temp in (0.0, 1.0)}
    assert (smoke_outputs / "drafts.png").exists()


def test_typo_in_params_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "smoke.yaml").write_text("01_losslessness:\n  n_sampels: 5\n")
    monkeypatch.setattr(reproduce, "PARAMS_DIR", tmp_path)
    with pytest.raises(SystemExit, match="n_sampels"):
        reproduce.plan("smoke", ["01_losslessness"])


def test_unknown_profile_or_notebook_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="unknown profile"):
        reproduce.load_profile("laptop")
    (tmp_path / "smoke.yaml").write_text("01_losless:\n  n_samples: 5\n")
    monkeypatch.setattr(reproduce, "PARAMS_DIR", tmp_path)
    with pytest.raises(SystemExit, match="unknown notebook"):
        reproduce.load_profile("smoke")


def test_results_are_keyed_by_settings():
    """A changed parameter gets a fresh results folder (no resuming from items made under other settings)."""
    base = dict(reproduce.plan("smoke", ["02_lookahead_sweep"]))["02_lookahead_sweep"]
    again = dict(reproduce.plan("smoke", ["02_lookahead_sweep"]))["02_lookahead_sweep"]
    other = dict(reproduce.plan("smoke", ["02_lookahead_sweep"], {"max_new_tokens": 5}))["02_lookahead_sweep"]
    assert base["results_dir"] == again["results_dir"]
    assert other["results_dir"] != base["results_dir"]
    assert base["results_dir"].startswith("runs/smoke/results/02_lookahead_sweep-")
