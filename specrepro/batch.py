"""Batched speculative sampling: several prompts at once, each row with its own acceptance length.

HF assisted generation is batch-size-1 only. Here every row of one static KV cache has its own length:
a row writes its new keys at its own positions, attends through a per-row mask, and rolls back by
setting its own length, so rows that accept different numbers of draft tokens never need re-padding.
The rejection step is Algorithm 2 applied to every row at once (vectorised, no per-row Python loop).
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from .engines.lean import LeanRunner, mlp, rms_norm, rotate
from .sampling import SamplingConfig, sample, uniforms
from .speculative import Generation


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


def batch_rejection_step(drafted, p, q, generator=None):
    """Algorithm 2, steps 3-4, for every row at once.

    drafted: [B, K]; p: [B, K, V]; q: [B, K + 1, V]. Returns accepted counts n [B] and next tokens [B]:
    the residual (q - p)+ sample at a row's first rejection, or the bonus token from q[:, K].
    """
    b, k = drafted.shape
    rows = torch.arange(b, device=q.device)
    q_x = q[:, :k].gather(-1, drafted.unsqueeze(-1)).squeeze(-1)
    p_x = p.gather(-1, drafted.unsqueeze(-1)).squeeze(-1)
    r = uniforms((b, k), generator, q.device)
    accept = r * p_x < q_x  # r < q/p without dividing
    n = accept.long().cumprod(1).sum(1)  # accepted before the first rejection
    # p padded with a zero row at K: the "residual" of a row that accepted everything is q[:, K] itself
    p_pad = torch.cat([p, p.new_zeros(b, 1, p.shape[-1])], 1)
    q_n, p_n = q[rows, n], p_pad[rows, n]
    residual = (q_n - p_n).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    dist = torch.where(total > 0, residual / total.clamp_min(1e-30), q_n)  # q == p: fall back to q
    return n, sample(dist, generator)


def speculative_generate_batch(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompts: list[torch.Tensor],
    max_new_tokens: int = 64,
    lookahead: int = 4,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | None = None,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> list[Generation]:
    """Algorithm 2 over a batch of prompts (Llama-family target and draft models). One Generation per row.

    Each row keeps its own sequence length and acceptance; a row that is done (budget or EOS) stops
    growing but stays in the batch until all rows are done. The random stream differs from running
    the rows one by one, so sampled tokens differ, but each row has the target's distribution.
    """
    sampling = SamplingConfig(temperature, top_k, top_p)
    B, K = len(prompts), lookahead
    t_run, d_run = BatchLeanRunner(target, B, dtype), BatchLeanRunner(draft, B, dtype)
    start_time = time.perf_counter()
    lens = torch.tensor([p.shape[0] for p in prompts])
    if int(lens.min()) < 1:
        raise ValueError("every prompt needs at least one token")
    width = int(lens.max())
    seqs = torch.zeros(B, width + max_new_tokens + K + 1, dtype=torch.long)  # right-padded token table
    for b, p in enumerate(prompts):
        seqs[b, : p.shape[0]] = p
    rows = torch.arange(B)
    outs = [Generation(tokens=torch.empty(0, dtype=torch.long)) for _ in range(B)]
    if max_new_tokens == 0:
        return outs
    # both models see each row's seq[:-1]; padded columns write slots that later writes overwrite
    if width > 1:
        t_run.forward(seqs[:, : width - 1])
        d_run.forward(seqs[:, : width - 1])
    t_run.rollback(lens - 1)
    d_run.rollback(lens - 1)
    new = torch.zeros(B, dtype=torch.long)  # tokens emitted per row
    done = torch.zeros(B, dtype=torch.bool)
    while not bool(done.all()):
        # the draft catches up to each row's full sequence: its last two tokens (one is recomputed
        # when the draft already saw it), so every row feeds the same number of tokens
        if bool((lens >= 2).all()):
            d_run.rollback(lens - 2)
            logits = d_run.forward(torch.stack([seqs[rows, lens - 2], seqs[rows, lens - 1]], 1))[:, -1]
        else:  # first loop with a one-token prompt: the draft has seen exactly seq[:-1] already
            logits = d_run.forward(seqs[rows, lens - 1].view(B, 1))[:, -1]
        drafted, ps = [], []
        for t in range(K):
            p = sampling.probs(logits)
            x = sample(p, generator)
            drafted.append(x)
            ps.append(p)
            if t < K - 1:
                logits = d_run.forward(x.view(B, 1))[:, -1]
        drafted, p = torch.stack(drafted, 1), torch.stack(ps, 1)  # [B, K], [B, K, V]
        q = sampling.probs(t_run.forward(torch.cat([seqs[rows, lens - 1].view(B, 1), drafted], 1)))
        n, nxt = batch_rejection_step(drafted, p, q, generator)
        n = torch.where(done, 0, n)
        emitted = torch.cat([drafted, drafted.new_zeros(B, 1)], 1)
        emitted[rows, n] = nxt
        for b in (~done).nonzero().flatten().tolist():
            m = int(n[b]) + 1
            toks = emitted[b, :m].tolist()
            if eos_token_id is not None and eos_token_id in toks:
                toks = toks[: toks.index(eos_token_id) + 1]
            toks = toks[: max_new_tokens - int(new[b])]
            seqs[b, lens[b] : lens[b] + len(toks)] = torch.tensor(toks)
            outs[b].accepted.append(int(n[b]))
            outs[b].proposed.append(K)
            outs[b].target_calls += 1
            outs[b].draft_calls += K
            lens[b] += len(toks)
            new[b] += len(toks)
            if new[b] >= max_new_tokens or (eos_token_id is not None and toks[-1] == eos_token_id):
                done[b] = True
        t_run.rollback(lens - 1)  # the target has seen each row's sequence but its last token
    seconds = time.perf_counter() - start_time
    for b, p in enumerate(prompts):
        outs[b].tokens = seqs[b, p.shape[0] : lens[b]].clone()
        outs[b].seconds = seconds
    return outs
