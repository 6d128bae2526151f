"""Unit tests of the experiment helpers: resumable results, atomic writes, chi-square, predictions."""
import json
import math
import os

import numpy as np
import pytest
import torch

from specrepro.experiments.lossless import run_losslessness, toy_models
from specrepro.experiments.records import check_params, generation_record, per_token_latencies
from specrepro.experiments.workloads import make_draft
from specrepro.stats.speedup import acceptance_mle, predicted_speedup
from specrepro.tuning.costs import measure_costs
from specrepro.experiments.results import ResultsFile, read_csv, write_csv
from specrepro.files import atomic_write_text, write_json
from specrepro.algorithm.sampling import SamplingConfig
from specrepro.stats.exact import chisquare_fit, exact_joint


def test_results_file_resumes_and_skips_finished_items(tmp_path):
    path = tmp_path / "r.jsonl"
    done = []

    def run(stop_after=None):
        results = ResultsFile(path)
        for i in range(5):
            key = f"item{i}"
            if key in results:
                continue
            if stop_after is not None and len(done) == stop_after:
                return  # simulated interruption: the rest never ran
            done.append(key)
            results.append({"key": key, "value": i * i})

    run(stop_after=2)
    assert len(ResultsFile(path)) == 2
    run()
    assert done == [f"item{i}" for i in range(5)]  # nothing was redone
    assert {r["value"] for r in ResultsFile(path).values()} == {0, 1, 4, 9, 16}


def test_torn_last_line_is_dropped_with_warning(tmp_path):
    path = tmp_path / "r.jsonl"
    results = ResultsFile(path)
    results.append({"key": "a", "x": 1})
    results.append({"key": "b", "x": 2})
    with open(path, "a") as f:
        f.write('{"key": "c", "x"')  # killed mid-write
    with pytest.warns(UserWarning, match="torn"):
        again = ResultsFile(path)
    assert set(again.records) == {"a", "b"}
    assert path.read_text().endswith("\n")  # the torn bytes are cut, so the next append starts a clean line
    again.append({"key": "c", "x": 3})
    assert set(ResultsFile(path).records) == {"a", "b", "c"}


def test_corrupt_complete_line_is_dropped_too(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"key": "a"}\nnot json\n')
    with pytest.warns(UserWarning):
        assert set(ResultsFile(path).records) == {"a"}


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "t.csv"
    atomic_write_text(path, "old\n")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]  # no temp file left behind


def test_csv_and_json_roundtrip(tmp_path):
    rows = [{"a": 1, "b": 0.5, "c": None}, {"a": 2, "b": float("nan"), "d": "x"}]
    write_csv(tmp_path / "t.csv", rows)
    back = read_csv(tmp_path / "t.csv")
    assert back[0] == {"a": 1, "b": 0.5, "c": None, "d": None}
    assert math.isnan(back[1]["b"]) and back[1]["d"] == "x"
    write_json(tmp_path / "t.json", {"rows": rows})
    assert json.loads((tmp_path / "t.json").read_text().replace("NaN", "null"))["rows"][0]["a"] == 1


def test_chisquare_pools_small_cells():
    # the losslessness experiment's test: stats.chisquare_fit over outcome tuples
    expected = dict(zip([(i,) for i in range(7)], np.array([0.5, 0.5, 1, 2, 3, 40, 53]) / 100))
    observed = [1, 0, 1, 3, 2, 38, 55]
    out = chisquare_fit([(i,) for i, n in enumerate(observed) for _ in range(n)], expected)
    assert out.cells == 3  # 0.5+0.5+1+2+3 pooled to 7, then the two big cells
    assert out.pvalue > 0.05
    assert chisquare_fit([(1,)] * 5 + [(2,)] * 95, {(1,): 0.05, (2,): 0.95}).pvalue == 1.0
    # a sample where the target has no mass (an outcome exact_joint does not list) is a certain failure
    assert chisquare_fit([(0,)] * 3 + [(1,)] * 5 + [(2,)] * 92, {(1,): 0.5, (2,): 0.5}).pvalue == 0.0


