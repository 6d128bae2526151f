"""A Llama decoder layer with an explicit, truncatable KV cache, for the feature draft.

HF's layer would need its cache/mask machinery for a one-layer model that is fed one position at a time;
this is the same maths (RMSNorm, RoPE, grouped-query attention, SwiGLU) in a few lines.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..engines.kernels import inference_linear as lin


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding, half-split layout as in HF Llama. x: [B, h, T, hd], pos: [T]."""
    hd = x.shape[-1]
    freqs = theta ** (-torch.arange(0, hd, 2, dtype=torch.float32, device=x.device) / hd)
    angles = pos.float()[:, None] * freqs[None]
    cos, sin = torch.cat([angles, angles], -1).cos().to(x.dtype), torch.cat([angles, angles], -1).sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class KVCache:
    """Keys and values of one layer, [B, kv_heads, n, hd]; truncate() forgets positions past n."""

    def __init__(self):
        self.k = self.v = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], 2)
        self.v = v if self.v is None else torch.cat([self.v, v], 2)
        return self.k, self.v

    def truncate(self, n: int) -> None:
        if self.k is not None and n < self.length:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]


class DecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, head_dim: int, ffn: int, theta: float, eps: float):
        super().__init__()
        self.heads, self.kv_heads, self.hd, self.theta = heads, kv_heads, head_dim, theta
        self.norm1, self.norm2 = RMSNorm(d, eps), RMSNorm(d, eps)
        self.q = nn.Linear(d, heads * head_dim, bias=False)
        self.k = nn.Linear(d, kv_heads * head_dim, bias=False)
        self.v = nn.Linear(d, kv_heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, d, bias=False)
        self.gate = nn.Linear(d, ffn, bias=False)
        self.up = nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, T, d] at positions pos [T]; with a cache, the new positions follow the cached ones.
        mask: [T, cached + T] bool, which keys each query sees (a token tree); default causal."""
        b, t, _ = x.shape
        h = self.norm1(x)
        q = rope(lin(self.q, h).view(b, t, self.heads, self.hd).transpose(1, 2), pos, self.theta)
        k = rope(lin(self.k, h).view(b, t, self.kv_heads, self.hd).transpose(1, 2), pos, self.theta)
        v = lin(self.v, h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.append(k, v)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        if mask is not None:
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif past == 0:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        else:
            # query i sits at position past + i and may see keys 0 .. past + i
            mask = torch.arange(past + t, device=x.device)[None, :] <= (past + torch.arange(t, device=x.device))[:, None]
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + lin(self.o, att.transpose(1, 2).reshape(b, t, -1))
        h = self.norm2(x)
        return x + lin(self.down, F.silu(lin(self.gate, h)) * lin(self.up, h))
