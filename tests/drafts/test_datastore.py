"""The datastore draft: its suffix index, the rows it proposes, losslessness (chain and tree, chi-square, with a
deliberately wrong variant that must be rejected), loading, and the build file's resumable pieces.

Chain and tree losslessness at T = 1 are also covered by tests/helpers.DRAFTS (every draft kind); here, other
sampling settings on the same tiny in-memory datastore, and the power check. Family-wise alpha 0.01,
Bonferroni-corrected over this module's chi-square tests.
"""
import json
import random

import numpy as np
import pytest
import torch

import specrepro as sr
from helpers import EOS, PROMPT, TINY_STORE, fit_chain_or_tree, tiny_llama
from specrepro.algorithm.sampling import SamplingConfig
from specrepro.algorithm.tree import TreeSpec
from specrepro.drafts import Datastore, DatastoreDraft
from specrepro.training import datastore_build
from specrepro.drafts.datastore import SEP, read_sequences, shipped_tokens
from specrepro.drafts.growing import without
from specrepro.stats.exact import exact_joint

CORRECT = [  # (tree or None, temperature, top_k, top_p)
    (None, 0.7, 3, None),
    (None, 1.3, None, 0.9),
    (TreeSpec(2, 3), 0.7, None, None),
    (TreeSpec(3, 2, 4), 1.0, 3, None),
]
WRONG = [None, TreeSpec(3, 2)]
ALPHA = 0.01 / (len(CORRECT) + len(WRONG))


def tiny_draft(cls=DatastoreDraft, **kw):
    return cls(Datastore(TINY_STORE, max_ngram=3), 5, **kw)


class ArgmaxWithFrequencyRows(DatastoreDraft):
    """Wrong on purpose: takes the most frequent continuations but says they were drawn from the frequencies
    (the row is not what the token was drawn from), so the rejection step over-accepts them."""

    def children_of(self, p, m, greedy, generator=None):
        if greedy:
            return super().children_of(p, m, greedy, generator)
        return list(range(m)), [without(p, list(range(i))) for i in range(m)]


def test_index_finds_every_occurrence():
    rng = random.Random(0)
    seqs = [[rng.randrange(6) for _ in range(rng.randrange(1, 40))] for _ in range(50)]
    store = Datastore(seqs, max_ngram=5)
    assert store.n_tokens == sum(map(len, seqs)) and store.n_sequences == 50
    for _ in range(300):
        suffix = [rng.randrange(6) for _ in range(rng.randrange(1, 6))]
        n = len(suffix)
        want = sorted(s[e + 1] for s in seqs for e in range(n - 1, len(s) - 1) if s[e - n + 1: e + 1] == suffix)
        assert sorted(store.stream[store.matches(np.array(suffix)) + 1].tolist()) == want, suffix


def test_continuations_stop_at_the_end_of_their_sequence():
    store = Datastore([[0, 3, 2, 4, 2], [3, 2, 4, 0, 3, 2, 1], [1, 1, 1]], max_ngram=4)
    n, rows = store.continuations(np.array([4, 0, 3, 2]), 3)
    assert n == 4 and rows.tolist() == [[1, -1, -1]]
    n, rows = store.continuations(np.array([9, 0, 3, 2]), 3)  # 9 is nowhere: the longest match is 3 tokens
    assert n == 3 and sorted(rows.tolist()) == [[1, -1, -1], [4, 2, -1]]


def test_greedy_proposes_the_most_frequent_continuation_one_hot():
    draft = tiny_draft()
    # after "0 3" the store continues 2 4 0 / 4 2 / 4 4 2 / 2 4 1: 2 and 4 tie at the root (lower id first)
    tokens, p = draft.propose(torch.tensor([0, 3]), 3, SamplingConfig(0.0))
    assert tokens.tolist() == [2, 4, 0]
    assert torch.equal(p, torch.nn.functional.one_hot(tokens, 5).float())
    assert draft.sources["datastore"] == 1
    # a context with an earlier match of its last 2 tokens proposes what followed it there (prompt lookup)
    tokens, _ = draft.propose(torch.tensor([4, 4, 1, 0, 4, 4]), 2, SamplingConfig(0.0))
    assert tokens.tolist() == [1, 0] and draft.sources["context"] == 1


