"""Pieces the trained drafts share: the distillation loss and reduced output vocabularies."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def soft_ce(logp: torch.Tensor, top_ids: torch.Tensor, top_p: torch.Tensor, rest: torch.Tensor,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy H(q, p) against the target's cached top-k q plus its residual mass.

    Equals KL(q || p) up to q's entropy (a constant), with the mass q puts outside its top-k matched
    to the mass p puts outside those same tokens. logp: [N, V] draft log-probs; top_*: [N, k]; rest: [N].
    """
    lp_top = logp.gather(-1, top_ids.long())
    p_rest = (1 - lp_top.exp().sum(-1)).clamp_min(1e-6)
    loss = -(top_p.float() * lp_top).sum(-1) - rest.float() * p_rest.log()
    if mask is not None:
        return (loss * mask).sum() / mask.sum().clamp_min(1)
    return loss.mean()


def hard_ce(logp: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    loss = F.nll_loss(logp, labels, reduction="none")
    if mask is not None:
        return (loss * mask).sum() / mask.sum().clamp_min(1)
    return loss.mean()


def frequent_tokens(data: dict, n: int, special: list[int]) -> torch.Tensor:
    """The n token ids the target emits or predicts most often in the training data (sorted ids).

    A draft whose head covers only these is still lossless: its p is zero elsewhere, and it proposes
    only tokens it gives mass to. Special tokens (EOS, chat markers) are always kept.
    """
    counts = torch.bincount(data["tokens"], minlength=1).float()
    vocab = max(int(data["top_ids"].max()) + 1, len(counts))
    full = torch.zeros(vocab)
    full[: len(counts)] += counts
    full.index_add_(0, data["top_ids"][:, 0].long(), torch.ones(len(data["top_ids"])))
    full[torch.tensor(special, dtype=torch.long)] = float("inf")
    return full.topk(min(n, vocab)).indices.sort().values


def frequency_subset(keep: torch.Tensor | None, counts: torch.Tensor, n: int, vocab: int,
                     special=()) -> torch.Tensor:
    """Sorted ids of the n tokens of `keep` (None: the whole vocabulary) that `counts` [>= vocab or fewer
    entries; missing ones count 0] ranks highest, ties to the lower id, `special` ids (EOS) always in: the
    frequency-ranked subset FR-Spec cuts a draft's LM head to. Errors name a bad n."""
    kept = torch.arange(vocab) if keep is None else keep.detach().cpu().long()
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(kept):
        raise ValueError(f"head_vocab must be an integer in 1..{len(kept)} (the tokens this draft's head covers), "
                         f"got {n!r}")
    full = torch.zeros(vocab, dtype=torch.float64)
    counts = torch.as_tensor(counts, dtype=torch.float64).flatten()[:vocab]
    full[: len(counts)] = counts
    score = full[kept]
    special = [int(t) for t in special if 0 <= int(t) < vocab]
    if special:
        score[torch.isin(kept, torch.tensor(special))] = float("inf")
    order = torch.argsort(-score, stable=True)  # kept is sorted by id, so ties go to the lower id
    return kept[order[:n]].sort().values


def remap(ids: torch.Tensor, keep: torch.Tensor, vocab: int) -> torch.Tensor:
    """Positions of `ids` inside the kept vocabulary (-1 where a token is not kept)."""
    index = torch.full((vocab,), -1, dtype=torch.long, device=keep.device)
    index[keep] = torch.arange(len(keep), device=keep.device)
    return index[ids.long()]


def reduced_soft_targets(top_ids, top_p, rest, keep: torch.Tensor, vocab: int):
    """Cached top-k labels moved into the kept vocabulary; mass on dropped tokens joins the residual."""
    local = remap(top_ids, keep, vocab)
    dropped = local < 0
    rest = rest + (top_p.float() * dropped).sum(-1)
    return local.clamp_min(0), top_p.float().masked_fill(dropped, 0), rest


def expand_logits(sub: torch.Tensor, keep: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """Logits over a kept vocabulary -> logits over the full one (-inf elsewhere, so p is 0 there)."""
    if keep is None:
        return sub
    full = sub.new_full(sub.shape[:-1] + (vocab,), float("-inf"))
    full[..., keep] = sub
    return full


def draw_kept(logits: torch.Tensor, keep: torch.Tensor | None, sampling, generator=None):
    """(token id, p over the kept columns) for one row of logits over a kept vocabulary (`keep`, sorted ids;
    None: logits over the full one). p is sampling's distribution over the kept tokens only: every other token
    has p = 0 in the full row (expand_logits gives it -inf), so the draw is the one a full row would give (the
    same uniform inverts the same cumulative sums; zeros add nothing), over the kept columns instead of the
    whole vocabulary (timed on the 2-core CPU, a heads:1024 step was not measurably cheaper for it)."""
    from ..algorithm.sampling import sample

    p = sampling.probs(logits)
    j = sample(p, generator)
    return (j if keep is None else keep[j]), p


def full_rows(p: torch.Tensor, keep: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """[R, n kept] probabilities -> [R, vocab] rows, zero outside the kept columns."""
    if keep is None:
        return p
    from .growing import zero_rows

    rows = zero_rows(p.shape[0], vocab, p.device)
    rows[:, keep] = p
    return rows
