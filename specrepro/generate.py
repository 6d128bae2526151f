"""The library's entry points: `autoregressive_generate` (Algorithm 1) and `speculative_generate`
(Algorithm 2), as `import specrepro as sr` offers them.

They take what a user has (a Hugging Face causal LM or a runner as the target; a model, a runner or a
specrepro.drafts strategy as the draft), check every argument with a clear error, turn the target into a
runner (specrepro.engines.runners.as_runner) and the draft into a proposer (specrepro.drafts.as_draft), and
run the loop of specrepro.algorithm.speculative, which is where the paper's algorithms are.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .algorithm.sampling import SamplingConfig
from .algorithm.speculative import Generation, Rules, StopRule, sampling_loop
from .algorithm.tree import TreeSpec, check_can_branch
from .drafts.base import as_draft
from .engines.runners import as_runner

MAX_LOOKAHEAD = 32


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
    tree: TreeSpec | None = None,
    stop_when: Callable[[list[int]], bool] | None = None,
    _rules: Rules | None = None,
) -> Generation:
    """Algorithm 2: the draft proposes `lookahead` tokens, one target pass scores them all.

    tree: a TreeSpec verifies a token tree per target call instead (specrepro.algorithm.tree;
    `lookahead` unused).
    stop_when: as in autoregressive_generate; checked at every token of an accepted block, so greedy SpS
    ends at the same token as greedy ArS.
    _rules: other acceptance rules, for the experiments' deliberately wrong samplers only.
    """
    if draft is None:
        raise ValueError("speculative_generate needs a draft; use autoregressive_generate without one")
    _check_lookahead(lookahead)
    if tree is not None and not isinstance(tree, TreeSpec):
        raise TypeError(f"tree must be a specrepro.TreeSpec or None, got {type(tree).__name__}")
    return _generate(
        target, draft, input_ids, max_new_tokens, lookahead, temperature, top_k, top_p, eos_token_id, generator,
        tree, stop_when, _rules,
    )


def _generate(target, draft, input_ids, max_new_tokens, lookahead, temperature, top_k, top_p, eos_token_id, generator,
              tree=None, stop_when=None, rules=None):
    sampling = SamplingConfig(temperature, top_k, top_p)
    _check_max_new_tokens(max_new_tokens)
    proposer = as_draft(draft) if draft is not None else None
    if tree is not None:
        check_can_branch(proposer, tree)
    runner = as_runner(target)
    prompt = _check_prompt(input_ids, runner.vocab_size)
    _check_fits(prompt.shape[0], max_new_tokens, runner, proposer)
    if proposer is not None and proposer.vocab_size != runner.vocab_size:
        if not hasattr(proposer, "fit_vocab"):
            raise ValueError(
                f"draft and target vocabularies differ ({proposer.vocab_size} vs {runner.vocab_size} tokens): "
                "the draft must use the target's tokenizer"
            )
        proposer.fit_vocab(runner.vocab_size)  # one tokenizer, padded differently: p over the target's columns
    if stop_when is not None and not callable(stop_when):
        raise TypeError(f"stop_when must be a callable taking the new token ids, got {type(stop_when).__name__}")
    stops = StopRule(frozenset(_eos_set(eos_token_id)), stop_when)
    return sampling_loop(runner, proposer, prompt, max_new_tokens, lookahead, sampling, stops, generator, tree,
                         rules or Rules())


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


def _check_fits(prompt_len: int, max_new_tokens: int, runner, proposer) -> None:
    for who, window in (("target", runner.context_window), ("draft", getattr(proposer, "context_window", None))):
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
