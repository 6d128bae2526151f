"""Growing a token tree from a draft: which nodes get children, how many, and how they are drawn.

Used by every draft that can branch (model, feature, heads, hybrid and lookup drafts). What verification
requires of a tree, and why it is then exactly lossless, is in specrepro.algorithm.tree: each child must be
a draw from the row it carries, given its earlier siblings, and which nodes are expanded must be decided
before their children are drawn.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..algorithm.sampling import SamplingConfig, sample
from ..algorithm.tree import Tree, TreeSpec


def draw_children(p: torch.Tensor, m: int, generator: torch.Generator | None = None):
    """m tokens drawn WITHOUT replacement from p, one at a time (fewer if p has fewer nonzero entries).

    Returns (tokens, rows): rows[i] is p without tokens[:i], renormalised: what tokens[i] was drawn from.
    For m == 1 this is `sample(p)`, the chain's draw.
    """
    tokens, rows = [], []
    current = p
    for _ in range(m):
        token = int(sample(current, generator))
        tokens.append(token)
        rows.append(current)
        rest = current.clone()
        rest[token] = 0
        total = rest.sum()
        if total <= 0:
            break
        current = rest / total
    return tokens, rows


def top_children(logits: torch.Tensor, m: int):
    """Greedy drafting: the m likeliest tokens (fewer where the draft gives the rest no mass), one-hot rows."""
    probs = logits.float().softmax(-1)
    m = min(m, int((probs > 0).sum()))
    tokens = probs.topk(m).indices.tolist()
    return tokens, list(one_hot_rows(tokens, logits.shape[-1], logits.device))


def zero_rows(n: int, vocab_size: int, device=None) -> torch.Tensor:
    """[n, V] float32 zeros for a draft's rows. On the CPU they come from calloc (numpy): torch.zeros fills a
    tensor this size with a parallel loop whose thread wake-ups cost 0.3-1.5 ms while the target's threads
    hold the cores, more than a whole cheap draft step; calloc's pages are zero already."""
    if device is None or torch.device(device).type == "cpu":
        return torch.from_numpy(np.zeros((n, vocab_size), dtype=np.float32))
    return torch.zeros(n, vocab_size, device=device)


def one_hot_rows(tokens: list[int], vocab_size: int, device=None) -> torch.Tensor:
    """[len(tokens), V] float32 one-hot rows (F.one_hot would build an int64 table first: 3x the memory),
    on `device` (default the CPU): a draft's rows stay beside its other rows, on its device."""
    rows = zero_rows(len(tokens), vocab_size, device)
    rows[torch.arange(len(tokens), device=device), torch.tensor(tokens, dtype=torch.long, device=device)] = 1.0
    return rows


def without(p: torch.Tensor, tokens: list[int]) -> torch.Tensor | None:
    """p with `tokens` removed, renormalised (None if nothing is left)."""
    if not tokens:
        return p
    rest = p.clone()
    rest[torch.tensor(tokens, dtype=torch.long)] = 0
    total = rest.sum()
    return rest / total if total > 0 else None


def draft_children(probs: torch.Tensor, forced: list[int], m: int, greedy: bool, generator=None):
    """The draft's m children of a node whose first children are the `forced` tokens: drawn (or, greedy, the
    likeliest) from the draft distribution without the forced tokens; rows: what each was drawn from."""
    rest = without(probs, forced)
    if rest is None or m <= 0:
        return [], []
    if greedy:
        m = min(m, int((rest > 0).sum()))
        tokens = rest.topk(m).indices.tolist()
        return tokens, list(one_hot_rows(tokens, probs.shape[-1], probs.device))
    return draw_children(rest, m, generator)


def grow(spec: TreeSpec, sampling: SamplingConfig, generator, root_logits: torch.Tensor, next_logits,
         seed: dict[tuple, list[int]] | None = None, children: Callable = draft_children) -> Tree:
    """Build a tree level by level from a draft that gives logits after any node.

    root_logits: [V] the draft's logits after the context. next_logits(tree, nodes) -> [len(nodes), V]:
    its logits after each of `nodes` (one batched draft pass per level). Which nodes are expanded, and how
    many children each gets, is decided before their children are drawn (see the module docstring).

    seed (a hybrid draft's other proposer, e.g. prompt lookup's trie): path tokens -> tokens that an
    expanded node with that path gets as its FIRST children, one-hot rows (a function of the context alone,
    as for any deterministic proposer), scored as certain; the draft's own children follow, drawn from its
    distribution without those tokens (`draft_children`), so each child is still a draw from its row.
    children: how a node's sampled children are drawn (`draft_children`; a draft's `children` attribute, which
    only the experiments' deliberately wrong drafts change).
    """
    tree = Tree(root_logits.shape[-1])
    budget = spec.nodes
    seed = seed or {}
    paths: dict[int, tuple] = {-1: ()}
    frontier, logits = [-1], root_logits.view(1, -1)
    for level in range(spec.depth):
        if level > 0:
            # the `width` best nodes of the last level by cumulative draft probability (stable on ties)
            frontier = sorted(frontier, key=lambda i: -tree.scores[i])[: spec.width]
            logits = next_logits(tree, frontier)
        new = []
        # one node of the budget stays reserved for each deeper level, so that the tree reaches its depth
        level_budget = budget - len(tree) - (spec.depth - level - 1)
        for node, row in zip(frontier, logits):
            m = min(spec.width, level_budget - len(new))
            if m <= 0:
                break
            base = 1.0 if node < 0 else tree.scores[node]
            forced = list(dict.fromkeys(seed.get(paths[node], [])))[:m]
            kids = [tree.add(node, t, r, base) for t, r in zip(forced, one_hot_rows(forced, tree.vocab_size, row.device))]
            if not forced and sampling.greedy:
                tokens, rows = top_children(row, m)
                probs = row.float().softmax(-1)
            else:
                probs = row.float().softmax(-1) if sampling.greedy else sampling.probs(row)
                tokens, rows = children(probs, forced, m - len(forced), sampling.greedy, generator)
            kids += [tree.add(node, t, r, base * float(probs[t])) for t, r in zip(tokens, rows)]
            for k in kids:
                paths[k] = paths[node] + (tree.tokens[k],)
            new += kids
        if not new:
            break
        frontier = new
    return tree


