"""sr.tune: the choice on fake cost tables, the per-machine cache and its invalidation, bad settings."""
import pytest
import torch

import specrepro as sr
from specrepro.engines import kernels, machine
from specrepro.tuning import tune as tune_mod
from specrepro.engines.lean import LeanRunner
from specrepro.stats.speedup import expected_tokens
from specrepro.stats.toy import tiny_llama


def llama(seed, layers=2):
    return tiny_llama(seed, vocab=16, layers=layers)


def entry(dtype, backend, threads, t1, slope, draft_ms=None):
    """A fake cost table row: a pass over n tokens costs t1 + slope * (n - 1) ms."""
    target_ms = {n: t1 + slope * (n - 1) for n in range(1, 18)}
    out = {"candidate": {"dtype": dtype, "backend": backend, "threads": threads, "compile": False},
           "target_ms": target_ms, "v": {k: target_ms[k + 1] / t1 for k in range(1, 17)}}
    if draft_ms is not None:
        out.update(draft_ms=draft_ms, c=draft_ms / t1)
    return out


def table(draft_ms=None):
    return {
        "fp32-flat": entry("float32", "onednn", 2, 40.0, 1.0, draft_ms),  # slow one-token pass, flat verify
        "bf16-steep": entry("bfloat16", "eager", 2, 30.0, 8.0, draft_ms),  # fast one-token pass, steep verify
    }


def test_choose_without_a_draft_takes_the_fastest_one_token_pass():
    choice = tune_mod.choose(table(), has_draft=False, acceptance=None)
    assert choice["name"] == "bf16-steep"
    assert choice["fastest_ars"]["name"] == "bf16-steep"


def test_choose_with_a_draft_minimises_expected_time_per_token_over_settings_and_k():
    costs = table(draft_ms=1.0)
    a = 0.8
    choice = tune_mod.choose(costs, has_draft=True, acceptance=a, max_lookahead=16)
    # brute force over the same table
    best = min(((k * 1.0 + e["target_ms"][k + 1]) / expected_tokens(a, k), name, k)
               for name, e in costs.items() for k in range(1, 17))
    assert (choice["name"], choice["lookahead"]) == (best[1], best[2])
    assert choice["name"] == "fp32-flat"  # a flat verify cost beats a cheaper one-token pass at high a
    assert choice["ms_per_token"] == pytest.approx(best[0])
    assert choice["expected_speedup_over_fastest_ars"] == pytest.approx(30.0 / best[0])
    # at a low acceptance a short K on the fast one-token pass wins instead
    low = tune_mod.choose(costs, has_draft=True, acceptance=0.05)
    assert low["name"] == "bf16-steep" and low["lookahead"] == 1


def test_choose_without_an_acceptance_estimate_ranks_at_the_papers_k():
    choice = tune_mod.choose(table(draft_ms=1.0), has_draft=True, acceptance=None)
    assert choice["lookahead"] == tune_mod.DEFAULT_LOOKAHEAD
    # K = 4 loop: fp32 4 + 44 = 48 ms, bf16 4 + 62 = 66 ms
    assert choice["name"] == "fp32-flat"
    assert "no acceptance estimate" in choice["why"]
    assert choice["expected_speedup_over_fastest_ars"] is None


def test_choose_reads_json_round_tripped_tables():
    import json

    costs = json.loads(json.dumps(table(draft_ms=1.0)))  # int keys become strings
    assert tune_mod.choose(costs, True, 0.8)["name"] == "fp32-flat"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECREPRO_HOME", str(tmp_path))
    return tmp_path


def small_tune(model, **kw):
    return sr.tune(model, max_lookahead=3, threads=[1], reps=1, **kw)