def test_sampled_rows_are_the_frequencies_they_were_drawn_from():
    draft = tiny_draft()
    g = torch.Generator().manual_seed(0)
    seen_branch = False
    for _ in range(20):
        tree = draft.propose_tree(torch.tensor([0, 3]), TreeSpec(3, 2), SamplingConfig(1.0), g)
        kids = tree.children()
        root_rows = [tree.rows[c] for c in kids[-1]]
        # the root's frequencies after "0 3": 2 twice, 4 twice
        assert torch.allclose(root_rows[0], torch.tensor([0, 0, 0.5, 0, 0.5]))
        for i, c in enumerate(kids[-1]):  # drawn without replacement: earlier siblings removed
            assert torch.allclose(tree.rows[c], without(root_rows[0], [tree.tokens[s] for s in kids[-1][:i]]))
            assert tree.rows[c][tree.tokens[c]] > 0
        seen_branch |= len(kids[-1]) == 2
    assert seen_branch


def test_sharpen_moves_p_towards_the_most_frequent():
    rows = np.array([[2], [2], [2], [4]])
    support, plain = tiny_draft().node_p(rows[:, 0])
    _, sharp = tiny_draft(sharpen=0.5).node_p(rows[:, 0])
    assert support == [2, 4] and plain[0] == pytest.approx(0.75) and sharp[0] == pytest.approx(0.9)


@pytest.mark.parametrize("tree, temperature, top_k, top_p", CORRECT)
def test_datastore_draft_is_lossless(tree, temperature, top_k, top_p):
    target = tiny_llama(0, layers=2)
    sampling = SamplingConfig(temperature, top_k, top_p)
    seed = 700 + CORRECT.index((tree, temperature, top_k, top_p))
    result, _, ran = fit_chain_or_tree(target, tiny_draft(), tree, sampling, seed)
    assert (ran if tree is None else ran["accepted_any"]) > 0  # the bonus path (chain), an acceptance (tree)
    assert result.pvalue > ALPHA, result


@pytest.mark.parametrize("tree", WRONG)
def test_rows_not_drawn_from_are_rejected(tree):
    target = tiny_llama(0, layers=2)
    sampling = SamplingConfig(1.0)
    seed = 800 + WRONG.index(tree)
    result, _, _ = fit_chain_or_tree(target, tiny_draft(ArgmaxWithFrequencyRows), tree, sampling, seed)
    assert result.pvalue < ALPHA, result


