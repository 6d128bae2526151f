"""The datastore draft's stop rule (pass_costs): no costs leaves proposals as they were, the rule never
proposes more than K, stops where one more token does not pay for its pass, and stays lossless.

Chi-square tests: family-wise alpha 0.01, Bonferroni-corrected over this module's chi-square tests.
"""
import random

import pytest
import torch

import specrepro as sr
from helpers import EOS, PROMPT, TINY_STORE, fit_chain_or_tree, tiny_llama
from specrepro.algorithm.sampling import SamplingConfig
from specrepro.algorithm.tree import TreeSpec
from specrepro.drafts import Datastore, DatastoreDraft
from specrepro.drafts.datastore import check_pass_costs

STEEP = (2.0, 3.0, 4.0, 5.0, 6.0, 7.0)  # every proposed token costs a whole pass: never worth it here
MIXED = (1.1, 1.3, 1.6, 1.8, 2.0, 2.2)  # some proposals stop early, some do not
LOSSLESS = [(None, 1.0, None), (None, 0.8, 3), (TreeSpec(2, 3), 1.0, None)]
ALPHA = 0.01 / len(LOSSLESS)


def tiny_draft(**kw):
    return DatastoreDraft(Datastore(TINY_STORE, max_ngram=3), 5, **kw)


def random_draft(seed, **kw):
    rng = random.Random(seed)
    seqs = [[rng.randrange(7) for _ in range(rng.randrange(3, 30))] for _ in range(40)]
    return DatastoreDraft(Datastore(seqs, max_ngram=4), 7, **kw)


def one_hot(tokens, v=5):
    return torch.nn.functional.one_hot(torch.tensor(tokens), v).float()


def test_no_costs_proposes_what_the_draft_proposed_before_the_rule():
    """Tokens and rows written down from the draft before the stop rule existed (same seeded generator)."""
    draft, g = tiny_draft(), torch.Generator().manual_seed(5)
    tokens, p = draft.propose(PROMPT, 4, SamplingConfig(0.0), g)
    assert tokens.tolist() == [2, 4, 0, 3] and torch.equal(p, one_hot([2, 4, 0, 3]))
    tree = draft.propose_tree(PROMPT, TreeSpec(2, 3), SamplingConfig(0.0), g)
    assert tree.tokens == [2, 4, 4, 2, 4, 0, 1] and tree.parents == [-1, -1, 0, 1, 1, 2, 2]
    assert torch.equal(torch.stack(tree.rows), one_hot([2, 4, 4, 2, 4, 0, 1]))
    half = torch.tensor([0, 0, 0.5, 0, 0.5])
    tokens, p = draft.propose(PROMPT, 4, SamplingConfig(1.0), g)
    assert tokens.tolist() == [4, 2] and torch.equal(p, torch.stack([half, half]))
    tree = draft.propose_tree(PROMPT, TreeSpec(2, 3), SamplingConfig(1.0), g)
    assert tree.tokens == [2, 4, 4, 4, 2, 1, 0, 2] and tree.parents == [-1, -1, 0, 1, 1, 2, 2, 3]
    want = torch.stack([half, one_hot([4])[0], one_hot([4])[0], half, one_hot([2])[0],
                        torch.tensor([0.5, 0.5, 0, 0, 0]), one_hot([0])[0], one_hot([2])[0]])
    assert torch.equal(torch.stack(tree.rows), want)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_costs_that_never_grow_change_nothing(temperature):
    """With v(n) = 1 every token with a count pays: the same draws, tokens and rows as without costs."""
    for seed in range(5):
        plain, flat = random_draft(seed), random_draft(seed, pass_costs=[1.0] * 16)
        g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for ctx in ([0, 3], [1, 2, 3], [4, 4, 1, 0, 4, 4], [6, 5, 4, 3, 2, 1]):
            a, pa = plain.propose(torch.tensor(ctx), 5, SamplingConfig(temperature), g1)
            b, pb = flat.propose(torch.tensor(ctx), 5, SamplingConfig(temperature), g2)
            assert torch.equal(a, b) and torch.equal(pa, pb)
            ta = plain.propose_tree(torch.tensor(ctx), TreeSpec(2, 3), SamplingConfig(temperature), g1)
            tb = flat.propose_tree(torch.tensor(ctx), TreeSpec(2, 3), SamplingConfig(temperature), g2)
            assert ta.tokens == tb.tokens and ta.parents == tb.parents


