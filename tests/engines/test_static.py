"""StaticRunner (engines/static.py) against the eager LeanRunner and HF: the static-shape code that a GPU
captures as CUDA graphs, run here without capture (graphs="none").

Parity: logits and hidden states within float32 round-off over chunks that cross buckets, roll back, outgrow
the cache and exceed the largest bucket; tree passes and compaction against fresh forwards; greedy SpS
(chain and tree) equal to greedy ArS and HF generate token for token; the context-window edge.
Losslessness: the chain and the tree sampler with StaticRunner target and draft against the exact target
joint (test_lossless / test_tree harness), family-wise alpha 0.01 Bonferroni-corrected over the 2 correct
runs; a wrong rejection step and a wrong tree rule on the same runners must be rejected at that level.
"""

import pytest
import torch
from helpers import llama, run_chunks

import specrepro as sr
from helpers import EOS, tiny_llama
from specrepro.algorithm import tree as tree_module
from specrepro.drafts import ModelDraft
from specrepro.engines.lean import LeanRunner
from specrepro.engines.static import BUCKETS, StaticRunner, bucket_for
from specrepro.algorithm.sampling import SamplingConfig
from specrepro.experiments import wrong
from specrepro.stats.exact import chisquare_fit, exact_joint
from specrepro.algorithm.tree import TreeSpec

ALPHA = 0.01 / 2  # the chain and the tree run below; each wrong variant must fall under the same level
# (start, end) of each forward: rollbacks, bucket sizes 1..64 crossed, a block larger than the largest bucket
CHUNKS = [(0, 7), (7, 10), (8, 13), (13, 14), (14, 19), (15, 16), (16, 33), (30, 31), (31, 110), (100, 120)]


def test_bucket_for():
    assert [bucket_for(n, BUCKETS) for n in (1, 2, 3, 5, 9, 33, 64, 65)] == [1, 2, 4, 8, 16, 64, 64, 65]


@pytest.mark.parametrize("tied,kv_heads", [(False, 2), (True, 4), (False, 1)])
def test_logits_and_hidden_match_lean_over_buckets_rollbacks_and_growth(tied, kv_heads):
    model = llama(tied=tied, kv_heads=kv_heads)
    ids = torch.randint(0, 50, (120,), generator=torch.Generator().manual_seed(1))
    lean = LeanRunner(model, keep_hidden=True)
    static = StaticRunner(model, capacity=8, keep_hidden=True)  # grows 8 -> 16 -> 32 -> 64 -> 128 on the way
    assert static.graphs == "none"
    for (start, end, a, ha), (_, _, b, hb) in zip(run_chunks(lean, ids, CHUNKS), run_chunks(static, ids, CHUNKS)):
        assert b.dtype == torch.float32 and b.shape == (end - start, 50)
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(hb, ha, atol=1e-5, rtol=1e-5)
    assert static.capacity == 128  # the context window caps the growth
    full = model(ids.view(1, -1)).logits[0]
    static.reset()
    torch.testing.assert_close(static.forward(ids), full, atol=1e-5, rtol=1e-5)  # one block of 120 > 64


def test_bfloat16_within_dtype_tolerance_of_lean():
    model = llama()
    ids = torch.randint(0, 50, (40,), generator=torch.Generator().manual_seed(2))
    lean, static = LeanRunner(model, dtype=torch.bfloat16), StaticRunner(model, dtype=torch.bfloat16, capacity=64)
    for start, end in [(0, 13), (13, 16), (16, 17), (12, 40)]:
        lean.rollback(start), static.rollback(start)
        a, b = lean.forward(ids[start:end]), static.forward(ids[start:end])
        assert a.shape == b.shape == (end - start, 50)
        torch.testing.assert_close(b, a, atol=3e-2, rtol=3e-2)


def test_padding_never_leaks_into_real_rows():
    """A block padded from 3 to 4 (bucket) and one padded from 5 to 8: the scratch slot the pads write is
    beyond every real row's mask, and a later pass over the same slots gives fresh logits."""
    model = llama()
    ids = torch.randint(0, 50, (20,), generator=torch.Generator().manual_seed(3))
    static = StaticRunner(model, capacity=32)
    static.forward(ids[:3])
    static.k_cache[:, :, :, static.capacity] = 1e4  # poison the scratch slot: a real row reading it would blow up
    static.v_cache[:, :, :, static.capacity] = 1e4
    got = static.forward(ids[3:8])
    want = model(ids[:8].view(1, -1)).logits[0, 3:8]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("on_host", [True, False], ids=["keep-on-host", "keep-on-device"])