def test_tune_returns_a_runner_that_generates_like_the_model(home):
    model = llama(0)
    setting = small_tune(model, dtypes=["float32"])
    assert isinstance(setting.target, LeanRunner)
    assert setting.tree is None and setting.lookahead == tune_mod.DEFAULT_LOOKAHEAD
    report = setting.report
    assert report["machine"]["flags"] == machine.cpu_info()["flags"] and report["cpu"]
    assert report["cached"] is False and set(report["costs"]) == {"float32/eager/1t", "float32/onednn/1t"} - set(
        report["skipped"])
    prompt = torch.tensor([0, 4, 9])
    kw = dict(max_new_tokens=12, temperature=0.0)
    assert torch.equal(sr.autoregressive_generate(setting.target, prompt, **kw).tokens,
                       sr.autoregressive_generate(model, prompt, **kw).tokens)
    assert torch.get_num_threads() == 1  # tune applies the chosen thread count


def test_tune_with_a_draft_costs_it_and_picks_k(home):
    model, draft = llama(0), llama(3, layers=1)
    setting = small_tune(model, draft=draft, acceptance=0.7, dtypes=["float32"], backends=["eager"])
    entry_ = setting.report["costs"]["float32/eager/1t"]
    assert entry_["draft_ms"] > 0 and set(entry_["v"]) == {1, 2, 3}
    assert 1 <= setting.lookahead <= 3 and setting.report["acceptance_source"] == "given"
    measured = small_tune(model, draft=draft, prompt=torch.tensor([0, 4, 9, 4, 9]), dtypes=["float32"],
                          backends=["eager"])
    assert 0 <= measured.report["acceptance"] < 1 and "measured" in measured.report["acceptance_source"]


def test_tune_cache_is_reused_and_keyed_by_machine_torch_and_model(home, monkeypatch):
    model = llama(0)
    calls = []
    real = tune_mod.measure_candidates
    monkeypatch.setattr(tune_mod, "measure_candidates", lambda *a, **k: calls.append(1) or real(*a, **k))
    kw = dict(dtypes=["float32"], backends=["eager"])
    first = small_tune(model, **kw)
    again = small_tune(model, **kw)
    assert len(calls) == 1 and again.report["cached"] and again.report["costs"] == first.report["costs"]
    assert len(list((home / "tune").glob("*.json"))) == 1

    real_info = machine.cpu_info
    monkeypatch.setattr(tune_mod, "cpu_info", lambda: {**real_info(), "flags": sorted(real_info()["flags"] + ["amx_bf16"])})
    assert not small_tune(model, **kw).report["cached"] and len(calls) == 2  # another CPU kind
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # the same CPU capped to an older instruction set
    assert not small_tune(model, **kw).report["cached"] and len(calls) == 3
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert not small_tune(model, **kw).report["cached"] and len(calls) == 4  # another torch
    assert not small_tune(llama(5, layers=3), **kw).report["cached"] and len(calls) == 5  # another target
    assert small_tune(model, **kw).report["cached"] and len(calls) == 5
    # a damaged cache file is measured afresh, not trusted
    for f in (home / "tune").glob("*.json"):
        f.write_text("{not json")
    assert not small_tune(model, **kw).report["cached"] and len(calls) == 6


def test_the_native_build_flags_key_the_cache(monkeypatch):
    """Another build of the native pass ($SPECREPRO_NATIVE_CFLAGS, e.g. the AVX2 kernels) is another runner: a
    cached measurement of one build is never returned for the other; runners without it keep their key."""
    info, model = machine.cpu_info(), llama(0)
    native_ = [tune_mod.Candidate("bfloat16", "native", 2)]
    eager = [tune_mod.Candidate("bfloat16", "eager", 2)]
    monkeypatch.delenv("SPECREPRO_NATIVE_CFLAGS", raising=False)
    before = {c[0].backend: tune_mod.cache_key(info, model, None, c, 4) for c in (native_, eager)}
    monkeypatch.setenv("SPECREPRO_NATIVE_CFLAGS", "-mno-avx512f")
    after = {c[0].backend: tune_mod.cache_key(info, model, None, c, 4) for c in (native_, eager)}
    assert after["native"] != before["native"] and after["eager"] == before["eager"]


