import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

# Tests run on 2 cores next to other work: one thread keeps timings of the suite predictable.
torch.set_num_threads(1)

EOS = 1


def tiny_llama(seed: int, vocab: int = 5, logit_scale: float = 12.0, layers: int = 1, window: int = 64):
    """A tiny random Llama whose next-token distributions are far from uniform (logit_scale)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=window,
        bos_token_id=0, eos_token_id=EOS, pad_token_id=EOS, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


@pytest.fixture(scope="session")
def tiny_pair():
    """(target, draft): different random models over one 5-token vocabulary."""
    return tiny_llama(seed=0), tiny_llama(seed=1)


@pytest.fixture(scope="session")
def smollm():
    """The real offline target (converted once into SPECREPRO_HOME)."""
    import specrepro as sr

    return sr.load_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def truncated_draft(smollm):
    """A real draft that agrees often enough to exercise both paths: the target's first 26 layers with its final norm and head (weights copied)."""
    target, _ = smollm
    config = target.config.to_dict()
    config["num_hidden_layers"] = 26
    draft = LlamaForCausalLM(type(target.config).from_dict(config)).eval()
    draft.load_state_dict(target.state_dict(), strict=False)
    return draft
