"""A trained draft's LM head cut to its most frequent tokens (FR-Spec's frequency-ranked head, applied
without retraining): the subset, the head rows it keeps, exactness of SpS with it, and clear errors."""
import pytest
import torch

import specrepro as sr
from helpers import EOS, PROMPT, fit_chain
from specrepro.algorithm.sampling import SamplingConfig
from specrepro.drafts.common import frequency_subset
from specrepro.drafts.feature import FeatureDraft
from specrepro.drafts.heads import HeadsDraft
from specrepro.stats.toy import tiny_llama


def test_frequency_subset_ranks_by_count_keeps_special_ids_and_breaks_ties_by_id():
    counts = torch.tensor([5.0, 0.0, 9.0, 5.0, 7.0, 1.0])
    assert frequency_subset(None, counts, 3, 6).tolist() == [0, 2, 4]  # 9, 7, then 5 at the lower id
    assert frequency_subset(None, counts, 3, 6, special=[1]).tolist() == [1, 2, 4]  # EOS first, whatever its count
    assert frequency_subset(torch.tensor([1, 3, 5]), counts, 2, 6).tolist() == [3, 5]  # within what was kept
    assert frequency_subset(None, torch.tensor([2.0]), 2, 6).tolist() == [0, 1]  # missing counts are 0
    for bad in (0, 7, 2.5, True):
        with pytest.raises(ValueError, match="head_vocab must be an integer in 1..6"):
            frequency_subset(None, counts, bad, 6)


@pytest.mark.parametrize("cls, cfg", [(FeatureDraft, {"ffn": 32}), (HeadsDraft, {"heads": 3})])
def test_restrict_keeps_the_targets_head_rows_of_the_ranked_tokens(cls, cfg):
    target = tiny_llama(0)
    vocab = target.config.vocab_size
    draft = cls.init_for(target, cfg, keep=torch.tensor([0, 1, 2, 3]), seed=1)
    counts = torch.arange(vocab, 0, -1).float()  # lower ids more frequent
    counts[3] = 100.0
    draft.net.restrict(2, counts, special=[EOS])
    assert draft.net.keep.tolist() == [1, 3]
    assert torch.equal(draft.net.head, target.lm_head.weight.detach()[[1, 3]])
    gen = torch.Generator().manual_seed(0)
    tokens, p = draft.propose(PROMPT, 2, SamplingConfig(1.0), gen, torch.randn(2, target.config.hidden_size))
    assert torch.allclose(p.sum(-1), torch.ones(2)) and p[:, [0, 2, 4]].abs().sum() == 0
    assert set(tokens.tolist()) <= {1, 3}


def test_restricted_heads_draft_keeps_sps_exact():
    """3-token SpS samples with a heads draft cut to 2 of the target's 5 tokens against the target's exact
    joint (chi-square, alpha 0.01, fixed seed; the wrong-rule variants are rejected in test_lossless)."""
    target = tiny_llama(0)
    draft = HeadsDraft.init_for(target, {"heads": 3}, seed=5)
    draft.net.restrict(2, torch.tensor([1.0, 0.0, 3.0, 2.0, 0.0]), special=[EOS])
    assert draft.net.keep.tolist() == [1, 2]
    result, _, _ = fit_chain(target, draft, 3, SamplingConfig(1.0), EOS, seed=11)
    assert result.pvalue > 0.01, result
    g = torch.Generator().manual_seed(0)
    ars = sr.autoregressive_generate(target, PROMPT, max_new_tokens=10, temperature=0)
    sps = sr.speculative_generate(target, draft, PROMPT, max_new_tokens=10, lookahead=3, temperature=0, generator=g)
    assert torch.equal(ars.tokens, sps.tokens)