def test_greedy_sps_equals_the_target_argmax_path():
    target = tiny_llama(0, layers=2)
    (path,) = exact_joint(target, PROMPT, 8, SamplingConfig(0.0), EOS).keys()
    for tree in (None, TreeSpec(3, 3)):
        gen = sr.speculative_generate(target, tiny_draft(), PROMPT, max_new_tokens=8, lookahead=4, temperature=0,
                                      eos_token_id=EOS, tree=tree)
        assert tuple(gen.tokens.tolist()) == path


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="token ids >= 0"):
        Datastore([[1, -2]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        Datastore([[1, 7]], vocab_size=5)
    with pytest.raises(ValueError, match="sharpen"):
        tiny_draft(sharpen=0)
    with pytest.raises(FileNotFoundError, match="datastore build"):
        read_sequences(tmp_path / "none.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"tokens": [1]}\n')
    with pytest.raises(ValueError, match="line 1 is not a datastore record"):
        read_sequences(tmp_path / "bad.jsonl")


def test_build_file_is_appended_in_whole_pieces_and_a_torn_line_is_dropped(tmp_path):
    path = tmp_path / "tokens.jsonl"
    datastore_build.append_records(path, [{"id": "a", "tail": [1], "tokens": [2, 3]},
                                          {"id": "b", "tail": [], "tokens": [4]}])
    with open(path, "a") as f:
        f.write('{"id": "c", "tail": [5], "tok')  # an interrupted write
    assert [r["id"] for r in datastore_build.read_records(path)] == ["a", "b"]


def test_training_prompts_never_use_held_out_news_or_humaneval(smollm):
    from specrepro.tasks.humaneval import load_humaneval
    from specrepro.tasks.news import load_news

    _, tokenizer = smollm
    prompts = datastore_build.training_prompts(tokenizer, 300, 12)
    news = {p["id"] for p in prompts if p["kind"] == "news"}
    assert news == {e.id for e in load_news("train")}
    assert not news & {e.id for e in load_news("eval")}
    code = [p for p in prompts if p["kind"] == "code"]
    assert len(code) == 12 and all(p["id"].startswith("stdlib:") for p in code)
    def_lines = [next(line for line in p.prompt.splitlines() if line.startswith("def ")) for p in load_humaneval()]
    assert not [d for d in def_lines for c in code if d in c["prompt"]]


def test_load_uses_the_shipped_token_file(smollm):
    model, _ = smollm
    manifest = json.loads((shipped_tokens().parent / "manifest.json").read_text())
    draft = sr.drafts.load("datastore", target=model)
    assert isinstance(draft, DatastoreDraft) and draft.vocab_size == model.config.vocab_size
    assert draft.store.n_tokens == manifest["tokens_indexed"] and draft.store.n_sequences == manifest["sequences"]
    from specrepro.drafts.spec import make_draft

    hybrid = make_draft("lookup+datastore", model)
    assert isinstance(hybrid.fallback, DatastoreDraft)
    ids = torch.tensor([1, 9690, 198, 2683, 314, 260])
    gen = sr.speculative_generate(model, draft, ids, max_new_tokens=12, lookahead=4, temperature=0)
    ars = sr.autoregressive_generate(model, ids, max_new_tokens=12, temperature=0)
    assert gen.tokens.tolist() == ars.tokens.tolist()


def _context_continuations_by_windows(seq, depth, max_ngram, min_ngram):
    """The plain search the fast one must equal: every earlier n-gram compared, longest n first."""
    padded = np.concatenate([seq, np.full(depth, SEP, dtype=np.int64)])
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
        hits = np.nonzero((windows == seq[-n:]).all(1))[0]
        if len(hits):
            return n, padded[hits[:, None] + n + np.arange(depth)]
    return 0, np.empty((0, depth), dtype=np.int64)


@pytest.mark.parametrize("alphabet", [2, 3, 5, 50])
def test_context_search_equals_the_plain_window_search(alphabet):
    from specrepro.drafts.datastore import context_continuations

    rng = np.random.default_rng(alphabet)
    for trial in range(300):
        seq = rng.integers(0, alphabet, int(rng.integers(1, 60))).astype(np.int64)
        depth, lo = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        hi = int(rng.integers(lo, 9))
        n, rows = context_continuations(seq, depth, hi, lo)
        n0, rows0 = _context_continuations_by_windows(seq, depth, hi, lo)
        assert n == n0 and np.array_equal(rows, rows0), (seq, depth, hi, lo)


def test_draft_rows_are_fresh_zeroed_tensors_each_step():
    """zero_rows comes from calloc on the CPU: every call a new, zeroed, writable float32 tensor."""
    from specrepro.drafts.growing import one_hot_rows, zero_rows

    a = zero_rows(3, 10)
    a[0, 1] = 5.0
    b = zero_rows(3, 10)
    assert a.dtype == b.dtype == torch.float32 and b.abs().sum() == 0 and a[0, 1] == 5.0
    rows = one_hot_rows([2, 7], 10)
    assert rows.tolist() == [[0, 0, 1, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1, 0, 0]]
