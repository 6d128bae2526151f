"""llama.cpp as a measured peer: its plain decoding of a GGUF file, timed beside our ArS and SpS.

A CPU user who wants SmolLM2 to write faster would pick llama.cpp, the engine made for the GGUF file this
package ships. The bench times it on the same token ids, interleaved with our configurations, when the
optional `llama-cpp-python` is installed (`pip install 'specrepro[llamacpp]'`, which compiles llama.cpp;
set CMAKE_ARGS="-DGGML_NATIVE=ON" for this CPU's instructions).

What is timed: `Llama.eval` over the prompt, then one `Llama.eval` per new token, the next token chosen
from llama.cpp's float32 logits by our own sampler (greedy argmax, or `specrepro.algorithm.sampling.sample` with the
run's torch.Generator at T = 1): the same selection code as our loops, so the comparison is the engines'.
Peers: "q4_1" (the shipped file itself), and "f16" / "bf16" / "f32", conversions of it made once by
llama.cpp's own quantize tool (`llama_model_quantize`, allow_requantize: the Q4_1 weights dequantized, then
stored in that type) and cached under SPECREPRO_HOME/gguf/. Our target is that same Q4_1 file dequantized
to float32, so every peer decodes the same weights, the f16/bf16 ones rounded as ours are in bfloat16.
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import torch

from ..files import atomic_path

PEERS = ("q4_1", "f16", "bf16", "f32")
# llama.h's llama_ftype values for the conversions (LLAMA_FTYPE_ALL_F32, _MOSTLY_F16, _MOSTLY_BF16)
_FTYPES = {"f32": 0, "f16": 1, "bf16": 32}


def unavailable_reason() -> str | None:
    """None if llama_cpp imports here, else one line saying why the peer cannot run."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:  # not installed, or a build that fails to load its shared library
        return f"llama-cpp-python is not importable ({type(e).__name__}: {e}); pip install 'specrepro[llamacpp]'"
    return None


def check_peers(names) -> list[str]:
    names = [n.strip().lower() for n in names if n.strip()]
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise ValueError(f"unknown llama.cpp peer(s) {', '.join(bad)}: choose from {', '.join(PEERS)}")
    return names


def convert(src: str | os.PathLike, kind: str, out_dir: str | os.PathLike | None = None, threads: int = 0) -> Path:
    """A copy of GGUF `src` with its weights stored as `kind` ("f16", "bf16" or "f32"), made once by llama.cpp's
    quantize (requantizing: dequantize, then store) and cached beside others in out_dir. Returns its path."""
    import llama_cpp

    if kind not in _FTYPES:
        raise ValueError(f"convert: kind must be one of {', '.join(_FTYPES)}, got {kind!r}")
    src = Path(src)
    if not src.is_file():
        raise FileNotFoundError(f"no GGUF file at {src}")
    if out_dir is None:
        from ..models import specrepro_home

        out_dir = specrepro_home() / "gguf"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / f"{src.stem}.{kind.upper()}.gguf"
    if dst.is_file() and dst.stat().st_mtime >= src.stat().st_mtime:
        return dst
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = _FTYPES[kind]
    params.allow_requantize = True
    params.nthread = threads
    with atomic_path(dst) as tmp:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
        if rc != 0:
            raise RuntimeError(f"llama.cpp could not convert {src} to {kind} (llama_model_quantize returned {rc})")
    return dst


def peer_path(kind: str, shipped: str | os.PathLike | None = None, out_dir=None) -> Path:
    """The GGUF file of a peer: the shipped Q4_1 file (or `shipped`), or its cached conversion."""
    if shipped is None:
        from ..models import find_offline_gguf

        shipped = find_offline_gguf()
    return Path(shipped) if kind == "q4_1" else convert(shipped, kind, out_dir)


def tensor_types(path: str | os.PathLike) -> dict[str, int]:
    """{GGML type name: tensor count} of a GGUF file (the `gguf` package's reader): what a peer really holds."""
    from gguf import GGUFReader

    counts: dict[str, int] = {}
    for t in GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


