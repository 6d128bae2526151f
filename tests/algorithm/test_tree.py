"""Tree speculative sampling (specrepro.algorithm.tree): exactly the target's distribution, at any temperature.

Three layers of evidence:
1. the acceptance rule alone, on random p, q over 6 tokens (no model): chi-square of the first emitted token
   against q with many samples, for sampled (without replacement), sparse and one-hot children;
2. end to end on the tiny-model harness of test_lossless.py: chi-square of the joint distribution of the
   first 3 tokens against the exact target, for widths 2-4, depths 1-4, temperatures 0.5/1/1.5, top-k,
   top-p, a node budget, EOS inside the tree, both runners, every draft kind;
3. the wrong multi-candidate rules of specrepro.experiments.wrong are rejected by both harnesses (power).
Family-wise alpha 0.01, Bonferroni-corrected over every correct configuration below (one family).
End-to-end sample size (helpers.N_TREE = 1200 per configuration), sized by power: the subtlest wrong rule,
"fallback to q", moves the joint by w^2 = sum (pi - e)^2 / e ~ 0.075 (noncentrality ~150 at 2000 samples,
by exact enumeration of the first token); at the corrected alpha and up to 45 cells 1200 samples reject
it with power >= 0.99 (test_the_sample_size_has_the_stated_power).
Plus: width 1 is the chain token for token, the tree mask and KV compaction against fresh forwards,
greedy tree == greedy ArS == HF generate on the real target, bad input.
"""
import pytest
import torch
from scipy.stats import chisquare

import specrepro as sr
from helpers import EOS, tiny_llama
from specrepro.algorithm import tree as tree_module
from specrepro.drafts import growing
from specrepro.experiments import wrong
from specrepro.drafts import Draft, HybridDraft, LookupDraft, ModelDraft
from specrepro.engines.lean import LeanRunner
from specrepro.engines.runners import HFRunner
from specrepro.algorithm.sampling import SamplingConfig
from specrepro.stats.exact import exact_joint
from specrepro.algorithm.tree import Tree, TreeSpec
from helpers import DRAFTS, L, N_TREE, PROMPT, check_tree_logits, chisquare_power, fit_tree, fixed_tree, kv

N_RULE = 20000  # samples per rule-level configuration (no model: cheap)
V_RULE = 6

# (width, depth, temperature, top_k, top_p, max_nodes, eos, runner): each width with each depth and each
# temperature at least once, EOS absorbing unless None; runner: target and draft run as HF models (hf) or
# in specrepro.engines.lean (lean), so both runners' tree passes and compaction are covered
CONFIGS = [
    (2, 1, 1.0, None, None, None, EOS, "hf"),
    (2, 2, 0.5, None, None, None, EOS, "lean"),
    (2, 3, 1.5, None, None, None, EOS, "lean"),
    (2, 4, 1.0, None, None, None, EOS, "hf"),
    (3, 1, 1.5, None, None, None, EOS, "lean"),
    (3, 2, 1.0, None, None, None, EOS, "lean"),
    (3, 3, 0.5, None, None, None, EOS, "hf"),
    (3, 4, 1.0, None, None, 8, EOS, "lean"),
    (4, 1, 0.5, None, None, None, EOS, "lean"),
    (4, 2, 1.5, None, None, None, EOS, "lean"),
    (4, 3, 1.0, 3, None, 16, EOS, "hf"),  # top-k below the width: fewer children than asked
    (4, 4, 1.2, None, 0.8, 12, EOS, "lean"),
    (3, 3, 0.8, 4, 0.9, None, EOS, "lean"),
    (3, 2, 1.0, None, None, None, None, "hf"),  # no EOS: every outcome is a full 3-tuple
]
# (name, width, top_k, children): rule-level configurations on random p and q
RULES = [
    ("sampled-w1", 1, None, "sampled"),
    ("sampled-w2", 2, None, "sampled"),
    ("sampled-w4", 4, None, "sampled"),
    ("sparse-w3", 3, 3, "sampled"),  # p zero on 3 of 6 tokens, q positive there: the residual carries them
    ("one-hot-w3", 3, None, "one-hot"),  # a deterministic proposer: distinct children, one-hot rows
    # a hybrid's merged tree: prompt lookup's token first (one-hot), then the draft's, drawn without it
    ("seeded-w3", 3, None, "seeded"),
    ("seeded-sparse-w2", 2, 3, "seeded"),
]
TREE_DRAFTS = DRAFTS  # every draft kind of test_lossless
ALPHA = 0.01 / (len(CONFIGS) + len(RULES) + len(TREE_DRAFTS) + 1)  # + the power draft's correct run
W2_DESIGN = 0.075  # the smallest shift the end-to-end tests must catch ("fallback to q": the docstring)
MAX_CELLS = 45  # more than any end-to-end configuration has at N_TREE samples