def test_the_screen_measures_every_candidate_and_only_the_best_in_full(home):
    setting = sr.tune(llama(0), max_lookahead=3, reps=1, dtypes=["float32", "bfloat16"], threads=[1, 2], cache=False)
    report = setting.report
    names = {f"{d}/{b}/{t}t" for d in ("float32", "bfloat16") for b in kernels.BACKENDS for t in (1, 2)}
    unavailable = {n for n, why in report["skipped"].items() if not why.startswith("screened out")}
    assert set(report["screen"]) | unavailable == names and not set(report["screen"]) & unavailable
    assert all(set(ms) == set(tune_mod.SCREEN_SIZES) and ms[1] > 0 for ms in report["screen"].values())
    assert len(report["costs"]) == 2 and set(report["costs"]) <= set(report["screen"])
    score = {n: ms[1] + ms[5] for n, ms in report["screen"].items()}
    assert max(score[n] for n in report["costs"]) <= min(score[n] for n in report["screen"] if n not in report["costs"])
    assert setting.report["name"] in report["costs"]


def test_unavailable_backend_is_skipped_with_its_reason(home, monkeypatch):
    monkeypatch.setattr(kernels, "_probe_onednn", lambda dtype: "no oneDNN here (test)")
    monkeypatch.setattr(kernels, "_probe_cache", {})
    setting = small_tune(llama(0), dtypes=["float32"], cache=False)
    skipped = setting.report["skipped"]
    assert skipped.pop("float32/onednn/1t") == "no oneDNN here (test)"
    assert "bfloat16 weights" in skipped.pop("float32/native/1t") and not skipped  # the native pass is bfloat16 only
    assert setting.candidate.backend == "eager"