class LlamaCppPeer:
    """llama.cpp's plain decoding of one GGUF file, fed token ids, at a fixed thread count."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None, n_ctx: int = 2048, name: str = ""):
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        import llama_cpp

        self.path, self.name = Path(path), name or Path(path).stem
        self.threads = threads or torch.get_num_threads()
        with _quiet():
            self.llm = llama_cpp.Llama(
                model_path=str(self.path), n_ctx=n_ctx, n_batch=min(n_ctx, 512), n_threads=self.threads,
                n_threads_batch=self.threads, logits_all=False, verbose=False,
            )
        self.n_ctx = n_ctx
        self.vocab_size = self.llm.n_vocab()

    def logits(self) -> torch.Tensor:
        """The last evaluated position's logits, float32 [V] (a view of llama.cpp's buffer: read it before the next eval).

        Read from the context (llama_get_logits_ith(-1)): without logits_all, Llama.eval no longer copies them
        into Llama.scores."""
        import numpy as np

        ptr = self.llm._ctx.get_logits_ith(-1)
        return torch.from_numpy(np.ctypeslib.as_array(ptr, shape=(self.vocab_size,)))

    def generate(self, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> dict:
        """Plain decoding: eval the prompt, then one eval per new token. Returns ids, seconds, decode_seconds and
        first_token_seconds."""
        from ..algorithm.sampling import SamplingConfig, sample

        ids = [int(t) for t in prompt.view(-1).tolist()]
        if not ids:
            raise ValueError("llama.cpp peer: the prompt must hold at least one token")
        if len(ids) + max_new_tokens > self.n_ctx:
            raise ValueError(f"llama.cpp peer: {len(ids)} prompt + {max_new_tokens} new tokens exceed n_ctx {self.n_ctx}")
        config = None if temperature == 0 else SamplingConfig(temperature)
        out = []
        self._prefix = None  # pass_ms's cached prefix is overwritten below
        start = time.perf_counter()
        self.llm.reset()  # n_tokens = 0: the next eval overwrites the cache from position 0
        self.llm.eval(ids)
        decode_start = time.perf_counter()
        for i in range(max_new_tokens):
            logits = self.logits()
            if config is None:
                tok = int(torch.argmax(logits))
            else:
                tok = int(sample(config.probs(logits.view(1, -1)), generator)[0])
            out.append(tok)
            if i == 0:
                first = time.perf_counter()
            if i + 1 < max_new_tokens:
                self.llm.eval([tok])
        end = time.perf_counter()
        return dict(ids=out, tokens=len(out), seconds=end - start, decode_seconds=end - decode_start,
                    first_token_seconds=first - start if out else None)

    def pass_ms(self, prefix: torch.Tensor, n: int, reps: int = 5) -> float:
        """Median ms of one eval over n tokens after `prefix` is cached (llama.cpp's v(K) is pass_ms(K+1)/pass_ms(1))."""
        ids = [int(t) for t in prefix.view(-1).tolist()]
        if getattr(self, "_prefix", None) != ids:  # the prefix's cache is kept between calls: only the block is redone
            self.llm.reset()
            self.llm.eval(ids)
            self._prefix = ids
        times = []
        block = [ids[-1]] * n
        for _ in range(reps + 1):
            self.llm.n_tokens = len(ids)  # eval trims the cache past n_tokens (kv_cache_seq_rm) before decoding
            t = time.perf_counter()
            self.llm.eval(block)
            times.append(time.perf_counter() - t)
        times = sorted(times[1:])
        return 1e3 * times[len(times) // 2]


    def costs(self, prefix: torch.Tensor, ks, reps: int = 5) -> dict:
        """{"target_ms": {n: median ms of one eval over n tokens after prefix}, "v": {K: target_ms[K+1] / target_ms[1]}},
        the sizes interleaved; the shape of specrepro.tuning.costs' table, so the bench reports both alike."""
        sizes = sorted({1} | {k + 1 for k in ks})
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for _ in range(reps):
            for n in sizes:
                times[n].append(self.pass_ms(prefix, n, reps=1))
        target_ms = {n: sorted(t)[len(t) // 2] for n, t in times.items()}
        return {"target_ms": target_ms, "v": {k: target_ms[k + 1] / target_ms[1] for k in ks}, "engine": "llama.cpp",
                "file": self.path.name}


@contextlib.contextmanager
def _quiet():
    """llama.cpp prints its load log to fd 2 even with verbose=False on some builds: silence the fd for the load."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