def test_load_cuts_the_shipped_drafts_head_and_refuses_what_it_cannot_cut(smollm):
    from specrepro.drafts.spec import make_draft
    from specrepro.drafts.artifacts import load

    model, tokenizer = smollm
    full = load("feature", target=model)
    cut = make_draft("feature:2048", model)
    assert full.net.keep.numel() > 2048 and cut.net.keep.numel() == 2048
    assert set(cut.net.keep.tolist()) <= set(full.net.keep.tolist())
    assert tokenizer.eos_token_id in cut.net.keep.tolist()
    words = tokenizer(" the")["input_ids"]
    assert set(words) <= set(cut.net.keep.tolist())  # the most frequent words stay
    assert load("heads", target=model, head_vocab=1024).net.keep.numel() == 1024
    with pytest.raises(ValueError, match="a 'small' draft has none to cut"):
        load("small", target=model, head_vocab=1024)
    with pytest.raises(ValueError, match=f"head_vocab must be an integer in 1\\.\\.{full.net.keep.numel()} "):
        load("feature", target=model, head_vocab=10 ** 6)
    with pytest.raises(ValueError, match="head's token count"):
        make_draft("feature:many", model)
    with pytest.raises(ValueError, match="pass token_counts"):
        from specrepro.drafts.datastore import written_token_counts

        written_token_counts("another-model", 5)


def test_head_cost_cli_times_each_head_size_and_records_its_provenance(tmp_path, smollm):
    import json
    import os

    from specrepro.experiments import head_cost

    out = tmp_path / "head_cost.json"
    rows = head_cost.main(["--kinds", "heads", "--sizes", "1024", "--reps", "3", "--threads", "1", "--out", str(out)])
    assert [(r["draft"], r["head_tokens"]) for r in rows] == [("heads", 16384), ("heads:1024", 1024)]
    assert all(r["draft_ms"] > 0 and r["c"] == pytest.approx(r["draft_ms"] / r["target_one_token_ms"]) for r in rows)
    meta = json.loads(out.read_text())["meta"]
    assert {"commit", "dirty", "code_digest"} <= set(meta["provenance"]) and meta["machine"]["cpu_count"] >= 1
    assert not os.path.isabs(meta["args"]["out"])  # no directory of the machine it ran on
    with pytest.raises(SystemExit):
        head_cost.main(["--reps", "1"])


@pytest.mark.parametrize("sampling", [SamplingConfig(0.0), SamplingConfig(1.0), SamplingConfig(0.7, top_k=5),
                                      SamplingConfig(1.0, top_p=0.9), SamplingConfig(0.8, top_k=3000)])
def test_drawing_over_the_kept_columns_is_the_full_rows_draw(sampling):
    """draw_kept (the kept columns only) against the full row with -inf elsewhere, as drafts drew before:
    the same token for the same uniform, and the same probabilities, on 200 seeds."""
    from specrepro.algorithm.sampling import sample
    from specrepro.drafts.common import draw_kept, expand_logits, full_rows

    vocab = 5000
    keep = torch.randperm(vocab, generator=torch.Generator().manual_seed(1))[:700].sort().values
    for seed in range(200):
        sub = 3 * torch.randn(len(keep), generator=torch.Generator().manual_seed(seed))
        ref_p = sampling.probs(expand_logits(sub, keep, vocab))
        ref = sample(ref_p, torch.Generator().manual_seed(seed))
        token, p = draw_kept(sub, keep, sampling, torch.Generator().manual_seed(seed))
        assert int(token) == int(ref)
        assert torch.allclose(full_rows(p.unsqueeze(0), keep, vocab)[0], ref_p, atol=1e-7, rtol=1e-5)
    token, p = draw_kept(sub, None, sampling, torch.Generator().manual_seed(0))  # a full head: unchanged
    assert int(token) == int(sample(sampling.probs(sub), torch.Generator().manual_seed(0)))
    if sampling.temperature == 0:  # greedy: the first of tied maxima, as probs' one-hot (no uniform drawn)
        tied = torch.tensor([1.0, 5.0, 2.0, 5.0])
        token, p = draw_kept(tied, torch.tensor([3, 4, 8, 9]), sampling, None)
        assert int(token) == 4 and torch.equal(p, sampling.probs(tied))