def test_exact_joint_sums_to_one_and_matches_model():
    q, _ = toy_models()
    prompt = torch.tensor([0, 3])
    joint = exact_joint(q, prompt, 2, SamplingConfig(0.7, None, 0.9))
    assert 0 < len(joint) <= 36 and all(len(s) == 2 for s in joint)
    assert abs(sum(joint.values()) - 1) < 1e-5
    with torch.inference_mode():
        first = SamplingConfig(0.7, None, 0.9).probs(q(input_ids=prompt[None]).logits[0, -1]).double()
    assert sum(v for s, v in joint.items() if s[0] == 0) == pytest.approx(float(first[0]), abs=1e-6)


@torch.inference_mode()
def test_toy_models_are_far_apart():
    # resampling from q at a rejection emits min(p, q) + (1 - sum min(p, q)) q: the chi-square can only
    # see it where that is far from q, which needs p and q far apart (specrepro.stats.toy's logit_scale)
    q_model, p_model = toy_models()
    prompt = torch.tensor([[0, 3]])
    q, p = (torch.softmax(m(input_ids=prompt).logits[0, -1], -1) for m in (q_model, p_model))
    overlap = torch.minimum(p, q)
    wrong = overlap + (1 - overlap.sum()) * q
    assert 0.5 * float((p - q).abs().sum()) > 0.15
    assert 0.5 * float((wrong - q).abs().sum()) > 0.1


def test_losslessness_correct_passes_wrong_fails(tmp_path):
    settings = [{"name": "sps", "sampler": "sps", "lookahead": 2},
                {"name": "wrong", "sampler": "sps_wrong_resample_q", "lookahead": 2}]
    rows = run_losslessness(settings, tmp_path / "l.jsonl", n_samples=400, chunk=200)
    by = {r["setting"]: r for r in rows}
    assert by["sps"]["pvalue"] > by["sps"]["alpha_corrected"]
    assert by["wrong"]["pvalue"] < by["wrong"]["alpha_corrected"]
    # resuming recomputes nothing and gives the same numbers
    assert run_losslessness(settings, tmp_path / "l.jsonl", n_samples=400, chunk=200) == rows


def test_acceptance_mle_and_prediction():
    # loops: kept 2 of 2 (censored), 0 of 2, 1 of 2 -> 3 acceptances, 2 rejections
    assert acceptance_mle([2, 0, 1], [2, 2, 2]) == pytest.approx(3 / 5)
    assert predicted_speedup(0.0, 4, 0.0, 1.0) == pytest.approx(1.0)
    assert predicted_speedup(1.0, 4, 0.0, 1.0) == pytest.approx(5.0)
    a, k, c, v = 0.8, 4, 0.1, 1.2
    assert predicted_speedup(a, k, c, v) == pytest.approx((1 - a**5) / ((1 - a) * (k * c + v)))


def test_acceptance_by_position_counts_the_loops_that_reached_each_position():
    from specrepro.experiments.sweep import acceptance_by_position

    # loops (accepted of proposed): 3/3, 0/3, 1/3, 2/2 (a stop rule proposed 2)
    rates = acceptance_by_position([3, 0, 1, 2], [3, 3, 3, 2])
    # position 1: all 4 reached, 3 accepted; 2: loops 1, 3, 4 reached, 1 and 4 accepted; 3: loop 1 (3/3) reached
    # and accepted, loop 4 reached position 3's turn but proposed only 2, so it does not count
    assert rates == pytest.approx([3 / 4, 2 / 3, 1.0])
    assert acceptance_by_position([0, 0], [1, 1]) == [0.0]
    nan = acceptance_by_position([0], [2])
    assert nan[0] == 0.0 and nan[1] != nan[1]  # position 2 never reached
    with pytest.raises(ValueError, match="per-loop counts"):
        acceptance_by_position([3], [2])


def test_per_token_latency_and_emitted_counts():
    gen = type("G", (), {"tokens": torch.arange(5), "accepted": [2, 0, 3], "proposed": [3, 3, 3],
                         "loop_seconds": [0.3, 0.1, 0.4], "seconds": 1.0, "target_calls": 3, "draft_calls": 9})()
    rec = generation_record(gen, "k")
    assert rec["emitted"] == [3, 1, 1]  # the last loop was cut by the token budget
    lat = per_token_latencies([rec])
    assert lat == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.4])


def test_check_params_names_the_typo():
    with pytest.raises(ValueError, match="n_sampels"):
        check_params({"n_sampels": 3}, {"n_samples"})


