"""End to end: speculative_generate's joint distribution of the first tokens equals the target's.

Two tiny random Llamas (draft != target) over a 5-token vocabulary; the exact joint distribution of
the first L tokens under the target (with the sampling transforms, EOS absorbing) is enumerated with
uncached forwards, and SpS samples are tested against it by chi-square. Family-wise alpha 0.01,
Bonferroni-corrected over the correct configurations; the wrong samplers must fail at the same level.

Sample size (helpers.N_CHAIN = 1000 per configuration), sized by power: the subtlest deliberately wrong
sampler here, resampling from q instead of the residual at a rejection, moves the joint distribution by
an effect size w^2 = sum (pi - e)^2 / e of about 0.09 (measured on 3000 samples; the others: unnormalised
residual ~1.4, bonus off by one ~0.2, inverted ratio ~3, pre-transform p ~0.14). At the corrected alpha
and up to 45 cells, 1000 samples reject a shift of w^2 = 0.09 with power >= 0.99
(test_the_sample_size_has_the_stated_power); 3000 samples had power ~1 - 1e-9, three times the cost.
"""
from types import SimpleNamespace

import pytest
import torch

from helpers import DRAFTS, EOS, L, N_CHAIN, PROMPT, chisquare_power, fit_chain as fit, tiny_llama
from specrepro import speculative_generate
from specrepro.experiments import wrong as wrong_samplers
from specrepro.drafts import HybridDraft, ModelDraft
from specrepro.engines.lean import LeanRunner
from specrepro.algorithm.sampling import SamplingConfig
from specrepro.stats.exact import exact_joint


# (lookahead, temperature, top_k, top_p, eos, runner): runner: target and draft run as HF models (hf) or in
# specrepro.engines.lean (lean, about twice as fast here), so both runners' chain passes are covered: every
# lookahead at temperature 1 and the combined transforms through the HF runner, the rest in the lean runner
CONFIGS = [
    (k, t, None, None, EOS, "hf" if t == 1.0 else "lean") for k in (1, 2, 4, 7) for t in (0.5, 1.0, 1.5)
] + [
    (4, 1.0, 3, None, EOS, "lean"),
    (4, 1.2, None, 0.8, EOS, "lean"),
    (2, 0.8, 4, 0.9, EOS, "hf"),
    (3, 1.0, None, None, None, "hf"),  # no EOS: every outcome is a full L-tuple
]
# the correct configurations, the draft strategies, the int8 native target and the no-bonus control share one family
ALPHA = 0.01 / (len(CONFIGS) + len(DRAFTS) + 2)
W2_DESIGN = 0.09  # the smallest shift the tests must catch (resampling from q: see the module docstring)
MAX_CELLS = 45  # more than any configuration here has at N_CHAIN samples (up to ~32)


