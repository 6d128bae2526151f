"""One draft that picks per step: the datastore where its match is confident (min_accept), a model draft
elsewhere ("datastore+<spec>"). The choice is made from the context's counts before any draw, so the output
stays the target's: chi-square tests of the chain and a tree at T = 1 (family-wise alpha 0.01, Bonferroni over
the two; the harness's sample sizes give the power stated in tests/helpers.py, and its wrong-sampler tests show
it rejects), greedy parity, and the choice really varies on the test prompt.
"""
import pytest
import torch

import specrepro as sr
from helpers import EOS, PROMPT, TINY_STORE, fit_chain_or_tree
from specrepro.algorithm.sampling import SamplingConfig
from specrepro.algorithm.tree import TreeSpec
from specrepro.drafts import Datastore, DatastoreDraft, FeatureDraft, HybridDraft
from specrepro.stats.exact import exact_joint
from specrepro.stats.toy import tiny_llama

MIN_ACCEPT = 0.45  # on PROMPT this hands part the loops to the fallback (see the test below)
TREES = [None, TreeSpec(2, 3)]
ALPHA = 0.01 / len(TREES)


def store(**kw):
    return DatastoreDraft(Datastore(TINY_STORE, max_ngram=3), 5, **kw)


def hybrid(target, min_accept=MIN_ACCEPT, seed=6):
    return HybridDraft(FeatureDraft.init_for(target, {"ffn": 32}, seed=seed), store(min_accept=min_accept))


def run(target, draft, n, temperature=1.0, tree=None, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        sr.speculative_generate(target, draft, PROMPT, max_new_tokens=4, lookahead=3, temperature=temperature,
                                eos_token_id=EOS, generator=g, tree=tree)


def test_min_accept_bounds_and_its_extremes():
    with pytest.raises(ValueError, match="min_accept must be a number in"):
        store(min_accept=1.5)
    seq = torch.tensor(TINY_STORE[0][:3])
    greedy = SamplingConfig(0.0)
    assert len(store(min_accept=0.0).propose(seq, 3, greedy)[0]) == len(store().propose(seq, 3, greedy)[0]) > 0
    assert len(store(min_accept=1.0).propose(seq, 3, greedy)[0]) == 0  # pseudo-counts keep every estimate < 1


@pytest.mark.parametrize("tree", TREES)
def test_the_choice_varies_on_the_test_prompt(tree):
    """The chi-square tests below are worth something only if both proposers serve loops there."""
    target = tiny_llama(0, layers=2)
    draft = hybrid(target)
    run(target, draft, 40, tree=tree)
    assert draft.lookup_loops > 5 and draft.fallback_loops > 5, (draft.lookup_loops, draft.fallback_loops)


@pytest.mark.parametrize("tree", TREES)
def test_the_hybrid_is_lossless(tree):
    target = tiny_llama(0, layers=2)
    sampling = SamplingConfig(1.0)
    seed = 950 + TREES.index(tree)
    result, _, _ = fit_chain_or_tree(target, hybrid(target), tree, sampling, seed)
    assert result.pvalue > ALPHA, result


def test_greedy_hybrid_equals_the_target_argmax_path():
    target = tiny_llama(0, layers=2)
    (path,) = exact_joint(target, PROMPT, 8, SamplingConfig(0.0), EOS).keys()
    for tree in TREES:
        gen = sr.speculative_generate(target, hybrid(target), PROMPT, max_new_tokens=8, lookahead=3, temperature=0,
                                      eos_token_id=EOS, tree=tree)
        assert tuple(gen.tokens.tolist()) == path


def test_the_spec_builds_the_datastore_first_hybrid(monkeypatch):
    from specrepro.drafts import artifacts, spec

    real_load = artifacts.load
    monkeypatch.setattr(artifacts, "load", lambda kind, **kw: store() if kind == "datastore" else real_load(kind, **kw))
    target = tiny_llama(0, layers=2)
    draft = spec.make_draft("datastore+lookup", target)
    assert isinstance(draft, HybridDraft) and isinstance(draft.lookup, DatastoreDraft)
    assert draft.lookup.min_accept == spec.HYBRID_MIN_ACCEPT
