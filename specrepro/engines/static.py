"""A static-shape runner (gpt-fast style): every pass has one of a few fixed shapes, so on CUDA each shape
is captured once as a graph and replayed, without Python or kernel-launch cost per layer.

Why: at batch 1 a GPU pass of a small model is launch-bound. On an H200 (bfloat16, torch 2.11) an eager
one-token pass of the 30-layer SmolLM2-135M cost 11.3 ms while streaming its weights takes 0.06 ms; HF's
compiled static-cache decode step ran at 2.8-3.1 ms/token (measured 2026-12-04). A captured graph replays the
whole pass as one launch.

What makes every shape static:
- the KV cache [layers, 1, kv_heads, capacity + 1, head_dim] is preallocated and written by slot with
  `index_copy_` (slot = position for a chain; the next free slots for a token tree), so a rollback is
  `self.length = n` and later writes overwrite rejected slots; the extra last slot is scratch for padding;
- a block of n new tokens is padded to the smallest bucket >= n (1, 2, 4, 8, 16, 32, 64 by default; a
  tree larger than the largest bucket gets a bucket of its own size, captured on first use). Padded rows
  read token 0 at position 0 and write to the scratch slot, which no real row ever sees;
- attention runs over all capacity + 1 slots under a bool mask [bucket, capacity + 1] that is a graph
  input: causal up to each real token's slot for a chain, the tree's own mask (specrepro.algorithm.tree) for a tree;
- RoPE tables cover the capacity and are indexed in the graph by a positions input.
The cache grows (a copy, and the graphs are captured again) only when a sequence outgrows `capacity`:
give the capacity you need (prompt + new tokens + the largest block) to pay capture once per process.

graphs: "cuda" (torch.cuda.CUDAGraph, captured per bucket on first use), "compile" (the pass compiled by
torch.compile, default mode, fullgraph, static shapes, then captured the same way by torch.cuda.CUDAGraph),
or "none" (the same static-shape code run eagerly: what runs on a CPU, and what the tests compare with the
eager LeanRunner). "auto" is "cuda" on a CUDA device and "none" elsewhere; `specrepro.tune` measures the
choices on a GPU when asked to compile.

Why plain CUDAGraph capture for "compile" too, not mode="reduce-overhead": CUDA-graph trees copy every input
that is not marked static into their own buffers on each replay, and the weights, the cache, the RoPE tables
and the slot index are all inputs here (3.4 GB per pass at the 1.7B shape). A graph captured over the
runner's own buffers reads them where they are; only the four step inputs (ids, positions, slots, mask) are
written before a replay, and they are static buffers too. Every runner calls one compiled function
(`compiled_block`) with its tensors as arguments, so runners of the same shape share its Dynamo entries; the
recompile limit is raised to cover every bucket of several shapes (`size_recompile_limit`). On a CPU,
graphs="compile" with `compile_backend="aot_eager"` (or "inductor") runs the compiled pass uncaptured:
the tests use it to show that no bucket recompiles once compiled.
A capture that fails is an error where SPECREPRO_STRICT_GRAPHS=1 (the GPU check), otherwise a
GraphFallbackWarning and the runner goes on uncaptured, with the reason in `runner.fallback` (sr.tune
reports such a candidate as skipped rather than timing it as captured).

Host synchronisations: none inside forward/forward_tree/rollback; `compact` with a CPU `keep` finds the
first moved slot on the host (no device sync), with a device `keep` it moves every kept slot on the device.
"""
from __future__ import annotations

import os
import time
import warnings

import torch
import torch.nn.functional as F

from .lean import LeanRunner, attend, heads_qkv, mlp, rms_norm

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
GRAPH_MODES = ("auto", "cuda", "compile", "none")
SHAPES_PER_PROCESS = 4  # model shapes (target, draft, ...) x capacities the recompile limit leaves room for


class GraphFallbackWarning(RuntimeWarning):
    """A graph capture failed and the runner went on uncaptured (an error under SPECREPRO_STRICT_GRAPHS=1)."""


_COMPILED: dict = {}


def compiled_block(backend="inductor"):
    """static_block compiled once per backend (fullgraph, static shapes), shared by every runner."""
    if backend not in _COMPILED:
        _COMPILED[backend] = torch.compile(static_block, backend=backend, fullgraph=True, dynamic=False)
    return _COMPILED[backend]


def size_recompile_limit(buckets: tuple[int, ...]) -> int:
    """Raise Dynamo's per-function recompile limit to one entry per bucket (and tree size) for
    SHAPES_PER_PROCESS shapes; returns the limit now set."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    needed = SHAPES_PER_PROCESS * (len(buckets) + 4)
    setattr(config, name, max(getattr(config, name), needed))
    if hasattr(config, "accumulated_recompile_limit"):
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * needed)
    return getattr(config, name)


def bucket_for(n: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket >= n, or n itself when it is larger than every bucket."""
    for b in buckets:
        if b >= n:
            return b
    return n


