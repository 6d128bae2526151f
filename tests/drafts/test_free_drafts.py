"""The training-free drafts: prompt lookup and truncated target layers."""
import json
import pytest
import torch

import specrepro as sr
from helpers import tiny_llama
from specrepro.drafts import LookupDraft, TruncatedDraft, truncated_model
from specrepro.algorithm.sampling import SamplingConfig


def test_lookup_proposes_continuation_of_latest_longest_match():
    d = LookupDraft(10, max_ngram=3)
    seq = torch.tensor([1, 2, 3, 4, 5, 2, 3, 9, 9, 1, 2, 3])
    assert d.lookup(seq, 4).tolist() == [4, 5, 2, 3]  # "1 2 3" matched at the start
    assert d.lookup(torch.tensor([7, 2, 3, 8, 6, 2, 3]), 2).tolist() == [8, 6]
    assert d.lookup(torch.tensor([1, 2, 3]), 4).numel() == 0  # nothing repeats


def test_lookup_p_rows_are_one_hot_on_the_proposals():
    d = LookupDraft(10)
    tokens, p = d.propose(torch.tensor([4, 5, 6, 4, 5]), 3, SamplingConfig(0.7))
    assert tokens.tolist() == [6, 4, 5]
    assert torch.equal(p, torch.nn.functional.one_hot(tokens, 10).float())


def test_lookup_with_no_match_falls_back_to_target_steps():
    target = tiny_llama(0, vocab=40)
    gen = sr.speculative_generate(target, LookupDraft(40), torch.tensor([0]), max_new_tokens=5, lookahead=3, temperature=0)
    ars = sr.autoregressive_generate(target, torch.tensor([0]), max_new_tokens=5, temperature=0)
    assert gen.tokens.tolist() == ars.tokens.tolist()


def test_lookup_rejects_bad_ngram_range():
    with pytest.raises(ValueError, match="min_ngram"):
        LookupDraft(10, max_ngram=1, min_ngram=2)


def test_truncated_model_shares_weights_and_leaves_target_intact():
    target = tiny_llama(0, vocab=9, layers=3)
    ids = torch.tensor([[0, 4, 2]])
    before = target(input_ids=ids).logits
    draft = truncated_model(target, 1)
    assert len(target.model.layers) == 3 and target.config.num_hidden_layers == 3
    assert len(draft.model.layers) == 1 and draft.config.num_hidden_layers == 1
    assert draft.model.layers[0] is target.model.layers[0] and draft.lm_head is target.lm_head
    assert torch.equal(target(input_ids=ids).logits, before)
    draft.generation_config.num_assistant_tokens = 99  # as HF assisted generation does to its assistant
    assert target.generation_config.num_assistant_tokens != 99
    assert not torch.allclose(draft(input_ids=ids).logits, before)


def test_truncated_layer_count_is_checked():
    with pytest.raises(ValueError, match="n_layers must be in 1..2"):
        TruncatedDraft(tiny_llama(0, layers=3), n_layers=3)


@pytest.mark.parametrize("make", [lambda t: LookupDraft(t.config.vocab_size), lambda t: TruncatedDraft(t, 1)])
def test_greedy_parity(make):
    target = tiny_llama(0, vocab=7, layers=2)
    prompt = torch.tensor([0, 3, 4, 3])
    ars = sr.autoregressive_generate(target, prompt, max_new_tokens=25, temperature=0)
    gen = sr.speculative_generate(target, make(target), prompt, max_new_tokens=25, lookahead=4, temperature=0)
    assert gen.tokens.tolist() == ars.tokens.tolist()


