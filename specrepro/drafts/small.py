"""The paper's draft: a small causal LM with the target's tokenizer, trained by token-level distillation.

It is a real transformers LlamaForCausalLM (so `generate(assistant_model=...)` accepts it too). Its
embeddings start as a PCA projection of the target's, which hands it the target's token geometry
for free; it is then trained on KL(q || p) to the target's cached top-k distributions, mixed with the
hard next-token label.
"""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .base import ModelDraft

DEFAULTS = {"hidden": 128, "layers": 2, "ffn": 384, "head_dim": 32, "hard_weight": 0.1, "lr": 2e-3,
            "batch": 8, "window": 128}


def small_config(target_config, cfg: dict) -> LlamaConfig:
    """A Llama config with the target's vocabulary, special tokens, RoPE and context window."""
    d = cfg["hidden"]
    return LlamaConfig(
        vocab_size=target_config.vocab_size,
        hidden_size=d,
        intermediate_size=cfg["ffn"],
        num_hidden_layers=cfg["layers"],
        num_attention_heads=d // cfg["head_dim"],
        num_key_value_heads=d // cfg["head_dim"],
        head_dim=cfg["head_dim"],
        max_position_embeddings=target_config.max_position_embeddings,
        rope_parameters=getattr(target_config, "rope_parameters", None),
        rms_norm_eps=target_config.rms_norm_eps,
        tie_word_embeddings=True,
        bos_token_id=target_config.bos_token_id,
        eos_token_id=target_config.eos_token_id,
        pad_token_id=getattr(target_config, "pad_token_id", None),
    )


def pca_embeddings(target_emb: torch.Tensor, d: int) -> torch.Tensor:
    """Target embeddings projected on their top-d principal directions, rescaled to RMS 0.05.

    The table is tied to the output head, so its scale sets the initial logit scale: RMS 1 would give
    logits of std ~sqrt(d) and a loss far above log(V).
    """
    e = target_emb.float()
    centred = e - e.mean(0)
    _, _, v = torch.linalg.svd(centred.T @ centred)  # 576 x 576: cheap, unlike an SVD of [V, 576]
    z = centred @ v[:, :d]
    return 0.05 * z / z.pow(2).mean().sqrt()


def init_small(target, cfg: dict | None = None, seed: int = 0) -> LlamaForCausalLM:
    """A fresh small LM for `target` (any HF causal LM); embeddings from the target's when d allows."""
    cfg = DEFAULTS | (cfg or {})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(small_config(target.config, cfg))
    emb = target.get_input_embeddings().weight.detach()
    if cfg["hidden"] <= emb.shape[1]:
        with torch.no_grad():
            model.get_input_embeddings().weight.copy_(pca_embeddings(emb, cfg["hidden"]))
    return model


class SmallDraft(ModelDraft):
    """ModelDraft around a small LlamaForCausalLM; `from_config` builds an untrained one for tests."""

    @classmethod
    def from_config(cls, target, cfg: dict | None = None, seed: int = 0) -> "SmallDraft":
        from ..engines.runners import input_device

        return cls(init_small(target, cfg, seed).to(input_device(target)).eval())  # beside the target
