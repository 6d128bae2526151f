"""Deliberately wrong samplers, for demonstrating the chi-square test's power: never use them to generate.

Each function has the signature of `specrepro.speculative.rejection_step` (Algorithm 2, steps 3-4) and
gets swapped in for it (`rejection_step_replaced`, or monkeypatching in tests); the losslessness test must
reject every one of them. `no_bonus_token` is the control: slower, but still exact, so it must pass.
"""
from __future__ import annotations

import contextlib

import torch

from . import speculative
from .sampling import sample


@contextlib.contextmanager
def rejection_step_replaced(step):
    """Run speculative_generate with another rejection step (to show a wrong sampler failing)."""
    original = speculative.rejection_step
    speculative.rejection_step = step
    try:
        yield
    finally:
        speculative.rejection_step = original


def _accept(draft_tokens, p, q, generator):
    k = draft_tokens.shape[0]
    if k == 0:  # the last token of the budget is a plain target step
        return 0
    rows = torch.arange(k)
    r = torch.rand(k, generator=generator)
    rejected = (r * p[rows, draft_tokens] >= q[rows, draft_tokens]).nonzero()
    return int(rejected[0]) if rejected.numel() else k


def resample_from_q(draft_tokens, p, q, generator=None):
    """At a rejection, samples from q instead of the normalised (q - p)+."""
    n = _accept(draft_tokens, p, q, generator)
    return n, sample(q[n], generator)


def unnormalised_residual(draft_tokens, p, q, generator=None):
    """Inverse-CDF sampling from max(0, q - p) without dividing by its sum: the missing mass lands on
    the last token, as in a hand-written sampler that forgets to normalise."""
    n = _accept(draft_tokens, p, q, generator)
    if n == draft_tokens.shape[0]:
        return n, sample(q[n], generator)
    cdf = (q[n] - p[n]).clamp_min(0).cumsum(-1)
    u = torch.rand((), generator=generator)
    index = min(int((cdf <= u).sum()), q.shape[-1] - 1)
    return n, torch.tensor(index)


def bonus_off_by_one(draft_tokens, p, q, generator=None):
    """When all k drafts are kept, draws the bonus token from q[k - 1] instead of q[k]."""
    k = draft_tokens.shape[0]
    n = _accept(draft_tokens, p, q, generator)
    if n == k:
        return n, sample(q[max(k - 1, 0)], generator)
    residual = (q[n] - p[n]).clamp_min(0)
    return n, sample(residual / residual.sum(), generator)


def accept_ratio_inverted(draft_tokens, p, q, generator=None):
    """Accepts with min(1, p/q) instead of min(1, q/p)."""
    return _correct_after(draft_tokens, p, q, generator, invert=True)


def no_bonus_token(draft_tokens, p, q, generator=None):
    """Emits nothing extra when all k drafts are kept. NOT wrong: each kept token is still an exact
    sample from q, only fewer tokens come per target call. The harness must accept it."""
    k = draft_tokens.shape[0]
    n = _accept(draft_tokens, p, q, generator)
    if n == k and k > 0:
        return k - 1, draft_tokens[k - 1]  # the k-th draft becomes the loop's last token
    if n == k:
        return n, sample(q[n], generator)
    residual = (q[n] - p[n]).clamp_min(0)
    return n, sample(residual / residual.sum(), generator)


def _correct_after(draft_tokens, p, q, generator, invert):
    k = draft_tokens.shape[0]
    if k == 0:
        return 0, sample(q[0], generator)
    rows = torch.arange(k)
    num, den = (p, q) if invert else (q, p)
    r = torch.rand(k, generator=generator)
    rejected = (r * den[rows, draft_tokens] >= num[rows, draft_tokens]).nonzero()
    n = int(rejected[0]) if rejected.numel() else k
    if n == k:
        return n, sample(q[n], generator)
    residual = (q[n] - p[n]).clamp_min(0)
    if residual.sum() <= 0:
        return n, sample(q[n], generator)
    return n, sample(residual / residual.sum(), generator)
