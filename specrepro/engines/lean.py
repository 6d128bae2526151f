"""A lean runner for Llama-family Hugging Face models: the decode path without HF's per-call machinery.

Same interface as `runners.HFRunner` (length, forward, rollback, reset, hidden, device, keep_hidden), so it
is a drop-in `target` for speculative_generate and a runner for `drafts.ModelDraft`. What makes it lean:
- it reads the HF model's own weight tensors (no copy in the model's dtype);
- a preallocated KV cache [layers, 1, kv_heads, capacity, head_dim] written by position, so a rollback
  is just `self.length = n` (later writes overwrite the rejected slots, as in gpt-fast);
- RoPE cos/sin tables computed once by the model's own rotary module (any rope_type it supports);
- attention over the cached prefix as two batched matmuls per layer with the query heads grouped by
  their key/value head (GQA without repeating keys) and an explicit causal mask for the new block: on
  CPU, `F.scaled_dot_product_attention` hits shapes where it takes ~16 ms instead of ~0.1 ms (measured
  on the 2-core EPYC, e.g. 5 float32 queries over 133 keys, 1 bfloat16 query over 600), so it is used
  only on other devices. On CPU the attention runs in float32 whatever the compute dtype, over a float32
  KV cache that holds the keys and values exactly as the dtype rounded them: bfloat16 matmuls of these
  tiny shapes cost ~90 us each where float32 ones cost ~25 (bfloat16 pass over 1 token 26.8 -> 23.9 ms
  after 64 cached, 28.7 -> 26.6 after 400; over 2-9 tokens 1.00-1.07x; float32 unchanged; 2-core EPYC
  with avx512_bf16, oneDNN linears, 2 threads: figures/bench/attention-f32-ab.txt);
- no host syncs, no Python work that grows with the vocabulary or the sequence.
"""
from __future__ import annotations

import os

import warnings

import torch
import torch.nn.functional as F

from .kernels import Linear, check_backend, resolve_backend
from .native import MAX_ROWS as NATIVE_MAX_ROWS


def set_threads(n: int | None = None) -> int:
    """Set torch's intra-op threads to n (default: the CPUs this process may run on). Returns n.

    Call it explicitly (the bench CLI does): importing specrepro changes no global state.
    """
    if n is None:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(n)
    return n


def is_llama_like(model: torch.nn.Module) -> bool:
    """Llama-shaped decoder layers the lean runner computes exactly (q/k/v/o projections, gated SiLU MLP,
    RMSNorm, full RoPE, 1/sqrt(head size) attention, no multipliers): Llama, SmolLM, Qwen2... `llama_like_reason`
    says why a model is not."""
    return llama_like_reason(model) is None


_SCALES = ("embedding_multiplier", "residual_multiplier", "logits_scaling", "logit_scale", "attention_multiplier")


