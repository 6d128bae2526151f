"""Tiny random models for tests and the losslessness experiment: small enough to enumerate exactly."""
from __future__ import annotations

import torch


def tiny_llama(seed: int, vocab: int = 5, logit_scale: float = 12.0, layers: int = 1, window: int = 64,
               eos_token_id: int | None = 1):
    """A tiny random LlamaForCausalLM whose next-token distributions are far from uniform.

    The LM head is scaled by `logit_scale`: with the default initialisation the logits are near 0 and
    two seeds give almost the same (uniform) distributions, which no wrong sampler could be told apart on.
    `eos_token_id` (also the pad token) is written into the config; None gives a model without EOS.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=window,
        bos_token_id=0, eos_token_id=eos_token_id, pad_token_id=eos_token_id, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model
