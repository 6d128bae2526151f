"""A model draft whose vocabulary differs from the target's only in padding rows (one tokenizer, as
Qwen2.5-0.5B and Qwen2.5-7B: 151936 and 152064 rows, 151665 tokens): p is fitted to the target's columns
and SpS stays exactly the target's distribution; vocabularies that truly differ stay an error."""
import pytest
import torch

import specrepro as sr
from specrepro.algorithm.sampling import SamplingConfig
from specrepro.drafts.base import ModelDraft
from specrepro.stats.exact import chisquare_fit, exact_joint, truncate_outcome
from specrepro.stats.toy import tiny_llama

TOKENS = 5  # the shared tokenizer's length
PROMPT = torch.tensor([0, 3])


def padded_target(seed=0, rows=8):
    """A tiny target with TOKENS real tokens and padding rows after them that it never produces (its LM
    head gives them a -1e4 bias, as a trained checkpoint's padding rows get ~0 probability)."""
    model = tiny_llama(seed, vocab=rows)
    head = torch.nn.Linear(model.config.hidden_size, rows, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[TOKENS:] = -1e4
    model.lm_head = head
    return model


@pytest.mark.parametrize("target_rows, draft_rows", [(8, 6), (TOKENS, 7), (6, TOKENS)])
def test_padded_vocabularies_keep_sps_exact(target_rows, draft_rows):
    """Draft smaller than the target (the Qwen2.5 pair), larger, and exactly the tokenizer: the chi-square
    of 3-token SpS samples against the target's exact joint passes at a fixed seed."""
    target = padded_target(0, target_rows)
    draft = ModelDraft(tiny_llama(1, vocab=draft_rows), tokens=TOKENS)
    g = torch.Generator().manual_seed(0)
    outcomes = []
    for _ in range(1500):
        gen = sr.speculative_generate(target, draft, PROMPT, max_new_tokens=3, lookahead=2, generator=g)
        outcomes.append(truncate_outcome(gen.tokens, 3))
    assert draft.vocab_size == target_rows
    fit = chisquare_fit(outcomes, exact_joint(target, PROMPT, 3, SamplingConfig(1.0)))
    assert fit.pvalue > 0.01, fit
    # the draft never proposed a padding row: p is 0 there
    assert max(t for o in outcomes for t in o) < TOKENS


def test_padded_vocabularies_keep_greedy_parity():
    target = padded_target(2, 8)
    draft = ModelDraft(tiny_llama(3, vocab=6), tokens=TOKENS)
    ars = sr.autoregressive_generate(target, PROMPT, max_new_tokens=12, temperature=0)
    sps = sr.speculative_generate(target, draft, PROMPT, max_new_tokens=12, lookahead=3, temperature=0)
    assert torch.equal(ars.tokens, sps.tokens)


def test_vocabularies_that_truly_differ_are_an_error():
    target = padded_target(0, 8)
    with pytest.raises(ValueError, match="vocabularies differ .*give the tokenizer's length"):
        sr.speculative_generate(target, tiny_llama(1, vocab=6), PROMPT, max_new_tokens=3)  # length unknown
    small = tiny_llama(0, vocab=4)  # a target covering fewer tokens than the draft's tokenizer has
    with pytest.raises(ValueError, match="draft's tokenizer has 5 tokens, more than the target's 4"):
        sr.speculative_generate(small, ModelDraft(tiny_llama(1, vocab=6), tokens=TOKENS), PROMPT[:1], max_new_tokens=3)
    with pytest.raises(ValueError, match="tokenizer has 7 tokens but the draft model only 6 rows"):
        ModelDraft(tiny_llama(1, vocab=6), tokens=7)


def test_a_padding_token_from_the_target_is_a_clear_error():
    """A target that does produce a padding row the smaller draft cannot embed."""
    target = tiny_llama(0, vocab=8)
    draft = ModelDraft(tiny_llama(1, vocab=6), tokens=TOKENS)
    with pytest.raises(ValueError, match="padding row beyond the draft's 6"):
        sr.speculative_generate(target, draft, torch.tensor([0, 7]), max_new_tokens=3)


def test_make_draft_records_the_tokenizer_length(monkeypatch):
    from specrepro import models
    from specrepro.drafts.spec import make_draft

    class Tok:
        def __len__(self):
            return TOKENS

    monkeypatch.setattr(models, "load_model", lambda name, dtype, device: (tiny_llama(1, vocab=6), Tok()))
    draft = make_draft("model:some/padded-draft", padded_target(0, 8))
    assert draft.tokenizer_length == TOKENS
    gen = sr.speculative_generate(padded_target(0, 8), draft, PROMPT, max_new_tokens=4,
                                  generator=torch.Generator().manual_seed(0))
    assert gen.tokens.numel() == 4


def test_a_hybrid_draft_fits_its_model_part_to_a_padded_target():
    """lookup+model over a padded pair: both parts speak the target's columns, greedy SpS equals ArS, and a
    hybrid whose model's tokenizer length is unknown is the same clear error as the model alone."""
    from specrepro.drafts import HybridDraft

    target = padded_target(2, 8)
    prompt = torch.tensor([0, 3, 1, 0, 3])  # a repeated n-gram, so lookup proposes too
    hybrid = HybridDraft(ModelDraft(tiny_llama(3, vocab=6), tokens=TOKENS))
    ars = sr.autoregressive_generate(target, prompt, max_new_tokens=12, temperature=0)
    sps = sr.speculative_generate(target, hybrid, prompt, max_new_tokens=12, lookahead=3, temperature=0)
    assert torch.equal(ars.tokens, sps.tokens)
    assert hybrid.vocab_size == hybrid.lookup.vocab_size == hybrid.fallback.vocab_size == 8
    assert hybrid.lookup_loops > 0 and hybrid.fallback_loops > 0
    with pytest.raises(ValueError, match="give the tokenizer's length"):
        sr.speculative_generate(target, HybridDraft(ModelDraft(tiny_llama(1, vocab=6))), PROMPT, max_new_tokens=3)
