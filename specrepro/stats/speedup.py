"""The speedup model of Leviathan et al. (2023) and Chen et al. (2023), shared by the bench and notebooks.

a: per-token acceptance probability (i.i.d. model); K: lookahead; c: one draft step / one target step;
v(K): one target pass over K + 1 tokens / one target pass over 1 token.
"""
from __future__ import annotations


def expected_tokens(a: float, k: int) -> float:
    """Expected tokens per loop, (1 - a^(K+1)) / (1 - a) (K + 1 when every draft is accepted)."""
    return k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def predicted_speedup(a: float, k: int, c: float, v: float) -> float:
    """(1 - a^(K+1)) / ((1 - a)(K c + v(K))); K = 0 is ArS (1 by definition)."""
    if k == 0:
        return 1.0
    return expected_tokens(a, k) / (k * c + v)


def acceptance_mle(accepted: list[int], proposed: list[int]) -> float:
    """Per-token acceptance a under the i.i.d. model: accepted / (accepted + rejections).

    A loop that kept n of k drafts with n < k saw n acceptances then one rejection; n = k is censored.
    Loops that proposed nothing carry no information and drop out.
    """
    acc = sum(accepted)
    rejections = sum(1 for n, k in zip(accepted, proposed) if n < k)
    return acc / (acc + rejections) if acc + rejections else float("nan")


def loop_cost_bound(tokens: int, proposed: list[int], c: float, v: dict) -> float:
    """The speedup the measured loops allow: tokens made / their modelled cost in one-token target steps.

    Each loop costs k_i c + v(k_i) with k_i what the draft actually proposed (v(0) = 1). Unlike the i.i.d.
    prediction it takes the measured acceptance lengths as given, so measured / bound isolates overhead
    (Python, sampling, cache bookkeeping) from the draft's quality. v: {K: v(K)} covering every k_i.
    """
    cost = sum(k * c + (v[k] if k else 1.0) for k in proposed)
    return tokens / cost if cost else float("nan")
