"""The datastore draft: training-free proposals from text the target itself wrote, and from the live context.

The idea of REST, SuffixDecoding and SAM-decoding: keep an index of token sequences, find the longest
suffix of the context that occurs in them, and propose what most often followed it. Here the sequences are
the target's own greedy continuations of training prompts (news train articles, CPython stdlib functions;
specrepro.drafts.datastore_build writes them, artifacts/drafts/datastore/ ships them) plus the live
context itself, where prompt lookup's matches are.

Where the proposals come from: the context's longest earlier match of its last n tokens (n from max_ngram
down to context_min_ngram) if there is one, else the datastore's longest match (n down to min_ngram), else
the context's shorter matches. The rows of all occurrences of that suffix with the tokens that followed
them form a count trie: a node's children are the distinct tokens that followed its path, with counts.

What each token's row is (specrepro.algorithm.tree: a node's child must be a draw from the row it carries):
- greedy (temperature 0): the most frequent continuations, deterministic given the context, so one-hot
  rows (as prompt lookup's);
- temperature > 0: p = the continuation frequencies at that node, counts ** (1 / sharpen) normalised over
  the tokens seen (one-hot where one token was seen); a chain samples each token from its node's p, a tree
  draws a node's children without replacement from it (growing.draw_children), each carrying the row it
  was drawn from. The rejection step then accepts with min(1, q/p) and the chance of acceptance is
  1 - TV(p, q) instead of a one-hot row's q(x).
Which nodes get children, and how many, is decided before those children are drawn (by the counts and
cumulative frequency of nodes drawn earlier), as the tree proof requires.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import torch

from ..algorithm.tree import Tree, TreeSpec
from .base import Draft
from .growing import draw_children, zero_rows

SEP = -1  # between sequences in the stream: no n-gram or continuation crosses it
_MULT = np.int64(0x9E3779B97F4A7C15 - (1 << 64))  # odd 64-bit multiplier of the rolling n-gram hash


def shipped_tokens() -> Path:
    """The token file shipped with the repository (artifacts/drafts/datastore/tokens.jsonl.gz)."""
    from .shipped import shipped_root

    return shipped_root() / "datastore" / "tokens.jsonl.gz"


def read_sequences(path: str | Path) -> list[list[int]]:
    """The token sequences of a build file (.jsonl or .jsonl.gz; records with "tail" and "tokens"): each
    the last prompt tokens followed by what the target wrote."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no datastore token file at {path}: build one with specrepro-drafts datastore build")
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                seq = list(record["tail"]) + list(record["tokens"])
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{path} line {i + 1} is not a datastore record ({err})") from None
            if record["tokens"]:
                out.append(seq)
    return out


class Datastore:
    """A suffix index over token sequences: every n-gram (n = 1..max_ngram) to the stream positions after it.

    Built with numpy in one pass per n (a rolling hash, sorted; lookups by binary search, checked against
    the tokens), so tens of thousands of tokens index in well under a second.
    """

    def __init__(self, sequences: list[list[int]], max_ngram: int = 8, vocab_size: int | None = None):
        if not isinstance(max_ngram, int) or max_ngram < 1:
            raise ValueError(f"max_ngram must be an integer >= 1, got {max_ngram!r}")
        flat = [t for s in sequences for t in s]
        if any(not isinstance(t, (int, np.integer)) or t < 0 for t in flat):
            raise ValueError("datastore sequences must hold token ids >= 0")
        if vocab_size is not None and flat and max(flat) >= vocab_size:
            raise ValueError(f"datastore token id {max(flat)} is outside the vocabulary of {vocab_size} tokens")
        self.max_ngram = max_ngram
        self.n_sequences = sum(1 for s in sequences if s)
        self.n_tokens = len(flat)
        parts = []
        for s in sequences:
            if s:
                parts += [np.asarray(s, dtype=np.int64), np.array([SEP], dtype=np.int64)]
        stream = np.concatenate(parts) if parts else np.array([SEP], dtype=np.int64)
        self.stream = np.concatenate([stream, np.full(32, SEP, dtype=np.int64)])  # room for any depth
        self.keys, self.ends = [], []
        h = np.zeros(len(self.stream), dtype=np.int64)
        ok = None
        with np.errstate(over="ignore"):
            for n in range(1, max_ngram + 1):
                # h[e] = hash of stream[e - n + 1 .. e]; the n-gram ending at e is followed by stream[e + 1]
                shifted = np.concatenate([[0], h[:-1]])
                h = shifted * _MULT + self.stream + 1
                # ok[e]: stream[e - n + 1 .. e] holds no SEP (and starts inside the stream)
                ok = self.stream != SEP if n == 1 else np.concatenate([[False], ok[:-1]]) & (self.stream != SEP)
                ends = np.nonzero(ok[:-1] & (self.stream[1:] != SEP))[0]
                order = np.argsort(h[ends], kind="stable")
                self.keys.append(h[ends][order])
                self.ends.append(ends[order])

    @classmethod
    def from_file(cls, path: str | Path, max_ngram: int = 8, vocab_size: int | None = None) -> "Datastore":
        return cls(read_sequences(path), max_ngram, vocab_size)

    def matches(self, suffix: np.ndarray) -> np.ndarray:
        """Stream positions of the last token of every occurrence of `suffix` (followed by a token)."""
        n = len(suffix)
        if not 1 <= n <= self.max_ngram:
            return np.empty(0, dtype=np.int64)
        h = np.int64(0)
        with np.errstate(over="ignore"):
            for t in suffix:
                h = h * _MULT + np.int64(t) + np.int64(1)
        keys = self.keys[n - 1]
        lo, hi = np.searchsorted(keys, h, "left"), np.searchsorted(keys, h, "right")
        ends = self.ends[n - 1][lo:hi]
        if len(ends):  # hash collisions: keep the true occurrences
            window = self.stream[ends[:, None] + np.arange(-n + 1, 1)]
            ends = ends[(window == suffix).all(1)]
        return ends

    def continuations(self, seq: np.ndarray, depth: int, min_ngram: int = 1) -> tuple[int, np.ndarray]:
        """(n, rows): the longest suffix of seq (n >= min_ngram) found here, and [m, depth] what followed each
        occurrence (SEP past a sequence's end). (0, empty) without a match."""
        for n in range(min(self.max_ngram, len(seq)), min_ngram - 1, -1):
            ends = self.matches(seq[-n:])
            if len(ends):
                return n, _cut_at_sep(self.stream[ends[:, None] + np.arange(1, depth + 1)])
        return 0, np.empty((0, depth), dtype=np.int64)


