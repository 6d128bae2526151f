"""The native CPU pass: every layer of a Llama-family target over 1-64 new tokens in one C++ call (native.cpp).

Why: a one-token bfloat16 pass of SmolLM2-135M through torch ops (oneDNN linears) takes 28.7 ms at 1
thread where llama.cpp's F16 pass over the same weights takes 12.7, and this pass 11.0 (quiet 2-core AMD
EPYC with AVX512-BF16, 300 cached tokens, figures/bench/ops-profile-native.json as committed in 49457d4): oneDNN's products for one
row stream the weights at about half the memory bandwidth, and ~300 small torch ops per pass add their
dispatch cost. No library we can install
has a kernel for "a few bfloat16 rows times a weight matrix at memory speed" with torch's tensors (oneDNN is
the one torch offers; llama.cpp's ggml is the peer we measure against and holds its own copy of the model),
so this module compiles one: weights packed once for AVX512-BF16's dot product (AVX2 + FMA or portable kernels
on other CPUs), a pass whose norms, RoPE, cache writes, attention and SiLU run in place
between the products, and threads from torch's own pool (torch.set_num_threads applies).

It is built on first use with torch.utils.cpp_extension (g++, ninja; -O3 -march=native, so for the CPU it
runs on), once per (source, torch, Python, CPU flags, $SPECREPRO_NATIVE_CFLAGS) under
$SPECREPRO_HOME/native/; the build took 19 s on the 2-core EPYC, and `build_seconds()` reports it. A machine without a compiler gets a one-line reason
from `unavailable_reason` and the lean runner's other backends.

Two targets, never mixed in one model: `weights="bfloat16"` (the default) and `weights="int8"` (below).
Numbers (bfloat16): bfloat16 weights; the activations entering each product rounded to bfloat16 (as a bfloat16 runner
rounds them); float32 accumulation, residual stream, norms, RoPE, attention and SiLU. The same weights as
the bfloat16 lean runner, more precise between the products; logits agree with it within bfloat16
round-off (tests/engines/test_native.py). Batch-invariant: a token's logits are the same bits whatever else
shares its pass and whichever pass wrote its cache entries (native.cpp says how; tests/engines/
test_native_invariance.py), so greedy SpS equals greedy ArS on it. Use it through `LeanRunner(model, dtype=torch.bfloat16,
backend="native")`, which `specrepro.tune` measures beside the other backends.

int8 (`LeanRunner(model, dtype=torch.bfloat16, backend="native", weights="int8")`, llama.cpp's Q8_0): every
linear layer and the LM head quantised once to int8 with one float32 scale per output and block of 32 inputs;
each product's input rows quantised alone the same way as the pass runs; integer dot products per block
(AVX512-VNNI, AVX2 or portable, all three the same bits), float32 across blocks in order. Half the weight
stream of bfloat16 and a higher multiply rate. Its logits differ from the bfloat16 target's (a different
target: SpS on it is lossless with respect to it, not to bfloat16); it is batch-invariant as the bfloat16 pass
is. Nothing chooses it unless asked (tune only with quantized=True). Why a scale per 32 inputs and not per
output row: on SmolLM2-135M's weights the relative error |W - dequantised W| / |W| is 0.55% on average (at
most 0.65%) per 32, 0.85% (at most 1.17%) per row (bfloat16's rounding: 0.13%); the activations, whose few
large channels would set a whole row's scale, are quantised per 32 for the same reason. On that model, after
300 random tokens, int8's next-token distributions are within 0.012 nats (KL) of float32's (the native
bfloat16 pass 0.0005; fbgemm's dynamic int8, ruled out as a target, 0.98). Greedy text differs: from 4 held-out
news prompts, int8 and bfloat16 shared 20 of 64 new tokens before parting on average. Measured on the 2-core
AVX512-BF16 EPYC (2 threads, 300 cached tokens, bfloat16 beside it, load ~2; figures/bench/ops-int8-*.json):
one-token pass 6.0 ms (bfloat16 9.1), v(1, 2, 4, 8) 1.06, 1.14, 1.35, 1.90; the -mno-avx512f (AVX2) build
6.6 ms (bfloat16 9.4), v 0.96, 1.02, 1.34, 2.89: its 9-row pass (19 ms) is bound by the AVX2 integer products
(2 multiplies per 32 multiply-adds: 115 G/s in cache at 2 threads), not overlapped with the weight stream.
"""
from __future__ import annotations