def llama_like_reason(model: torch.nn.Module) -> str | None:
    """None if the lean runner computes `model` exactly, else what it would get wrong or cannot read.

    Structure alone is not enough: Granite has Llama's modules and multiplies embeddings, residuals, attention
    scores and logits by configured constants; StableLM and Cohere have them with LayerNorms (and partial RoPE, or
    a parallel residual). So the layers must hold exactly Llama's modules, the norms must compute RMSNorm (checked
    on a probe row), the attention must scale by 1/sqrt(head size), and every multiplier must be 1.
    """
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None or not len(layers) or not hasattr(base, "rotary_emb"):
        return "no decoder layers with rotary embeddings at model.model"
    config = getattr(model, "config", None)
    layer = layers[0]
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if not all(hasattr(attn, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return "attention without separate q/k/v/o projections"
    if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj")):
        return "no gated MLP (gate/up/down projections)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}, not SiLU"
    if getattr(config, "sliding_window", None) is not None:
        return "sliding-window attention"
    for i, lay in enumerate(layers):
        extra = (_children(lay) - {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
                 or _children(lay.self_attn) - {"q_proj", "k_proj", "v_proj", "o_proj", "rotary_emb"}
                 or _children(lay.mlp) - {"gate_proj", "up_proj", "down_proj", "act_fn"})
        if extra:  # q/k norms (Qwen3, OLMo2, Cohere), extra layer norms (Gemma2): steps the runner would skip
            return f"layer {i} has modules the runner does not compute: {', '.join(sorted(extra))}"
        if not hasattr(lay, "post_attention_layernorm"):
            return f"layer {i} has no post-attention norm (a parallel residual)"
    for name in _SCALES:
        value = getattr(config, name, None)
        if value is not None and name != "attention_multiplier" and value != 1:
            return f"{name} = {value} (the runner multiplies by nothing)"
    rope = getattr(config, "rope_parameters", None) or {}
    partial = getattr(config, "partial_rotary_factor", None) or (rope.get("partial_rotary_factor") if isinstance(rope, dict)
                                                                 else None)
    if partial not in (None, 1, 1.0):
        return f"partial RoPE (partial_rotary_factor = {partial})"
    if getattr(config, "use_parallel_residual", False):
        return "a parallel residual"
    if getattr(config, "clip_qkv", None) is not None:
        return f"clipped q/k/v (clip_qkv = {config.clip_qkv})"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    scaling = getattr(attn, "scaling", None)
    if scaling is not None and abs(scaling * head_dim ** 0.5 - 1) > 1e-6:
        return f"attention scores scaled by {scaling:g}, not 1/sqrt({head_dim})"
    for where, norm in [("final norm", base.norm)] + [(f"layer {i} {n}", getattr(lay, n)) for i, lay in enumerate(layers)
                                                      for n in ("input_layernorm", "post_attention_layernorm")]:
        reason = _not_rms_norm(norm, config.hidden_size)
        if reason:
            return f"the {where} {reason}"
    return None


def _children(module: torch.nn.Module) -> set[str]:
    """Names of the child modules that compute something at inference (dropouts do not)."""
    return {n for n, c in module.named_children() if not isinstance(c, (torch.nn.Dropout, torch.nn.Identity))}


def _not_rms_norm(norm: torch.nn.Module, hidden: int) -> str | None:
    """None if norm(x) = weight * x / sqrt(mean(x^2) + eps) on a probe row (offset from zero, so that a LayerNorm's
    mean subtraction shows), else how it differs."""
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.shape != (hidden,):
        return f"({type(norm).__name__}) has no weight of size {hidden}"
    if getattr(norm, "bias", None) is not None:
        return f"({type(norm).__name__}) has a bias"
    if weight.device.type == "meta":
        return None
    x = (torch.randn(2, hidden, generator=torch.Generator().manual_seed(0)) + 2).to(weight.device, weight.dtype)
    with torch.no_grad():
        got = norm(x).float()
        xf = x.float()
        want = weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + _eps(norm)))
    tol = 1e-4 if weight.dtype == torch.float32 else 2e-2
    if got.shape != want.shape or not torch.allclose(got, want, rtol=tol, atol=tol * want.abs().max().item()):
        return f"({type(norm).__name__}) does not compute RMSNorm"
    return None


class LeanRunner:
    """Feed tokens, get logits [n, V] float32; KV cache preallocated and written by position.

    dtype: the compute dtype (float32 default). If it differs from the model's, the weights are cast once
    (that is a copy); in the model's own dtype the runner holds views of the model's tensors.
    capacity: initial cache length in positions; the cache grows (a copy, rare) up to the context window.
    backend: how the linear layers run (specrepro.engines.kernels): "eager" (F.linear over the model's tensors) or
    "onednn" (q/k/v and gate/up fused, weights prepacked once for oneDNN: a copy). A backend this machine
    lacks falls back to eager with a warning. `specrepro.tune` measures which is faster here.
    compile: run the block through torch.compile(dynamic=True) (one compile of 10-25 s on a 2-core CPU,
    shapes vary in the block length and the cache length). Measured on the 2-core EPYC (1 thread), ms per
    forward of 1 / 2 / 5 / 8 tokens: float32 eager 47.7 / 84.5 / 85.1 / 84.3, compiled 57.3 / 73.8 /
    75.7 / 74.6; bfloat16 eager 29.2 / 27.3 / 33.4 / 34.7, compiled 48.1 / 36.8 / 30.7 / 33.5. It does not
    help the one-token steps of ArS or bfloat16, so it is off by default; `specrepro-bench
    --runners lean,compiled` measures it side by side on other machines. A compile that fails falls back
    to the eager block with a warning.
    weights: "bfloat16" (default) or "int8" (backend="native" and dtype=torch.bfloat16 only): the native pass with
    int8 weights (specrepro.engines.native, llama.cpp's Q8_0), a different target from the bfloat16 one (its
    logits differ; greedy text agrees only in part): chosen only when asked, never as a fallback.
    """

    batch = 1  # cache rows; specrepro.engines.batch.BatchLeanRunner sets more
    supports_native = True  # subclasses that replace the pass set False: backend="native" is refused there
    float32_cache_on_cpu = True  # see `attend`; BatchLeanRunner's SDPA wants the cache in the compute dtype

    def __init__(
        self,
        model: torch.nn.Module,
        dtype: torch.dtype | None = torch.float32,
        capacity: int = 512,
        keep_hidden: bool = False,
        compile: bool = False,
        backend: str = "eager",
        weights: str = "bfloat16",
    ):
        reason = llama_like_reason(model)
        if reason is not None:
            raise TypeError(f"LeanRunner handles Llama-family models only, got {type(model).__name__}: {reason}")
        from .runners import split_reason

        reason = split_reason(model)
        if reason is not None:
            raise TypeError(f"LeanRunner needs every weight on one device, but {reason}: run this model with the HF "
                            "runner (pass the model itself as target, or specrepro.engines.runners.HFRunner(model))")
        check_backend(backend)
        if compile and backend != "eager":
            # measured with torch 2.13: inductor fails to lower mkldnn._linear_pointwise on a prepacked weight
            raise ValueError(f"compile=True needs backend='eager' (torch.compile cannot lower the {backend!r} linears)")
        if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype such as torch.float32, got {dtype!r}")
        config = model.config
        self.model = model
        self.keep_hidden = keep_hidden
        self.compiled = compile
        self._block = _CompiledBlock() if compile else _block
        first = next(model.parameters())
        self.device = first.device
        self.dtype = dtype or first.dtype
        if backend == "native" and not self.supports_native:
            raise ValueError(f"{type(self).__name__} has no native pass: use backend 'eager' or 'onednn'")
        if weights not in ("bfloat16", "int8"):
            raise ValueError(f"weights must be 'bfloat16' or 'int8', got {weights!r}")
        if weights == "int8":  # another target: never replaced by a fallback that would run the bfloat16 one
            from .kernels import unavailable_reason

            if backend != "native" or self.dtype != torch.bfloat16 or not self.supports_native:
                raise ValueError("weights='int8' runs on the native pass only: LeanRunner(model, dtype=torch.bfloat16, "
                                 f"backend='native', weights='int8'), got backend={backend!r}, dtype={self.dtype}")
            reason = unavailable_reason("native", self.dtype, self.device)
            if reason is not None:
                raise RuntimeError(f"weights='int8' needs the native pass, unavailable here: {reason}")
        self.weights = weights
        self.backend = resolve_backend(backend, self.dtype, self.device)
        # the native pass runs blocks of up to native.MAX_ROWS tokens, longer ones (prompts) block by block;
        # self.layers and self.head keep eager linears for the code that reads them
        linear_backend = "eager" if self.backend == "native" else self.backend
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = getattr(config, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.hidden_size = config.hidden_size
        self.context_window = getattr(config, "max_position_embeddings", None)

        def w(t):  # a detached view when dtypes match, else a one-time cast
            return None if t is None else t.detach().to(self.dtype)

        base = model.model
        self.embed = w(base.embed_tokens.weight)
        self.head = Linear([(model.get_output_embeddings().weight, None)], self.dtype, linear_backend)
        self.norm = (w(base.norm.weight), _eps(base.norm))
        self.layers = []
        def linear(*projections):
            return Linear([(p.weight, p.bias) for p in projections], self.dtype, linear_backend)

        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(
                (
                    (w(layer.input_layernorm.weight), _eps(layer.input_layernorm)),
                    linear(a.q_proj, a.k_proj, a.v_proj),
                    linear(a.o_proj),
                    (w(layer.post_attention_layernorm.weight), _eps(layer.post_attention_layernorm)),
                    linear(m.gate_proj, m.up_proj),
                    linear(m.down_proj),
                )
            )
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        # float32 on CPU: `attend` computes there in float32 (the values stored are the dtype's, rounded)
        self.cache_dtype = torch.float32 if self.device.type == "cpu" and self.float32_cache_on_cpu else self.dtype
        self._native = None
        self._taps: tuple[int, ...] = ()
        if self.backend == "native":
            from . import native

            self._native = native.build_model(self, weights)
        self.capacity = 0
        self._grow(min(capacity, self.context_window or capacity))
        self.reset()

    def reset(self) -> None:
        # the cache keeps its memory: stale slots past `length` are never read (the mask stops at length + n)
        self.length = 0
        self.hidden: torch.Tensor | None = None

    def rollback(self, length: int) -> None:
        if length < self.length:
            self.length = length

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[-1]
        start, end = self.length, self.length + n
        if end > self.capacity:
            self._grow(end)
        hidden, logits = self._pass(ids.to(self.device).view(n), start, slice(start, end), None, self.head)
        if self.keep_hidden:
            self.hidden = hidden
        self.length = end
        return logits.float()

    @torch.inference_mode()
    def forward_tree(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """forward() over a token tree (specrepro.algorithm.tree): RoPE at `positions`, keys seen per bool `mask`
        [n, length + n]; the new keys go to the next n cache slots."""
        n = ids.shape[-1]
        start, end = self.length, self.length + n
        if mask.shape != (n, end):
            raise ValueError(f"tree mask must have shape {(n, end)}, got {tuple(mask.shape)}")
        if end > self.capacity:
            self._grow(end)
        hidden, logits = self._pass(ids.to(self.device).view(n), start, positions.to(self.device), mask.to(self.device),
                                    self.head)
        if self.keep_hidden:
            self.hidden = hidden
        self.length = end
        return logits.float()

    @torch.inference_mode()
    def compact(self, keep: torch.Tensor) -> None:
        """Keep only cache slots `keep` (ascending), moved down in place (no recomputation)."""
        keep = keep.to(self.device)
        dst = torch.arange(len(keep), device=self.device)
        moved = keep != dst
        if bool(moved.any()):
            self.k_cache[:, :, :, dst[moved]] = self.k_cache[:, :, :, keep[moved]]
            self.v_cache[:, :, :, dst[moved]] = self.v_cache[:, :, :, keep[moved]]
        self.length = len(keep)

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> None:
        """forward() without the LM head: caches the tokens (a prompt's logits are never read)."""
        n = ids.shape[-1]
        start, end = self.length, self.length + n
        if end > self.capacity:
            self._grow(end)
        hidden, _ = self._pass(ids.to(self.device).view(n), start, slice(start, end), None, None)
        if self.keep_hidden:
            self.hidden = hidden
        self.length = end

    def _pass(self, ids, start: int, positions, mask, head):
        """(hidden, logits or None) of tokens `ids` written to cache slots start..; RoPE at `positions` (a
        slice or index tensor); `mask` [n, start + n] bool for a tree, None for causal; no LM head if head is None."""
        if self._native is not None:
            return self._native_pass(ids, start, positions, mask, head is not None)
        return self._block(ids, start, self.embed, head, self.norm, self.layers, self.k_cache, self.v_cache,
                           self.cos[positions], self.sin[positions], self.n_heads, self.n_kv_heads, self.head_dim, mask,
                           self._taps)

    def _native_pass(self, ids, start: int, positions, mask, logits: bool):
        """_pass through the native model, in blocks of up to native.MAX_ROWS tokens (a prompt): each row's
        numbers are those of a lone one-token pass, whatever the blocks."""
        n = ids.shape[0]
        if isinstance(positions, slice):
            positions = torch.arange(positions.start, positions.stop)
        parts = []
        for c0 in range(0, n, NATIVE_MAX_ROWS):
            c1 = min(n, c0 + NATIVE_MAX_ROWS)
            rows = positions[c0:c1]
            parts.append(self._native.forward(ids[c0:c1], start + c0, self._cos32[rows], self._sin32[rows],
                                              None if mask is None else mask[c0:c1, : start + c1], self.k_cache,
                                              self.v_cache, logits))
        hidden = torch.cat([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        out = (torch.cat([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]) if logits else None
        if self._taps:  # EAGLE-3's fused features: the tapped layers' outputs, then the final hidden state
            tapped = torch.cat([p[2] for p in parts]) if len(parts) > 1 else parts[0][2]
            hidden = torch.cat([tapped.flatten(1), hidden], 1)
        return hidden.to(self.dtype), out

    @property
    def hidden_taps(self) -> tuple[int, ...]:
        """Layers whose outputs (the residual stream after them) `hidden` holds before the final hidden state:
        with taps (l, m), hidden is [n, 3H] = [layer l's out, layer m's out, final normed] (a fused-feature
        draft's input). Empty (default): hidden is the final hidden state [n, H]. Runners that replace the pass
        (static, frozen, batch) refuse taps."""
        return self._taps

    @hidden_taps.setter
    def hidden_taps(self, taps) -> None:
        taps = tuple(int(t) for t in taps)
        if taps == self._taps:
            return
        if taps and not self.supports_native:
            raise ValueError(f"{type(self).__name__} replaces the lean pass and gives no hidden_taps: run a draft that "
                             "reads target layers with LeanRunner or HFRunner")
        bad = [t for t in taps if not 0 <= t < len(self.layers) - 1]
        if bad:
            raise ValueError(f"hidden_taps {bad} are not layers 0..{len(self.layers) - 2} of this {len(self.layers)}-layer "
                             "model (the last layer's output is the final hidden state, which hidden always holds)")
        if self._native is not None:
            self._native.set_taps(list(taps))
        self._taps = taps

    def _grow(self, needed: int) -> None:
        """(Re)allocate the cache for at least `needed` positions, keeping what is cached."""
        if self.context_window is not None and needed > self.context_window:
            raise ValueError(f"{needed} positions exceed the model's context window of {self.context_window}")
        capacity = max(needed, 2 * self.capacity)
        if self.context_window is not None:
            capacity = min(capacity, self.context_window)
        shape = (len(self.layers), self.batch, self.n_kv_heads, capacity, self.head_dim)
        k = torch.zeros(shape, dtype=self.cache_dtype, device=self.device)
        v = torch.zeros(shape, dtype=self.cache_dtype, device=self.device)
        if self.capacity:
            k[:, :, :, : self.capacity] = self.k_cache
            v[:, :, :, : self.capacity] = self.v_cache
        self.k_cache, self.v_cache, self.capacity = k, v, capacity
        # the model's own rotary module: same inv_freq and attention scaling as HF, computed in float32
        positions = torch.arange(capacity, device=self.device).view(1, capacity)
        probe = torch.zeros(1, dtype=torch.float32, device=self.device)
        with torch.no_grad():
            cos, sin = self.model.model.rotary_emb(probe, positions)
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)  # [capacity, head_dim]
        if self._native is not None:  # the native pass rotates in float32
            self._cos32, self._sin32 = cos[0].float().contiguous(), sin[0].float().contiguous()


def _eps(norm: torch.nn.Module) -> float:
    return getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)


def rms_norm(x: torch.Tensor, weight_eps) -> torch.Tensor:
    weight, eps = weight_eps
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in HF's half-split layout. x: [1, heads, n, head_dim]; cos, sin: [n, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def heads_qkv(h, qkv, n_heads: int, n_kv_heads: int, head_dim: int, cos, sin):
    """One layer's normed input [n, H] -> q, k, v per head, [1, heads, n, head_dim], q and k rotated."""
    n = h.shape[0]
    q, k, v = qkv(h)
    q = q.reshape(1, n, n_heads, head_dim).transpose(1, 2)
    k = k.reshape(1, n, n_kv_heads, head_dim).transpose(1, 2)
    v = v.reshape(1, n, n_kv_heads, head_dim).transpose(1, 2)
    return rotate(q, cos, sin), rotate(k, cos, sin), v


def causal_mask(start: int, n: int, device) -> torch.Tensor | None:
    """[n, start + n] bool: new token i (at position start + i) sees keys 0..start + i. None for n == 1."""
    if n == 1:
        return None  # one new token sees the whole prefix: no mask, SDPA's fastest path
    keys = torch.arange(start + n, device=device)
    queries = torch.arange(start, start + n, device=device)
    return keys.view(1, -1) <= queries.view(-1, 1)


def _block(ids, start, embed, head, norm, layers, k_cache, v_cache, cos, sin, n_heads, n_kv_heads, head_dim,
           tree_mask=None, taps=()):
    """Embed n new tokens into cache slots start.., run every layer writing the cache, return (hidden, logits).
    cos/sin are at the tokens' positions (start.. unless a tree); tree_mask [n, start + n] replaces the causal one.
    taps: layers whose outputs hidden holds before the final hidden state (LeanRunner.hidden_taps)."""
    n = ids.shape[0]
    end = start + n
    mask = causal_mask(start, n, ids.device) if tree_mask is None else tree_mask
    x = F.embedding(ids, embed)  # [n, H]
    tapped = []
    for i, (ln1, qkv, wo, ln2, gate_up, down) in enumerate(layers):
        q, k, v = heads_qkv(rms_norm(x, ln1), qkv, n_heads, n_kv_heads, head_dim, cos, sin)
        k_cache[i, :, :, start:end] = k
        v_cache[i, :, :, start:end] = v
        o = attend(q, k_cache[i, :, :, :end], v_cache[i, :, :, :end], mask)
        x = x + wo(o.transpose(1, 2).reshape(n, n_heads * head_dim))[0]
        x = x + mlp(rms_norm(x, ln2), gate_up, down)
        if i in taps:
            tapped.append(x)
    x = rms_norm(x, norm)
    return (torch.cat([*tapped, x], -1) if taps else x), None if head is None else head(x)[0]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax attention. q: [1, heads, n, d]; k, v: [1, kv_heads, L, d]; mask: [n, L] bool or None.

    Query head h reads key/value head h // (heads / kv_heads), as in HF's GQA. On CPU the products and the
    softmax run in float32 (k and v come from the runner's float32 cache; the output is cast back to q's
    dtype), so a float32 model is computed exactly as before and a half-precision one with its scores
    unrounded; HF's eager attention rounds them to the half dtype before its float32 softmax.
    """
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
    _, heads, n, d = q.shape
    kv, length = k.shape[1], k.shape[2]
    group = heads // kv
    scores = (q.float().reshape(1, kv, group * n, d) @ k.float().transpose(-1, -2)) * d**-0.5  # [1, kv, group * n, L]
    if mask is not None:
        scores = scores.view(1, kv, group, n, length).masked_fill(~mask, float("-inf")).view(1, kv, group * n, length)
    weights = torch.softmax(scores, dim=-1)
    return (weights @ v.float()).to(q.dtype).view(1, heads, n, d)


def mlp(h: torch.Tensor, gate_up, down) -> torch.Tensor:
    gate, up = gate_up(h)
    return down(F.silu(gate) * up)[0]


class _CompiledBlock:
    """torch.compile(_block, dynamic=True), falling back to the eager block (with a warning) if it fails."""

    def __init__(self):
        self.fn = torch.compile(_block, dynamic=True)

    def __call__(self, *args):
        if self.fn is not _block:
            try:
                return self.fn(*args)
            except Exception as e:  # inductor needs a C++ toolchain and can fail on odd builds
                warnings.warn(f"torch.compile of the lean block failed ({type(e).__name__}: {e}); running eager",
                              stacklevel=3)
                self.fn = _block
        return _block(*args)