def test_the_rule_never_proposes_more_than_k_and_steep_costs_propose_fewer():
    rng = random.Random(3)
    longer = 0
    for seed in range(8):
        plain, mixed = random_draft(seed), random_draft(seed, pass_costs=MIXED)
        for _ in range(20):
            ctx = torch.tensor([rng.randrange(7) for _ in range(rng.randrange(2, 12))])
            for k in (1, 3, 5):
                a, _ = plain.propose(ctx, k, SamplingConfig(0.0))
                b, pb = mixed.propose(ctx, k, SamplingConfig(0.0))
                assert len(b) <= len(a) <= k and pb.shape == (len(b), 7)
                assert a[: len(b)].tolist() == b.tolist()  # greedy: the same chain, cut
                longer += len(b) < len(a)
    assert longer > 0
    tokens, p = tiny_draft(pass_costs=STEEP).propose(PROMPT, 4, SamplingConfig(0.0))
    assert tokens.shape == (0,) and p.shape == (0, 5)
    assert len(tiny_draft(pass_costs=STEEP).propose_tree(PROMPT, TreeSpec(2, 3), SamplingConfig(0.0))) == 0


def test_the_chain_stops_where_one_more_token_lowers_tokens_per_cost():
    """After "0 3" the store continues 2 4 0 / 4 2 / 4 4 2 / 2 4 1 (counted to depth 3): 2 (2 of 4), then
    4 (2 of 2), then 0 (1 of 2). With alpha = 1: a = 2/5, 2/5 * 2/3, then * 1/3."""
    a1, a2 = 2 / 5, 2 / 5 * 2 / 3
    a3 = a2 / 3
    costs = (1.2, 1.3, 1.4)
    ratios = [1.0, (1 + a1) / 1.2, (1 + a1 + a2) / 1.3, (1 + a1 + a2 + a3) / 1.4]
    assert ratios[1] > ratios[0] and ratios[2] > ratios[1] and ratios[3] < ratios[2]
    tokens, _ = tiny_draft(pass_costs=costs, pseudo_count=1.0).propose(PROMPT, 3, SamplingConfig(0.0))
    assert tokens.tolist() == [2, 4]
    # a larger pseudo-count trusts the counts less: the first token no longer pays for v(1) = 1.2
    tokens, _ = tiny_draft(pass_costs=costs, pseudo_count=8.0).propose(PROMPT, 3, SamplingConfig(0.0))
    assert (1 + 2 / 12) / 1.2 < 1 and tokens.tolist() == []


def test_costs_are_read_from_a_sequence_or_tunes_dict():
    assert check_pass_costs(None) is None
    assert check_pass_costs([1.1, 1.2]) == {1: 1.1, 2: 1.2}
    assert check_pass_costs({"2": 1.2, "1": 1.1}) == {1: 1.1, 2: 1.2}  # tune's v after a JSON round trip
    draft = tiny_draft()
    draft.pass_costs = {1: 1.1, 2: 1.2, 3: 1.3, 4: 1.5}
    assert draft.pass_costs[4] == 1.5


