"""Bad input gets a clear error naming the problem, never a traceback from inside torch."""
import pytest
import torch

import specrepro as sr
from conftest import tiny_llama


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(0, vocab=7, window=32), tiny_llama(1, vocab=7, window=32)


PROMPT = torch.tensor([0, 3])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(lookahead=0), ValueError, r"lookahead \(K\) must be an integer in 1\.\.32"),
        (dict(lookahead=-2), ValueError, "lookahead"),
        (dict(lookahead=33), ValueError, "lookahead"),
        (dict(lookahead=2.0), ValueError, "lookahead"),
        (dict(temperature=-1.0), ValueError, "temperature must be >= 0"),
        (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.01), ValueError, "top_p"),
        (dict(top_k=0), ValueError, "top_k must be a positive integer"),
        (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be an integer >= 0"),
        (dict(max_new_tokens=31), ValueError, "exceeds the target's context window of 32"),
        (dict(input_ids=torch.tensor([], dtype=torch.long)), ValueError, "empty prompt"),
        (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), ValueError, "empty prompt"),
        (dict(input_ids=torch.zeros(2, 3, dtype=torch.long)), ValueError, "batch size 1"),
        (dict(input_ids=torch.tensor([0, 7])), ValueError, "outside the vocabulary"),
        (dict(input_ids=torch.tensor([0.0, 1.0])), TypeError, "integer token ids"),
        (dict(input_ids=[0, 1]), TypeError, "LongTensor"),
    ],
)
def test_bad_arguments(pair, kwargs, error, message):
    target, draft = pair
    args = dict(input_ids=PROMPT, max_new_tokens=4, lookahead=2) | kwargs
    with pytest.raises(error, match=message):
        sr.speculative_generate(target, draft, **args)


def test_prompt_past_context_window(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="prompt \\(40 tokens\\).*context window"):
        sr.autoregressive_generate(target, torch.zeros(40, dtype=torch.long), max_new_tokens=1)


def test_draft_with_smaller_window_is_checked(pair):
    target, _ = pair
    short = tiny_llama(1, vocab=7, window=8)
    with pytest.raises(ValueError, match="draft's context window of 8"):
        sr.speculative_generate(target, short, PROMPT, max_new_tokens=10)


def test_vocab_mismatch(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="vocabularies differ \\(9 vs 7 tokens\\)"):
        sr.speculative_generate(target, tiny_llama(1, vocab=9), PROMPT, max_new_tokens=4)


def test_not_a_draft(pair):
    target, _ = pair
    with pytest.raises(TypeError, match="draft must be a Hugging Face causal LM"):
        sr.speculative_generate(target, "small", PROMPT, max_new_tokens=4)
    with pytest.raises(ValueError, match="needs a draft"):
        sr.speculative_generate(target, None, PROMPT, max_new_tokens=4)


def test_zero_new_tokens_returns_nothing(pair):
    target, draft = pair
    assert sr.speculative_generate(target, draft, PROMPT, max_new_tokens=0).tokens.numel() == 0
    assert sr.autoregressive_generate(target, PROMPT, max_new_tokens=0).tokens.numel() == 0


def test_ars_rejects_bad_sampling(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="temperature"):
        sr.autoregressive_generate(target, PROMPT, temperature=-0.5)


def _word_tokenizer(words):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


def test_mismatched_tokenizers():
    a = _word_tokenizer(["<unk>", "</s>", "hello", "world"])
    b = _word_tokenizer(["<unk>", "</s>", "world", "hello"])
    sr.check_tokenizers(a, _word_tokenizer(["<unk>", "</s>", "hello", "world"]))
    with pytest.raises(ValueError, match="tokenizers differ .*2 with different ids"):
        sr.check_tokenizers(a, b)
