"""A lean runner over a batch of sequences, each row with its own length (specrepro.algorithm.batch).

A row writes its new keys at its own positions, attends through a per-row mask, and rolls back by
setting its own length.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .lean import LeanRunner, mlp, rms_norm, rotate


class BatchLeanRunner(LeanRunner):
    """LeanRunner with B cache rows. lengths: [B] LongTensor; forward(ids [B, n]) -> logits [B, n, V].

    Row b's n new tokens go to positions lengths[b] .. lengths[b] + n - 1; slots past a row's length hold
    stale keys that the per-row mask never lets a query see (a query at position t sees keys 0..t).
    """

    supports_native = False  # it replaces the pass itself

    float32_cache_on_cpu = False  # the batched block attends with SDPA, which wants q's dtype

    def __init__(self, model, batch: int, dtype=torch.float32, capacity: int = 512, backend: str = "eager"):
        self.batch = batch
        super().__init__(model, dtype=dtype, capacity=capacity, backend=backend)

    def reset(self) -> None:
        super().reset()
        self.lengths = torch.zeros(self.batch, dtype=torch.long, device=self.device)

    def rollback(self, lengths: torch.Tensor) -> None:
        self.lengths = torch.minimum(self.lengths, lengths.to(self.lengths.device))

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, n = ids.shape
        pos = self.lengths.view(b, 1) + torch.arange(n, device=self.device)  # [B, n]
        end = int(pos.max()) + 1  # one host read per call: the key range to attend over
        if end > self.capacity:
            self._grow(end)
        logits = _batch_block(
            ids.to(self.device), pos, end, self.embed, self.head, self.norm, self.layers, self.k_cache,
            self.v_cache, self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1), self.n_heads, self.n_kv_heads,
            self.head_dim,
        )
        self.lengths = self.lengths + n
        self.length = end
        return logits.float()


def _batch_block(ids, pos, end, embed, head, norm, layers, k_cache, v_cache, cos, sin, n_heads, n_kv, head_dim):
    b, n = ids.shape
    rows = torch.arange(b, device=ids.device).view(b, 1)
    # [B, 1, n, end]: query at position pos[b, i] sees keys 0..pos[b, i] of its own row
    mask = (torch.arange(end, device=ids.device).view(1, 1, end) <= pos.unsqueeze(-1)).unsqueeze(1)
    x = F.embedding(ids, embed)  # [B, n, H]
    for i, (ln1, qkv, wo, ln2, gate_up, down) in enumerate(layers):
        h = rms_norm(x, ln1)
        q, k, v = qkv(h)
        q = q.reshape(b, n, n_heads, head_dim).transpose(1, 2)
        k = k.reshape(b, n, n_kv, head_dim).transpose(1, 2)
        v = v.reshape(b, n, n_kv, head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        # advanced indices around a slice: the indexed view is [B, n, kv_heads, head_dim]
        k_cache[i][rows, :, pos] = k.transpose(1, 2)
        v_cache[i][rows, :, pos] = v.transpose(1, 2)
        o = F.scaled_dot_product_attention(
            q, k_cache[i, :, :, :end], v_cache[i, :, :, :end], attn_mask=mask, enable_gqa=n_heads != n_kv
        )
        x = x + wo(o.transpose(1, 2).reshape(b, n, n_heads * head_dim))[0]
        x = x + mlp(rms_norm(x, ln2), gate_up, down)
    return head(rms_norm(x, norm))[0]