class StaticRunner(LeanRunner):
    """LeanRunner's interface (forward, forward_tree, prefill, rollback, compact, reset, hidden, device, dtype)
    with static shapes; see the module docstring. Logits come back float32 [n, V], as from every runner.

    capacity: cache positions (default min(context window, 2048)); buckets: padded block sizes;
    graphs: "auto" | "cuda" | "compile" | "none"; backend: linear layers as in LeanRunner ("eager" on CUDA);
    compile_backend: torch.compile's backend for graphs="compile" ("inductor"; "aot_eager" on a CPU to test).
    `capture_seconds` accumulates the time spent capturing (or compiling) graphs; `captures` counts them.
    """

    supports_native = False  # it replaces the pass itself

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype | None = torch.float32, capacity: int | None = None,
                 keep_hidden: bool = False, buckets: tuple[int, ...] = BUCKETS, graphs: str = "auto",
                 backend: str = "eager", compile_backend="inductor"):
        if graphs not in GRAPH_MODES:
            raise ValueError(f"graphs must be one of {', '.join(GRAPH_MODES)}, got {graphs!r}")
        buckets = tuple(sorted(set(buckets)))
        if not buckets or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in buckets):
            raise ValueError(f"buckets must be positive integers, got {buckets!r}")
        self.buckets = buckets
        self.compile_backend = compile_backend
        self._graphs: dict[int, object] = {}
        self.capture_seconds = 0.0
        self.captures = 0
        self.fallback: str | None = None  # why the runner went on uncaptured, if a capture failed
        window = getattr(model.config, "max_position_embeddings", None)
        if capacity is None:
            capacity = min(window or 2048, 2048)
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        super().__init__(model, dtype=dtype, capacity=capacity, keep_hidden=keep_hidden, backend=backend)
        if graphs == "auto":
            graphs = "cuda" if self.device.type == "cuda" else "none"
        if graphs == "cuda" and self.device.type != "cuda":
            raise ValueError(f"graphs={graphs!r} captures CUDA graphs and needs a CUDA model, not {self.device}; "
                             "use graphs='none' (the same static shapes, run eagerly)")
        if graphs == "compile":
            if backend != "eager":
                raise ValueError(f"graphs='compile' needs backend='eager', got {backend!r}")
            size_recompile_limit(buckets)
        self.graphs = graphs

    # ------------------------------------------------------------------ cache

    @torch.no_grad()
    @torch.inference_mode(False)
    def _grow(self, needed: int) -> None:
        """(Re)allocate cache and RoPE tables for at least `needed` positions (+1 scratch slot); graphs that
        point at the old buffers are dropped and captured again on next use. Built outside inference mode
        whether called from the constructor or from a pass, so every table is one kind of tensor (a
        compiled pass would otherwise guard on, and recompile for, the difference)."""
        if self.context_window is not None and needed > self.context_window:
            raise ValueError(f"{needed} positions exceed the model's context window of {self.context_window}")
        capacity = max(needed, 2 * self.capacity)
        if self.context_window is not None:
            capacity = min(capacity, self.context_window)
        shape = (len(self.layers), 1, self.n_kv_heads, capacity + 1, self.head_dim)
        k = torch.zeros(shape, dtype=self.cache_dtype, device=self.device)
        v = torch.zeros(shape, dtype=self.cache_dtype, device=self.device)
        if self.capacity:
            k[:, :, :, : self.capacity] = self.k_cache[:, :, :, : self.capacity]
            v[:, :, :, : self.capacity] = self.v_cache[:, :, :, : self.capacity]
        self.k_cache, self.v_cache, self.capacity = k, v, capacity
        positions = torch.arange(capacity, device=self.device).view(1, capacity)
        probe = torch.zeros(1, dtype=torch.float32, device=self.device)
        cos, sin = self.model.model.rotary_emb(probe, positions)
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)
        self.slot_index = torch.arange(capacity + 1, device=self.device)
        self._graphs = {}
        self.__dict__.pop("_buffers", None)

    @torch.inference_mode()
    def compact(self, keep: torch.Tensor) -> None:
        """Keep only cache slots `keep` (ascending), moved down in place (no recomputation)."""
        n = len(keep)
        if keep.device.type == "cpu":  # find the first moved slot on the host: no device sync
            moved = (keep != torch.arange(n)).nonzero()
            first = int(moved[0]) if moved.numel() else n
            if first < n:
                src = keep[first:].to(self.device)
                self.k_cache[:, :, :, first:n] = self.k_cache[:, :, :, src]
                self.v_cache[:, :, :, first:n] = self.v_cache[:, :, :, src]
            self.length = n
        else:
            self._compact_on_device(keep)

    def _compact_on_device(self, keep: torch.Tensor) -> None:
        """compact() without reading `keep` on the host: every kept slot is gathered, then written back
        (correct for any overlap), so no device sync; costs a copy of the kept cache."""
        keep = keep.to(self.device)
        n = len(keep)
        self.k_cache[:, :, :, :n] = self.k_cache[:, :, :, keep]
        self.v_cache[:, :, :, :n] = self.v_cache[:, :, :, keep]
        self.length = n

    # ------------------------------------------------------------------ passes

    def _stage(self, ids: torch.Tensor, n: int):
        """Grow the cache if the block would overflow it, pick the block's bucket and write its ids and cache
        slots into that bucket's static inputs (padding rows: token 0, written to the scratch slot).
        Returns (bucket, the cache length after the block, the inputs)."""
        start, end = self.length, self.length + n
        if end > self.capacity:
            self._grow(end)
        b = bucket_for(n, self.buckets)
        step = self._inputs(b)
        step["ids"][:n].copy_(ids)
        step["ids"][n:].zero_()
        torch.arange(start, start + b, out=step["slots"], device=self.device)
        step["slots"][n:] = self.capacity  # padding: the scratch slot
        return b, end, step

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(self.device).view(-1)
        n = ids.shape[0]
        top = self.buckets[-1]
        if n > top:  # a long block (a prompt): in chunks of the largest bucket
            parts, hidden = [], []
            for i in range(0, n, top):
                parts.append(self.forward(ids[i : i + top]))
                hidden.append(self.hidden)
            if self.keep_hidden:
                self.hidden = torch.cat(hidden)
            return torch.cat(parts)
        b, end, step = self._stage(ids, n)
        slots = step["slots"]
        step["positions"].copy_(slots)
        step["positions"][n:] = 0
        torch.le(self.slot_index.view(1, -1), slots.view(-1, 1), out=step["mask"])
        return self._run(b, n, end)

    @torch.inference_mode()
    def forward_tree(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """forward() over a token tree: RoPE at `positions`, keys seen per bool `mask` [n, length + n];
        the new keys go to the next n cache slots."""
        ids = ids.to(self.device).view(-1)
        n = ids.shape[0]
        if mask.shape != (n, self.length + n):
            raise ValueError(f"tree mask must have shape {(n, self.length + n)}, got {tuple(mask.shape)}")
        b, end, step = self._stage(ids, n)
        step["positions"][:n].copy_(positions.view(-1))
        step["positions"][n:].zero_()
        step["mask"].zero_()
        step["mask"][:n, :end].copy_(mask)
        step["mask"][n:, self.capacity] = True
        return self._run(b, n, end)

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> None:
        """Caches ids. Captured: through the buckets' graphs (their logits dropped: on a GPU the LM head of
        64 rows costs little); uncaptured (a CPU): one pass of the prompt's own length without the LM head."""
        if self.graphs != "none":
            self.forward(ids)
            return
        ids = ids.to(self.device).view(-1)
        n = ids.shape[0]
        start, end = self.length, self.length + n
        if end > self.capacity:
            self._grow(end)
        slots = torch.arange(start, end, device=self.device)
        mask = self.slot_index.view(1, -1) <= slots.view(-1, 1)
        hidden, _ = static_block(ids, slots, slots, mask, self.embed, None, self.norm, self.layers, self.k_cache,
                                 self.v_cache, self.cos, self.sin, self.n_heads, self.n_kv_heads, self.head_dim)
        self.length = end
        if self.keep_hidden:
            self.hidden = hidden

    def _run(self, b: int, n: int, end: int) -> torch.Tensor:
        step = self._inputs(b)
        if self.graphs == "none":
            hidden, logits = self._step(step)
        else:
            hidden, logits = self._replay(b)
        self.length = end
        if self.keep_hidden:
            self.hidden = hidden[:n].clone()
        # a graph's outputs are overwritten by its next replay: hand out a copy
        return logits[:n].float() if logits.dtype != torch.float32 or self.graphs == "none" else logits[:n].clone()

    def _inputs(self, b: int) -> dict:
        """The static input buffers of bucket b (a captured graph reads exactly these tensors)."""
        inputs = self.__dict__.setdefault("_buffers", {})
        key = (b, self.capacity)
        if key not in inputs:
            with torch.inference_mode(False):
                inputs[key] = self._new_inputs(b)
        return inputs[key]

    def _new_inputs(self, b: int) -> dict:
        dev = self.device
        return {
            "ids": torch.zeros(b, dtype=torch.long, device=dev),
            "positions": torch.zeros(b, dtype=torch.long, device=dev),
            "slots": torch.zeros(b, dtype=torch.long, device=dev),
            "mask": torch.zeros(b, self.capacity + 1, dtype=torch.bool, device=dev),
        }

    def _step(self, step: dict, block=None):
        """One static-shape pass: embed, every layer writing its keys/values by slot, norm, LM head."""
        return (block or static_block)(step["ids"], step["positions"], step["slots"], step["mask"], self.embed, self.head,
                            self.norm, self.layers, self.k_cache, self.v_cache, self.cos, self.sin, self.n_heads,
                            self.n_kv_heads, self.head_dim)

    def _replay(self, b: int, strict: bool = False):
        graph = self._graphs.get(b)
        if graph is None:
            t0 = time.perf_counter()
            try:
                graph = self._capture(b)
            except Exception as err:  # noqa: BLE001 - an odd build or op: run the same code uncaptured
                if strict or os.environ.get("SPECREPRO_STRICT_GRAPHS") == "1":
                    raise RuntimeError(f"capturing the {self.graphs!r} graph of bucket {b} failed: "
                                       f"{type(err).__name__}: {err}") from err
                self.fallback = (f"capturing the {self.graphs!r} graph of bucket {b} failed "
                                 f"({type(err).__name__}: {err})")
                warnings.warn(f"{self.fallback}; this runner now runs uncaptured (graphs='none')", GraphFallbackWarning,
                              stacklevel=4)
                self.graphs = "none"
                return self._step(self._inputs(b))
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.capture_seconds += time.perf_counter() - t0
            self.captures += 1
            self._graphs[b] = graph
        return graph()

    def _capture(self, b: int):
        """A callable replaying bucket b's pass; the cache is saved and restored around the warm-up runs
        (they write the cache like real passes). graphs="compile" off CUDA: the compiled pass, uncaptured."""
        step = self._inputs(b)
        block = compiled_block(self.compile_backend) if self.graphs == "compile" else None
        saved = (self.k_cache.clone(), self.v_cache.clone())
        try:
            if self.device.type != "cuda":
                self._step(step, block)  # compiles this bucket now

                def replay():
                    return self._step(step, block)
                return replay
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(3):  # compiles (and autotunes) outside the capture
                    self._step(step, block)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._step(step, block)

            def replay():
                graph.replay()
                return out
        finally:
            self.k_cache.copy_(saved[0])
            self.v_cache.copy_(saved[1])
        return replay

    def warmup(self, sizes: tuple[int, ...] | None = None) -> float:
        """Capture the graphs of `sizes` (default: every bucket) now; returns the seconds it took."""
        if self.graphs == "none":
            return 0.0
        t0 = time.perf_counter()
        for b in sizes or self.buckets:
            b = bucket_for(b, self.buckets)
            if b not in self._graphs:
                self._inputs(b)
                with torch.inference_mode():
                    self._replay(b, strict=True)
        return time.perf_counter() - t0


def static_block(ids, positions, slots, mask, embed, head, norm, layers, k_cache, v_cache, cos, sin, n_heads,
                 n_kv_heads, head_dim):
    """n (= the bucket) tokens at RoPE `positions` written to cache `slots`; row i attends to the slots
    mask[i] allows, over the whole cache. Returns (hidden [n, H], logits [n, V] in the compute dtype)."""
    n = ids.shape[0]
    x = F.embedding(ids, embed)
    c, s = cos[positions], sin[positions]
    for i, (ln1, qkv, wo, ln2, gate_up, down) in enumerate(layers):
        q, k, v = heads_qkv(rms_norm(x, ln1), qkv, n_heads, n_kv_heads, head_dim, c, s)
        k_cache[i].index_copy_(2, slots, k.to(k_cache.dtype))
        v_cache[i].index_copy_(2, slots, v.to(v_cache.dtype))
        o = attend(q, k_cache[i], v_cache[i], mask)
        x = x + wo(o.transpose(1, 2).reshape(n, n_heads * head_dim))[0]
        x = x + mlp(rms_norm(x, ln2), gate_up, down)
    x = rms_norm(x, norm)
    return x, None if head is None else head(x)[0]


def capture_note(runner) -> str:
    """One line on what a StaticRunner has captured (for reports)."""
    if not isinstance(runner, StaticRunner):
        return ""
    return f"{runner.graphs} graphs: {runner.captures} captured in {runner.capture_seconds:.2f} s"


__all__ = ["StaticRunner", "BUCKETS", "GRAPH_MODES", "GraphFallbackWarning", "bucket_for", "compiled_block", "static_block",
           "size_recompile_limit", "capture_note"]
