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
    separate build, ~30 s), and this file's, the batch-invariance file's, the int8 file's and the one-call draw's
    exactness tests run against it in a fresh process (int8: the AVX2 or portable integer products)."""
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
    # every kernel input buffer ending against an unreadable page: a read past its end (as the portable family's
    # vectorized tile once made, faulting only where the buffer ended the heap) is a SIGSEGV every time
    env["SPECREPRO_NATIVE_GUARD_PAGE"] = "1"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                          str(here / "test_native.py"), str(here / "test_native_invariance.py"),
                          str(here / "test_native_int8.py"), str(here / "test_native_sampling.py"), "-k",
                          "(kernel or float32_runner or bit_for_bit or tree or greedy or same or equal) and not other_kernel"],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.returncode, run.stdout[-3000:])
    assert " passed" in run.stdout and " failed" not in run.stdout


def run_python(code, timeout=600, **env):
    import os
    import subprocess

    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout)


def test_a_module_compiled_for_features_the_cpu_lacks_is_refused_at_load_with_their_names():
    """The module checks, as it loads and before any code that uses them runs, every instruction set it was
    compiled for against the CPU ($SPECREPRO_NATIVE_ASSUME_CPU stands in for a CPU without some of them): a
    refusal naming them, then the lean runner's other backends, never a SIGILL."""
    features = native.compiled_for()
    if not features:
        pytest.skip("no load-time instruction-set check on this architecture")
    probe = ("import torch, warnings\nfrom specrepro.engines import native\nfrom specrepro.stats.toy import tiny_llama\n"
             "from specrepro.engines.lean import LeanRunner\n"
             "print(native.unavailable_reason(torch.bfloat16, 'cpu'))\n"
             "with warnings.catch_warnings(record=True) as w:\n"
             "    warnings.simplefilter('always')\n"
             "    r = LeanRunner(tiny_llama(0, vocab=16), dtype=torch.bfloat16, backend='native')\n"
             "print(r.backend, r.forward(torch.tensor([1, 2])).shape[0], len(w))\n")
    for lacking in {features[0], features[-1]}:
        run = run_python(probe, SPECREPRO_NATIVE_ASSUME_CPU=",".join(f for f in features if f != lacking))
        assert run.returncode == 0, run.stderr[-2000:]
        reason, fallback = run.stdout.strip().splitlines()
        assert reason == (f"the native CPU pass cannot run on this CPU: this CPU lacks {lacking}, which the native "
                          f"module was compiled for (flags {' '.join(native.FLAGS + native.extra_flags())})")
        assert fallback == "eager 2 1"
    run = run_python(probe, SPECREPRO_NATIVE_ASSUME_CPU=" ".join(features))
    assert run.returncode == 0 and run.stdout.split() == ["None", "native", "2", "0"], run.stderr[-2000:]


TINY_MODULE = """#include <Python.h>
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "specrepro_lock_probe", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_specrepro_lock_probe(void) {
  PyObject* m = PyModule_Create(&def);
  PyModule_AddIntConstant(m, "answer", 42);
  return m;
}
"""


def _build_probe(source, folder, conn, new_group):
    import os

    if new_group:  # its own process group, so that killing the group spares pytest
        os.setsid()
    conn.send("go")
    conn.send(native.build_extension("specrepro_lock_probe", source, folder, [], []).answer)


@pytest.mark.parametrize("group", [False, True])
def test_a_build_killed_half_way_never_makes_the_next_load_wait(tmp_path, group):
    """A build killed by SIGKILL at several moments (before the compiler starts, while it compiles, while it links;
    the process alone, its ninja and compiler orphaned and running on, or its whole process group) leaves the
    folder in a state the next load builds from, in bounded time. A module of a few lines stands in for
    native.cpp (the locking is the same function), built in forked processes, so that each try takes a second
    or two."""
    import multiprocessing
    import os
    import signal
    import time

    source = tmp_path / "probe.cpp"
    source.write_text(TINY_MODULE)
    folder = tmp_path / "build"
    fork = multiprocessing.get_context("fork")
    # how long one whole build takes here (a quiet machine builds in a fraction of a second, a busy one in
    # seconds): the kills below land at fixed moments and at fractions of it, so that several fall inside builds
    mine, theirs = fork.Pipe()
    proc = fork.Process(target=_build_probe, args=(source, tmp_path / "timing", theirs, False))
    proc.start()
    assert mine.poll(60) and mine.recv() == "go"
    start = time.perf_counter()
    assert mine.poll(60) and mine.recv() == 42
    whole = time.perf_counter() - start
    proc.join(10)
    killed_with_lock = 0
    for delay in sorted({0.0, 0.1, 0.3, 0.6, 1.0, 1.5} | {round(f * whole, 3) for f in (0.2, 0.4, 0.6, 0.8)}):
        for f in folder.glob("*.so"):  # a module that finished gets built again
            f.unlink()
        (folder / ".ninja_log").unlink(missing_ok=True)
        mine, theirs = fork.Pipe()
        proc = fork.Process(target=_build_probe, args=(source, folder, theirs, group))
        proc.start()
        assert mine.poll(60) and mine.recv() == "go"
        time.sleep(delay)
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        killed_with_lock += (folder / "lock").exists()
        start = time.perf_counter()
        mine, theirs = fork.Pipe()
        proc = fork.Process(target=_build_probe, args=(source, folder, theirs, False))
        proc.start()
        assert mine.poll(60) and mine.recv() == "go"
        assert mine.poll(60), f"the load after a kill at {delay} s did not finish in 60 s"
        assert mine.recv() == 42
        proc.join(10)
        assert proc.exitcode == 0 and time.perf_counter() - start < 60 and not (folder / "lock").exists()
    assert killed_with_lock >= 2  # the kills did land inside builds, where cpp_extension's lock file was left


