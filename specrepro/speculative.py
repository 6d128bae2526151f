"""Autoregressive sampling (Algorithm 1) and speculative sampling (Algorithm 2) of Chen et al. 2023.

Notation as in the paper: p = draft, q = target. Both functions share one loop: ArS is the loop with no
draft, so the two differ only in the rejection step.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .drafts.base import Draft, as_draft
from .engines.runners import HFRunner, context_window, vocab_size
from .sampling import SamplingConfig, sample, uniforms
from . import tree as tree_sampling

MAX_LOOKAHEAD = 32


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


def autoregressive_generate(
    target,
    input_ids: torch.Tensor,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    stop_when: Callable[[list[int]], bool] | None = None,
) -> Generation:
    """Algorithm 1: one target forward per token.

    stop_when: called with the new tokens after each token; True ends the generation after that token
    (e.g. `stop_at_text(tokenizer, "```")`), like EOS.
    """
    return _generate(target, None, input_ids, max_new_tokens, 0, temperature, top_k, top_p, eos_token_id, generator,
                     stop_when=stop_when)


def speculative_generate(
    target,
    draft,
    input_ids: torch.Tensor,
    max_new_tokens: int = 64,
    lookahead: int = 4,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    tree: tree_sampling.TreeSpec | None = None,
    stop_when: Callable[[list[int]], bool] | None = None,
) -> Generation:
    """Algorithm 2: the draft proposes `lookahead` tokens, one target pass scores them all.

    tree: a TreeSpec verifies a token tree per target call instead (specrepro.tree; `lookahead` unused).
    stop_when: as in autoregressive_generate; checked at every token of an accepted block, so greedy SpS
    ends at the same token as greedy ArS.
    """
    if draft is None:
        raise ValueError("speculative_generate needs a draft; use autoregressive_generate without one")
    _check_lookahead(lookahead)
    if tree is not None and not isinstance(tree, tree_sampling.TreeSpec):
        raise TypeError(f"tree must be a specrepro.TreeSpec or None, got {type(tree).__name__}")
    return _generate(
        target, draft, input_ids, max_new_tokens, lookahead, temperature, top_k, top_p, eos_token_id, generator,
        tree, stop_when,
    )


def _generate(target, draft, input_ids, max_new_tokens, lookahead, temperature, top_k, top_p, eos_token_id, generator,
              tree=None, stop_when=None):
    sampling = SamplingConfig(temperature, top_k, top_p)
    _check_max_new_tokens(max_new_tokens)
    proposer: Draft | None = as_draft(draft) if draft is not None else None
    if tree is not None:
        tree_sampling.check_can_branch(proposer, tree)
    if hasattr(target, "rollback"):  # already a runner (e.g. specrepro.engines.lean.LeanRunner)
        runner = target
        runner.keep_hidden = runner.keep_hidden or _wants_hidden(proposer)
    else:
        runner = HFRunner(target, keep_hidden=_wants_hidden(proposer))
    vocab = _target_vocab(target, runner)
    prompt = _check_prompt(input_ids, vocab)
    _check_fits(prompt.shape[0], max_new_tokens, target, proposer)
    if proposer is not None and proposer.vocab_size != vocab:
        raise ValueError(
            f"draft and target vocabularies differ ({proposer.vocab_size} vs {vocab} tokens): "
            "the draft must use the target's tokenizer"
        )
    if stop_when is not None and not callable(stop_when):
        raise TypeError(f"stop_when must be a callable taking the new token ids, got {type(stop_when).__name__}")
    stops = StopRule(frozenset(_eos_set(eos_token_id)), stop_when)

    start = time.perf_counter()
    runner.reset()
    if proposer is not None:
        proposer.reset()
    prompt = prompt.to(runner.device)
    out = Generation(tokens=prompt.new_empty(0))
    if max_new_tokens == 0:
        return out
    hidden = _HiddenStates(runner) if _wants_hidden(proposer) else None
    if prompt.shape[0] > 1:
        # a runner's prefill, where it has one, skips the LM head: these logits are never read
        getattr(runner, "prefill", runner.forward)(prompt[:-1])
        if hidden is not None:
            hidden.append(runner.hidden)
    seq = prompt
    if tree is not None:
        tree_sampling.generate(runner, proposer, seq, out, max_new_tokens, tree, sampling, stops, generator, hidden)
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
        q = sampling.probs(runner.forward(torch.cat([seq[-1:], drafted])))
        if hidden is not None:
            hidden.append(runner.hidden)
        n, next_token = rejection_step(drafted, p, q, generator)
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


def _wants_hidden(proposer) -> bool:
    return proposer is not None and proposer.wants_target_hidden


def _target_vocab(target, runner) -> int:
    return runner.vocab_size if hasattr(runner, "vocab_size") else vocab_size(target)


def _check_lookahead(lookahead) -> None:
    if not isinstance(lookahead, int) or isinstance(lookahead, bool) or not 1 <= lookahead <= MAX_LOOKAHEAD:
        raise ValueError(f"lookahead (K) must be an integer in 1..{MAX_LOOKAHEAD}, got {lookahead!r}")


def _check_max_new_tokens(max_new_tokens) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")


def _check_prompt(input_ids, vocab: int) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a LongTensor of shape [n] or [1, n], got {type(input_ids).__name__}")
    if input_ids.dtype not in (torch.long, torch.int, torch.int16, torch.uint8):
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.device.type == "meta":
        raise ValueError("input_ids are on the 'meta' device (no values); give token ids on the CPU or the model's device")
    if input_ids.dim() == 2:
        if input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must have batch size 1 (shape [1, n]), got shape {tuple(input_ids.shape)}")
        input_ids = input_ids[0]
    if input_ids.dim() != 1:
        raise ValueError(f"input_ids must have shape [n] or [1, n], got {tuple(input_ids.shape)}")
    if input_ids.numel() == 0:
        raise ValueError("empty prompt: input_ids needs at least one token (e.g. the BOS token)")
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"input_ids hold token ids outside the vocabulary [0, {vocab}): min {lo}, max {hi}")
    return input_ids.long()


def _check_fits(prompt_len: int, max_new_tokens: int, target, proposer) -> None:
    for who, window in (("target", context_window(target)), ("draft", getattr(proposer, "context_window", None))):
        if window is not None and prompt_len + max_new_tokens > window:
            raise ValueError(
                f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds the {who}'s "
                f"context window of {window} positions"
            )


def _eos_set(eos_token_id) -> set[int]:
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, int):
        return {eos_token_id}
    return {int(t) for t in eos_token_id}