import hashlib
import os
import platform
import sys
import threading
import time
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("native.cpp")
# -ffp-contract=off: a multiply and an add stay two roundings everywhere, so that the same steps give the same
# bits in every copy of an inlined loop (the pass's batch invariance rests on it)
FLAGS = ["-O3", "-march=native", "-ffp-contract=off"]
MAX_ROWS = 64  # rows per native call: the lean runner feeds longer passes (prompts) block by block
LANES = 16  # outputs per packed block (native.cpp: kLanes)

_lock = threading.Lock()
_state: dict = {}  # "module" or "error", and "seconds"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].strip() for ln in lines if ln.split(":")[0].strip() in ("flags", "Features")), "")
    return f"{model}|{flags}"


def extra_flags() -> list[str]:
    """$SPECREPRO_NATIVE_CFLAGS, after -march=native: e.g. "-mno-avx512f" builds the AVX2 kernels that a CPU
    without AVX512 runs (the tests check them that way on an AVX512 machine)."""
    return os.environ.get("SPECREPRO_NATIVE_CFLAGS", "").split()


def build_key() -> str:
    """What the compiled module depends on: the source, torch, Python, the CPU (-march=native) and extra flags."""
    ident = "\n".join([SOURCE.read_text(), torch.__version__, sys.version, platform.machine(), _cpu_flags(),
                        " ".join(FLAGS + extra_flags())])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def load():
    """The compiled extension (built on first call, then loaded from $SPECREPRO_HOME/native/<key>).
    Raises RuntimeError saying why when it cannot be built here."""
    with _lock:
        if "module" in _state:
            return _state["module"]
        if "error" in _state:
            raise RuntimeError(_state["error"])
        try:
            _state["module"] = _build()
        except Exception as e:  # no compiler, no ninja, a failed compile, a CPU without the built-for ISA: one reason, kept
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            # a compiler's message is more use than ninja's command line
            first = next((ln for ln in lines if "error:" in ln), lines[0] if lines else type(e).__name__)
            if first.startswith("this CPU lacks"):  # native.cpp's load-time check of the instruction sets
                _state["error"] = (f"the native CPU pass cannot run on this CPU: {first} "
                                   f"(flags {' '.join(FLAGS + extra_flags())})")
            else:
                _state["error"] = f"the native CPU pass could not be built ({type(e).__name__}: {first})"
            raise RuntimeError(_state["error"]) from e
        return _state["module"]


def loaded():
    """The compiled extension where this process has loaded it already, else None (this never builds it)."""
    return _state.get("module")


def _build():
    from torch.utils import cpp_extension

    from ..models import specrepro_home

    if platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"):
        raise RuntimeError(f"no native build for {platform.machine()}")
    key = build_key()
    start = time.perf_counter()
    module = build_extension(f"specrepro_native_{key}", SOURCE, specrepro_home() / "native" / key,
                             [*FLAGS, "-fopenmp", *extra_flags()], ["-fopenmp"])
    _state["seconds"] = time.perf_counter() - start
    return module


def build_extension(name: str, source: Path, folder: Path, cflags: list[str], ldflags: list[str]):
    """torch.utils.cpp_extension.load of one source into `folder`, safe against builds killed half-way.

    cpp_extension marks a build in progress with a file `lock` that only a finishing build removes: a build
    killed by SIGKILL (a kernel restart, the OOM killer) leaves it, and every later load of that folder waits
    for it forever. Here the builds of a folder take turns on an flock of `folder/build.flock`, which the
    kernel drops when its holder dies; whoever holds it knows no other build runs there, so a `lock` file then
    is a dead build's and is removed. ninja then redoes whatever the dead build left unfinished.
    """
    from torch.utils import cpp_extension

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "build.flock", "a") as turn:
        try:
            import fcntl
        except ImportError:  # no flock (Windows): cpp_extension's own lock alone
            fcntl = None
        if fcntl is not None:
            fcntl.flock(turn.fileno(), fcntl.LOCK_EX)
            (folder / "lock").unlink(missing_ok=True)
        try:
            return cpp_extension.load(name=name, sources=[str(source)], build_directory=str(folder),
                                      extra_cflags=cflags, extra_ldflags=ldflags, verbose=False)
        finally:
            if fcntl is not None:
                fcntl.flock(turn.fileno(), fcntl.LOCK_UN)


