"""A near-free proposer first, a model draft where it has nothing to propose.

Prompt lookup costs almost nothing but proposes only when the context's last n-gram occurred before
(copying spans of a summarised article, repeated identifiers in code); elsewhere it proposes nothing and
the loop is a plain target step. A hybrid hands those loops to a model draft instead. The first proposer may
also be a datastore draft with `min_accept` (spec "datastore+<spec>"): it proposes where its match is
confident (the estimated acceptance of its first token reaches min_accept), the trained draft elsewhere.
"""
from __future__ import annotations

from .base import Draft, as_draft
from .lookup import LookupDraft


class HybridDraft(Draft):
    """Propose the lookup's continuation when the context has an n-gram match, else the fallback's.

    lookup: the first proposer, a LookupDraft (default) or a DatastoreDraft; it must decide whether to
    propose from the context alone (both do), so that the choice never depends on a draw.

    The choice is a function of the context alone (never of the target's output), and each proposal's
    p rows are the distribution its tokens were drawn from (one-hot for lookup), so the rejection step
    stays exact. The fallback keeps its own cache and catches up on the tokens lookup loops added when it
    is next called. fallback_k caps the fallback's lookahead (None: the loop's K). lookup_loops and
    fallback_loops count the proposals each made since construction (reset() keeps them); with token
    trees, merge_trees puts both in one tree (see propose_tree), counted in lookup_loops and merged_loops.
    """

    def __init__(self, fallback, lookup: Draft | None = None, fallback_k: int | None = None,
                 merge_trees: bool = True):
        super().__init__()
        self.fallback = as_draft(fallback)
        self.vocab_size = self.fallback.vocab_size
        self.context_window = getattr(self.fallback, "context_window", None)
        self.lookup = lookup or LookupDraft(self.vocab_size, context_window=self.context_window)
        if self.lookup.vocab_size != self.vocab_size:
            raise ValueError(f"lookup vocabulary {self.lookup.vocab_size} != fallback vocabulary {self.vocab_size}")
        if fallback_k is not None and (not isinstance(fallback_k, int) or fallback_k < 1):
            raise ValueError(f"fallback_k must be an integer >= 1 or None, got {fallback_k!r}")
        self.fallback_k = fallback_k
        self.wants_target_hidden = self.fallback.wants_target_hidden
        self.merge_trees = bool(merge_trees)
        self.lookup_loops = self.fallback_loops = self.merged_loops = 0

    def offer_pass_costs(self, costs) -> None:
        self.lookup.offer_pass_costs(costs)
        self.fallback.offer_pass_costs(costs)

    def reset(self) -> None:
        super().reset()
        self.fallback.reset()

    def fit_vocab(self, target_vocab: int) -> None:
        """Fit both proposers to a target whose vocabulary differs from the fallback's only in padding rows
        (ModelDraft.fit_vocab says when that holds); any other difference is the fallback's error."""
        if target_vocab == self.vocab_size:
            return
        if not hasattr(self.fallback, "fit_vocab"):
            raise ValueError(f"draft and target vocabularies differ ({self.vocab_size} vs {target_vocab} tokens): "
                             "the draft must use the target's tokenizer")
        self.fallback.fit_vocab(target_vocab)
        self.vocab_size = self.lookup.vocab_size = self.fallback.vocab_size

    def propose(self, seq, k, sampling, generator=None, target_hidden=None):
        tokens, p = self.lookup.propose(seq, k, sampling, generator)
        if tokens.numel():
            self.lookup_loops += 1
            return tokens, p
        self.fallback_loops += 1
        before = self.fallback.calls
        out = self.fallback.propose(seq, min(k, self.fallback_k or k), sampling, generator, target_hidden)
        self.calls += self.fallback.calls - before
        return out

    def propose_tree(self, seq, spec, sampling, generator=None, target_hidden=None):
        """One tree from both proposers (merge_trees, the default): the lookup's trie gives each expanded
        node on its branches its first children (one-hot rows), and the fallback draft adds its own children
        beside them, drawn from its distribution without the lookup's tokens (growing.grow's seed), in the
        same node budget: when the copied continuation is wrong at some depth, the draft's candidates are
        there. Without a lookup match this is the fallback's tree. merge_trees=False: the lookup's tree
        where the context has a match, else the fallback's (the chain's either/or). A fallback that cannot
        branch gives its chain, which specrepro.algorithm.tree allows only at width 1."""
        from ..algorithm.tree import check_can_branch, propose

        lookup = self.lookup.propose_tree(seq, spec, sampling, generator)
        if len(lookup) and not (self.merge_trees and _can_seed(self.fallback)):
            self.lookup_loops += 1
            return lookup
        check_can_branch(self.fallback, spec)
        before = self.fallback.calls
        if len(lookup) and self.merge_trees:
            self.lookup_loops += 1
            self.merged_loops += 1
            out = self.fallback.propose_tree(seq, spec, sampling, generator, target_hidden, seed=trie(lookup))
        else:
            self.fallback_loops += 1
            out = propose(self.fallback, seq, spec, sampling, generator, target_hidden)
        self.calls += self.fallback.calls - before
        return out


def trie(tree) -> dict[tuple, list[int]]:
    """A tree's children by path: (tokens from the root) -> the tokens of that node's children, in order."""
    out: dict[tuple, list[int]] = {}
    paths: dict[int, tuple] = {-1: ()}
    for i, (parent, token) in enumerate(zip(tree.parents, tree.tokens)):
        out.setdefault(paths[parent], []).append(token)
        paths[i] = paths[parent] + (token,)
    return out


def _can_seed(draft) -> bool:
    """Whether the draft's propose_tree takes a seed (the model drafts built on growing.grow)."""
    import inspect

    fn = getattr(draft, "propose_tree", None)
    return fn is not None and "seed" in inspect.signature(fn).parameters
