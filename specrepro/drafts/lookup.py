"""Prompt lookup: a training-free draft that proposes what followed the context's last n-gram earlier."""
from __future__ import annotations

import torch

from .base import Draft


class LookupDraft(Draft):
    """Prompt lookup decoding: find the latest earlier occurrence of the context's last n tokens
    (n = max_ngram down to min_ngram) and propose what followed it.

    Proposals are deterministic, so each p row is one-hot on the proposed token: the rejection step
    accepts it with probability q(x) and otherwise samples from q without x, which is still exact.
    With no match it proposes nothing and the loop takes a plain target step.
    """

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1, context_window: int | None = None):
        super().__init__()
        if not _is_int(vocab_size) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an integer >= 1 (the target's vocabulary), got {vocab_size!r}")
        if not (_is_int(min_ngram) and _is_int(max_ngram)) or not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if context_window is not None and (not _is_int(context_window) or context_window < 1):
            raise ValueError(f"context_window must be an integer >= 1 or None, got {context_window!r}")
        self.vocab_size = vocab_size
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.context_window = context_window

    def propose(self, seq, k, sampling, generator=None, target_hidden=None):
        from .growing import one_hot_rows

        tokens = self.lookup(seq, k)
        return tokens, one_hot_rows(tokens.tolist(), self.vocab_size)

    def propose_tree(self, seq, spec, sampling, generator=None, target_hidden=None):
        """One branch per distinct continuation of the earlier matches of the longest matching n-gram
        (most recent match first), merged into a trie: at most spec.width children per node, spec.nodes in
        all. The tree is a function of the context alone, so its one-hot rows are what each token was
        "drawn" from (specrepro.algorithm.tree's rule for deterministic proposers)."""
        from ..algorithm.tree import Tree
        from .growing import one_hot_rows

        tree = Tree(self.vocab_size)
        budget = spec.nodes
        kids: dict[int, dict[int, int]] = {-1: {}}  # node -> {token: child}
        for cont in self.continuations(seq, spec.depth):
            if len(tree) >= budget:
                break
            node = -1
            for token in cont.tolist():
                child = kids[node].get(token)
                if child is None:
                    if len(kids[node]) >= spec.width or len(tree) >= budget:
                        break
                    child = tree.add(node, token, None, 1.0)  # rows below, in one allocation
                    kids[node][token] = child
                    kids[child] = {}
                node = child
        if len(tree):
            tree.rows = list(one_hot_rows(tree.tokens, self.vocab_size))
        return tree

    def continuations(self, seq: torch.Tensor, k: int) -> list[torch.Tensor]:
        """What followed each earlier match of the longest matching n-gram, most recent first (<= k each)."""
        n_seq = seq.shape[0]
        for n in range(min(self.max_ngram, n_seq - 1), self.min_ngram - 1, -1):
            windows = seq.unfold(0, n, 1)[:-1]
            hits = (windows == seq[-n:]).all(-1).nonzero().flatten().tolist()
            if hits:
                return [seq[h + n : h + n + k] for h in reversed(hits)]
        return []

    def lookup(self, seq: torch.Tensor, k: int) -> torch.Tensor:
        n_seq = seq.shape[0]
        for n in range(min(self.max_ngram, n_seq - 1), self.min_ngram - 1, -1):
            windows = seq.unfold(0, n, 1)[:-1]  # every earlier n-gram, excluding the suffix itself
            hits = (windows == seq[-n:]).all(-1).nonzero()
            if hits.numel():
                start = int(hits[-1]) + n  # the most recent match
                return seq[start : start + k]
        return seq.new_empty(0)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