@pytest.mark.parametrize("kwargs,match", [
    ({"dtypes": ["float16"]}, "unknown dtype 'float16'"),
    ({"threads": 0}, "threads must be integers >= 1"),
    ({"threads": [2, -1]}, "threads must be integers >= 1"),
    ({"acceptance": 1.0}, r"acceptance must be a number in \[0, 1\)"),
    ({"backends": ["mkl"]}, "unknown linear backend 'mkl'"),
    ({"max_lookahead": 0}, "max_lookahead must be an integer in 1..16"),
])
def test_bad_tune_settings_are_clear_errors(home, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sr.tune(llama(0), **kwargs)


def test_tune_weighs_trees_against_the_chain_on_the_prompt(home):
    from specrepro.algorithm.tree import TreeSpec

    model, draft = llama(0), llama(3, layers=1)
    prompt = torch.tensor([0, 4, 9, 4, 9, 4])
    trees = [TreeSpec(2, 2), TreeSpec(3, 3, max_nodes=6)]
    setting = small_tune(model, draft=draft, acceptance=0.6, prompt=prompt, trees=trees, dtypes=["float32"],
                         backends=["eager"])
    compared = setting.report["trees"]
    assert [r["tree"] for r in compared] == [None, "2x2", "3x3/6"]
    costs = setting.report["costs"]["float32/eager/1t"]
    assert {t.nodes + 1 for t in trees} <= set(costs["target_ms"])  # the passes over each tree were timed
    best = min(compared, key=lambda r: r["ms_per_token"])
    assert (setting.tree is None) == (best["tree"] is None)
    assert setting.tree is None or str(setting.tree) == best["tree"]
    for r in compared:
        assert r["ms_per_token"] == pytest.approx(
            (r["levels"] * costs["draft_ms"] + costs["target_ms"][r["nodes"] + 1]) / r["tau"])
    # the chosen tree generates (greedy: the target's own tokens)
    kw = dict(max_new_tokens=8, temperature=0.0)
    assert torch.equal(sr.speculative_generate(setting.target, draft, prompt, tree=setting.tree, **kw).tokens,
                       sr.autoregressive_generate(model, prompt, **kw).tokens)
    with pytest.raises(ValueError, match="needs a draft and a prompt"):
        small_tune(model, draft=draft, trees=trees)


class FirstCallsSlow:
    """A runner whose first `slow_calls` passes take 0.3 s (building, packing) and every later one
    `ms` milliseconds more than the wrapped runner's own pass."""

    def __init__(self, runner, ms: float, slow_calls: int):
        self.__dict__.update(_runner=runner, _ms=ms, _left=slow_calls)

    def forward(self, ids):
        import time

        time.sleep(0.3 if self._left > 0 else self._ms / 1e3)
        self.__dict__["_left"] -= 1
        return self._runner.forward(ids)

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def __setattr__(self, name, value):
        setattr(self._runner, name, value)


def test_the_screen_times_warm_runners_not_their_first_calls(monkeypatch):
    """A candidate that is slow only on its first calls (as the native pass is while it packs its weights)
    must win the screen when it is the faster one warm."""
    real = tune_mod.build_runner
    slow_start = {"bfloat16/eager/1t": (1.0, 7), "float32/eager/1t": (8.0, 0)}
    monkeypatch.setattr(tune_mod, "build_runner",
                        lambda target, cand: FirstCallsSlow(real(target, cand), *slow_start[cand.name]))
    cands = [tune_mod.Candidate("float32", "eager", 1), tune_mod.Candidate("bfloat16", "eager", 1)]
    out = tune_mod.measure_candidates(llama(0), None, cands, max_lookahead=3, reps=3, keep=1)
    assert list(out["costs"]) == ["bfloat16/eager/1t"], out["screen"]
    assert out["screen"]["bfloat16/eager/1t"][1] < 0.1e3  # no 0.3 s first call in any median
    assert set(out["prepare"]["bfloat16/eager/1t"]) >= {"build_seconds", "warmup_seconds"}


def test_an_outlier_screen_is_measured_again(monkeypatch):
    """One disturbed screen (here: the candidate's first timed passes) is repeated before it decides."""
    real = tune_mod.measure_cost_table
    calls = []

    def disturbed(pairs, *a, **k):
        out = real(pairs, *a, **k)
        calls.append(list(pairs))
        (name,) = pairs
        if name == "bfloat16/eager/1t" and len([c for c in calls if c == [name]]) == 1:
            out[name]["target_ms"] = {n: ms + 1e3 for n, ms in out[name]["target_ms"].items()}
        return out

    monkeypatch.setattr(tune_mod, "measure_cost_table", disturbed)
    cands = [tune_mod.Candidate("float32", "eager", 1), tune_mod.Candidate("bfloat16", "eager", 1)]
    out = tune_mod.measure_candidates(llama(0), None, cands, max_lookahead=2, reps=1, keep=2)
    first, second = out["prepare"]["bfloat16/eager/1t"]["screens"]
    assert first > 2e3 > second and out["screen"]["bfloat16/eager/1t"][1] < 1e3


@pytest.mark.parametrize("fail_at", ["screen", "measure"])
def test_a_graph_runner_that_falls_back_is_skipped_not_timed(monkeypatch, fail_at):
    """A compile-mode candidate whose runner falls back to uncaptured replay after its warm-up (here a bucket
    beyond the warmed sizes fails to capture: the screen's 32-token prefix, or the full measurement's
    9-token pass) is reported as skipped with the reason, never ranked with its uncaptured times."""
    from specrepro.engines.static import GraphFallbackWarning, StaticRunner

    def capture(self, b):  # the plain static pass for the warmed buckets; a failing capture beyond them
        if b > {"screen": 4, "measure": 8}[fail_at]:
            raise RuntimeError("no capture here")
        step = self._inputs(b)
        return lambda: self._step(step)

    monkeypatch.setattr(StaticRunner, "_capture", capture)
    monkeypatch.delenv("SPECREPRO_STRICT_GRAPHS", raising=False)
    real = tune_mod.build_runner
    monkeypatch.setattr(tune_mod, "build_runner", lambda target, cand: (
        StaticRunner(target, graphs="compile", compile_backend="aot_eager") if cand.graphs else real(target, cand)))
    monkeypatch.setattr(tune_mod, "_graph_sizes", lambda *a: [1, 2, 3, 4])  # what the warm-up captures
    cands = [tune_mod.Candidate("float32", "eager", 1), tune_mod.Candidate("float32", "eager", 1, graphs="compile")]
    with pytest.warns(GraphFallbackWarning):
        out = tune_mod.measure_candidates(llama(0), None, cands, max_lookahead=8, reps=1, keep=2)
    name = "float32/eager/1t/graphs-compile"
    assert name not in out["costs"] and list(out["costs"]) == ["float32/eager/1t"]
    assert "fell back to uncaptured replay" in out["skipped"][name] and "no capture here" in out["skipped"][name]



def test_the_timing_prefix_holds_ids_a_smaller_padded_draft_can_read(monkeypatch):
    """A draft whose own vocabulary is smaller than the target's (padding rows, as in Qwen2.5 pairs) must not
    be fed prefix ids it has no rows for while tune times it: the prefix is drawn below the draft's rows."""
    draws = []
    real = torch.randint
    monkeypatch.setattr(torch, "randint", lambda lo, hi, *a, **k: draws.append(hi) or real(lo, hi, *a, **k))
    from specrepro.drafts.lookup import LookupDraft

    padded = LookupDraft(vocab_size=64)
    padded.rows = 9  # as a model draft with 9 rows of its own fitted to a 64-token target records it
    out = tune_mod.measure_candidates(llama(0), padded, [tune_mod.Candidate("float32", "eager", 1)], max_lookahead=1,
                                      reps=1, keep=1)
    assert draws[0] == 9 and "float32/eager/1t" in out["screen"]
    draws.clear()
    tune_mod.measure_candidates(llama(0), None, [tune_mod.Candidate("float32", "eager", 1)], max_lookahead=1, reps=1,
                                keep=1)
    assert draws[0] == llama(0).config.vocab_size  # no draft: the target's whole vocabulary


def test_a_native_build_for_an_instruction_set_the_cpu_lacks_is_skipped_by_tune_not_a_crash(tmp_path):
    """A real build with a flag this CPU lacks (AVX-VNNI on CPUs without it): the module refuses at load with the
    feature named, and tune measures and picks another setting (before the load-time check this died by SIGILL
    where the compiler used the instructions)."""
    import os
    import shutil
    import subprocess
    import sys

    from specrepro.engines import native

    flags = native._cpu_flags().split()
    if shutil.which("g++") is None or "avx2" not in flags or "avx_vnni" in flags:
        pytest.skip("needs g++ and an x86 CPU with AVX2 and without AVX-VNNI")
    code = ("import specrepro as sr\nfrom specrepro.stats.toy import tiny_llama\n"
            "s = sr.tune(tiny_llama(0, vocab=16, layers=2), max_lookahead=3, threads=[1], reps=1, dtypes=['bfloat16'],"
            " backends=['eager', 'native'], cache=False)\n"
            "print(s.candidate.backend)\nprint(s.report['skipped']['bfloat16/native/1t'])\n")
    env = {**os.environ, "SPECREPRO_NATIVE_CFLAGS": "-mavxvnni", "SPECREPRO_HOME": str(tmp_path)}
    env.pop("SPECREPRO_NATIVE_ASSUME_CPU", None)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    backend, why = run.stdout.strip().splitlines()[-2:]
    assert backend == "eager"
    assert why.startswith("the native CPU pass cannot run on this CPU: this CPU lacks avxvnni,") and "-mavxvnni" in why


def test_int8_settings_compete_only_when_asked_and_leave_the_default_keys_alone(home):
    """quantized=True adds "int8/native/<t>t" (the native pass with int8 weights, another target) to the candidates;
    without it tune measures exactly what it did before int8 existed (the same candidates, the same cache keys)."""
    from specrepro.engines import native

    model = llama(0)
    default = tune_mod.candidate_settings(model, ["float32", "bfloat16"], kernels.BACKENDS, [1, 2], False)
    assert all(c.weights == "bfloat16" and not c.name.startswith("int8") for c in default)
    assert tune_mod.Candidate("bfloat16", "native", 2).ident() == {
        "dtype": "bfloat16", "backend": "native", "threads": 2, "compile": False, "graphs": ""}
    asked = tune_mod.candidate_settings(model, ["bfloat16"], ["eager", "native"], [1, 2], False, quantized=True)
    assert [c.name for c in asked if c.weights == "int8"] == ["int8/native/1t", "int8/native/2t"]
    assert not [c for c in tune_mod.candidate_settings(model, ["bfloat16"], ["eager"], [1], False, True)
                if c.weights == "int8"]  # no native backend asked: no int8
    info = machine.cpu_info()
    assert tune_mod.cache_key(info, model, None, default, 4) != tune_mod.cache_key(info, model, None, asked, 4)
    with pytest.raises(TypeError, match="quantized must be True or False"):
        sr.tune(model, quantized="yes")
    if native.unavailable_reason(torch.bfloat16, "cpu") is not None:
        return
    setting = small_tune(model, dtypes=["bfloat16"], backends=["native"], quantized=True)
    assert {"bfloat16/native/1t", "int8/native/1t"} == set(setting.report["screen"])
    int8 = tune_mod.build_runner(model, tune_mod.Candidate("bfloat16", "native", 1, weights="int8"))
    assert int8.weights == "int8"
    assert setting.report["target_weights"] == setting.target.weights == setting.candidate.weights
    plain = small_tune(model, dtypes=["bfloat16"], backends=["native"])
    assert set(plain.report["screen"]) == {"bfloat16/native/1t"} and plain.target.weights == "bfloat16"


def test_draft_steps_are_pooled_per_thread_count_across_candidates():
    costs = {name: {**entry(*cand, t1, 1.0, draft_ms=float(sum(samples) / len(samples))), "draft_samples_ms": samples}
             for name, cand, t1, samples in [
                 ("a", ("bfloat16", "native", 2), 5.0, [1.0, 9.0]),
                 ("b", ("bfloat16", "onednn", 2), 20.0, [1.2, 1.1]),
                 ("c", ("bfloat16", "native", 1), 8.0, [2.0, 2.2])]}
    costs["d"] = entry("float32", "eager", 2, 30.0, 1.0)  # no draft timed: left alone
    tune_mod.pool_draft_costs(costs)
    assert costs["a"]["draft_ms"] == costs["b"]["draft_ms"] == pytest.approx((1.1 + 1.2) / 2)  # median of 4
    assert costs["a"]["draft_ms_own"] == 5.0 and costs["a"]["c"] == pytest.approx(1.15 / 5.0)
    assert costs["a"]["draft_pooled_from"] == ["a", "b"]
    assert costs["c"]["draft_ms"] == pytest.approx(2.1) and costs["c"]["draft_pooled_from"] == ["c"]
    assert "draft_ms" not in costs["d"]


def test_one_disturbed_draft_step_does_not_rank_a_slower_pass_first(monkeypatch):
    """One draft step timed beside the faster runner is disturbed (as by another process on the cores): pooled
    with the steps timed beside the other runner, it no longer decides the ranking. The times are set, not
    measured, so that only the pooling decides."""
    real = tune_mod.measure_cost_table

    def disturbed(pairs, *a, **k):
        out = real(pairs, *a, **k)
        for name, e in out.items():
            slow = name == "bfloat16/eager/1t"  # this runner's passes are 3x slower
            e["target_ms"] = {n: (3 if slow else 1) * (10.0 + n) for n in e["target_ms"]}
            if "draft_samples_ms" in e:
                e["draft_samples_ms"] = [2.0, 2.1] if slow else [80.0, 2.0]
                e["draft_ms"] = sum(e["draft_samples_ms"]) / 2
        return out

    monkeypatch.setattr(tune_mod, "measure_cost_table", disturbed)
    cands = [tune_mod.Candidate("float32", "eager", 1), tune_mod.Candidate("bfloat16", "eager", 1)]
    out = tune_mod.measure_candidates(llama(0), llama(1, layers=1), cands, max_lookahead=2, reps=2, keep=2)
    fast, slow = out["costs"]["float32/eager/1t"], out["costs"]["bfloat16/eager/1t"]
    assert fast["draft_ms_own"] == 41.0 and fast["draft_ms"] == slow["draft_ms"] == pytest.approx(2.05)
    assert tune_mod.choose(out["costs"], True, 0.5)["name"] == "float32/eager/1t"
    unpooled = {n: {**e, "draft_ms": e["draft_ms_own"]} for n, e in out["costs"].items()}
    assert tune_mod.choose(unpooled, True, 0.5)["name"] == "bfloat16/eager/1t"  # what one bad step did before