def test_adaptive_lookahead_stops_when_unsure_and_stays_exact():
    target, draft = tiny_llama(0, vocab=7, layers=2), tiny_llama(1, vocab=7)
    prompt = torch.tensor([0, 3])
    ars = sr.autoregressive_generate(target, prompt, max_new_tokens=30, temperature=0)
    fixed = sr.speculative_generate(target, draft, prompt, max_new_tokens=30, lookahead=6, temperature=0)
    adaptive_draft = sr.drafts.ModelDraft(draft, confidence_threshold=0.9)
    gen = sr.speculative_generate(target, adaptive_draft, prompt, max_new_tokens=30, lookahead=6, temperature=1.0,
                                  generator=torch.Generator().manual_seed(0))
    # every loop drafts at least one token (the last may have no budget left to draft) and some stop early
    assert min(gen.proposed[:-1]) >= 1 and any(p < 6 for p in gen.proposed[:-1]), gen.proposed
    greedy = sr.speculative_generate(target, sr.drafts.ModelDraft(draft, confidence_threshold=0.9), prompt,
                                     max_new_tokens=30, lookahead=6, temperature=0)
    assert greedy.tokens.tolist() == ars.tokens.tolist() == fixed.tokens.tolist()
    # one-hot greedy p is always fully confident: no early stop at temperature 0
    assert greedy.proposed[:-1] == fixed.proposed[:-1]
    with pytest.raises(ValueError, match="confidence_threshold"):
        sr.drafts.ModelDraft(draft, confidence_threshold=1.5)


def test_measure_cli_writes_the_drafts_table(tmp_path, smollm):
    from specrepro.experiments import measure_drafts as measure

    out = tmp_path / "fig" / "measure"
    rows = measure.main(["--drafts", "lookup", "--ks", "1,2", "--news", "1", "--code", "1", "--temps", "0",
                         "--new-tokens", "4", "--dtype", "float32", "--threads", "1",
                         "--results", str(tmp_path / "runs" / "m.jsonl"), "--out", str(out), "--tree", "2x2"])
    assert {(r["task"], r["K"], r["tree"]) for r in rows} == {
        (task, k, tree) for task in ("news", "code") for k, tree in ((1, ""), (2, ""), (2, "2x2"))}
    assert all(r["tau"] >= 1 and r["v"] > 0 and r["c"] > 0 for r in rows)
    tree_rows = [r for r in rows if r["tree"]]
    assert all(r["nodes"] == 6 and r["predicted_speedup"] != r["predicted_speedup"] for r in tree_rows)  # nan
    assert out.with_suffix(".csv").exists() and out.with_suffix(".json").exists()
    meta = json.loads(out.with_suffix(".json").read_text())["meta"]
    assert set(meta["provenance"]) >= {"commit", "dirty", "code_digest"} and len(meta["load_average_end"]) == 3


@pytest.mark.parametrize("argv, message", [(["--ks", "0"], "1..32"), (["--temps", "-1"], "--temps"),
                                           (["--new-tokens", "0"], "--new-tokens"),
                                           (["--tree", "2by4"], "WIDTHxDEPTH")])
def test_measure_cli_rejects_bad_arguments(argv, message, capsys):
    from specrepro.experiments import measure_drafts as measure

    with pytest.raises(SystemExit):
        measure.main(argv)
    assert message in capsys.readouterr().err


def test_hybrid_draft_greedy_equals_ars_and_uses_both_proposers(smollm):
    from specrepro.drafts import HybridDraft
    from specrepro.experiments.workloads import make_draft

    model, tokenizer = smollm
    text = "def add(a, b):\n    return a + b\n\n\ndef add3(a, b, c):\n    return"
    prompt = torch.tensor(tokenizer(text)["input_ids"])
    draft = make_draft("lookup+truncated:4", model)
    assert isinstance(draft, HybridDraft)
    ref = sr.autoregressive_generate(model, prompt, 24, temperature=0)
    got = sr.speculative_generate(model, draft, prompt, 24, lookahead=3, temperature=0)
    assert torch.equal(got.tokens, ref.tokens)
    assert draft.lookup_loops > 0 and draft.fallback_loops > 0


def test_hybrid_draft_rejects_bad_settings():
    from specrepro.drafts import HybridDraft

    target = tiny_llama(0)
    with pytest.raises(ValueError, match="fallback_k"):
        HybridDraft(target, fallback_k=0)
    with pytest.raises(ValueError, match="vocabulary"):
        HybridDraft(target, LookupDraft(target.config.vocab_size + 1))