@pytest.mark.parametrize("costs, error, message", [
    ([], ValueError, "every n = 1..N"),
    ({1: 1.1, 3: 1.3}, ValueError, "every n = 1..N"),
    ({0: 1.0, 1: 1.1}, ValueError, "every n = 1..N"),
    ({"one": 1.1}, ValueError, "keys must be draft lengths"),
    ([1.1, 0.0], ValueError, r"v\(2\) must be a finite number > 0"),
    ([1.1, -1.0], ValueError, r"v\(2\) must be a finite number > 0"),
    ([float("nan")], ValueError, r"v\(1\) must be a finite number > 0"),
    ([1.1, "2"], ValueError, r"v\(2\) must be a finite number > 0"),
    (1.5, TypeError, "pass_costs must be a sequence"),
])
def test_bad_costs_are_a_clear_error(costs, error, message):
    with pytest.raises(error, match=message):
        tiny_draft(pass_costs=costs)


def test_costs_too_short_for_the_proposal_and_bad_pseudo_count_are_clear_errors():
    with pytest.raises(ValueError, match="v\\(n\\) for n up to 2"):
        tiny_draft(pass_costs=[1.0, 1.0]).propose(PROMPT, 4, SamplingConfig(0.0))
    for alpha in (-1.0, float("inf"), "1"):
        with pytest.raises(ValueError, match="pseudo_count"):
            tiny_draft(pseudo_count=alpha)


def test_proposal_lengths_vary_on_the_lossless_prompt():
    """The chi-square tests below are only worth something if the rule cuts some proposals and not others."""
    target = tiny_llama(0, layers=2)
    g = torch.Generator().manual_seed(1)
    lengths = set()
    for _ in range(30):
        gen = sr.speculative_generate(target, tiny_draft(pass_costs=MIXED), PROMPT, max_new_tokens=8, lookahead=3,
                                      temperature=1.0, eos_token_id=EOS, generator=g)
        lengths |= set(gen.proposed)
    assert {0, 1}.issubset(lengths) and max(lengths) >= 2, lengths


@pytest.mark.parametrize("tree, temperature, top_k", LOSSLESS)
def test_a_stopped_proposal_is_lossless(tree, temperature, top_k):
    target = tiny_llama(0, layers=2)
    sampling = SamplingConfig(temperature, top_k)
    seed = 900 + LOSSLESS.index((tree, temperature, top_k))
    draft = tiny_draft(pass_costs=MIXED)
    result, _, _ = fit_chain_or_tree(target, draft, tree, sampling, seed)
    assert result.pvalue > ALPHA, result


def test_greedy_with_the_rule_equals_the_target_argmax_path():
    from specrepro.stats.exact import exact_joint

    target = tiny_llama(0, layers=2)
    (path,) = exact_joint(target, PROMPT, 8, SamplingConfig(0.0), EOS).keys()
    for tree in (None, TreeSpec(2, 3)):
        gen = sr.speculative_generate(target, tiny_draft(pass_costs=MIXED), PROMPT, max_new_tokens=8, lookahead=4,
                                      temperature=0, eos_token_id=EOS, tree=tree)
        assert tuple(gen.tokens.tolist()) == path


def test_notebooks_give_datastore_drafts_the_tuned_costs():
    """workloads.with_pass_costs sets the tuned v(n) on a datastore draft and on a hybrid's datastore part."""
    from specrepro.drafts.hybrid import HybridDraft
    from specrepro.drafts.lookup import LookupDraft
    from specrepro.experiments.workloads import with_pass_costs

    v = {"1": 1.1, "2": 1.2, "3": 1.3, "4": 1.5}
    plain = with_pass_costs(tiny_draft(), {"v": v})
    hybrid = with_pass_costs(HybridDraft(tiny_draft()), {"v": v})
    first = with_pass_costs(HybridDraft(LookupDraft(tiny_draft().vocab_size), lookup=tiny_draft()), {"v": v})
    for d in (plain, hybrid.fallback, first.lookup):  # "lookup+datastore" and "datastore+<spec>"
        assert d.pass_costs is not None and d.pass_costs[4] == pytest.approx(1.5)


