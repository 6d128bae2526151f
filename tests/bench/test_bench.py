"""The bench end to end on tiny random models: it runs in seconds and writes well-formed CSV/JSON.

No timing assertions: a benchmark is not a test.
"""
import pytest
import csv
import json

import torch

from helpers import llama
from specrepro.bench import harness as bench
from specrepro.stats import speedup
from specrepro.experiments import workloads
from specrepro.drafts.lookup import LookupDraft
from specrepro.stats.speedup import loop_cost_bound


def tiny(seed, layers=2):
    return llama(seed, vocab=64, layers=layers, tied=True)


def test_bench_end_to_end_writes_csv_and_json(tmp_path):
    target = tiny(0)
    draft = workloads.truncated_draft(target, 1)
    prompts = workloads.builtin_prompts("code", None, n=2, vocab=64)
    result = bench.bench(target, draft, prompts, ks=(1, 3), max_new_tokens=6, reps=2)
    csv_path, json_path = bench.write_results(result, tmp_path / "sub" / "bench", meta={"test": True})

    names = {c.name for c in bench.make_configs((1, 3))}
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert {r["name"] for r in rows} == names
    assert all(float(r["ms_per_token"]) > 0 for r in rows)
    # time to first token for every implementation (HF's through a streamer), shorter than the whole run
    assert all(0 < float(r["first_token_ms"]) < float(r["ms_per_token"]) * 6 for r in rows)
    sps = [r for r in rows if r["impl"] == "ours_sps"]
    assert all(0 <= float(r["a"]) <= 1 and 1 <= float(r["tau"]) <= int(r["k"]) + 1 for r in sps)
    assert all(float(r["predicted"]) > 0 and float(r["v"]) > 0 and float(r["bound"]) > 0 for r in sps)
    assert {h["mode"] for h in result["headline"]} == {"greedy", "sample"}
    for h in result["headline"]:
        assert h["ars_vs_hf_generate"] > 0 and h["sps_vs_hf_assisted"] > 0 and h["best_k"] in (1, 3)

    data = json.loads(json_path.read_text())
    assert data["meta"] == {"test": True}
    assert len(data["rows"]) == len(names) * 2 * 2  # configs x prompts x reps
    assert all(r["tokens"] == 6 for r in data["rows"])  # EOS ignored everywhere: fixed-length runs
    assert set(data["costs"]) == {"hf", "lean"}
    assert not list(csv_path.parent.glob(".*tmp*"))  # atomic writes leave no temporaries

    # greedy is deterministic: every greedy implementation emits the same tokens for a prompt
    greedy = {}
    for r in data["rows"]:
        if r["mode"] == "greedy":
            greedy.setdefault(r["prompt"], set()).add(tuple(r["ids"]))
    assert all(len(v) == 1 for v in greedy.values())
    print(bench.format_table(result["summary"]))


def test_profile_and_helpers():
    target = tiny(0)
    draft = workloads.truncated_draft(target, 1)
    setup = bench.Setup(target, draft)
    prompt = workloads.builtin_prompts("news", None, n=1, vocab=64)[0]
    prof = bench.profile_sps(setup.lean_target, setup.drafts["lean"].runner, prompt, k=2, max_new_tokens=8)
    assert prof["tokens"] == 8 and prof["loops"] >= 3 and prof["target_forward"] > 0
    # every loop drafts except a last one left with a single budget token (a plain target step)
    assert prof["loops"] - 1 <= prof["draft_calls"] <= prof["loops"] and prof["draft_propose"] > 0
    parts = ("target_forward", "draft_propose", "verify_sampling_est", "python_overhead_est")
    assert sum(prof[p] for p in parts) == pytest.approx(prof["loop_seconds"])
    lookup = bench.profile_sps(setup.lean_target, LookupDraft(64), prompt, k=2, max_new_tokens=8)
    assert lookup["tokens"] == 8 and lookup["loops"] - 1 <= lookup["draft_calls"] <= lookup["loops"]
    assert workloads.parse_ks("1,2,...,7") == list(range(1, 8)) == workloads.parse_ks("1-7")
    assert speedup.predicted_speedup(0.0, 4, 0.1, 1.0) == 1 / 1.4
    assert abs(speedup.predicted_speedup(1.0, 3, 0.0, 1.0) - 4) < 1e-12