def context_continuations(seq: np.ndarray, depth: int, max_ngram: int, min_ngram: int) -> tuple[int, np.ndarray]:
    """Prompt lookup's matches as count rows: the longest n (max_ngram down to min_ngram) whose last n tokens
    occurred earlier in seq, and [m, depth] what followed each earlier occurrence (SEP past seq's end).

    One pass over the context finds where its last token occurred before; each longer n keeps the ends whose
    previous token matches too, so a step costs one comparison over the context plus the (few) candidates."""
    padded = np.concatenate([seq, np.full(depth, SEP, dtype=np.int64)])
    top = min(max_ngram, len(seq) - 1)
    if top < max(min_ngram, 1):
        return 0, np.empty((0, depth), dtype=np.int64)
    ends = np.nonzero(seq[:-1] == seq[-1])[0]  # earlier occurrences of the 1-gram, by where they end
    best = None
    for n in range(1, top + 1):
        if n > 1:
            ends = ends[ends >= n - 1]
            ends = ends[seq[ends - (n - 1)] == seq[-n]]
        if not len(ends):
            break
        if n >= min_ngram:
            best = (n, ends)
    if best is None:
        return 0, np.empty((0, depth), dtype=np.int64)
    n, ends = best
    return n, padded[ends[:, None] + 1 + np.arange(depth)]


def _cut_at_sep(rows: np.ndarray) -> np.ndarray:
    """Rows with everything from their first SEP on set to SEP (a continuation ends with its sequence)."""
    rows[np.cumsum(rows == SEP, axis=1) > 0] = SEP
    return rows