def test_measure_drafts_gives_datastore_drafts_the_runner_costs(monkeypatch):
    """specrepro-drafts measure and notebook 04 pass the tuned v(n) to datastore drafts (the rule on), and
    without it (--no-stop-rule) they propose every token a match allows."""
    from specrepro.experiments import drafts_table

    seen = []
    monkeypatch.setattr(drafts_table, "make_draft", lambda spec, target, dtype=None: tiny_draft())
    monkeypatch.setattr(drafts_table, "run_lookahead_sweep",
                        lambda runner, draft, *a, **kw: seen.append(draft.pass_costs) or {"rows": []})
    v = {"1": 1.1, "2": 1.2, "3": 1.3, "4": 1.5}
    drafts_table.measure_drafts(None, ["datastore"], {}, [4], 8, [0.0], "runs/x.jsonl", dtype=torch.float32,
                                pass_costs=v)
    drafts_table.measure_drafts(None, ["datastore"], {}, [4], 8, [0.0], "runs/x.jsonl", dtype=torch.float32)
    assert seen[0] is not None and seen[0][4] == pytest.approx(1.5)
    assert seen[1] is None


def test_extended_costs_grow_linearly_past_the_measured_sizes_and_notebooks_use_them():
    """A 3x4 tree has up to 30 nodes, tune measures v up to 16: the notebooks' drafts get the table extended
    at its upper half's slope (never falling), and a 3x4 tree with them runs where the bare table is an error."""
    from specrepro.drafts.datastore import extend_pass_costs
    from specrepro.experiments.workloads import with_pass_costs

    v = {"1": 1.1, "2": 1.2, "3": 1.3, "4": 1.5}
    table = extend_pass_costs(v, 8)
    assert [round(table[n], 6) for n in range(1, 9)] == [1.1, 1.2, 1.3, 1.5, 1.65, 1.8, 1.95, 2.1]
    assert extend_pass_costs([1.2], 3)[3] == pytest.approx(1.6)
    assert extend_pass_costs([1.5, 1.4], 4)[4] == pytest.approx(1.4)  # a falling top is held, not followed
    with pytest.raises(ValueError, match="needs a v"):
        extend_pass_costs(None, 4)
    draft = with_pass_costs(tiny_draft(), {"v": v}, up_to=30)
    assert draft.pass_costs[30] == pytest.approx(1.5 + 26 * 0.15)
    sr.speculative_generate(tiny_llama(0), draft, PROMPT, max_new_tokens=8, temperature=0, tree=TreeSpec(3, 4))
    with pytest.raises(ValueError, match="v\\(n\\) for n up to 4"):
        sr.speculative_generate(tiny_llama(0), tiny_draft(pass_costs=v), PROMPT, max_new_tokens=8, temperature=0,
                                tree=TreeSpec(3, 4))


def test_measure_drafts_resumes_only_items_made_with_the_same_settings(monkeypatch, tmp_path):
    from specrepro.experiments import drafts_table

    paths = []
    monkeypatch.setattr(drafts_table, "make_draft", lambda spec, target, dtype=None: tiny_draft())
    monkeypatch.setattr(drafts_table, "run_lookahead_sweep",
                        lambda runner, draft, prompts, ks, n, sampling, path, **kw: paths.append(path) or {"rows": []})
    run = dict(target=None, draft_specs=["datastore"], prompts={"news": [{"id": "a"}]}, lookaheads=[4],
               temperatures=[0.0], results_path=tmp_path / "m.jsonl", dtype=torch.float32)
    drafts_table.measure_drafts(max_new_tokens=8, **run)
    drafts_table.measure_drafts(max_new_tokens=8, **run)
    drafts_table.measure_drafts(max_new_tokens=8, pass_costs={"1": 1.1}, **run)
    drafts_table.measure_drafts(max_new_tokens=16, **run)
    assert paths[0] == paths[1] and len(set(paths)) == 3
