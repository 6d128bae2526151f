"""The native CPU pass (specrepro.engines.native): its product kernel against bfloat16 arithmetic, its pass
against a float32 runner over the same bfloat16 weights, itself fed in chunks, trees and generations."""
import shutil
from pathlib import Path
import sys

import pytest
import torch
from transformers import LlamaForCausalLM

import specrepro as sr
from specrepro.algorithm import tree as tree_module
from specrepro.engines.batch import BatchLeanRunner
from specrepro.engines import kernels, native
from specrepro.engines.lean import LeanRunner
from specrepro.engines.static import StaticRunner

from helpers import check_tree_logits, fixed_tree
from helpers import llama, run_chunks

# The build needs g++ (the CI script installs it): without one, the reason is the skip's message; with one,
# a failed build fails these tests.
REASON = native.unavailable_reason(torch.bfloat16, "cpu") if shutil.which("g++") is None else None
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no native build here: {REASON}")


def model(seed=0, vocab=64, layers=2, heads=4, kv_heads=2, hidden=64, window=256, tied=False, bias=False):
    """A tiny Llama whose weights are large enough (initializer_range 0.2) that logits spread over several units."""
    m = llama(seed, vocab, layers, heads, kv_heads, tied, window, hidden, ffn=2 * hidden + 6, initializer_range=0.2,
              attention_bias=bias)
    with torch.no_grad():  # RMSNorm weights start at 1: vary them so that a dropped norm weight is seen
        for name, p in m.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(1 + 0.5 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    return m


def rounded(m):
    """A copy of m with every weight rounded to bfloat16 (kept in float32)."""
    copy = LlamaForCausalLM(m.config).eval()
    copy.load_state_dict({k: v.bfloat16().float() for k, v in m.state_dict().items()})
    return copy


def test_kernel_matches_bfloat16_products_for_any_shape_and_row_count():
    g = torch.Generator().manual_seed(0)
    for n, k in [(37, 11), (64, 48), (200, 96), (16, 2)]:
        w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        packed = native.pack([w[: n // 2], w[n // 2:]], [b[: n // 2], None])
        bias = torch.cat([b[: n // 2], torch.zeros(n - n // 2)])
        for rows in (1, 3, 4, 5, 12, 13, 30, 70):  # tiles of 4/2/1 blocks and 12-row chunks
            x = torch.randn(rows, k, generator=g)
            got = native.linear(x, packed)
            want = x.bfloat16().double() @ w.bfloat16().double().T + bias.double()
            assert got.shape == (rows, n) and got.dtype == torch.float32
            torch.testing.assert_close(got.double(), want, atol=1e-4 * k, rtol=1e-5)
            # each row's sum is the same whatever other rows share the call
            assert torch.equal(got[rows - 1:], native.linear(x[rows - 1:], packed))
        # the inputs are rounded to bfloat16 as a bfloat16 runner rounds them: float32 products differ
        x = torch.randn(3, k, generator=g) * (1 + 1e-3)
        exact = x.double() @ w.bfloat16().double().T + bias.double()
        assert not torch.allclose(native.linear(x, packed).double(), exact, atol=1e-7, rtol=1e-7)


CHUNKS = [(0, 7), (7, 10), (8, 13), (13, 14), (14, 19), (15, 16), (16, 30), (30, 101), (101, 102), (90, 91)]


def feed(runner, ids, chunks=CHUNKS):
    """Logits per chunk (start, end), rolling back where a chunk starts before the cached length."""
    return [logits for _, _, logits, _ in run_chunks(runner, ids, chunks)]


@pytest.mark.parametrize("tied,heads,kv_heads,bias", [(False, 4, 2, False), (True, 4, 4, False), (False, 4, 1, True),
                                                      (False, 8, 2, False)])
def test_native_pass_matches_a_float32_runner_on_the_same_bfloat16_weights(tied, heads, kv_heads, bias):
    """Chunks of 1-16 tokens run natively in one call, the 71-token one in blocks of MAX_ROWS: both
    against float32 on the rounded weights, within the bfloat16 rounding of the products' inputs. Head
    size 16 takes the AVX512 attention that shares each kv head's loads; 8 the per-head loop."""
    m = model(0, tied=tied, heads=heads, kv_heads=kv_heads, bias=bias)
    ids = torch.randint(0, 64, (102,), generator=torch.Generator().manual_seed(1))
    runner = LeanRunner(m, dtype=torch.bfloat16, backend="native", capacity=8, keep_hidden=True)
    assert runner.backend == "native"
    reference = LeanRunner(rounded(m), dtype=torch.float32)
    other = LeanRunner(rounded(model(5, tied=tied, heads=heads, kv_heads=kv_heads, bias=bias)), dtype=torch.float32)
    for (start, end), mine, want, wrong in zip(CHUNKS, feed(runner, ids), feed(reference, ids), feed(other, ids)):
        scale = want.abs().max()
        assert scale > 2  # logits spread enough that the bound below means something
        bound = 0.03
        assert (mine - want).abs().max() < bound * scale
        assert (wrong - want).abs().max() > 0.3 * scale  # another model is far outside that bound
    assert runner.hidden.dtype == torch.bfloat16 and runner.hidden.shape == (1, 64)
    assert runner.capacity >= 102
    info = native.describe()  # what tune's and the bench's reports carry
    assert info["simd"] in ("avx512_bf16", "avx512", "avx2", "portable") and info["build_seconds"] >= 0


def test_native_chunks_equal_one_token_at_a_time_bit_for_bit():
    """Rows of one call are summed exactly as single rows are, and rollbacks leave no trace."""
    m = model(2)
    ids = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(3))
    runner = LeanRunner(m, dtype=torch.bfloat16, backend="native")
    chunks = [(0, 13), (13, 14), (10, 22), (22, 40)]
    single = torch.cat(feed(runner, ids, [(i, i + 1) for i in range(40)]))
    for (start, end), logits in zip(chunks, feed(runner, ids, chunks)):
        assert torch.equal(logits, single[start:end])


def test_native_tree_pass_and_compaction_equal_plain_passes():
    m = model(0, vocab=50)
    context = torch.tensor([0, 3, 2, 2, 7, 9])
    tree = fixed_tree(50)
    runner = LeanRunner(m, dtype=torch.bfloat16, backend="native")
    runner.prefill(context[:-1])
    logits = tree_module.verify(runner, context[-1:], tree)
    check_tree_logits(logits, context, tree, lambda seq: LeanRunner(m, dtype=torch.bfloat16, backend="native").forward(seq)[-1],
                      tol=1e-5)
    runner.compact(tree_module.keep_slots(len(context) - 1, [1, 5, 7]))
    accepted = torch.cat([context, torch.tensor([tree.tokens[i] for i in [1, 5, 7]])])
    reference = LeanRunner(m, dtype=torch.bfloat16, backend="native")
    reference.prefill(accepted)
    nxt = torch.tensor([4])
    torch.testing.assert_close(runner.forward(nxt), reference.forward(nxt), rtol=1e-5, atol=1e-5)


def test_a_tree_mask_of_the_wrong_shape_is_refused():
    runner = LeanRunner(model(0), dtype=torch.bfloat16, backend="native")
    runner.forward(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="tree mask must have shape"):
        runner.forward_tree(torch.tensor([4, 5]), torch.tensor([3, 3]), torch.ones(2, 4, dtype=torch.bool))


def test_greedy_sps_with_a_native_target_equals_greedy_ars():
    """The verify passes (5 tokens), rollbacks and bonus tokens of SpS leave the native target's greedy
    output exactly that of its one-token passes."""
    target = model(0)
    prompt = torch.tensor([0, 5, 9, 12])
    kw = dict(max_new_tokens=40, temperature=0.0)
    draft = model(0)  # the target with a noisy LM head: it agrees often, not always
    with torch.no_grad():
        draft.lm_head.weight.add_(0.2 * torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(9)))
    sps = sr.speculative_generate(LeanRunner(target, dtype=torch.bfloat16, backend="native"), LeanRunner(draft),
                                  prompt, lookahead=4, **kw)
    ars = sr.autoregressive_generate(LeanRunner(target, dtype=torch.bfloat16, backend="native"), prompt, **kw)
    assert 0 < sum(sps.accepted) < sum(sps.proposed)  # both paths of the loop were taken
    assert torch.equal(sps.tokens, ars.tokens)


def test_native_is_refused_where_it_cannot_run():
    m = model(0)
    with pytest.warns(UserWarning, match="bfloat16"):
        runner = LeanRunner(m, dtype=torch.float32, backend="native")
    assert runner.backend == "eager"
    assert "bfloat16" in kernels.unavailable_reason("native", torch.float32, "cpu")
    assert "CPU only" in kernels.unavailable_reason("native", torch.bfloat16, "cuda")
    for cls, kw in [(BatchLeanRunner, dict(batch=2)), (StaticRunner, {})]:
        with pytest.raises(ValueError, match="no native pass"):
            cls(m, dtype=torch.bfloat16, backend="native", **kw)
    with pytest.raises(ValueError, match="whole-pass backend"):
        kernels.Linear([(torch.zeros(4, 4), None)], torch.bfloat16, "native")


def test_a_failed_build_is_one_line_and_kept(monkeypatch):
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setattr(native, "_build", lambda: (_ for _ in ()).throw(OSError("g++: not found\nmore")))
    reason = native.unavailable_reason(torch.bfloat16, "cpu")
    assert reason == "the native CPU pass could not be built (OSError: g++: not found)"
    monkeypatch.setattr(native, "_build", lambda: pytest.fail("a failed build is not retried"))
    assert native.unavailable_reason(torch.bfloat16, "cpu") == reason


@pytest.mark.slow
def test_native_on_the_real_target_is_closer_to_float32_than_the_bfloat16_runner(smollm):
    """Same bfloat16 weights; the native pass keeps float32 between the products, so its logits are nearer
    the float32 runner's than the oneDNN bfloat16 runner's are (300 cached tokens, then 9)."""
    target, _ = smollm
    g = torch.Generator().manual_seed(0)
    prefix, block = torch.randint(0, 49152, (300,), generator=g), torch.randint(0, 49152, (9,), generator=g)
    out = {}
    for name, dtype, backend in [("f32", torch.float32, "eager"), ("native", torch.bfloat16, "native"),
                                 ("bf16", torch.bfloat16, "eager")]:
        runner = LeanRunner(target, dtype=dtype, backend=backend, capacity=320)
        runner.prefill(prefix)
        out[name] = runner.forward(block)
    err_native = (out["native"] - out["f32"]).abs().max()
    err_bf16 = (out["bf16"] - out["f32"]).abs().max()
    assert err_native < err_bf16 and err_native < 0.02 * out["f32"].abs().max()
    assert (out["native"].argmax(-1) == out["f32"].argmax(-1)).float().mean() >= 0.8


NATIVE_HERE = native.unavailable_reason(torch.bfloat16, "cpu") is None


@pytest.mark.parametrize("flags,family,cpu_flag", [("-mno-avx512f", "avx2", "avx2"),
                                                   ("-mno-avx512f -mno-avx2 -mno-fma", "portable", None)])
def test_the_other_kernel_families_pass_the_same_tests(tmp_path, flags, family, cpu_flag):
    """What a CPU without AVX512 (AVX2 + FMA), or without AVX2 too, runs: the module built with those flags (a
    separate build, ~30 s), and this file's and the batch-invariance file's exactness tests run against it in a
    fresh process."""
    import os
    import subprocess

    if os.environ.get("SPECREPRO_NATIVE_CFLAGS"):
        pytest.skip("already a build with other flags")
    if not NATIVE_HERE or native.simd() == family:
        pytest.skip(f"this machine builds the {family} kernels already (the tests above check them)")
    if cpu_flag is not None and cpu_flag not in native._cpu_flags().split():
        pytest.skip(f"this CPU has no {cpu_flag}")
    env = {**os.environ, "SPECREPRO_NATIVE_CFLAGS": flags, "SPECREPRO_HOME": str(tmp_path)}
    probe = subprocess.run([sys.executable, "-c", "from specrepro.engines import native; print(native.simd())"],
                           env=env, capture_output=True, text=True, timeout=600)
    assert probe.returncode == 0 and probe.stdout.strip() == family, probe.stderr[-2000:]
    here = Path(__file__).parent
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                          str(here / "test_native.py"), str(here / "test_native_invariance.py"), "-k",
                          "(kernel or float32_runner or bit_for_bit or tree or greedy or same or equal) and not other_kernel"],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
