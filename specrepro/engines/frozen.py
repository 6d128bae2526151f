"""A one-token decode step compiled by inductor's CPU backend with frozen weights (gpt-fast style).

The lean runner's one-token pass is ~60 small ops per layer around 7 matrix-vector products; on a 2-core
CPU each op costs microseconds of dispatch, so the small ops add up to a large share of the pass. Here the
whole step is one static-shape graph: the position is a tensor, the cache is written with `index_copy_`
at it and attention reads the whole cache capacity under a mask (no slicing by length), so one compiled
graph serves every step at a given capacity. Inductor fuses the norms, RoPE, SiLU and residual adds into a
few C++ loops and, with `freezing`, treats the weights as constants and prepacks them for oneDNN.
Exact for the dtype: the same products in the same dtype, with a different summation order (logits agree
with the eager runner within the dtype's round-off; float32 greedy tokens are equal; tests/engines).

Passes over more than one token (prompts, verification) stay on the eager lean block, which is already
near-flat in the block length: only the one-token step changes, so v(K) = pass(K+1) / pass(1) rises by
the factor the step gets faster (the bench reports both).

Measured (2-core AMD EPYC with avx512_bf16, torch 2.13, bfloat16, 1 thread, other jobs loading the cores,
one-token passes after 300 cached tokens interleaved with the eager oneDNN lean runner,
figures/bench/ops-profile-1t.json as committed in c97fa5f): 417 ms against 72 ms, i.e. this compiled step is 5.8x SLOWER here; at
2 threads on the oversubscribed machine 11.8 s against 4.0 s. Almost all of it is inside the compiled
graph's own code, not its oneDNN linears (49 ms): why inductor's output is slow for this graph on this CPU
is not yet known. So it is an opt-in runner for measuring on other machines (`specrepro-bench --runners
frozen@bfloat16`), not something sr.tune picks.

Compiling takes minutes on a small CPU (628 s for the 30-layer SmolLM2 step at 2 threads on the loaded
2-core machine; 103 s at 1 thread with part of it in the cache); inductor's FX graph cache (on disk, under TORCHINDUCTOR_CACHE_DIR,
default /tmp/torchinductor_$USER) makes a later process with the same shapes load it in seconds.
`FrozenRunner.compile_seconds` records what the first step cost.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from .lean import LeanRunner


class _Step(torch.nn.Module):
    """One token through every layer at position `pos` over a cache of fixed capacity."""

    def __init__(self, model: torch.nn.Module, runner: LeanRunner):
        super().__init__()
        P = lambda t: torch.nn.Parameter(t.detach().to(runner.dtype).clone(), requires_grad=False)  # noqa: E731
        self.n_heads, self.n_kv, self.d = runner.n_heads, runner.n_kv_heads, runner.head_dim
        base = model.model
        self.embed = P(base.embed_tokens.weight)
        self.norm_w, self.norm_eps = P(base.norm.weight), runner.norm[1]
        self.head = P(model.get_output_embeddings().weight)
        self.layers = torch.nn.ModuleList()
        self.eps = []
        for layer, lean in zip(base.layers, runner.layers):
            a, mlp = layer.self_attn, layer.mlp
            if any(p.bias is not None for p in (a.q_proj, a.k_proj, a.v_proj, a.o_proj)):
                raise TypeError("the frozen step handles bias-free projections only (Llama, SmolLM)")
            m = torch.nn.Module()
            m.ln1, m.ln2 = P(layer.input_layernorm.weight), P(layer.post_attention_layernorm.weight)
            m.qkv = P(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            m.wo = P(a.o_proj.weight)
            m.gate_up = P(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
            m.down = P(mlp.down_proj.weight)
            self.layers.append(m)
            self.eps.append((lean[0][1], lean[3][1]))
        self.inter = base.layers[0].mlp.gate_proj.weight.shape[0]

    def forward(self, ids, pos, k_cache, v_cache, cos, sin):
        # ids, pos: [1] long; k/v_cache: [layers, 1, kv, cap, d] (written at pos); cos/sin: [cap, d]
        H, nh, nkv, d = self.embed.shape[1], self.n_heads, self.n_kv, self.d
        group, cap = nh // nkv, k_cache.shape[3]
        x = F.embedding(ids, self.embed)  # [1, H]
        c, s = cos[pos], sin[pos]  # [1, d]
        visible = torch.arange(cap, device=ids.device) <= pos  # [cap]
        for i, m in enumerate(self.layers):
            eps1, eps2 = self.eps[i]
            h = F.rms_norm(x, (H,), m.ln1, eps1)
            qkv = F.linear(h, m.qkv)
            qk = qkv[:, : (nh + nkv) * d].view(nh + nkv, d)  # RoPE on q and k heads at once
            half = d // 2
            qk = qk * c + torch.cat((-qk[:, half:], qk[:, :half]), -1) * s
            q, k = qk[:nh], qk[nh:]
            v = qkv[:, (nh + nkv) * d :].view(nkv, d)
            k_cache[i, 0].index_copy_(1, pos, k.view(nkv, 1, d).to(k_cache.dtype))
            v_cache[i, 0].index_copy_(1, pos, v.view(nkv, 1, d).to(v_cache.dtype))
            kc, vc = k_cache[i, 0], v_cache[i, 0]  # [kv, cap, d]
            scores = (q.float().view(nkv, group, d) @ kc.transpose(1, 2)) * d**-0.5  # [kv, group, cap]
            scores = scores.masked_fill(~visible, float("-inf"))
            o = (torch.softmax(scores, -1) @ vc).to(x.dtype).reshape(1, nh * d)
            x = x + F.linear(o, m.wo)
            h = F.rms_norm(x, (H,), m.ln2, eps2)
            gate, up = F.linear(h, m.gate_up).split(self.inter, -1)
            x = x + F.linear(F.silu(gate) * up, m.down)
        x = F.rms_norm(x, (H,), self.norm_w, self.norm_eps)
        return x, F.linear(x, self.head)


class FrozenRunner(LeanRunner):
    """LeanRunner whose one-token forward runs a compiled, weight-frozen static graph (CPU).

    Same interface and cache as LeanRunner (rollback, compact, trees, prefill are the lean runner's);
    `forward` over one token uses the compiled step; longer blocks run the lean block on `backend`'s
    linears. The step holds its own copy of the weights (in `dtype`), so this runner costs the weights'
    memory once more. A compile that fails falls back to the
    eager lean path with a warning.
    """

    supports_native = False  # it replaces the pass itself

    def __init__(self, model, dtype=torch.float32, capacity: int = 512, keep_hidden: bool = False,
                 backend: str = "onednn", mode: str | None = None):
        super().__init__(model, dtype=dtype, capacity=capacity, keep_hidden=keep_hidden, backend=backend)
        if self.device.type != "cpu":
            raise ValueError(f"FrozenRunner compiles for the CPU; the model is on {self.device}")
        self.step = _Step(model, self).eval()
        self.mode = mode
        self.compile_seconds: float | None = None
        self._compiled = None
        self._failed = False

    def _compiled_step(self):
        if self._compiled is None:
            import torch._inductor.config as inductor_config

            inductor_config.freezing = True  # weights become constants: prepacked, folded
            inductor_config.fx_graph_cache = True
            self._compiled = torch.compile(self.step, mode=self.mode, dynamic=False, fullgraph=True)
        return self._compiled

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[-1]
        if n != 1 or self._failed:
            return super().forward(ids)
        start = self.length
        if start + 1 > self.capacity:
            self._grow(start + 1)
        pos = torch.tensor([start], device=self.device)
        args = (ids.to(self.device).view(1), pos, self.k_cache, self.v_cache, self.cos, self.sin)
        try:
            if self.compile_seconds is None:
                t = time.perf_counter()
                hidden, logits = self._compiled_step()(*args)
                self.compile_seconds = time.perf_counter() - t
            else:
                hidden, logits = self._compiled_step()(*args)
        except Exception as e:  # inductor needs a C++ toolchain; odd builds fail to lower
            import warnings

            warnings.warn(f"compiling the frozen one-token step failed ({type(e).__name__}: {e}); running eager",
                          stacklevel=2)
            self._failed = True
            return super().forward(ids)
        if self.keep_hidden:
            self.hidden = hidden
        self.length = start + 1
        return logits.float()