def build_seconds() -> float | None:
    """Seconds the first load() of this process took (a compile, or a load of the cached build)."""
    return _state.get("seconds")


def describe() -> dict | None:
    """{"simd", "build_seconds" (this process's first load: a compile or a cached load), "flags", "compiled_for"
    (the instruction sets the compiler was allowed, each checked against the CPU at load)} once the module is
    loaded in this process, else None (tune and the bench put it in their reports)."""
    if "module" not in _state:
        return None
    return {"simd": _state["module"].simd(), "build_seconds": _state.get("seconds"),
            "flags": [*FLAGS, *extra_flags()], "compiled_for": compiled_for()}


def compiled_for() -> list[str]:
    """The instruction sets the module was compiled for (as gcc's __builtin_cpu_supports names them); loading
    it refuses, naming the missing ones, on a CPU without all of them (x86 only: [] elsewhere)."""
    return [f for f in load().compiled_for().split(",") if f]


def simd() -> str:
    """Which kernels were compiled: "avx512_bf16", "avx512" (AVX512F without bfloat16 products), "avx2" (AVX2 +
    FMA) or "portable"."""
    return load().simd()


def unavailable_reason(dtype: torch.dtype, device) -> str | None:
    """None if the native pass runs `dtype` on `device` here, else why not."""
    if torch.device(device).type != "cpu":
        return f"the native pass runs on CPU only, not on {device}"
    if dtype != torch.bfloat16:
        return f"the native pass computes with bfloat16 weights, not {dtype} (float32 runs with eager or onednn)"
    try:
        load()
    except RuntimeError as e:
        return str(e)
    return None