def test_tree_pass_and_compaction_equal_fresh_forwards(on_host):
    model = llama()
    context = torch.tensor([0, 3, 2, 2, 7, 9])
    from helpers import check_tree_logits, fixed_tree

    tree = fixed_tree(50)  # 9 rows with the root: bucket 16
    runner = StaticRunner(model, capacity=16)
    runner.prefill(context[:-1])
    logits = tree_module.verify(runner, context[-1:], tree)
    assert runner.length == len(context) + len(tree)
    check_tree_logits(logits, context, tree, lambda seq: model(seq.view(1, -1)).logits[0, -1])
    for path in ([1, 5, 7], [0, 3, 6], [2], []):
        runner = StaticRunner(model, capacity=16)
        runner.prefill(context[:-1])
        tree_module.verify(runner, context[-1:], tree)
        keep = tree_module.keep_slots(len(context) - 1, path)
        if on_host:
            runner.compact(keep)
        else:  # the device path (a CUDA keep), exercised on the CPU through the same method
            runner._compact_on_device(keep)
        accepted = torch.cat([context, torch.tensor([tree.tokens[i] for i in path], dtype=torch.long)])
        assert runner.length == len(accepted)
        reference = LeanRunner(model)
        reference.prefill(accepted)
        n = len(accepted)
        torch.testing.assert_close(runner.k_cache[..., :n, :], reference.k_cache[..., :n, :], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(runner.v_cache[..., :n, :], reference.v_cache[..., :n, :], rtol=1e-5, atol=1e-5)
        nxt = torch.tensor([1, 4])
        torch.testing.assert_close(runner.forward(nxt), reference.forward(nxt), rtol=1e-4, atol=1e-4)


def test_tree_larger_than_every_bucket_gets_its_own():
    model = llama()
    runner = StaticRunner(model, capacity=64, buckets=(1, 2, 4))
    context = torch.tensor([0, 3, 2])
    from helpers import fixed_tree

    tree = fixed_tree(50)  # 9 rows > 4
    runner.prefill(context[:-1])
    logits = tree_module.verify(runner, context[-1:], tree)
    lean = LeanRunner(model)
    lean.prefill(context[:-1])
    torch.testing.assert_close(logits, tree_module.verify(lean, context[-1:], tree), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tree", [None, TreeSpec(2, 3), TreeSpec(3, 4, 10), TreeSpec(4, 6, 40)], ids=str)
def test_greedy_sps_with_static_runners_equals_ars_and_hf(tree):
    target, draft = tiny_llama(0, layers=3, eos_token_id=None, window=128), tiny_llama(1, eos_token_id=None)
    prompt, n = torch.tensor([0, 3, 2, 4, 4, 1, 0, 3]), 40
    hf = target.generate(prompt.view(1, -1), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(prompt):]
    t = StaticRunner(target, capacity=16)  # grows during the generation
    d = ModelDraft(StaticRunner(draft, capacity=64))
    assert torch.equal(sr.autoregressive_generate(t, prompt, max_new_tokens=n, temperature=0).tokens, hf)
    for k in (1, 3, 7):
        gen = sr.speculative_generate(t, d, prompt, max_new_tokens=n, lookahead=k, temperature=0, tree=tree)
        assert torch.equal(gen.tokens, hf), (k, tree)
        assert gen.target_calls < n  # the draft was used, not just the bonus tokens


def test_context_window_edge():
    model = tiny_llama(0, layers=2, eos_token_id=None, window=24)
    prompt = torch.tensor([0, 3, 2, 4])
    runner = StaticRunner(model, capacity=8)
    want = sr.autoregressive_generate(LeanRunner(model), prompt, max_new_tokens=20, temperature=0).tokens
    gen = sr.speculative_generate(runner, tiny_llama(1, eos_token_id=None), prompt, max_new_tokens=20, lookahead=4,
                                  temperature=0)
    assert torch.equal(gen.tokens, want) and runner.capacity == 24
    runner.reset()
    with pytest.raises(ValueError, match="context window of 24"):
        runner.forward(torch.zeros(25, dtype=torch.long))
    with pytest.raises(ValueError, match="context window"):
        sr.autoregressive_generate(runner, prompt, max_new_tokens=21)


def test_bad_settings_are_clear_errors():
    model = llama()
    with pytest.raises(ValueError, match="graphs must be one of"):
        StaticRunner(model, graphs="fast")
    with pytest.raises(ValueError, match="needs a CUDA model"):
        StaticRunner(model, graphs="cuda")
    with pytest.raises(ValueError, match="buckets must be positive"):
        StaticRunner(model, buckets=(0, 4))
    with pytest.raises(ValueError, match="capacity must be a positive"):
        StaticRunner(model, capacity=0)
    runner = StaticRunner(model)
    runner.forward(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="tree mask must have shape"):
        runner.forward_tree(torch.tensor([1]), torch.tensor([2]), torch.ones(1, 2, dtype=torch.bool))


# --- losslessness with static runners -------------------------------------------------------------------------

def test_chain_sampled_joint_with_static_runners(tiny_pair):
    from helpers import L, PROMPT, draw_chain as draw

    target, draft = tiny_pair
    t, d = StaticRunner(target), ModelDraft(StaticRunner(draft))
    sampling = SamplingConfig(1.0)
    expected = exact_joint(target, PROMPT, L, sampling, EOS)
    outcomes, bonus = draw(t, d, 3, sampling, EOS, seed=700)
    right = chisquare_fit(outcomes, expected)
    print(right)
    assert right.pvalue > ALPHA and right.cells >= 5 and bonus > 0, right
    bad = chisquare_fit(draw(t, d, 3, sampling, EOS, seed=701, rules=wrong.chain_rules(wrong.resample_from_q))[0],
                        expected)
    print(bad)
    assert bad.pvalue < ALPHA, bad


def test_tree_sampled_joint_with_static_runners(tiny_pair):
    from helpers import fit_tree as fit

    target, _ = tiny_pair
    draft = tiny_llama(3)  # test_tree's power draft
    t, d = StaticRunner(target), ModelDraft(StaticRunner(draft))
    args = (TreeSpec(3, 2), SamplingConfig(1.0), EOS)
    right, _, stats = fit(t, d, *args, seed=702, model=target)
    print(right)
    assert right.pvalue > ALPHA and stats["accepted_any"] > 0 and stats["rejected_all"] > 0, right
    bad, _, _ = fit(t, d, *args, seed=703, model=target, rules=wrong.tree_rules(wrong.tree_siblings_not_removed))
    print(bad)
    assert bad.pvalue < ALPHA, bad


def test_tune_measures_a_static_candidate_after_its_warmup():
    """sr.tune's plumbing for graph candidates (on a GPU: graphs cuda / compile), run here with graphs none:
    the runner is built, warmed over every measured size, timed, and its capture time reported."""
    from specrepro.tuning import tune as tuning

    model = llama()
    cand = tuning.Candidate("float32", "eager", 1, graphs="none")
    assert cand.name == "float32/eager/1t/graphs-none"
    runner = tuning.build_runner(model, cand)
    assert isinstance(runner, StaticRunner) and runner.graphs == "none"
    measured = tuning.measure_candidates(model, None, [cand, tuning.Candidate("float32", "eager", 1)], 4, reps=1)
    assert measured["costs"][cand.name]["capture_seconds"] == 0.0
    assert set(measured["costs"][cand.name]["target_ms"]) == {1, 2, 3, 4, 5}
    assert tuning.candidate_settings(model, ["float32"], ["eager"], [1, 2], False) == [
        tuning.Candidate("float32", "eager", 1), tuning.Candidate("float32", "eager", 2)]  # no graphs on a CPU


def test_model_drafts_keep_the_hf_runner_off_cuda():
    from specrepro.drafts.base import default_runner
    from specrepro.engines.runners import HFRunner

    assert isinstance(default_runner(llama()), HFRunner)  # on CUDA: a StaticRunner (tests/engines/test_devices.py)


# --- compile mode stays compiled: no recompile, no fallback --------------------------------------------------

def test_compile_mode_compiles_each_bucket_once_and_never_falls_back():
    """graphs='compile' on the CPU (torch.compile with aot_eager, uncaptured): two runners of different shapes
    (a target and a draft) over several buckets share one compiled function. Each (shape, bucket) compiles
    exactly once; after the warm-up, with Dynamo's stance set to fail on any recompile, passes in every bucket,
    rollbacks and greedy SpS run without one, give the uncaptured runner's logits, and nothing falls back."""
    import warnings

    from torch._dynamo.backends.common import aot_autograd  # noqa: F401 - the backend registry is loaded
    from torch._dynamo.backends.registry import lookup_backend

    from specrepro.engines.static import GraphFallbackWarning, compiled_block

    graphs_made = []

    def counting(gm, example_inputs):
        graphs_made.append(tuple(tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor))[:1])
        return lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    target, draft = tiny_llama(0, layers=3, eos_token_id=None, window=128), tiny_llama(1, eos_token_id=None)
    buckets = (1, 2, 4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphFallbackWarning)
        t = StaticRunner(target, capacity=64, buckets=buckets, graphs="compile", compile_backend=counting)
        d = StaticRunner(draft, capacity=64, buckets=buckets, graphs="compile", compile_backend=counting)
        assert t.warmup() > 0 and d.warmup() > 0
        assert t.captures == d.captures == len(buckets) and len(graphs_made) == 2 * len(buckets)
        plain_t = StaticRunner(target, capacity=64, buckets=buckets)
        ids = torch.randint(0, 5, (40,), generator=torch.Generator().manual_seed(5))
        prompt, n = torch.tensor([0, 3, 2, 4, 4, 1, 0, 3]), 24
        want = sr.autoregressive_generate(plain_t, prompt, max_new_tokens=n, temperature=0).tokens
        plain_t.reset()
        with torch.compiler.set_stance("fail_on_recompile"):
            for runner in (t, d, t):
                runner.reset()
                plain_t.reset()
                for start, end in [(0, 7), (7, 10), (8, 13), (13, 14), (14, 16), (15, 16), (16, 40)]:
                    runner.rollback(start)
                    got = runner.forward(ids[start:end])
                    if runner is t:
                        plain_t.rollback(start)
                        torch.testing.assert_close(got, plain_t.forward(ids[start:end]), atol=1e-5, rtol=1e-5)
            t.reset()
            assert torch.equal(sr.autoregressive_generate(t, prompt, max_new_tokens=n, temperature=0).tokens, want)
            for k in (1, 3, 7):
                gen = sr.speculative_generate(t, ModelDraft(d), prompt, max_new_tokens=n, lookahead=k, temperature=0)
                assert torch.equal(gen.tokens, want), k
    assert len(graphs_made) == 2 * len(buckets), "a bucket compiled twice"
    assert t.graphs == d.graphs == "compile" and t.captures == d.captures == len(buckets)
    assert compiled_block(counting) is compiled_block(counting)  # one compiled function for every runner


def test_compile_mode_recompile_is_caught(monkeypatch):
    """The test above has power: a pass that needs a new shape after the warm-up (here the cache outgrows
    its capacity, so the mask is wider) recompiles, and the fail_on_recompile stance makes that an error,
    which SPECREPRO_STRICT_GRAPHS=1 (the GPU check's setting) passes on instead of falling back."""
    monkeypatch.setenv("SPECREPRO_STRICT_GRAPHS", "1")
    torch._dynamo.reset()
    runner = StaticRunner(llama(), capacity=8, buckets=(1, 2), graphs="compile", compile_backend="aot_eager")
    runner.warmup()
    with torch.compiler.set_stance("fail_on_recompile"):
        runner.forward(torch.tensor([1, 2]))
        runner.forward(torch.tensor([3]))
        with pytest.raises(Exception, match="(?i)recompil"):
            runner.forward(torch.arange(8))


def test_a_failed_capture_is_an_error_when_strict(monkeypatch):
    from specrepro.engines.static import GraphFallbackWarning

    runner = StaticRunner(llama(), capacity=32, buckets=(1, 2), graphs="compile", compile_backend="aot_eager")

    def broken(b):
        raise RuntimeError("no capture here")

    monkeypatch.setattr(runner, "_capture", broken)
    monkeypatch.setenv("SPECREPRO_STRICT_GRAPHS", "1")
    with pytest.raises(RuntimeError, match="capturing the 'compile' graph of bucket 1 failed"):
        runner.forward(torch.tensor([1]))
    monkeypatch.delenv("SPECREPRO_STRICT_GRAPHS")
    with pytest.warns(GraphFallbackWarning, match="now runs uncaptured"):
        runner.forward(torch.tensor([1]))
    assert runner.graphs == "none"


def test_tune_offers_compiled_graphs_only_when_asked(monkeypatch):
    from specrepro.tuning import tune as tuning

    monkeypatch.setattr(tuning, "_device", lambda target: torch.device("cuda"))  # the CUDA branch, on a CPU
    plain = tuning.candidate_settings(llama(), ["bfloat16"], ["eager"], [1, 2], False)
    asked = tuning.candidate_settings(llama(), ["bfloat16"], ["eager"], [1, 2], True)
    assert [c.graphs for c in plain] == ["", "cuda"]
    assert sorted(c.graphs for c in asked if c.graphs) == ["compile", "cuda"]