def test_the_sample_size_has_the_stated_power():
    assert chisquare_power(N_CHAIN, W2_DESIGN, MAX_CELLS, ALPHA) >= 0.99
    # and the check has teeth: half the samples would not have it
    assert chisquare_power(N_CHAIN // 2, W2_DESIGN, MAX_CELLS, ALPHA) < 0.9


@pytest.mark.parametrize("k, temperature, top_k, top_p, eos, runner", CONFIGS)
def test_sps_matches_exact_target_joint(tiny_pair, k, temperature, top_k, top_p, eos, runner):
    target, draft = tiny_pair
    sampling = SamplingConfig(temperature, top_k, top_p)
    seed = CONFIGS.index((k, temperature, top_k, top_p, eos, runner))
    if runner == "lean":
        result, outcomes, bonus_loops = fit(LeanRunner(target), ModelDraft(LeanRunner(draft)), k, sampling, eos, seed,
                                            model=target)
    else:
        result, outcomes, bonus_loops = fit(target, draft, k, sampling, eos, seed)
    assert result.pvalue > ALPHA, result
    assert 5 <= result.cells <= MAX_CELLS, "too few cells for the test to mean anything, or more than its power allows"
    assert bonus_loops > 0, "the all-accepted bonus path never ran"
    if eos is not None:
        assert any(len(o) < L for o in outcomes), "no sample stopped early at EOS"


@pytest.mark.parametrize("name, factory", DRAFTS)
def test_every_draft_kind_is_lossless(name, factory):
    target = tiny_llama(0, layers=2)
    draft = factory(target, tiny_llama(1))
    sampling = SamplingConfig(1.0)
    # the target in the lean runner (faster; the HF runner's chain pass is covered by CONFIGS)
    result, outcomes, bonus_loops = fit(LeanRunner(target), draft, 3, sampling, EOS,
                                        seed=200 + [n for n, _ in DRAFTS].index(name), model=target)
    assert result.pvalue > ALPHA, result
    assert bonus_loops > 0
    if isinstance(draft, HybridDraft):  # both proposers took part
        assert draft.lookup_loops > 0 and draft.fallback_loops > 0, (draft.lookup_loops, draft.fallback_loops)


class RunnerAsModel:
    """exact_joint's model from a runner: each sequence of a batch in one fresh pass (no cache carried over)."""

    def __init__(self, runner):
        self.runner = runner

    def __call__(self, input_ids):
        rows = []
        for seq in input_ids:
            self.runner.reset()
            rows.append(self.runner.forward(seq)[-1:])
        return SimpleNamespace(logits=torch.stack(rows))


def test_an_int8_native_target_is_lossless(tiny_pair):
    """The native pass with int8 weights as the target: another target than the float32 model, so the exact joint
    is enumerated with that pass itself (uncached: each sequence in one fresh pass)."""
    from specrepro.engines import native

    reason = native.unavailable_reason(torch.bfloat16, "cpu")
    if reason is not None:
        pytest.skip(f"no native build here: {reason}")
    target, draft = tiny_pair
    int8 = LeanRunner(target, dtype=torch.bfloat16, backend="native", weights="int8")
    result, outcomes, bonus_loops = fit(int8, ModelDraft(LeanRunner(draft)), 3, SamplingConfig(1.0), EOS, seed=300,
                                        model=RunnerAsModel(LeanRunner(target, dtype=torch.bfloat16, backend="native",
                                                                       weights="int8")))
    assert result.pvalue > ALPHA, result
    assert 5 <= result.cells <= MAX_CELLS
    assert bonus_loops > 0
    # the harness tells this target from the float32 model's: the int8 pass's joint is not the float32 one
    float32 = exact_joint(target, PROMPT, L, SamplingConfig(1.0), EOS)
    quantised = exact_joint(RunnerAsModel(int8), PROMPT, L, SamplingConfig(1.0), EOS)
    assert max(abs(float32.get(o, 0) - quantised.get(o, 0)) for o in float32) > 0


def test_greedy_sps_is_deterministic_and_equals_target_argmax_path(tiny_pair):
    target, draft = tiny_pair
    greedy = SamplingConfig(0.0)
    (path,) = exact_joint(target, PROMPT, 6, greedy, EOS).keys()
    for k in (1, 2, 4, 7):
        gen = speculative_generate(target, draft, PROMPT, max_new_tokens=6, lookahead=k, temperature=0, eos_token_id=EOS)
        assert tuple(gen.tokens.tolist()) == path


WRONG = [
    ("resample_from_q", wrong_samplers.resample_from_q),
    ("unnormalised_residual", wrong_samplers.unnormalised_residual),
    ("bonus_off_by_one", wrong_samplers.bonus_off_by_one),
    ("accept_ratio_inverted", wrong_samplers.accept_ratio_inverted),
]


@pytest.mark.parametrize("name, wrong", WRONG)
def test_wrong_samplers_are_rejected(tiny_pair, name, wrong):
    target, draft = tiny_pair
    result, _, _ = fit(target, draft, 2, SamplingConfig(1.0), EOS, seed=100, rules=wrong_samplers.chain_rules(wrong))
    assert result.pvalue < ALPHA, result


def test_dropping_the_bonus_token_is_still_lossless(tiny_pair):
    # A control for the harness: skipping the bonus only costs speed, so it must NOT be rejected.
    target, draft = tiny_pair
    result, _, _ = fit(target, draft, 2, SamplingConfig(1.0), EOS, seed=101,
                       rules=wrong_samplers.chain_rules(wrong_samplers.no_bonus_token))
    assert result.pvalue > ALPHA, result


class PreTransformDraft(ModelDraft):
    """Draws tokens from the transformed draft distribution but reports the raw softmax as p."""

    def propose(self, seq, k, sampling, generator=None, target_hidden=None):
        tokens, _ = super().propose(seq, k, sampling, generator, target_hidden)
        feed = torch.cat([seq, tokens[:-1]])
        with torch.no_grad():
            raw = self.model(input_ids=feed.view(1, -1)).logits[0, -k:].float().softmax(-1)
        return tokens, raw


def test_draft_probabilities_before_the_transform_are_rejected(tiny_pair):
    target, draft = tiny_pair
    sampling = SamplingConfig(0.5, top_k=3)
    result, _, _ = fit(target, PreTransformDraft(draft), 2, sampling, EOS, seed=102)
    assert result.pvalue < ALPHA, result
