"""The datastore draft: training-free proposals from text the target itself wrote, and from the live context.

The idea of REST, SuffixDecoding and SAM-decoding: keep an index of token sequences, find the longest
suffix of the context that occurs in them, and propose what most often followed it. Here the sequences are
the target's own greedy continuations of training prompts (news train articles, CPython stdlib functions;
specrepro.training.datastore_build writes them, artifacts/drafts/datastore/ ships them) plus the live
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

The stop rule (optional: pass_costs, the target's measured v(n) = a pass over n + 1 tokens / a one-token
pass): a chain of L tokens whose first i are all accepted with probability a_i yields 1 + a_1 + ... + a_L
tokens per target call for a cost of v(L) one-token passes (the draft's own cost is ~0 here). The chain
grows while one more token raises (1 + sum a_i) / v(L) and stops at the first length where it does not; a
tree the same way level by level, a level's nodes added or none, with v of the node count. a_i is the
product of per-token estimates, count / (total + pseudo_count) at each node (the pseudo-count keeps a
single occurrence from counting as certain), where count is that of the node's rank-th most frequent
token for its rank-th child. Greedy, the child is that token, so this estimates q(x) by the frequency; at
temperature > 0 a token drawn from p is accepted with probability sum_x min(p, q), which needs q: the same
top frequencies stand in for it (p's top mass, which sum min(p, q) reaches when q agrees with the
datastore's most frequent continuation). Each decision uses only counts of nodes already in the proposal
and of the node about to get children, never the token about to be drawn, so a drawn token is still a
draw from its row and the shorter proposal stays exact.
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

# The stop rule's alpha (DatastoreDraft.pseudo_count), chosen on prompts the datastore was not written from:
# 10 CPython stdlib functions outside it and 10 news train articles each left out of the store, K = 4, 64
# tokens, bfloat16. Predicted SpS/ArS (tau / mean v of the proposed lengths, native bfloat16 2-thread v)
# averaged over news and code, greedy and T = 1 nucleus: no rule 1.17, alpha 0.5 1.30, 1 1.30, 2 1.30, 4 1.22.
PSEUDO_COUNT = 1.0
SEP = -1  # between sequences in the stream: no n-gram or continuation crosses it
_MULT = np.int64(0x9E3779B97F4A7C15 - (1 << 64))  # odd 64-bit multiplier of the rolling n-gram hash


def shipped_tokens() -> Path:
    """The token file shipped with the repository (artifacts/drafts/datastore/tokens.jsonl.gz)."""
    from .shipped import shipped_root

    return shipped_root() / "datastore" / "tokens.jsonl.gz"


def shipped_writer() -> str | None:
    """The target that wrote the shipped token file, as its manifest.json names it (None without one)."""
    manifest = shipped_tokens().parent / "manifest.json"
    return json.loads(manifest.read_text())["target"] if manifest.exists() else None


def written_token_counts(target_name: str, vocab: int, path: str | Path | None = None) -> torch.Tensor:
    """[vocab] counts of each token in the text the target wrote for the datastore (the shipped token file,
    or `path`): a frequency ranking of what this target emits, for cutting a trained draft's head to its most
    frequent tokens. The shipped file serves only the target that wrote it (its manifest names it)."""
    if path is None:
        path, wrote = shipped_tokens(), shipped_writer()
        if wrote != target_name:
            raise ValueError(f"the shipped datastore text was written by {wrote!r}, not {target_name!r}: pass "
                             "token_counts (how often the target emits each token) to rank its head")
    flat = [t for s in read_sequences(path) for t in s]
    if flat and max(flat) >= vocab:
        raise ValueError(f"token id {max(flat)} in {path} is outside the vocabulary of {vocab} tokens")
    return torch.bincount(torch.tensor(flat, dtype=torch.long), minlength=vocab).float()


def check_pass_costs(costs) -> dict[int, float] | None:
    """{n: v(n)} for n = 1..N from a sequence (v(1), ..., v(N)) or a dict keyed 1..N (int or str keys, as
    sr.tune's costs["v"] before and after a JSON round trip); None stays None (no stop rule). v(0) = 1."""
    if costs is None:
        return None
    if isinstance(costs, dict):
        try:
            table = {int(k): v for k, v in costs.items()}
        except (TypeError, ValueError):
            raise ValueError(f"pass_costs keys must be draft lengths 1..N, got {sorted(costs)!r}") from None
    elif isinstance(costs, (list, tuple)):
        table = {n + 1: v for n, v in enumerate(costs)}
    else:
        raise TypeError(f"pass_costs must be a sequence (v(1), ..., v(N)) or a dict {{n: v(n)}}, "
                        f"got {type(costs).__name__}")
    if not table or sorted(table) != list(range(1, len(table) + 1)):
        raise ValueError(f"pass_costs must give v(n) for every n = 1..N, got lengths {sorted(table)}")
    for n, v in table.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v <= 0:
            raise ValueError(f"pass_costs v({n}) must be a finite number > 0 (relative to a one-token pass), "
                             f"got {v!r}")
    return {n: float(v) for n, v in table.items()}


def extend_pass_costs(costs, up_to: int) -> dict[int, float]:
    """A v(n) table (as check_pass_costs takes it) extended to n = up_to: past the measured N, v grows
    linearly at the slope of the table's upper half, (v(N) - v(ceil(N / 2))) / (N - ceil(N / 2)), never
    falling (with N = 1: v(1) - 1). A pass over many tokens is compute-bound, so its cost grows about linearly
    in them; use it where a token tree needs v beyond the sizes tune measured (a 3x4 tree has up to 30 nodes)."""
    table = check_pass_costs(costs)
    if table is None:
        raise ValueError("extend_pass_costs needs a v(n) table, got None")
    n_max = len(table)
    half = (n_max + 1) // 2
    slope = table[n_max] - 1.0 if n_max == 1 else (table[n_max] - table[half]) / (n_max - half)
    slope = max(slope, 0.0)
    for n in range(n_max + 1, int(up_to) + 1):
        table[n] = table[n_max] + (n - n_max) * slope
    return table


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


def node_counts(column: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(tokens, counts) of a trie node's next-token column, most frequent first (ties by lower id); None where
    no row continues."""
    column = column[column != SEP]
    if not len(column):
        return None
    tokens, counts = np.unique(column, return_counts=True)
    order = np.lexsort((tokens, -counts))
    return tokens[order], counts[order]


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
    pass_costs: None (propose all K tokens a match allows), or the target's v(n) = cost of a pass over n + 1
    tokens / a one-token pass, n = 1..N (a sequence or {n: v}; sr.tune's setting.report["costs"][name]["v"]),
    for the stop rule of the module docstring; a proposal needing v past N is an error. pseudo_count: the
    rule's alpha in count / (total + alpha). Both may be set on a loaded draft (draft.pass_costs = v).
    min_accept: propose nothing unless the first token's estimated acceptance (the root's top count /
    (total + pseudo_count)) is at least this (default 0: any match). Decided from the context's counts before
    any draw, so an empty proposal is a function of the context alone and verification stays exact; in a
    HybridDraft it hands weak matches to the fallback draft ("datastore+<spec>").
    """

    def __init__(self, store: Datastore, vocab_size: int, max_ngram: int = 8, min_ngram: int = 1,
                 context_max_ngram: int = 8, context_min_ngram: int = 2, sharpen: float = 1.0,
                 max_rows: int = 4096, context_window: int | None = None, pass_costs=None,
                 pseudo_count: float = PSEUDO_COUNT, min_accept: float = 0.0):
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
        if isinstance(min_accept, bool) or not isinstance(min_accept, (int, float)) or not 0 <= min_accept <= 1:
            raise ValueError(f"min_accept must be a number in [0, 1] (an estimated acceptance), got {min_accept!r}")
        self.pass_costs, self.pseudo_count, self.min_accept = pass_costs, pseudo_count, float(min_accept)
        self.sources = {"context": 0, "datastore": 0, "none": 0}  # where each proposal came from

    @property
    def pass_costs(self) -> dict[int, float] | None:
        return self._pass_costs

    @pass_costs.setter
    def pass_costs(self, costs) -> None:
        self._pass_costs = check_pass_costs(costs)

    def offer_pass_costs(self, costs, up_to: int = 64) -> None:
        """Take a tuned setting's v(n) for the stop rule unless this draft was given its own; sizes past the
        measured ones (token trees of up to `up_to` nodes) get v extended linearly (extend_pass_costs)."""
        if self._pass_costs is None and costs:
            self.pass_costs = extend_pass_costs(costs, up_to)

    @property
    def pseudo_count(self) -> float:
        return self._pseudo_count

    @pseudo_count.setter
    def pseudo_count(self, alpha: float) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha < float("inf"):
            raise ValueError(f"pseudo_count must be a finite number >= 0, got {alpha!r}")
        self._pseudo_count = float(alpha)

    def cost(self, n: int) -> float:
        """v(n), the relative cost of verifying n proposed tokens (v(0) = 1)."""
        if n == 0:
            return 1.0
        if n not in self._pass_costs:
            raise ValueError(f"pass_costs gives v(n) for n up to {len(self._pass_costs)}, and a proposal of {n} "
                             "tokens was considered: pass the costs for every K (or tree size) used")
        return self._pass_costs[n]

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
        found = node_counts(column)
        if found is None:
            return None
        tokens, counts = found
        weights = counts.astype(np.float64) ** (1.0 / self.sharpen)
        return tokens.tolist(), torch.from_numpy(weights / weights.sum()).float()

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
        accept = {-1: 1.0}  # node -> the stop rule's estimate that its path is accepted
        for level in range(spec.depth if len(rows) else 0):
            if level > 0:
                frontier = sorted(frontier, key=lambda i: -tree.scores[i])[: spec.width]
            level_budget = budget - len(tree) - (spec.depth - level - 1)
            plan, planned = [], 0  # (node, column, counts, support, p, m): decided before any draw
            for node in frontier:
                m = min(spec.width, level_budget - planned)
                if m <= 0:
                    break
                column = rows[members[node], level]
                found = node_counts(column)
                if found is None:
                    continue
                support, p = self.node_p(column)
                plan.append((node, column, found[1], support, p, min(m, len(support))))
                planned += plan[-1][-1]
            if level == 0 and plan and self.estimate(plan[0][2], 0) < self.min_accept:
                break  # a weak match: nothing (the root's counts only, before any draw)
            if self._pass_costs is not None and plan and not self.worth_adding(tree, accept, plan):
                break
            new = []
            for node, column, counts, support, p, m in plan:
                picks, node_rows = self.children_of(p, m, sampling.greedy, generator)
                base = 1.0 if node < 0 else tree.scores[node]
                for rank, (i, r) in enumerate(zip(picks, node_rows)):
                    child = tree.add(node, support[i], None, base * float(p[i]))
                    small.append((support, r))
                    members[child] = members[node][column == support[i]]
                    accept[child] = accept[node] * self.estimate(counts, rank)
                    new.append(child)
            if not new:
                break
            frontier = new
        full = zero_rows(len(tree), self.vocab_size)
        for row, (support, r) in zip(full, small):
            row[torch.tensor(support)] = r
        tree.rows = list(full)
        return tree.tokens, full, tree

    def estimate(self, counts: np.ndarray, rank: int) -> float:
        """The stop rule's chance that a node's rank-th child is accepted, given its parent was: the rank-th
        largest count / (total + pseudo_count) (see the module docstring for temperature > 0)."""
        return float(counts[rank]) / (float(counts.sum()) + self._pseudo_count)

    def worth_adding(self, tree: Tree, accept: dict, plan: list) -> bool:
        """Whether the planned level raises expected tokens per target call / v(nodes) (the stop rule)."""
        now = 1.0 + sum(accept[i] for i in range(len(tree)))
        gain = sum(accept[node] * self.estimate(counts, rank) for node, _, counts, _, _, m in plan
                   for rank in range(m))
        size = len(tree) + sum(entry[-1] for entry in plan)
        return (now + gain) / self.cost(size) > now / self.cost(len(tree))

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
        path, wrote = shipped_tokens(), shipped_writer()
        if target_name is not None and wrote is not None and wrote != target_name:
            raise ValueError(f"the shipped datastore was written by {wrote!r}, not {target_name!r}: build one "
                             "for this target with specrepro-drafts datastore build and pass its path")
    vocab = vocab_size(target)
    store = Datastore.from_file(path, max_ngram=kw.get("max_ngram", 8), vocab_size=vocab)
    return DatastoreDraft(store, vocab, context_window=context_window(target), **kw)
