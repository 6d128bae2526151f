"""Tree speculative sampling: several candidates per position, verified in one target pass, exactly lossless.

Notation as in Algorithm 2 of the paper: p = draft, q = target. A draft proposes a token tree instead of a
chain: the root is the context's last token, each node a candidate for the token after its parent. One
target pass over the root and every node (each node attends to the context and its own ancestors, at
position context + depth) gives q after every node. `accept` then walks down from the root and emits the
accepted path plus one token; the target's KV entries of that path are compacted in place.

The acceptance rule (recursive rejection sampling; SpecInfer, Sequoia, Jeon et al. 2024 "recursive
speculative decoding") at a node whose target distribution is q and whose children, in the order they
were drawn, are x_1..x_m, child i carrying p_i = the distribution x_i was drawn from given x_1..x_{i-1}:

    r <- q
    for i = 1..m:
        u ~ U[0, 1]; if u < r(x_i) / p_i(x_i): accept x_i, move to that child and repeat there
        r <- max(0, r - p_i) / sum max(0, r - p_i)
    emit a token sampled from r and stop        (a leaf has m = 0: that is the bonus token from q)

Why it is exact (Theorem 1 of the paper, applied once per child). Claim: given everything drawn before
child i, the token this loop emits from child i on has distribution r_{i-1} (the residual before child
i). For i = m + 1 it samples r_m directly. For i <= m: x_i ~ p_i given the past (the draft drew it from
p_i, and the acceptance coins of earlier siblings do not influence which token it drew), so
    P(emit y) = p_i(y) min(1, r_{i-1}(y) / p_i(y)) + P(reject) r_i(y)          (by the claim for i + 1)
              = min(p_i(y), r_{i-1}(y)) + max(0, r_{i-1}(y) - p_i(y)) = r_{i-1}(y),
exactly the paper's Theorem 1 with (p, q) = (p_i, r_{i-1}); P(reject) = sum max(0, r_{i-1} - p_i) is the
normaliser of r_i, and r_i does not depend on which x_i was drawn. At i = 1, r_0 = q: the node emits a
token distributed as q given its path. An accepted child repeats the argument one level down with its own
q and children, drawn (like everything in the tree) before any coin was thrown. So every emitted token has
the target's distribution given the tokens before it, which is what autoregressive sampling does.

What the p_i are: children sampled WITHOUT replacement from a draft distribution p have
p_i = p with x_1..x_{i-1} removed, renormalised (specrepro.drafts.growing.draw_children). A deterministic proposer (prompt lookup,
greedy drafts) makes one-hot rows, p_i = onehot(x_i): child i is accepted with probability r(x_i) and the
residual becomes r with x_i zeroed, renormalised. With one child per node (width 1) this is Algorithm 2
step for step, and `accept` draws its uniforms as `rejection_step` does, so a chain reproduces the chain.

Which nodes get children, and how many, is decided level by level from the draft alone (specrepro.drafts.
growing.grow), BEFORE those children are drawn (the best `width` nodes of the last level by cumulative draft probability, EAGLE-2
style, within the node budget): it may depend on anything drawn earlier, never on the children
themselves. Discarding children after seeing them (keeping the likeliest) would make x_i no longer a draw
from p_i, and the proof above would fail. The draft's "distribution after a node" need not be a true
conditional (Medusa-style heads ignore the parent's token): the proof only needs x_i ~ p_i.

Greedy (temperature 0): q is one-hot, and the rule reduces to following the child equal to the target's
argmax; `accept` does exactly that, without coins.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from .sampling import sample, uniforms

MAX_DEPTH = 32


@dataclass(frozen=True)
class TreeSpec:
    """The shape of a token tree: at most `width` children per node, `depth` levels, `max_nodes` in all.

    Level 1 holds the root's `width` likeliest (greedy) or sampled-without-replacement children; each
    later level expands the `width` nodes of the level above with the highest cumulative draft probability,
    `width` children each, within `max_nodes` (default: no limit beyond the shape), of which one node per
    deeper level is kept in reserve so that the tree reaches `depth`.
    width=1 is the chain of `depth` tokens.
    """

    width: int = 2
    depth: int = 4
    max_nodes: int | None = None

    def __post_init__(self):
        for name in ("width", "depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TreeSpec {name} must be an integer >= 1, got {value!r}")
        if self.depth > MAX_DEPTH:
            raise ValueError(f"TreeSpec depth must be <= {MAX_DEPTH}, got {self.depth}")
        if self.max_nodes is not None:
            if not isinstance(self.max_nodes, int) or isinstance(self.max_nodes, bool):
                raise ValueError(f"TreeSpec max_nodes must be an integer or None, got {self.max_nodes!r}")
            if self.max_nodes < self.depth:
                raise ValueError(
                    f"TreeSpec max_nodes ({self.max_nodes}) is smaller than depth ({self.depth}): "
                    "the tree could never reach its depth"
                )

    @property
    def nodes(self) -> int:
        """The most nodes a tree of this spec holds."""
        full = self.width + (self.depth - 1) * self.width * self.width
        return full if self.max_nodes is None else min(full, self.max_nodes)

    def capped(self, depth: int) -> "TreeSpec":
        """The same spec, no deeper than `depth` (near the end of the token budget)."""
        if depth >= self.depth:
            return self
        return replace(self, depth=depth, max_nodes=None if self.max_nodes is None else max(self.max_nodes, depth))

    def __str__(self) -> str:
        return f"{self.width}x{self.depth}" + ("" if self.max_nodes is None else f"/{self.max_nodes}")


def parse_tree(text: str) -> TreeSpec:
    """'3x4' or '3x4/16' (width x depth / node budget) -> TreeSpec."""
    try:
        shape, _, budget = text.partition("/")
        width, depth = shape.lower().split("x")
        return TreeSpec(int(width), int(depth), int(budget) if budget else None)
    except ValueError as err:
        raise ValueError(f"tree must look like WIDTHxDEPTH or WIDTHxDEPTH/NODES (e.g. 3x4), got {text!r}: {err}")


def tree_specs(trees) -> list[TreeSpec]:
    """TreeSpecs from a list of TreeSpecs and/or 'WIDTHxDEPTH[/NODES]' strings (None or [] -> [])."""
    if trees is None:
        return []
    if isinstance(trees, (str, TreeSpec)):
        raise TypeError(f"trees must be a list of tree specs (e.g. ['2x4']), got the single {trees!r}")
    out = []
    for t in trees:
        if isinstance(t, TreeSpec):
            out.append(t)
        elif isinstance(t, str):
            out.append(parse_tree(t))
        else:
            raise TypeError(f"a tree must be a TreeSpec or a string like '3x4', got {type(t).__name__}")
    return out


@dataclass
class Tree:
    """Draft nodes in level order (parents before children; siblings in the order they were drawn).

    parents[i] == -1: a child of the root (the context's last token). p[i]: the distribution tokens[i] was
    drawn from, given its earlier siblings. scores[i]: cumulative draft probability of the path to node i.
    """

    vocab_size: int
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int, row: torch.Tensor, score: float) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        self.rows.append(row)
        self.scores.append(score)
        return len(self.tokens) - 1

    @classmethod
    def chain(cls, tokens: torch.Tensor, p: torch.Tensor, vocab_size: int) -> "Tree":
        """A chain proposal (Draft.propose) as a tree of width 1."""
        tree = cls(vocab_size)
        for i, (t, row) in enumerate(zip(tokens.tolist(), p)):
            tree.add(i - 1, t, row, 1.0)
        return tree

    @property
    def is_chain(self) -> bool:
        return all(parent == i - 1 for i, parent in enumerate(self.parents))

    @property
    def p(self) -> torch.Tensor:
        return torch.stack(self.rows) if self.rows else torch.empty(0, self.vocab_size)

    def children(self) -> dict[int, list[int]]:
        """parent (-1 for the root) -> its children in drawing order."""
        out: dict[int, list[int]] = {-1: []}
        for i, parent in enumerate(self.parents):
            out.setdefault(parent, []).append(i)
            out.setdefault(i, [])
        return out

    def path(self, node: int) -> list[int]:
        """Nodes from the root's child down to `node`."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]


# --- attention over a tree -------------------------------------------------------------------------------

def ancestor_mask(tree: Tree, rows: list[int], cols: list[int]) -> torch.Tensor:
    """[len(rows), len(cols)] bool: cols[j] is rows[i] itself or one of its ancestors (-1 is the root,
    an ancestor of every node)."""
    out = torch.zeros(len(rows), len(cols), dtype=torch.bool)
    where = {c: j for j, c in enumerate(cols)}
    for i, node in enumerate(rows):
        for a in [-1] + (tree.path(node) if node >= 0 else []):
            if a in where:
                out[i, where[a]] = True
    return out


def attention_mask(tree: Tree, context: int, rows: list[int], cached: list[int]) -> torch.Tensor:
    """The mask of a tree forward: [n, context + len(cached) + n] bool, n = len(rows).

    The cache holds `context` tokens every node sees, then the tree nodes `cached` (in cache order);
    `rows` are the nodes being fed now. Each sees the context and its ancestors, itself included.
    """
    tree_part = ancestor_mask(tree, rows, cached + rows)
    return torch.cat([torch.ones(len(rows), context, dtype=torch.bool), tree_part], 1)


def verify(runner, root: torch.Tensor, tree: Tree) -> torch.Tensor:
    """One target pass over [root] + the tree's nodes: logits [1 + N, V] (row 0 after the root, row 1 + i
    after node i). The runner's cache holds the context before the root."""
    ids = torch.cat([root.view(1), torch.tensor(tree.tokens, dtype=torch.long, device=root.device)])
    if tree.is_chain:  # positions and causal mask are the plain ones: the runner's ordinary path
        return runner.forward(ids)
    context = runner.length
    positions = context + torch.tensor([0] + tree.depths, dtype=torch.long)
    mask = attention_mask(tree, context, [-1] + list(range(len(tree))), [])
    return runner.forward_tree(ids, positions.to(runner.device), mask.to(runner.device))


def keep_slots(context: int, path: list[int]) -> torch.Tensor:
    """Cache slots to keep after `verify` accepted `path`: the context, the root, the path's nodes."""
    return torch.cat([torch.arange(context + 1), context + 1 + torch.tensor(path, dtype=torch.long)])


# --- asking the draft for a tree -----------------------------------------------------------------------

def propose(proposer, seq, spec: TreeSpec, sampling, generator, hidden) -> Tree:
    """The proposer's tree: its propose_tree, or for a draft that cannot branch, its chain (width 1 only)."""
    if hasattr(proposer, "propose_tree"):
        return proposer.propose_tree(seq, spec, sampling, generator, hidden)
    tokens, p = proposer.propose(seq, spec.depth, sampling, generator, hidden)
    return Tree.chain(tokens, p, proposer.vocab_size)


def check_can_branch(proposer, spec: TreeSpec) -> None:
    if spec.width > 1 and not hasattr(proposer, "propose_tree"):
        raise ValueError(
            f"{type(proposer).__name__} cannot propose a tree (it has no propose_tree): use "
            f"TreeSpec(width=1, ...) or a draft that can branch (model drafts, lookup, heads, hybrid)"
        )


# --- acceptance ------------------------------------------------------------------------------------------

def accept(tree: Tree, q: torch.Tensor, generator: torch.Generator | None = None, greedy: bool = False):
    """Walk the tree with recursive rejection sampling (the module docstring's rule and proof).

    q: [1 + N, V] target distributions (row 0 after the root, row 1 + i after node i).
    Returns (path, token): the accepted nodes from the root down, and the token that follows them.
    """
    children = tree.children()
    path, node = [], -1
    if greedy:
        while True:
            best = int(q[node + 1].argmax())
            nxt = next((c for c in children[node] if tree.tokens[c] == best), None)
            if nxt is None:
                return path, torch.tensor(best)
            path.append(nxt)
            node = nxt
    # one uniform per node, drawn up front: a chain consumes the generator exactly as rejection_step does
    u = uniforms(len(tree), generator, q.device)
    while True:
        r = q[node + 1]
        for c in children[node]:
            x, p_c = tree.tokens[c], tree.rows[c]
            if u[c] * p_c[x] < r[x]:  # u < r(x) / p_c(x) without dividing (p_c(x) > 0: x was drawn from it)
                path.append(c)
                node = c
                break
            residual = (r - p_c).clamp_min(0)
            total = residual.sum()
            # r == p_c up to round-off: a rejection had probability ~0, and r itself is the right fallback
            r = residual / total if total > 0 else r
        else:
            return path, sample(r, generator)


# --- the generation loop ---------------------------------------------------------------------------------

def generate(runner, proposer, seq, out, max_new_tokens, spec, sampling, stops, generator, hidden, rule=accept):
    """The tree version of speculative_generate's loop: `out` is filled in and returned.

    runner: the target runner with the prompt but its last token cached; hidden: speculative._HiddenStates
    or None. Each loop: draft a tree (no deeper than the tokens left), one target pass, accept, compact.
    rule: the acceptance walk (`accept`; the experiments' deliberately wrong rules replace it).
    """
    new: list[int] = []
    while len(new) < max_new_tokens:
        loop_start = time.perf_counter()
        depth = min(spec.depth, max_new_tokens - len(new) - 1)
        if depth > 0:
            tree = propose(proposer, seq, spec.capped(depth), sampling, generator, hidden.get() if hidden else None)
        else:
            tree = Tree(runner.vocab_size)
        context = runner.length
        q = sampling.probs(verify(runner, seq[-1:], tree))
        path, next_token = rule(tree, q, generator, sampling.greedy)
        keep = context + 1 + len(path)
        if path == list(range(len(path))):  # the path is the first nodes in cache order already
            runner.rollback(keep)
        else:
            runner.compact(keep_slots(context, path).to(runner.device))
        if hidden is not None:
            rows = torch.tensor([0] + [1 + i for i in path], dtype=torch.long)
            hidden.append(runner.hidden[rows.to(runner.hidden.device)])
            hidden.truncate(keep)
        emitted = [tree.tokens[i] for i in path] + [int(next_token)]
        seq, stopped = out.emit(new, seq, emitted, stops, len(path), len(tree), loop_start)
        if stopped:
            break
    out.tokens = torch.tensor(new[:max_new_tokens], dtype=torch.long)
    return out