def hand_model(hidden=8, heads=2, kv_heads=1, d=4, inter=12, layers=1, seed=0):
    """A native Model put together by hand (no LeanRunner in between), for the checks at its entry."""
    g = torch.Generator().manual_seed(seed)
    m = native.load().Model(torch.randn(16, hidden, generator=g), torch.ones(hidden), 1e-6, heads, kv_heads, d)
    for _ in range(layers):
        m.add_layer(torch.ones(hidden), native.pack([torch.randn((heads + 2 * kv_heads) * d, hidden, generator=g)]),
                    native.pack([torch.randn(hidden, heads * d, generator=g)]), torch.ones(hidden),
                    native.pack([torch.randn(2 * inter, hidden, generator=g)]),
                    native.pack([torch.randn(hidden, inter, generator=g)]))
    m.set_head(native.pack([torch.randn(16, hidden, generator=g)]))
    return m


def hand_forward(m, n=2, start=0, layers=1, kv_heads=1, d=4, capacity=8, v_shape=None, logits=True):
    cache = torch.zeros(layers, 1, kv_heads, capacity, d)
    values = torch.zeros(v_shape) if v_shape is not None else torch.zeros_like(cache)
    return m.forward(torch.arange(n), start, torch.ones(n, 4), torch.zeros(n, 4), None, cache, values, logits)


def test_the_native_model_checks_every_shape_it_reads():
    """Each shape the pass reads is checked where it enters, with an error naming it (before these checks, a kv head
    count of 0 divided by zero, a model without layers read past its list, a wrong cache shape read or wrote
    outside it)."""
    module = native.load()
    hidden, logits, taps = hand_forward(hand_model())  # the valid model runs (no taps asked: none returned)
    assert taps.shape == (2, 0, 8)
    assert hidden.shape == (2, 8) and logits.shape == (2, 16) and torch.isfinite(logits).all()
    embed, norm = torch.randn(16, 8), torch.ones(8)
    errors = [
        (lambda: module.Model(embed, norm, 1e-6, 2, 0, 4), "at least one query head and one kv head"),
        (lambda: module.Model(embed, norm, 1e-6, 0, 1, 4), "at least one query head and one kv head"),
        (lambda: module.Model(embed, norm, 1e-6, 3, 2, 4), "3 query heads do not group over 2 kv heads"),
        (lambda: module.Model(embed, norm, 1e-6, 2, 1, 5), "head size must be even"),
        (lambda: module.Model(embed[0], norm, 1e-6, 2, 1, 4), r"embedding must be \[vocab, hidden\]"),
        (lambda: module.Model(embed, torch.ones(7), 1e-6, 2, 1, 4), "final norm has 7 weights for hidden size 8"),
        (lambda: hand_forward(module.Model(embed, norm, 1e-6, 2, 1, 4), layers=0), "the model has no layers"),
        (lambda: hand_forward(hand_model(), start=-1), "start must be >= 0"),
        (lambda: hand_forward(hand_model(), kv_heads=2), "cache holds 2 kv heads of size 4, the model 1 of size 4"),
        (lambda: hand_forward(hand_model(), d=8), "cache holds 1 kv heads of size 8, the model 1 of size 4"),
        (lambda: hand_forward(hand_model(), v_shape=(1, 1, 1, 6, 4)), "caches must be .* and alike"),
        (lambda: hand_forward(hand_model(), layers=2), "cache has 2 layers, the model 1"),
        (lambda: hand_forward(hand_model(), capacity=1), "exceed the cache capacity 1"),
        (lambda: hand_model().forward(torch.zeros(1, 2, dtype=torch.long), 0, torch.ones(2, 4), torch.zeros(2, 4), None,
                                      torch.zeros(1, 1, 1, 8, 4), torch.zeros(1, 1, 1, 8, 4), True), "ids must be"),
        (lambda: module.Packed(torch.zeros(1, 5, 16, dtype=torch.int32), None, 16, 8),
         r"a 16 x 8 matrix packs to \[1, 4, 16\]"),
        (lambda: module.Packed(torch.zeros(2, 4, 16, dtype=torch.int32), None, 16, 8),
         r"a 16 x 8 matrix packs to \[1, 4, 16\]"),
        (lambda: module.attention(torch.zeros(1, 2, 4), torch.zeros(0, 4, 4), torch.zeros(0, 4, 4), 0, None),
         "at least one token, head, kv head"),
    ]
    m = module.Model(embed, norm, 1e-6, 2, 1, 4)
    qkv, o = native.pack([torch.randn(16, 8)]), native.pack([torch.randn(8, 8)])
    gu, down = native.pack([torch.randn(24, 8)]), native.pack([torch.randn(8, 12)])
    errors += [
        (lambda: m.add_layer(torch.ones(7), qkv, o, norm, gu, down), "layer 0's norms have 7 and 8 weights"),
        (lambda: m.add_layer(norm, qkv, o, torch.ones(9), gu, down), "layer 0's norms have 8 and 9 weights"),
        (lambda: m.add_layer(norm, o, o, norm, gu, down), "q/k/v projection is 8 x 8, expected 16 x 8"),
        (lambda: m.add_layer(norm, qkv, qkv, norm, gu, down), "o projection is 16 x 8, expected 8 x 8"),
        (lambda: m.add_layer(norm, qkv, o, norm, gu, o), "down projection is 8 x 8"),
    ]
    for call, match in errors:
        with pytest.raises(RuntimeError, match=match):
            call()
    m.add_layer(norm, qkv, o, norm, gu, down)
    with pytest.raises(RuntimeError, match="layer 1's MLP is 8 wide, layer 0's 12"):
        m.add_layer(norm, qkv, o, norm, native.pack([torch.randn(16, 8)]), native.pack([torch.randn(8, 8)]))
    with pytest.raises(RuntimeError, match="no LM head was set"):
        hand_forward(m)
    assert hand_forward(m, logits=False)[1] is None