def test_the_sample_size_has_the_stated_power():
    assert chisquare_power(N_TREE, W2_DESIGN, MAX_CELLS, ALPHA) >= 0.99
    assert chisquare_power(N_TREE // 2, W2_DESIGN, MAX_CELLS, ALPHA) < 0.9  # the check has teeth

# wrong draft children beside a seeded (hybrid) node's forced tokens, in place of growing.draft_children
WRONG_SEEDED = [
    ("rows keep the forced tokens", wrong.seeded_rows_keep_forced),
]
WRONG = [
    ("with replacement, unchanged target", wrong.tree_unchanged_target, wrong.children_with_replacement),
    ("residual not updated", wrong.tree_residual_not_updated, None),
    ("siblings not removed", wrong.tree_siblings_not_removed, None),
    ("fallback to q", wrong.tree_fallback_to_q, None),
]


# --- 1. the rule alone -----------------------------------------------------------------------------------

def rule_case(seed, width, top_k, children):
    """Random target q and draft p over V_RULE tokens (p sharpened so that it differs from q a lot)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(2 * torch.randn(V_RULE, generator=g), -1)
    logits = 2 * torch.randn(V_RULE, generator=g)
    if top_k is not None:
        logits[logits.argsort()[: V_RULE - top_k]] = -float("inf")
    return q, torch.softmax(logits, -1), g


def one_level_tree(p, width, children, g, draw=growing.draft_children):
    """draw: how sampled children are drawn (growing.draft_children, or a wrong one of the same signature)."""
    if children == "seeded":  # the forced token: the draft's likeliest, where p and q differ most
        return growing.grow(TreeSpec(width, 1), SamplingConfig(1.0), g, p.log(), None,
                            seed={(): [int(p.argmax())]}, children=draw)
    tree = Tree(V_RULE)
    if children == "one-hot":  # fixed distinct children, as prompt lookup makes them
        for t in p.argsort(descending=True)[:width].tolist():
            tree.add(-1, t, torch.eye(V_RULE)[t], 1.0)
    else:
        for t, row in zip(*draw(p, [], width, False, g)):
            tree.add(-1, t, row, 1.0)
    return tree


def first_tokens(width, top_k, children, seed, n=N_RULE, accept=tree_module.accept, draw=growing.draft_children):
    """accept, draw: the acceptance walk and the child draw (the correct ones, or wrong ones to reject)."""
    q, p, g = rule_case(seed, width, top_k, children)
    counts = torch.zeros(V_RULE)
    for _ in range(n):
        tree = one_level_tree(p, width, children, g, draw)
        path, token = accept(tree, q.view(1, -1).expand(len(tree) + 1, -1), g)
        counts[tree.tokens[path[0]] if path else int(token)] += 1
    return counts, q


@pytest.mark.parametrize("name, width, top_k, children", RULES)
def test_rule_emits_q(name, width, top_k, children):
    counts, q = first_tokens(width, top_k, children, seed=RULES.index((name, width, top_k, children)))
    result = chisquare(counts.numpy(), (q * N_RULE).numpy())
    print(name, result)  # pytest -rP shows the p-values
    assert result.pvalue > ALPHA


@pytest.mark.parametrize("name, rule, draw", WRONG)
def test_rule_harness_rejects_wrong_rules(name, rule, draw):
    counts, q = first_tokens(3, None, "sampled", seed=50, accept=rule, draw=draw or growing.draft_children)
    result = chisquare(counts.numpy(), (q * N_RULE).numpy())
    print(name, result)
    assert result.pvalue < ALPHA


@pytest.mark.parametrize("name, draft_children", WRONG_SEEDED)
def test_rule_harness_rejects_wrong_seeded_children(name, draft_children):
    counts, q = first_tokens(3, None, "seeded", seed=51, draw=draft_children)
    result = chisquare(counts.numpy(), (q * N_RULE).numpy())
    print(name, result)
    assert result.pvalue < ALPHA


def test_seeded_grow_puts_the_forced_tokens_first():
    p = torch.tensor([0.5, 0.3, 0.1, 0.1, 0.0])
    seed = {(): [0, 3], (0,): [2]}
    for sampling in (SamplingConfig(0.0), SamplingConfig(1.0)):
        tree = growing.grow(TreeSpec(3, 2), sampling, torch.Generator().manual_seed(0), p.log(),
                                lambda tree, nodes: p.log().expand(len(nodes), -1), seed=seed)
        kids = tree.children()
        assert [tree.tokens[c] for c in kids[-1][:2]] == [0, 3]
        assert tree.tokens[kids[-1][2]] not in (0, 3) and p[tree.tokens[kids[-1][2]]] > 0
        assert torch.equal(tree.rows[kids[-1][0]], torch.eye(5)[0])
        if not sampling.greedy:  # the draft's child was drawn from p without the forced tokens
            torch.testing.assert_close(tree.rows[kids[-1][2]], torch.tensor([0, 0.75, 0.25, 0, 0]))
        assert tree.tokens[kids[kids[-1][0]][0]] == 2  # the forced token one level down, under its path
        assert all(tree.tokens[c] != 2 for c in kids[kids[-1][0]][1:])


def test_hybrid_tree_merges_lookup_and_draft():
    from specrepro.drafts.hybrid import trie

    target = tiny_llama(0, layers=2)
    seq = torch.tensor(PROMPT.tolist() + PROMPT.tolist())  # the prompt twice: lookup has a match
    lookup = LookupDraft(target.config.vocab_size, max_ngram=2)
    copied = lookup.propose_tree(seq, TreeSpec(3, 3), SamplingConfig(0.0))
    assert len(copied)
    for merge in (True, False):
        hybrid = HybridDraft(ModelDraft(tiny_llama(1)), lookup, merge_trees=merge)
        tree = hybrid.propose_tree(seq, TreeSpec(3, 3), SamplingConfig(0.0))
        assert set(trie(copied)[()]) <= {tree.tokens[c] for c in tree.children()[-1]}
        assert (len(tree) > len(copied)) == merge and hybrid.merged_loops == int(merge)


# --- 2. end to end ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("width, depth, temperature, top_k, top_p, max_nodes, eos, runner", CONFIGS)
def test_tree_sps_matches_exact_target_joint(tiny_pair, width, depth, temperature, top_k, top_p, max_nodes, eos,
                                             runner):
    target, draft = tiny_pair
    spec = TreeSpec(width, depth, max_nodes)
    sampling = SamplingConfig(temperature, top_k, top_p)
    seed = 300 + CONFIGS.index((width, depth, temperature, top_k, top_p, max_nodes, eos, runner))
    if runner == "lean":
        result, outcomes, stats = fit_tree(LeanRunner(target), ModelDraft(LeanRunner(draft)), spec, sampling, eos, seed,
                                      model=target)
    else:
        result, outcomes, stats = fit_tree(target, draft, spec, sampling, eos, seed)
    print(result)
    assert result.pvalue > ALPHA, result
    assert 5 <= result.cells <= MAX_CELLS, "too few cells for the test to mean anything, or more than its power allows"
    assert stats["full_path"] > 0, "no first loop accepted a full path: the leaf's bonus token went untested"
    assert stats["rejected_all"] > 0, "no first loop rejected every child: the final residual went untested"
    if eos is not None:
        assert any(len(o) < L for o in outcomes), "no sample stopped early at EOS"


@pytest.mark.parametrize("name, factory", TREE_DRAFTS)
def test_every_draft_kind_is_lossless_with_a_tree(name, factory):
    target = tiny_llama(0, layers=2)
    draft = factory(target, tiny_llama(1))
    # the target in the lean runner (faster; the HF runner's tree pass is covered by CONFIGS)
    result, _, stats = fit_tree(LeanRunner(target), draft, TreeSpec(3, 2), SamplingConfig(1.0), EOS,
                           seed=400 + [n for n, _ in TREE_DRAFTS].index(name), model=target)
    print(result)
    assert result.pvalue > ALPHA, result
    assert stats["accepted_any"] > 0, "no tree node was ever accepted"
    if isinstance(draft, HybridDraft):  # both proposers took part, alone and in one tree
        assert draft.lookup_loops > 0 and draft.fallback_loops > 0, (draft.lookup_loops, draft.fallback_loops)
        assert draft.merged_loops > 0, "no tree merged the lookup's tokens and the draft's"


@pytest.mark.parametrize("name, rule, draw_children", WRONG)
def test_end_to_end_harness_rejects_wrong_rules(tiny_pair, name, rule, draw_children):
    # draft seed 3: its first-token distribution is peaked where the target's is not, so that rejected
    # siblings matter (by exact enumeration of the first token, the noncentrality at N is ~280 for
    # "siblings not removed" and ~150 for "fallback to q"; with the seed-1 draft it is ~1-2: no power)
    target, _ = tiny_pair
    draft = ModelDraft(LeanRunner(tiny_llama(3)))
    if draw_children is not None:
        draft.children = draw_children  # this draft object's child draw only
    result, _, _ = fit_tree(LeanRunner(target), draft, TreeSpec(3, 2), SamplingConfig(1.0), EOS, seed=500, model=target,
                       rules=wrong.tree_rules(rule))
    print(result)
    assert result.pvalue < ALPHA, result


def test_end_to_end_power_draft_passes_with_the_right_rule(tiny_pair):
    target, _ = tiny_pair
    draft = ModelDraft(LeanRunner(tiny_llama(3)))
    result, _, _ = fit_tree(LeanRunner(target), draft, TreeSpec(3, 2), SamplingConfig(1.0), EOS, seed=501, model=target)
    print(result)
    assert result.pvalue > ALPHA, result


def test_width_one_is_the_chain_token_for_token():
    target = tiny_llama(0, layers=2)
    for name, factory in DRAFTS:
        if name in ("adaptive", "lookup", "lookup+feature"):
            continue  # the tree ignores confidence_threshold; lookup's trie also extends short matches
        for temperature in (0.0, 1.0):
            for seed in range(3):
                runs = []
                for tree in (None, TreeSpec(1, 3)):
                    draft = factory(target, tiny_llama(1))
                    runs.append(sr.speculative_generate(
                        target, draft, PROMPT, max_new_tokens=20, lookahead=3, temperature=temperature,
                        generator=torch.Generator().manual_seed(seed), tree=tree))
                chain, tree = runs
                assert tree.tokens.tolist() == chain.tokens.tolist(), (name, temperature, seed)
                assert tree.accepted == chain.accepted and tree.target_calls == chain.target_calls


def test_greedy_tree_follows_the_target_argmax_path(tiny_pair):
    target, draft = tiny_pair
    (path,) = exact_joint(target, PROMPT, 8, SamplingConfig(0.0), EOS).keys()
    for spec in (TreeSpec(2, 1), TreeSpec(3, 3), TreeSpec(4, 4, 9)):
        for runs_on in (target, LeanRunner(target)):
            gen = sr.speculative_generate(runs_on, draft, PROMPT, max_new_tokens=8, temperature=0, eos_token_id=EOS,
                                          tree=spec)
            assert tuple(gen.tokens.tolist()) == path
            assert all(0 <= a <= spec.depth for a in gen.accepted)


def test_lookup_branches_on_distinct_continuations():
    seq = torch.tensor([1, 2, 3, 1, 2, 4, 1, 2, 3, 0, 1, 2])  # "1 2" was followed by 3, 4 and 3 again
    tree = LookupDraft(5, max_ngram=2).propose_tree(seq, TreeSpec(3, 3), SamplingConfig(1.0))
    first = [tree.tokens[i] for i in range(len(tree)) if tree.parents[i] == -1]
    assert first == [3, 4]  # distinct, most recent first
    assert all(torch.equal(tree.rows[i], torch.eye(5)[tree.tokens[i]]) for i in range(len(tree)))
    assert len(LookupDraft(5).propose_tree(seq[:3], TreeSpec(2, 3), SamplingConfig(1.0))) == 0  # no match


# --- tree attention and KV compaction ----------------------------------------------------------------------


@pytest.mark.parametrize("make_runner", [HFRunner, LeanRunner], ids=["hf", "lean"])
def test_tree_pass_and_compaction_equal_fresh_forwards(make_runner):
    model = tiny_llama(0, layers=2, vocab=5)
    context = torch.tensor([0, 3, 2, 2])
    tree = fixed_tree()
    runner = make_runner(model)
    runner.prefill(context[:-1])
    logits = tree_module.verify(runner, context[-1:], tree)
    assert runner.length == len(context) + len(tree)
    check_tree_logits(logits, context, tree, lambda seq: model(input_ids=seq.view(1, -1)).logits[0, -1])
    for path in ([1, 5, 7], [0, 3, 6], [2]):  # compaction after each accepted path, on a fresh tree pass
        runner = make_runner(model)
        runner.prefill(context[:-1])
        tree_module.verify(runner, context[-1:], tree)
        runner.compact(tree_module.keep_slots(len(context) - 1, path))
        accepted = torch.cat([context, torch.tensor([tree.tokens[i] for i in path])])
        assert runner.length == len(accepted)
        reference = make_runner(model)
        reference.prefill(accepted)
        for mine, theirs in zip(kv(runner), kv(reference)):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
        # and the runner goes on from the compacted cache as from a fresh one
        nxt = torch.tensor([1])
        torch.testing.assert_close(runner.forward(nxt), reference.forward(nxt), rtol=1e-4, atol=1e-4)


def test_attention_mask_sees_context_and_ancestors():
    tree = fixed_tree()
    mask = tree_module.attention_mask(tree, 3, [-1] + list(range(len(tree))), [])
    assert mask.shape == (1 + len(tree), 3 + 1 + len(tree))
    assert mask[:, :3].all()
    node = 7  # path 1 -> 5 -> 7
    assert mask[1 + node, 3:].nonzero().flatten().tolist() == [0, 1 + 1, 1 + 5, 1 + 7]


# --- the real target -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_greedy_tree_parity_smollm(smollm, truncated_draft):
    from test_parity import PROMPTS, chat_ids

    model, tokenizer = smollm
    eos = tokenizer.eos_token_id
    lean = LeanRunner(model)
    branched = 0
    for prompt in PROMPTS:
        ids = chat_ids(tokenizer, prompt)
        ars = sr.autoregressive_generate(model, ids, max_new_tokens=24, temperature=0, eos_token_id=eos)
        hf = model.generate(ids[None], max_new_tokens=24, do_sample=False, eos_token_id=eos)[0, len(ids):]
        assert ars.tokens.tolist() == hf.tolist()
        for target, draft, spec in ((model, truncated_draft, TreeSpec(2, 3)), (lean, truncated_draft, TreeSpec(3, 4, 10)),
                                    (lean, LookupDraft(model.config.vocab_size), TreeSpec(3, 4)),
                                    (lean, HybridDraft(truncated_draft), TreeSpec(3, 3, 8))):
            sps = sr.speculative_generate(target, draft, ids, max_new_tokens=24, temperature=0, eos_token_id=eos,
                                          tree=spec)
            assert sps.tokens.tolist() == ars.tokens.tolist(), (prompt, spec)
            branched += sum(sps.accepted) > 0
    assert branched > 0, "no tree path was ever accepted: the acceptance went untested"


# --- bad input -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"width": 0, "depth": 3}, "width must be an integer >= 1"),
    ({"width": 2, "depth": 0}, "depth must be an integer >= 1"),
    ({"width": 2.5, "depth": 3}, "width must be an integer >= 1"),
    ({"width": 2, "depth": 4, "max_nodes": 3}, "smaller than depth"),
    ({"width": 2, "depth": 99}, "depth must be <="),
])
def test_bad_tree_spec_is_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TreeSpec(**kwargs)


class ChainOnly(Draft):
    vocab_size = 5

    def propose(self, seq, k, sampling, generator=None, target_hidden=None):
        return seq[-1:].repeat(k), torch.eye(5)[seq[-1:].repeat(k)]


def test_draft_that_cannot_branch_is_a_clear_error(tiny_pair):
    target, _ = tiny_pair
    with pytest.raises(ValueError, match="ChainOnly cannot propose a tree"):
        sr.speculative_generate(target, ChainOnly(), PROMPT, tree=TreeSpec(2, 3))
    # width 1 is a chain: any draft can do it
    assert len(sr.speculative_generate(target, ChainOnly(), PROMPT, max_new_tokens=5, tree=TreeSpec(1, 3)).tokens) == 5
    with pytest.raises(TypeError, match="tree must be a specrepro.TreeSpec"):
        sr.speculative_generate(target, ModelDraft(tiny_llama(1)), PROMPT, tree=(2, 3))


def test_parse_tree():
    assert tree_module.parse_tree("3x4") == TreeSpec(3, 4)
    assert tree_module.parse_tree("2x5/12") == TreeSpec(2, 5, 12)
    with pytest.raises(ValueError, match="WIDTHxDEPTH"):
        tree_module.parse_tree("3by4")
