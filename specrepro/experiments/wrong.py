"""Deliberately wrong samplers, for demonstrating the chi-square tests' power: never use them to generate.

The chain rules have the signature of `specrepro.algorithm.speculative.rejection_step` (Algorithm 2, steps
3-4) and run through `speculative_generate(..., _rules=chain_rules(rule))`; the losslessness test must reject
every one of them. `no_bonus_token` is the control: slower, but still exact, so it must pass. The tree
rules replace `specrepro.algorithm.tree.accept` (`_rules=tree_rules(rule)`), and the wrong child draws replace a
draft's `children` (specrepro.drafts.growing.draft_children) on that draft object alone.
"""
from __future__ import annotations

import torch

from ..algorithm.sampling import sample
from ..algorithm.speculative import Rules
from ..drafts.growing import draw_children, without


def chain_rules(step) -> Rules:
    """The rules of a run whose chain rejection step is `step`."""
    return Rules(rejection_step=step)


def tree_rules(accept) -> Rules:
    """The rules of a run whose tree acceptance walk is `accept`."""
    return Rules(tree_accept=accept)


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


# --- wrong multi-candidate rules for token trees (specrepro.algorithm.tree) ------------------------------------
# Each has the signature of specrepro.algorithm.tree.accept (run with `_rules=tree_rules(rule)`); the first goes with
# a drafting step that samples children with replacement. The tree losslessness test must reject each.

def children_with_replacement(probs, forced, m, greedy, generator=None):
    """A node's children drawn independently from the draft distribution without the forced tokens
    (duplicates possible), each row that distribution itself: the signature of growing.draft_children."""
    rest = without(probs, forced)
    if rest is None or m <= 0:
        return [], []
    tokens = [int(sample(rest, generator)) for _ in range(m)]
    return tokens, [rest] * m


def _walk(tree, q, generator, child_test):
    """The walk of the correct rule with another test per child: child_test(q, r, row, first_row, x, u) ->
    (accepted, next r). Returns (path, the last r)."""
    children = tree.children()
    u = torch.rand(len(tree), generator=generator)
    path, node = [], -1
    while True:
        r = q[node + 1]
        kids = children[node]
        for c in kids:
            ok, r = child_test(q[node + 1], r, tree.rows[c], tree.rows[kids[0]], tree.tokens[c], u[c])
            if ok:
                path.append(c)
                node = c
                break
        else:
            return path, r


def _norm(x, fallback):
    total = x.sum()
    return x / total if total > 0 else fallback


def tree_unchanged_target(tree, q, generator=None, greedy=False):
    """Every child tested against the unchanged target, min(1, q/p), with p the draft distribution; after
    all are rejected, one sample from (q - p)+ (the chain's rule applied to each child independently).
    Run with draw_with_replacement."""
    def test(q0, r, row, first, x, u):
        return bool(u * first[x] < q0[x]), _norm((q0 - first).clamp_min(0), q0)
    path, r = _walk(tree, q, generator, test)
    return path, sample(r, generator)


def tree_residual_not_updated(tree, q, generator=None, greedy=False):
    """Rejected children do not update the residual: every child is tested against q; q at the end."""
    def test(q0, r, row, first, x, u):
        return bool(u * row[x] < q0[x]), q0
    path, r = _walk(tree, q, generator, test)
    return path, sample(r, generator)


def tree_siblings_not_removed(tree, q, generator=None, greedy=False):
    """Later children use the draft's full distribution (the first child's row) in the ratio and the
    residual, as if the rejected siblings were still in it."""
    def test(q0, r, row, first, x, u):
        if u * first[x] < r[x]:
            return True, r
        return False, _norm((r - first).clamp_min(0), r)
    path, r = _walk(tree, q, generator, test)
    return path, sample(r, generator)


def tree_fallback_to_q(tree, q, generator=None, greedy=False):
    """The correct tests and residual updates, but after all children are rejected a sample from q
    instead of the final residual."""
    def test(q0, r, row, first, x, u):
        if u * row[x] < r[x]:
            return True, r
        return False, _norm((r - row).clamp_min(0), r)
    path, _ = _walk(tree, q, generator, test)
    return path, sample(q[(path[-1] if path else -1) + 1], generator)


# --- a wrong merged (hybrid) tree: the draft's children beside the forced lookup tokens -----------------------

def seeded_rows_keep_forced(probs, forced, m, greedy, generator=None):
    """Children drawn from the draft without the forced tokens, as they should be, but each row says the
    full draft distribution (forced tokens and earlier siblings still in it): x_i is not a draw from its row.
    The signature of growing.draft_children: give it to a draft as its `children`."""
    rest = without(probs, forced)
    if rest is None or m <= 0:
        return [], []
    tokens, _ = draw_children(rest, m, generator)
    return tokens, [probs] * len(tokens)