def pack(weights, biases=None):
    """One packed weight (native.cpp's layout) for the projections `weights` of one input, stacked by output.

    weights: [W_i [out_i, in]]; biases: [b_i or None] (None: no biases). Returns native Packed.
    """
    module = load()
    w = torch.cat([t.detach() for t in weights]).to(torch.bfloat16)
    n, k = w.shape
    blocks, kp = -(-n // LANES), -(-k // 2)
    padded = w.new_zeros(blocks * LANES, kp * 2)
    padded[:n, :k] = w
    # [blocks, 16, kp, 2] -> [blocks, kp, 16, 2]: a bfloat16 pair (2k low, 2k + 1 high) per int32
    packed = padded.view(blocks, LANES, kp, 2).permute(0, 2, 1, 3).contiguous().view(torch.int32).view(blocks, kp, LANES)
    bias = None
    if biases is not None and any(b is not None for b in biases):
        bias = torch.cat([b.detach().float() if b is not None else torch.zeros(t.shape[0])
                          for t, b in zip(weights, biases)])
    return module.Packed(packed, bias, n, k)


QBLOCK = 32  # inputs per int8 quantisation block (native.cpp: kQBlock)
WEIGHTS = ("bfloat16", "int8")  # the kinds of packed weights a native model takes (two different targets)


def quantise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantisation per row and block of 32 columns (llama.cpp's Q8_0), as native.cpp quantises
    a product's input rows: d = max |x| / 127, q = round-half-even(x * (1 / d)), q = 0 where d = 0; each step a
    float32 rounding (computed in float64, then rounded: the same bits as float32 arithmetic). x [rows, k] ->
    (q int8 [rows, 32 * ceil(k / 32)] with zero columns after k, d float32 [rows, ceil(k / 32)])."""
    if x.dim() != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"quantise takes a [rows, k] tensor with rows, k >= 1, got shape {tuple(x.shape)}")
    rows, k = x.shape
    nkb = -(-k // QBLOCK)
    xf = torch.zeros(rows, nkb * QBLOCK)
    xf[:, :k] = x.detach().float()
    blocks = xf.view(rows, nkb, QBLOCK)
    d = (blocks.abs().amax(-1).double() / 127).float()
    inv = torch.where(d != 0, (1 / d.double()).float(), torch.zeros(()))
    q = torch.round((blocks.double() * inv.double()[..., None]).float()).clamp(-127, 127).to(torch.int8)
    return q.view(rows, nkb * QBLOCK), d


def pack_int8(weights, biases=None):
    """As `pack`, with the weights quantised to int8 (`quantise`: one float32 scale per output and block of 32
    inputs) from their own values (float32 for load_model's default), for native.cpp's int8 products.
    Returns native Packed (kind "int8")."""
    module = load()
    w = torch.cat([t.detach() for t in weights]).float()
    n, k = w.shape
    q, d = quantise(w)
    blocks, nkb = -(-n // LANES), d.shape[1]
    qp = q.new_zeros(blocks * LANES, nkb * QBLOCK)
    qp[:n] = q
    dp = d.new_zeros(blocks * LANES, nkb)
    dp[:n] = d
    # [blocks, 16, K'/4, 4] -> [blocks, K'/4, 16, 4]: four int8 weights (inputs 4k..4k + 3) per int32
    packed = qp.view(blocks, LANES, nkb * QBLOCK // 4, 4).permute(0, 2, 1, 3).contiguous().view(torch.int32)
    scales = dp.view(blocks, LANES, nkb).permute(0, 2, 1).contiguous()
    bias = None
    if biases is not None and any(b is not None for b in biases):
        bias = torch.cat([b.detach().float() if b is not None else torch.zeros(t.shape[0])
                          for t, b in zip(weights, biases)])
    return module.Packed.int8(packed.view(blocks, nkb * QBLOCK // 4, LANES), scales, bias, n, k)


def int8_reference(x: torch.Tensor, weights, bias=None) -> torch.Tensor:
    """What native.cpp's int8 product computes, in torch (for tests): x [rows, k] and the weights quantised
    (`quantise`), per output and block b in order y = y + float(integer sum) * (d_w * d_x), each a float32
    rounding. Returns float32 [rows, n]."""
    w = torch.cat([t.detach() for t in weights]).float()
    qx, dx = quantise(x)
    qw, dw = quantise(w)
    y = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32)
    for b in range(dx.shape[1]):
        cols = slice(b * QBLOCK, (b + 1) * QBLOCK)
        sums = qx[:, cols].double() @ qw[:, cols].double().T  # exact: integers below 2^53
        s = (dw[:, b].double()[None, :] * dx[:, b].double()[:, None]).float()
        y = (y.double() + (sums * s.double()).float().double()).float()
    if bias is not None:
        y = (y.double() + bias.detach().float().double()).float()
    return y


def linear(x: torch.Tensor, packed) -> torch.Tensor:
    """x [rows, in] @ W^T through the native kernel (float32 out); for tests and profiles."""
    return load().linear(x, packed)


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, mask=None) -> torch.Tensor:
    """The pass's attention alone, for tests: q [n, heads, d] of tokens at cache slots start..start + n, keys and
    values [kv_heads, capacity, d] (float32); mask [n, start + n] bool for a tree, None for causal."""
    return load().attention(q, keys, values, start, mask)


def build_model(runner, weights: str = "bfloat16"):
    """The native model of a LeanRunner's weights (the runner's dtype must be bfloat16). weights: "bfloat16" (the
    model's weights rounded to bfloat16, the bfloat16 target) or "int8" (every linear layer and the LM head
    quantised to int8 per output and block of 32 inputs, `pack_int8`: a different target, whose logits differ
    from the bfloat16 one's; the embedding stays bfloat16)."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    module = load()
    pack_one = pack_int8 if weights == "int8" else pack
    model = runner.model
    base = model.model
    eps = {_eps(n) for layer in base.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)}
    eps.add(_eps(base.norm))
    if len(eps) != 1:
        raise ValueError(f"the native pass takes one RMSNorm epsilon, the model has {sorted(eps)}")
    native = module.Model(runner.embed, runner.norm[0].float(), eps.pop(), runner.n_heads, runner.n_kv_heads,
                          runner.head_dim)
    for layer, (ln1, _, _, ln2, _, _) in zip(base.layers, runner.layers):  # norms as the runner holds them
        a, m = layer.self_attn, layer.mlp
        qkv = [a.q_proj, a.k_proj, a.v_proj]
        native.add_layer(
            ln1[0].float(),
            pack_one([p.weight for p in qkv], [p.bias for p in qkv]),
            pack_one([a.o_proj.weight], [a.o_proj.bias]),
            ln2[0].float(),
            pack_one([m.gate_proj.weight, m.up_proj.weight], [m.gate_proj.bias, m.up_proj.bias]),
            pack_one([m.down_proj.weight], [m.down_proj.bias]),
        )
    head = model.get_output_embeddings()
    native.set_head(pack_one([head.weight], [getattr(head, "bias", None)]))
    return native


def _eps(norm) -> float:
    return getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)