def test_denormals_are_flushed_on_every_worker_thread_and_the_mode_restored_after():
    """Values of 1e-39 (denormal floats) read as zero on every thread of a call (each of 2 threads runs half of the
    attention's 8 kv-head tasks and half of a product's outputs), whatever the kernel family; every thread's mode
    is the same after the call as before, so torch's own arithmetic, serial or on its worker threads, still keeps
    denormals. (torch's worker threads are started first, outside any call: a thread started inside one would
    inherit the flushed mode from its creator.)"""
    big = torch.full((1 << 20,), 1e-39)

    def torch_keeps_denormals():  # on this thread, and over 2 threads for a million-element product
        return (torch.tensor(1e-39) * 1.0).item() != 0 and bool(((big * 1.0) != 0).all())

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch_keeps_denormals()  # before any call; torch's pool of 2 threads now exists
        for t in (1, 2):
            torch.set_num_threads(t)
            q = torch.ones(3, 8, 16)
            vals = torch.full((8, 5, 16), 1e-39)
            out = native.attention(q, torch.ones(8, 5, 16), vals, 2, None)
            assert out.shape == (3, 8, 16) and torch.equal(out, torch.zeros_like(out)), t
            # a product whose every input pair is (1, 1e-39): zeros in every output block
            w = torch.full((64 * 16, 32), 1e-39)
            got = native.linear(torch.ones(2, 32), native.pack([w]))
            assert torch.equal(got, torch.zeros_like(got)), t
            torch.set_num_threads(2)
            assert torch_keeps_denormals(), t  # every thread's mode came back
        # the same check fails where nothing is flushed: torch's own attention-like sum of the same values
        assert (torch.softmax(torch.zeros(5), 0) @ vals[0]).abs().max() > 0
    finally:
        torch.set_num_threads(threads)


def test_the_kernel_exp_is_exp_within_a_few_ulp_and_zero_below_minus_86():
    """The one vexp of every kernel family (the softmax's and SiLU's): within 4 ulp of float64 exp over the range
    that matters, 0 below -86 and for NaN, finite above (clamped at 88.3), lanes independent of their neighbours."""
    x = torch.cat([torch.linspace(-86, 88, 20011), torch.tensor([-86.0, 0.0, 1e-30, -1e-30, 88.3])])
    got, want = native.load().exp(x).double(), x.double().exp()
    ulp = (want.float().nextafter(torch.tensor(float("inf"))) - want.float()).double()
    assert ((got - want).abs() / ulp).max() <= 4
    edge = torch.tensor([-86.01, -87.5, -100.0, -1e30, float("-inf"), float("nan"), 89.0, 1e30, float("inf")])
    out = native.load().exp(edge)
    assert torch.equal(out[:6], torch.zeros(6))
    assert torch.isfinite(out[6:]).all() and torch.equal(out[6:], out[6:7].expand(3))
    # a value's result does not depend on the other lanes it was computed with (tails included)
    for n in (1, 5, 8, 17):
        assert torch.equal(native.load().exp(x[:n]), native.load().exp(x)[:n])
