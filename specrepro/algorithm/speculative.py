"""Autoregressive sampling (Algorithm 1) and speculative sampling (Algorithm 2) of Chen et al. 2023.

Notation as in the paper: p = draft, q = target. Both share one loop, `sampling_loop`: ArS is the loop
with no draft, so the two differ only in the rejection step. The loop sees the target as a runner
(specrepro.engines.runners.Runner) and the draft as a `Proposer`; specrepro.generate turns models into
them and checks the caller's arguments.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from typing import Protocol

from ..engines.runners import Runner, hidden_kept
from .sampling import SamplingConfig, sample, uniforms
from . import tree as tree_sampling


class Proposer(Protocol):
    """A draft as the loop sees it (specrepro.drafts implements it; Draft is their base class).

    propose(seq, k, sampling, generator, target_hidden) -> (tokens [j], p [j, V]) with j <= k, row t the
    distribution token t was drawn from, after the same sampling transforms the target gets; propose_tree
    (optional) proposes a token tree (specrepro.algorithm.tree). `calls` counts its forward passes.
    """

    vocab_size: int
    wants_target_hidden: bool
    calls: int

    def reset(self) -> None: ...

    def propose(self, seq, k, sampling, generator=None, target_hidden=None): ...


@dataclass
class Generation:
    """What a generate call returns: new tokens (prompt excluded) and the cost it took."""

    tokens: torch.Tensor
    accepted: list[int] = field(default_factory=list)  # accepted draft tokens per target call
    proposed: list[int] = field(default_factory=list)  # draft tokens proposed per target call
    target_calls: int = 0
    draft_calls: int = 0
    loop_seconds: list[float] = field(default_factory=list)  # wall time of each draft+verify loop
    seconds: float = 0.0
    prefill_seconds: float = 0.0  # the prompt pass (and resets) before the first loop

    @property
    def first_token_seconds(self) -> float:
        """Time to first token: the prompt pass plus the first loop, which emits at least one token."""
        return self.prefill_seconds + (self.loop_seconds[0] if self.loop_seconds else 0.0)

    @property
    def tau(self) -> float:
        """Tokens per target call."""
        return len(self.tokens) / self.target_calls if self.target_calls else 0.0

    @property
    def acceptance_rate(self) -> float:
        proposed = sum(self.proposed)
        return sum(self.accepted) / proposed if proposed else 0.0

    def emit(self, new: list[int], seq: torch.Tensor, emitted: list[int], stops: "StopRule", accepted: int,
             proposed: int, loop_start: float) -> tuple[torch.Tensor, bool]:
        """End one draft+verify loop (chain or tree): the loop's tokens, cut after the first that ends the
        generation (StopRule), go onto `new` and `seq`, and the loop's counts and time are recorded. Returns
        (seq, stopped)."""
        stop = stops.cut(new, emitted)
        if stop is not None:
            emitted = emitted[: stop + 1]
        new.extend(emitted)
        seq = torch.cat([seq, torch.tensor(emitted, dtype=seq.dtype, device=seq.device)])
        self.target_calls += 1
        self.accepted.append(accepted)
        self.proposed.append(proposed)
        self.loop_seconds.append(time.perf_counter() - loop_start)
        return seq, stop is not None


@dataclass(frozen=True)
class StopRule:
    """Where a generation ends: after an EOS token, or after the first token at which `when(new_tokens)`
    holds. Checked token by token, also inside a block of accepted drafts, so ArS and SpS end at the same
    token and a stop never changes the distribution of the tokens before it."""

    eos: frozenset = frozenset()
    when: Callable[[list[int]], bool] | None = None

    def cut(self, new: list[int], emitted: list[int]) -> int | None:
        """The index in `emitted` of the token the generation ends with, or None (it goes on)."""
        for i, t in enumerate(emitted):
            if t in self.eos or (self.when is not None and self.when(new + emitted[: i + 1])):
                return i
        return None


def stop_at_text(tokenizer, *texts: str, tail_tokens: int = 8) -> Callable[[list[int]], bool]:
    """A `stop_when` that ends the generation once its last `tail_tokens` tokens decode to text containing
    one of `texts` (e.g. the closing fence of a code answer). The tail must be long enough to hold the
    longest text: a text can end a generation only when it is complete."""
    texts = tuple(t for t in texts if t)
    if not texts:
        raise ValueError("stop_at_text needs at least one non-empty text")

    def when(tokens: list[int]) -> bool:
        tail = tokenizer.decode(tokens[-tail_tokens:])
        return any(t in tail for t in texts)

    return when


def rejection_step(
    draft_tokens: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, torch.Tensor]:
    """Algorithm 2, steps 3-4: how many of the k draft tokens to keep, and the token that follows them.

    draft_tokens: [k]; p: [k, V] draft distributions they were drawn from; q: [k + 1, V] target.
    Keeps x~_t while r_t < q(x~_t) / p(x~_t); at the first rejection samples from (q - p)+; if all are
    kept samples the bonus token from q[k].
    """
    k = draft_tokens.shape[0]
    if k:
        draft_tokens, p = draft_tokens.to(q.device), p.to(q.device)  # a draft may run on another device
        rows = torch.arange(k, device=q.device)
        q_x = q[rows, draft_tokens]
        p_x = p[rows, draft_tokens]
        r = uniforms(k, generator, q.device)
        # r < q/p without dividing (p_x > 0: the token was drawn from p)
        rejected = (r * p_x >= q_x).nonzero()
        if rejected.numel():
            n = int(rejected[0])
            residual = (q[n] - p[n]).clamp_min(0)
            total = residual.sum()
            # q == p up to round-off: the residual is empty, and q is the right fallback
            dist = residual / total if total > 0 else q[n]
            return n, sample(dist, generator)
    return k, sample(q[k], generator)


def greedy_step(draft_tokens: torch.Tensor, logits: torch.Tensor) -> tuple[int, torch.Tensor]:
    """rejection_step for a greedy target, from its logits [k + 1, V] and without drawing: q is one-hot at each
    row's argmax (first index on ties, as logits_to_probs makes it), so a draft token is kept exactly when it
    is that argmax whatever p was (r * p(x) < 1 = q(x) for every r < 1), and the residual (q - p)+ at the first
    other token is q itself: the token after the kept ones is that row's argmax. The loop takes it when the
    sampling is greedy, which spares building and sampling one-hot rows over the vocabulary per token."""
    best = logits.float().argmax(-1)
    k = draft_tokens.shape[0]
    n = k
    if k:
        differ = (draft_tokens.to(best.device) != best[:k]).nonzero()
        if differ.numel():
            n = int(differ[0])
    return n, best[n]


@dataclass(frozen=True)
class Rules:
    """The acceptance rules the loops apply: `rejection_step` for a chain, `tree_accept` for a token tree.
    Only the experiments' deliberately wrong samplers (specrepro.experiments.wrong) pass others."""

    rejection_step: Callable = rejection_step
    tree_accept: Callable = tree_sampling.accept


