"""Batched speculative sampling: several prompts at once, each row with its own acceptance length.

HF assisted generation is batch-size-1 only. Here target and draft run in specrepro.engines.batch's
BatchLeanRunner, where every row of one static KV cache has its own length, so rows that accept different
numbers of draft tokens never need re-padding. The rejection step is Algorithm 2 applied to every row at
once (vectorised, no per-row Python loop).
"""
from __future__ import annotations

import time

import torch

from ..engines.batch import BatchLeanRunner
from .sampling import SamplingConfig, sample, uniforms
from .speculative import Generation


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