@pytest.mark.parametrize("argv, message", [
    (["--ks", "0,1"], "1..32"), (["--ks", "33"], "1..32"), (["--ks", ""], "1..32"),
    (["--n-prompts", "0"], "--n-prompts must be >= 1"), (["--reps", "-1"], "--reps must be >= 1"),
])
def test_bad_cli_arguments_exit_with_a_message(argv, message, capsys):
    from specrepro.bench.harness import main

    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_bench_lookup_runs_hf_prompt_lookup_and_adaptive_needs_a_model(tmp_path):
    """A lookup draft is compared with HF's own prompt lookup (the same n-gram draft); no adaptive runs."""
    target = tiny(0)
    prompts = workloads.builtin_prompts("code", None, n=1, vocab=64)
    result = bench.bench(target, LookupDraft(64), prompts, ks=(2,), max_new_tokens=6, reps=1, modes=("greedy",),
                         adaptive=True)
    names = {r["name"] for r in result["summary"]}
    assert "hf_assisted/hf/greedy/K2/lookup" in names and not any("adaptive" in n for n in names)
    assert set(result["costs"]["lean"]["v"]) == {1, 2} and result["costs"]["lean"]["c"] > 0
    # greedy: ours and HF's prompt lookup emit the target's greedy tokens
    assert len({tuple(r["ids"]) for r in result["rows"]}) == 1


def test_bench_adaptive_lookahead_with_a_model_draft():
    target = tiny(0)
    draft = workloads.truncated_draft(target, 1)
    prompts = workloads.builtin_prompts("code", None, n=1, vocab=64)
    result = bench.bench(target, draft, prompts, ks=(1, 3), max_new_tokens=6, reps=1, modes=("greedy",), hf=False,
                         adaptive=True, adaptive_threshold=0.5)
    rows = {r["name"]: r for r in result["summary"]}
    adaptive = rows["ours_sps/lean/greedy/K3/adaptive"]
    assert "predicted" not in adaptive and adaptive["bound"] > 0  # the i.i.d. model assumes K drafts per loop
    assert adaptive["mean_proposed"] <= 3
    assert len({tuple(r["ids"]) for r in result["rows"]}) == 1  # still the target's greedy tokens
    assert result["headline"][0]["adaptive_vs_best_fixed"] > 0


def test_loop_cost_bound():
    v = {1: 1.5, 2: 2.0}
    # two loops: one proposed 2 (cost 2c + v(2)), one proposed nothing (a plain step, cost 1)
    assert loop_cost_bound(4, [2, 0], 0.1, v) == pytest.approx(4 / (0.2 + 2.0 + 1.0))


def test_bench_compares_runner_settings_and_reports_the_memory_floor(tmp_path, monkeypatch):
    """Runners of several dtypes and backends, plus sr.tune's pick, in one run: fastest vs fastest, floor."""
    monkeypatch.setenv("SPECREPRO_HOME", str(tmp_path))
    target = tiny(0)
    draft = workloads.truncated_draft(target, 1)
    prompts = workloads.builtin_prompts("code", None, n=1, vocab=64)
    runners = ("lean", "onednn@bfloat16", "tuned")
    result = bench.bench(target, draft, prompts, ks=(1, 2), max_new_tokens=6, reps=1, modes=("greedy",),
                         runners=runners, hf=False)
    assert set(result["costs"]) == set(runners)
    assert result["costs"]["onednn@bfloat16"]["v"].keys() == {1, 2}
    machine = result["machine"]
    assert machine["copy_bandwidth_gbs"] > 0 and machine["cpu_info"]["flags"] is not None
    lean, low = machine["runners"]["lean"], machine["runners"]["onednn@bfloat16"]
    assert lean["weight_bytes"] == 2 * low["weight_bytes"]  # float32 streams twice the bytes of bfloat16
    assert low["dtype"] == "torch.bfloat16" and lean["one_token_over_floor"] > 0
    assert machine["tuned"]["name"]
    line = result["headline"][0]
    assert line["fastest_sps_vs_fastest_ars"] > 0
    # float32 runners are greedy-exact against each other
    f32 = {tuple(r["ids"]) for r in result["rows"] if r["runner"] == "lean"}
    assert len(f32) == 1


@pytest.mark.parametrize("spec", ["fast", "hf@bfloat16", "lean@float16", "tuned@float32", "native@float32"])
def test_bad_runner_specs_are_clear_errors(spec, capsys):
    with pytest.raises(ValueError, match="runner"):
        bench.parse_runner(spec, torch.float32)
    with pytest.raises(SystemExit):
        bench.main(["--runners", f"lean,{spec}"])
    assert "runner" in capsys.readouterr().err


def test_bench_runs_token_trees_beside_chains():
    from specrepro.algorithm.tree import TreeSpec

    target = tiny(0)
    draft = workloads.truncated_draft(target, 1)
    prompts = workloads.builtin_prompts("code", None, n=1, vocab=64)
    tree = TreeSpec(2, 3)
    result = bench.bench(target, draft, prompts, ks=(1, 3), max_new_tokens=6, reps=1, modes=("greedy",), hf=False,
                         runners=("lean",), trees=(tree,))
    rows = {r["name"]: r for r in result["summary"]}
    tree_row = rows[f"ours_sps/lean/greedy/K3/tree{tree}"]
    assert 1 <= tree_row["tau"] <= tree.depth + 1 and tree_row["mean_proposed"] > 1
    assert "predicted" not in tree_row  # the chain's i.i.d. model does not describe a tree
    assert tree.nodes in result["costs"]["lean"]["v"]  # the pass over the whole tree was timed
    line = result["headline"][0]
    assert line["tree_vs_chain"] > 0 and line["tree_tau_over_chain_tau"] > 0
    assert len({tuple(r["ids"]) for r in result["rows"]}) == 1  # greedy: trees emit the target's tokens too


