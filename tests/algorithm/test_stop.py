"""stop_when: a generation ends after the first token at which the rule holds, for ArS, chains and trees alike.

The exact check: with the same seed, a generation with a stop rule is the generation without one cut after
the first token where the rule holds (a stop only truncates; it never changes a token before it).
"""
import pytest
import torch

import specrepro as sr
from specrepro import TreeSpec
from specrepro.algorithm.speculative import StopRule

from helpers import EOS

PROMPT = torch.tensor([0, 2, 3])


def twice_three(tokens):
    """Holds once token 3 has been generated twice (any fixed rule of the new tokens would do)."""
    return tokens.count(3) >= 2


def first_stop(tokens, rule):
    return next((i for i in range(len(tokens)) if rule(tokens[: i + 1])), None)


def run(tiny_pair, how, seed, stop_when=None, temperature=1.0):
    target, draft = tiny_pair
    kw = dict(max_new_tokens=24, temperature=temperature, eos_token_id=None, stop_when=stop_when,
              generator=torch.Generator().manual_seed(seed))
    if how == "ars":
        return sr.autoregressive_generate(target, PROMPT, **kw)
    tree = TreeSpec(2, 3) if how == "tree" else None
    return sr.speculative_generate(target, draft, PROMPT, lookahead=3, tree=tree, **kw)


@pytest.mark.parametrize("how", ["ars", "chain", "tree"])
def test_a_stop_cuts_the_same_generation_after_the_first_token_where_it_holds(tiny_pair, how):
    cut_early = 0
    for seed in range(12):
        full = run(tiny_pair, how, seed).tokens.tolist()
        stopped = run(tiny_pair, how, seed, stop_when=twice_three).tokens.tolist()
        at = first_stop(full, twice_three)
        assert stopped == (full if at is None else full[: at + 1]), seed
        cut_early += at is not None and at + 1 < len(full)
    assert cut_early >= 6  # the rule really ends most of these generations early


@pytest.mark.parametrize("how", ["chain", "tree"])
def test_greedy_sps_stops_at_the_same_token_as_greedy_ars(tiny_pair, how):
    def at_token(t):
        return lambda tokens: tokens[-1] == t

    stopped_early = 0
    for t in range(5):
        ars = run(tiny_pair, "ars", 0, at_token(t), temperature=0).tokens.tolist()
        sps = run(tiny_pair, how, 0, at_token(t), temperature=0).tokens.tolist()
        assert sps == ars, t
        stopped_early += len(ars) < 24
    assert stopped_early >= 1


def test_stop_rule_cuts_at_eos_or_the_rule_whichever_comes_first():
    rule = StopRule(frozenset({EOS}), twice_three)
    assert rule.cut([3], [0, 3, EOS]) == 1
    assert rule.cut([], [0, EOS, 3, 3]) == 1
    assert rule.cut([], [0, 2]) is None
    assert StopRule(frozenset({EOS})).cut([3, 3], [3]) is None  # no rule: EOS only


def test_stop_at_text_ends_a_generation_at_the_closing_fence(smollm):
    _, tokenizer = smollm
    when = sr.stop_at_text(tokenizer, "```")
    body = tokenizer("    return a + b\n```\nThis function", add_special_tokens=False)["input_ids"]
    ends = [i for i in range(len(body)) if when(body[: i + 1])]
    assert ends, "the fence was never seen"
    assert "```" in tokenizer.decode(body[: ends[0] + 1]) and "```" not in tokenizer.decode(body[: ends[0]])


def test_bad_stop_rules_are_clear_errors(tiny_pair):
    target, _ = tiny_pair
    with pytest.raises(TypeError, match="stop_when must be a callable"):
        sr.autoregressive_generate(target, PROMPT, max_new_tokens=4, stop_when="```")
    with pytest.raises(ValueError, match="at least one non-empty text"):
        sr.stop_at_text(None, "")


@pytest.mark.parametrize("rest", ["\n```\nThis adds them.", "\ndef helper():\n    pass", "\n\nclass A:\n    x = 1",
                                  "\n# a comment\n", "\nif __name__ == '__main__':\n    main()", "\nprint(add(1, 2))"])
def test_code_answers_stopped_early_give_the_completion_they_would_unstopped(smollm, rest):
    """run_table1 stops HumanEval generations at extract_completion's stop sequences: the completion that is
    scored must be the same as from the whole text."""
    from specrepro.tasks.humaneval import STOP_SEQUENCES, extract_completion

    _, tokenizer = smollm
    when = sr.stop_at_text(tokenizer, *STOP_SEQUENCES)
    full = tokenizer("total = a + b\n    return total" + rest + "\n```\nmore text", add_special_tokens=False)["input_ids"]
    at = first_stop(full, when)
    assert at is not None and at + 1 < len(full)
    prompt = "def add(a, b):\n   "
    assert extract_completion(tokenizer.decode(full[: at + 1]), prompt) == extract_completion(tokenizer.decode(full), prompt)