class DatastoreDraft(Draft):
    """Proposals from a Datastore and the live context (the module docstring says how and why it is exact).

    max_ngram / min_ngram: the datastore suffix lengths tried, longest first; context_min_ngram: the shortest
    context match preferred over the datastore (prompt lookup's). sharpen: at temperature > 0, p is
    counts ** (1 / sharpen) normalised (1: the plain frequencies; smaller: closer to the most frequent).
    max_rows: at most this many occurrences are counted (the latest), bounding a draft step's cost.
    """

    def __init__(self, store: Datastore, vocab_size: int, max_ngram: int = 8, min_ngram: int = 1,
                 context_max_ngram: int = 8, context_min_ngram: int = 2, sharpen: float = 1.0,
                 max_rows: int = 4096, context_window: int | None = None):
        super().__init__()
        if not isinstance(store, Datastore):
            raise TypeError(f"store must be a specrepro.drafts.datastore.Datastore, got {type(store).__name__}")
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an integer >= 1 (the target's vocabulary), got {vocab_size!r}")
        for name, lo, hi in (("min_ngram", min_ngram, max_ngram), ("context_min_ngram", context_min_ngram,
                                                                   context_max_ngram)):
            if not (isinstance(lo, int) and isinstance(hi, int)) or not 1 <= lo <= hi:
                raise ValueError(f"need 1 <= {name} <= its max, got {lo}, {hi}")
        if not isinstance(sharpen, (int, float)) or not sharpen > 0:
            raise ValueError(f"sharpen must be a number > 0, got {sharpen!r}")
        if not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"max_rows must be an integer >= 1, got {max_rows!r}")
        self.store, self.vocab_size, self.context_window = store, vocab_size, context_window
        self.max_ngram, self.min_ngram = min(max_ngram, store.max_ngram), min_ngram
        self.context_max_ngram, self.context_min_ngram = context_max_ngram, context_min_ngram
        self.sharpen, self.max_rows = float(sharpen), max_rows
        self.sources = {"context": 0, "datastore": 0, "none": 0}  # where each proposal came from

    def rows(self, seq: torch.Tensor, depth: int) -> np.ndarray:
        """[m, depth] continuation rows of the chosen suffix (see the module docstring), latest last."""
        ids = seq.detach().cpu().numpy().astype(np.int64)
        n, rows = context_continuations(ids, depth, self.context_max_ngram, self.context_min_ngram)
        source = "context"
        if not n:
            n, rows = self.store.continuations(ids, depth, self.min_ngram)
            source = "datastore"
        if not n:
            n, rows = context_continuations(ids, depth, self.context_min_ngram - 1, 1) if self.context_min_ngram > 1 \
                else (0, rows)
            source = "context"
        self.sources[source if n else "none"] += 1
        return rows[-self.max_rows:]

    def node_p(self, column: np.ndarray) -> tuple[list[int], torch.Tensor] | None:
        """(tokens by count, most first, ties by id; p over those tokens, float32) from one trie node's
        next-token column; None where no row continues."""
        column = column[column != SEP]
        if not len(column):
            return None
        tokens, counts = np.unique(column, return_counts=True)
        order = np.lexsort((tokens, -counts))
        weights = counts[order].astype(np.float64) ** (1.0 / self.sharpen)
        return tokens[order].tolist(), torch.from_numpy(weights / weights.sum()).float()

    def propose(self, seq, k, sampling, generator=None, target_hidden=None):
        tokens, rows = self.grow(seq, TreeSpec(1, k), sampling, generator)[:2]
        return torch.tensor(tokens, dtype=torch.long), rows

    def propose_tree(self, seq, spec, sampling, generator=None, target_hidden=None):
        """A tree of the most frequent (greedy) or sampled (temperature > 0) continuations, level by level: the
        `width` nodes of a level with the highest cumulative frequency are expanded, each with up to `width`
        children, within spec.nodes (one node per deeper level kept in reserve, as growing.grow does)."""
        tree = self.grow(seq, spec, sampling, generator)[2]
        return tree

    def grow(self, seq, spec, sampling, generator=None):
        """(tokens, rows [N, V], tree) of the proposal in level order (see propose_tree). The rows are built
        once at the end from each node's row over its support (a [V] tensor per node would cost more than
        the search on a 49k vocabulary)."""
        tree = Tree(self.vocab_size)
        rows = self.rows(seq, spec.depth)
        small = []  # per node: (support tokens, the row over them)
        members = {-1: np.arange(len(rows))}  # node -> the rows whose path starts with the node's path
        frontier, budget = [-1], spec.nodes
        for level in range(spec.depth if len(rows) else 0):
            if level > 0:
                frontier = sorted(frontier, key=lambda i: -tree.scores[i])[: spec.width]
            new = []
            level_budget = budget - len(tree) - (spec.depth - level - 1)
            for node in frontier:
                m = min(spec.width, level_budget - len(new))
                if m <= 0:
                    break
                column = rows[members[node], level]
                found = self.node_p(column)
                if found is None:
                    continue
                support, p = found
                picks, node_rows = self.children_of(p, min(m, len(support)), sampling.greedy, generator)
                base = 1.0 if node < 0 else tree.scores[node]
                for i, r in zip(picks, node_rows):
                    child = tree.add(node, support[i], None, base * float(p[i]))
                    small.append((support, r))
                    members[child] = members[node][column == support[i]]
                    new.append(child)
            if not new:
                break
            frontier = new
        full = zero_rows(len(tree), self.vocab_size)
        for row, (support, r) in zip(full, small):
            row[torch.tensor(support)] = r
        tree.rows = list(full)
        return tree.tokens, full, tree

    def children_of(self, p: torch.Tensor, m: int, greedy: bool, generator=None):
        """A node's m children as indices into its support (ranked by count) and the row over the support each
        was drawn from: greedy, the m most frequent (one-hot rows); else m draws without replacement from the
        frequencies p (growing.draw_children)."""
        if greedy:
            return list(range(m)), list(torch.eye(len(p))[:m])
        return draw_children(p, m, generator)


def load_datastore_draft(target, path: str | Path | None = None, target_name: str | None = None,
                         **kw) -> DatastoreDraft:
    """The datastore draft for `target` (a model or runner) over the shipped token file (or `path`, a build
    file). The shipped file's manifest.json names the target that wrote it: another target is refused
    (its tokenizer's ids would mean other text)."""
    from ..engines.runners import context_window, vocab_size

    if path is None:
        path = shipped_tokens()
        manifest = path.parent / "manifest.json"
        wrote = json.loads(manifest.read_text())["target"] if manifest.exists() else None
        if target_name is not None and wrote is not None and wrote != target_name:
            raise ValueError(f"the shipped datastore was written by {wrote!r}, not {target_name!r}: build one "
                             "for this target with specrepro-drafts datastore build and pass its path")
    vocab = vocab_size(target)
    store = Datastore.from_file(path, max_ngram=kw.get("max_ngram", 8), vocab_size=vocab)
    return DatastoreDraft(store, vocab, context_window=context_window(target), **kw)
