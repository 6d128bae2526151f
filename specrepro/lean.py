"""A lean runner for Llama-family Hugging Face models: the decode path without HF's per-call machinery.

Same interface as `runners.HFRunner` (length, forward, rollback, reset, hidden, device, keep_hidden), so it
is a drop-in `target` for speculative_generate and a runner for `drafts.ModelDraft`. What makes it lean:
- it reads the HF model's own weight tensors (no copy in the model's dtype);
- a preallocated KV cache [layers, 1, kv_heads, capacity, head_dim] written by position, so a rollback
  is just `self.length = n` (later writes overwrite the rejected slots, as in gpt-fast);
- RoPE cos/sin tables computed once by the model's own rotary module (any rope_type it supports);
- one `F.scaled_dot_product_attention` per layer over the cached prefix with an explicit causal mask for
  the new block, GQA without repeating keys;
- no host syncs, no Python work that grows with the vocabulary or the sequence.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F


def set_threads(n: int | None = None) -> int:
    """Set torch's intra-op threads to n (default: the CPUs this process may run on). Returns n.

    Call it explicitly (the bench CLI does): importing specrepro changes no global state.
    """
    if n is None:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(n)
    return n


def is_llama_like(model: torch.nn.Module) -> bool:
    """Llama-shaped decoder layers (q/k/v/o projections, gated MLP, RMSNorm): Llama, SmolLM, Mistral..."""
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None or not len(layers) or not hasattr(base, "rotary_emb"):
        return False
    layer = layers[0]
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    return (
        all(hasattr(attn, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj"))
        and all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj"))
        and getattr(model.config, "hidden_act", "silu") == "silu"
        and not hasattr(attn, "q_norm")  # Qwen3/OLMo2-style q/k norms are not handled
        and getattr(model.config, "sliding_window", None) is None
    )


class LeanRunner:
    """Feed tokens, get logits [n, V] float32; KV cache preallocated and written by position.

    dtype: the compute dtype (float32 default). If it differs from the model's, the weights are cast once
    (that is a copy); in the model's own dtype the runner holds views of the model's tensors.
    capacity: initial cache length in positions; the cache grows (a copy, rare) up to the context window.
    compile: run the block through torch.compile(dynamic=True) (one compile of 10-25 s on a 2-core CPU,
    shapes vary in the block length and the cache length). Measured on the 2-core EPYC (1 thread), ms per
    forward of 1 / 2 / 5 / 8 tokens: float32 eager 47.7 / 84.5 / 85.1 / 84.3, compiled 57.3 / 73.8 /
    75.7 / 74.6; bfloat16 eager 29.2 / 27.3 / 33.4 / 34.7, compiled 48.1 / 36.8 / 30.7 / 33.5. It does not
    help the one-token steps of ArS or bfloat16, so it is off by default; `python -m specrepro.bench
    --runners lean,compiled` measures it side by side on other machines.
    """

    batch = 1  # cache rows; specrepro.batch.BatchLeanRunner sets more

    def __init__(
        self,
        model: torch.nn.Module,
        dtype: torch.dtype | None = torch.float32,
        capacity: int = 512,
        keep_hidden: bool = False,
        compile: bool = False,
    ):
        if not is_llama_like(model):
            raise TypeError(f"LeanRunner handles Llama-family models only, got {type(model).__name__}")
        from .runners import split_reason

        reason = split_reason(model)
        if reason is not None:
            raise TypeError(f"LeanRunner needs every weight on one device, but {reason}: run this model with the HF "
                            "runner (pass the model itself as target, or specrepro.runners.HFRunner(model))")
        config = model.config
        self.model = model
        self.keep_hidden = keep_hidden
        self._block = torch.compile(_block, dynamic=True) if compile else _block
        first = next(model.parameters())
        self.device = first.device
        self.dtype = dtype or first.dtype
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = getattr(config, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.hidden_size = config.hidden_size
        self.context_window = getattr(config, "max_position_embeddings", None)

        def w(t):  # a detached view when dtypes match, else a one-time cast
            return None if t is None else t.detach().to(self.dtype)

        base = model.model
        self.embed = w(base.embed_tokens.weight)
        self.head = w(model.get_output_embeddings().weight)  # tied: the same tensor as embed
        self.norm = (w(base.norm.weight), _eps(base.norm))
        self.layers = []
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(
                (
                    (w(layer.input_layernorm.weight), _eps(layer.input_layernorm)),
                    (w(a.q_proj.weight), w(a.q_proj.bias)),
                    (w(a.k_proj.weight), w(a.k_proj.bias)),
                    (w(a.v_proj.weight), w(a.v_proj.bias)),
                    (w(a.o_proj.weight), w(a.o_proj.bias)),
                    (w(layer.post_attention_layernorm.weight), _eps(layer.post_attention_layernorm)),
                    (w(m.gate_proj.weight), w(m.gate_proj.bias)),
                    (w(m.up_proj.weight), w(m.up_proj.bias)),
                    (w(m.down_proj.weight), w(m.down_proj.bias)),
                )
            )
        self.vocab_size = self.head.shape[0]
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
        hidden, logits = self._block(
            ids.to(self.device).view(n), start, self.embed, self.head, self.norm, self.layers,
            self.k_cache, self.v_cache, self.cos[start:end], self.sin[start:end], self.n_heads, self.n_kv_heads,
            self.head_dim,
        )
        if self.keep_hidden:
            self.hidden = hidden
        self.length = end
        return logits.float()

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> None:
        """forward() without the LM head: caches the tokens (a prompt's logits are never read)."""
        n = ids.shape[-1]
        start, end = self.length, self.length + n
        if end > self.capacity:
            self._grow(end)
        hidden, _ = self._block(
            ids.to(self.device).view(n), start, self.embed, None, self.norm, self.layers,
            self.k_cache, self.v_cache, self.cos[start:end], self.sin[start:end], self.n_heads, self.n_kv_heads,
            self.head_dim,
        )
        if self.keep_hidden:
            self.hidden = hidden
        self.length = end

    def _grow(self, needed: int) -> None:
        """(Re)allocate the cache for at least `needed` positions, keeping what is cached."""
        if self.context_window is not None and needed > self.context_window:
            raise ValueError(f"{needed} positions exceed the model's context window of {self.context_window}")
        capacity = max(needed, 2 * self.capacity)
        if self.context_window is not None:
            capacity = min(capacity, self.context_window)
        shape = (len(self.layers), self.batch, self.n_kv_heads, capacity, self.head_dim)
        k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        v = torch.zeros(shape, dtype=self.dtype, device=self.device)
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


def causal_mask(start: int, n: int, device) -> torch.Tensor | None:
    """[n, start + n] bool: new token i (at position start + i) sees keys 0..start + i. None for n == 1."""
    if n == 1:
        return None  # one new token sees the whole prefix: no mask, SDPA's fastest path
    keys = torch.arange(start + n, device=device)
    queries = torch.arange(start, start + n, device=device)
    return keys.view(1, -1) <= queries.view(-1, 1)


def _block(ids, start, embed, head, norm, layers, k_cache, v_cache, cos, sin, n_heads, n_kv_heads, head_dim):
    """Embed n new tokens at positions start.., run every layer writing the cache, return (hidden, logits)."""
    n = ids.shape[0]
    end = start + n
    mask = causal_mask(start, n, ids.device)
    x = F.embedding(ids, embed)  # [n, H]
    for i, (ln1, wq, wk, wv, wo, ln2, wg, wu, wd) in enumerate(layers):
        h = rms_norm(x, ln1)
        # [1, heads, n, head_dim]
        q = F.linear(h, *wq).view(1, n, n_heads, head_dim).transpose(1, 2)
        k = F.linear(h, *wk).view(1, n, n_kv_heads, head_dim).transpose(1, 2)
        v = F.linear(h, *wv).view(1, n, n_kv_heads, head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k_cache[i, :, :, start:end] = k
        v_cache[i, :, :, start:end] = v
        o = F.scaled_dot_product_attention(
            q, k_cache[i, :, :, :end], v_cache[i, :, :, :end], attn_mask=mask, enable_gqa=n_heads != n_kv_heads
        )
        x = x + F.linear(o.transpose(1, 2).reshape(n, n_heads * head_dim), *wo)
        h = rms_norm(x, ln2)
        x = x + F.linear(F.silu(F.linear(h, *wg)) * F.linear(h, *wu), *wd)
    x = rms_norm(x, norm)
    return x, None if head is None else F.linear(x, head)