def test_truncated_draft_is_a_valid_draft():
    from helpers import llama

    target = llama(0, layers=4, kv_heads=4)
    draft = make_draft("truncated:2", target)
    assert len(draft.model.layers) == 2 and len(target.model.layers) == 4
    assert target.config.num_hidden_layers == 4
    assert draft.lm_head is target.lm_head and draft.model.layers[0] is target.model.layers[0]  # shared, no copy
    import specrepro as sr

    ids = torch.tensor([1, 2, 3])
    a = sr.autoregressive_generate(target, ids, max_new_tokens=12, temperature=0)
    s = sr.speculative_generate(target, draft, ids, max_new_tokens=12, lookahead=3, temperature=0)
    assert torch.equal(a.tokens, s.tokens)


def test_measure_costs_feeds_target_features_to_feature_drafts():
    from specrepro.drafts import FeatureDraft
    from specrepro.stats.toy import tiny_llama

    target = tiny_llama(0, vocab=40, layers=2)
    costs = measure_costs(target, FeatureDraft.init_for(target, {"ffn": 32}), torch.tensor([0, 5, 7, 9]), [1, 2],
                             reps=1)
    assert costs["c"] > 0 and set(costs["v"]) == {1, 2} and set(costs["target_ms"]) == {1, 2, 3}


def test_every_output_records_the_commit_and_code_that_made_it():
    import subprocess
    from pathlib import Path

    from specrepro.experiments.records import run_header
    from specrepro.experiments.results import code_digest

    meta = run_header("smoke", 0, None)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip()
    assert meta["provenance"]["commit"] == head and len(head) == 40
    assert meta["provenance"]["code_digest"] == code_digest()
    assert isinstance(meta["provenance"]["dirty"], bool)
    assert meta["machine"]["cpu_model"] and "cpu_flags" in meta["machine"]


def test_the_dirty_flag_counts_code_changes_not_the_figures_a_run_rewrites(tmp_path):
    import shutil
    import subprocess

    from specrepro.experiments.results import provenance

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    run = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "table1.csv").write_text("a\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    run("add", ".")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    assert provenance(tmp_path)["dirty"] is False
    (tmp_path / "figures" / "table1.csv").write_text("b\n")  # what make reproduce does to the figures
    assert provenance(tmp_path)["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert provenance(tmp_path)["dirty"] is True
    assert len(provenance(tmp_path)["commit"]) == 40


def test_reproduce_time_estimates_scale_to_this_machine(tmp_path):
    """make reproduce's 'about N min left': the reference run's minutes (read from the committed figures' own
    records where they have them), scaled by this run's finished notebooks, or before any has finished by this
    machine's one-token pass against the reference run's; no estimate for profiles without a reference."""
    from specrepro.experiments import reproduce

    minutes, ref_ms = reproduce.reference_run("cpu")
    assert set(minutes) == set(reproduce.MINUTES["cpu"]) and ref_ms and ref_ms > 0  # the committed figures' tune
    table = {"01_losslessness": 4.0, "02_lookahead_sweep": 2.0, "03_table1": 10.0, "00_train_drafts": 0.1}
    names = ["02_lookahead_sweep", "03_table1"]
    assert reproduce.remaining_minutes("cpu", names, reference=table) == 12.0
    assert reproduce.remaining_minutes("cpu", names, pass_ratio=1.5, reference=table) == 18.0
    # 01 took twice its reference here; 00 (under a minute) does not count
    took = {"01_losslessness": 480.0, "00_train_drafts": 600.0}
    assert reproduce.remaining_minutes("cpu", names, took, pass_ratio=1.5, reference=table) == 24.0
    assert reproduce.remaining_minutes("smoke", names) is None
    # a figure with its own record (started .. finished) replaces the table's entry
    (tmp_path / "table1.json").write_text(json.dumps({"meta": {"started": "2026-12-06 03:00:00",
                                                                "finished": "2026-12-06 03:30:00",
                                                                "tune": {"one_token_ms": 5.0}}}))
    minutes, ref_ms = reproduce.reference_run("cpu", figures=tmp_path)
    assert minutes["03_table1"] == 30.0 and ref_ms == 5.0 and minutes["04_drafts"] == reproduce.MINUTES["cpu"]["04_drafts"]


def test_one_token_pass_is_measured_on_the_model_given():
    from specrepro.experiments.reproduce import one_token_ms
    from specrepro.stats.toy import tiny_llama

    assert 0 < one_token_ms(tiny_llama(0, vocab=50, layers=2), reps=5, prefix=8) < 1000