def test_prompt_ratio_ci_averages_repetitions_and_resamples_prompts():
    from specrepro.bench.report import prompt_ratio_ci

    # peer 10 ms/token on every prompt; ours 5 on prompt 0 (two repetitions: 4 and 6) and 10 on prompts 1, 2
    rows = [dict(name="peer", prompt=p, rep=r, ms=10.0) for p in range(3) for r in range(2)]
    rows += [dict(name="ours", prompt=0, rep=0, ms=4.0), dict(name="ours", prompt=0, rep=1, ms=6.0)]
    rows += [dict(name="ours", prompt=p, rep=r, ms=10.0) for p in (1, 2) for r in range(2)]
    rows.append(dict(name="ours", prompt=3, rep=0, ms=1.0))  # a prompt the peer did not run is left out
    point, low, high = prompt_ratio_ci(rows, "ours", "peer", key="ms")
    assert point == pytest.approx(30 / 25)
    assert low == pytest.approx(1.0) and high == pytest.approx(2.0)  # all-peer-speed and all-prompt-0 resamples
    assert prompt_ratio_ci(rows, "ours", "nobody", key="ms") is None


def test_the_overhead_tool_times_the_forwards_inside_the_same_loops():
    """bench.overhead splits ArS loop time into the target's forwards and the rest: the forwards it counts are
    the loops' (not the prompt's prefill), and the share outside them is what is left of the loop time."""
    from specrepro.bench.overhead import MODES, TimedForwards, overhead
    from specrepro.engines.lean import LeanRunner
    from helpers import llama

    runner = LeanRunner(llama(0))
    for sampling in MODES.values():
        out = overhead(runner, torch.tensor([1, 2, 3, 4, 5]), 12, sampling, seed=0)
        assert out["tokens"] == 12 and out["outside_share"] > 0
        assert out["loop_ms_per_token"] > out["forward_ms_per_token"] * 12 / 13  # the loops hold the forwards
    timed = TimedForwards(runner)
    timed.prefill(torch.tensor([1, 2, 3]))
    timed.forward(torch.tensor([4]))
    assert timed.forwards == 1 and timed.forward_seconds > 0  # prefill is not counted
    with pytest.raises(ValueError, match="no prefill"):
        overhead(torch.nn.Linear(2, 2), torch.tensor([1, 2]), 4, MODES["greedy"], seed=0)


def test_the_overhead_tool_draws_its_torch_mode_without_the_native_draw(monkeypatch):
    """nucleus-torch-draw is the nucleus mode with SamplingConfig.draw on its torch path: inside draw_path the
    native module reads as not loaded (no kernel call), outside it as it was (the kernel is called)."""
    from specrepro.algorithm.sampling import SamplingConfig
    from specrepro.bench.overhead import MODES, draw_path
    from specrepro.engines import native

    calls = []

    class Spy:
        def nucleus_sample(self, logits, temperature, top_p, u):
            calls.append(top_p)
            return 0

    monkeypatch.setattr(native, "loaded", lambda: Spy())
    assert MODES["nucleus-torch-draw"] == MODES["nucleus"]
    cfg, logits = SamplingConfig(**MODES["nucleus"]), torch.randn(50)
    with draw_path("nucleus-torch-draw"):
        assert native.loaded() is None
        cfg.draw(logits, torch.Generator().manual_seed(0))
    assert calls == []
    with draw_path("nucleus"):
        assert int(cfg.draw(logits, torch.Generator().manual_seed(0))) == 0
    assert calls == [0.8] and isinstance(native.loaded(), Spy)


def test_native_int8_is_its_own_runner_in_the_bench():
    """native@int8 names the int8-weight target (LeanRunner weights="int8"), never the bfloat16 one."""
    import shutil

    from specrepro.engines import native

    assert bench.parse_runner("native@int8", torch.float32) == ("native@int8", torch.bfloat16)
    assert bench.parse_runner("native", torch.float32) == ("native", torch.bfloat16)
    if shutil.which("g++") is None or native.unavailable_reason(torch.bfloat16, "cpu") is not None:
        pytest.skip("no native build here")
    setup = bench.Setup(tiny(0), None, runners=("native", "native@int8"))
    assert setup.targets["native@int8"].weights == "int8" and setup.targets["native"].weights == "bfloat16"