def sampling_loop(runner: Runner, proposer: Proposer | None, prompt: torch.Tensor, max_new_tokens: int,
                  lookahead: int, sampling: SamplingConfig, stops: StopRule, generator=None,
                  tree: tree_sampling.TreeSpec | None = None, rules: Rules = Rules()) -> Generation:
    """Algorithm 1 (proposer None: one target pass per token) and Algorithm 2 (the proposer drafts up to
    `lookahead` tokens, one target pass scores them all, `rules.rejection_step` keeps a prefix of them).

    prompt: [n] LongTensor of valid ids on any device. tree: verify a token tree per target call instead
    (specrepro.algorithm.tree). The runner is reset first and left holding the sequence.
    """
    wants = proposer is not None and proposer.wants_target_hidden
    with hidden_kept(runner, wants, getattr(proposer, "target_taps", ())):
        return _loop(runner, proposer, prompt, max_new_tokens, lookahead, sampling, stops, generator, tree, rules,
                     wants)


def _loop(runner, proposer, prompt, max_new_tokens, lookahead, sampling, stops, generator, tree, rules, wants):
    start = time.perf_counter()
    runner.reset()
    if proposer is not None:
        proposer.reset()
    prompt = prompt.to(runner.device)
    out = Generation(tokens=prompt.new_empty(0))
    if max_new_tokens == 0:
        return out
    hidden = _HiddenStates(runner) if wants else None
    if prompt.shape[0] > 1:
        # a runner's prefill, where it has one, skips the LM head: these logits are never read
        getattr(runner, "prefill", runner.forward)(prompt[:-1])
        if hidden is not None:
            hidden.append(runner.hidden)
    out.prefill_seconds = time.perf_counter() - start
    seq = prompt
    if tree is not None:
        tree_sampling.generate(runner, proposer, seq, out, max_new_tokens, tree, sampling, stops, generator, hidden,
                               rules.tree_accept)
        out.draft_calls = proposer.calls
        out.seconds = time.perf_counter() - start
        return out
    new = []
    while len(new) < max_new_tokens:
        loop_start = time.perf_counter()
        # never draft past max_new_tokens: the last token of the budget is a plain target step
        k = min(lookahead, max_new_tokens - len(new) - 1)
        if k > 0:
            # a draft may propose fewer than k tokens (an n-gram draft with no match proposes none)
            drafted, p = proposer.propose(seq, k, sampling, generator, hidden.get() if hidden else None)
            drafted, k = drafted.to(seq.device), drafted.shape[0]
        else:
            drafted, p = seq.new_empty(0), None
        logits = runner.forward(torch.cat([seq[-1:], drafted]))
        if hidden is not None:
            hidden.append(runner.hidden)
        exact = rules.rejection_step is rejection_step  # the experiments' wrong rules get q as before
        if exact and sampling.greedy:
            n, next_token = greedy_step(drafted, logits)  # the same tokens, without one-hot rows
        elif exact and k == 0:  # nothing drafted: a plain draw from the target, as rejection_step's sample(q[0])
            n, next_token = 0, sampling.draw(logits[0], generator)
        else:
            n, next_token = rules.rejection_step(drafted, p, sampling.probs(logits), generator)
        keep = seq.shape[0] + n  # the target has now seen seq and the n accepted drafts
        runner.rollback(keep)
        if hidden is not None:
            hidden.truncate(keep)
        emitted = torch.cat([drafted[:n], next_token.view(1)]).tolist()
        seq, stopped = out.emit(new, seq, emitted, stops, n, k, loop_start)
        if stopped:
            break
    out.tokens = torch.tensor(new[:max_new_tokens], dtype=torch.long)
    out.draft_calls = proposer.calls if proposer is not None else 0
    out.seconds = time.perf_counter() - start
    return out


class _HiddenStates:
    """Target hidden states for the tokens the target has processed, kept in step with its cache."""

    def __init__(self, runner):
        self.runner = runner
        self.parts: list[torch.Tensor] = []

    def append(self, h: torch.Tensor) -> None:
        self.parts.append(h)

    def truncate(self, length: int) -> None:
        self.parts = [torch.cat(self.parts)[:length]]

    def get(self) -> torch.Tensor | None:
        if not self.parts:
            return None
        if len(self.parts) > 1:
            self.parts = [torch.cat(self.parts)]
        return self.parts[0]
