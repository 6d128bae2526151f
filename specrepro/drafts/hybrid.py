"""Prompt lookup first, a model draft where the context has no match.

Prompt lookup costs almost nothing but proposes only when the context's last n-gram occurred before
(copying spans of a summarised article, repeated identifiers in code); elsewhere it proposes nothing and
the loop is a plain target step. A hybrid hands those loops to a model draft instead.
"""
from __future__ import annotations

from .base import Draft, as_draft
from .lookup import LookupDraft


class HybridDraft(Draft):
    """Propose the lookup's continuation when the context has an n-gram match, else the fallback's.

    The choice is a function of the context alone (never of the target's output), and each proposal's
    p rows are the distribution its tokens were drawn from (one-hot for lookup), so the rejection step
    stays exact. The fallback keeps its own cache and catches up on the tokens lookup loops added when it
    is next called. fallback_k caps the fallback's lookahead (None: the loop's K). lookup_loops and
    fallback_loops count the proposals each made since construction (reset() keeps them).
    """

    def __init__(self, fallback, lookup: LookupDraft | None = None, fallback_k: int | None = None):
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
        self.lookup_loops = self.fallback_loops = 0

    def reset(self) -> None:
        super().reset()
        self.fallback.reset()

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
        """The lookup's tree where the context has a match, else the fallback's (its chain if it cannot branch,
        which specrepro.tree allows only at width 1)."""
        from ..tree import check_can_branch, propose

        tree = self.lookup.propose_tree(seq, spec, sampling, generator)
        if len(tree):
            self.lookup_loops += 1
            return tree
        check_can_branch(self.fallback, spec)
        self.fallback_loops += 1
        before = self.fallback.calls
        out = propose(self.fallback, seq, spec, sampling, generator, target_hidden)
        self.calls += self.fallback.calls - before
        return out
