"""A training-free draft from the target itself: its own first layers and its LM head."""
from __future__ import annotations

import copy

import torch

from .base import ModelDraft


def truncated_model(target: torch.nn.Module, n_layers: int) -> torch.nn.Module:
    """Self-speculative draft: the target's first n_layers with its final norm and LM head.

    The modules are shared with the target (no weight copy); only the layer list is shorter.
    """
    layers = target.get_decoder().layers
    if not 1 <= n_layers < len(layers):
        raise ValueError(f"n_layers must be in 1..{len(layers) - 1} for a {len(layers)}-layer target, got {n_layers}")
    decoder = copy.copy(target.get_decoder())
    decoder._modules = dict(decoder._modules)  # its own module table: the target's stays untouched
    decoder.layers = torch.nn.ModuleList(layers[:n_layers])
    draft = copy.copy(target)
    draft._modules = dict(draft._modules)
    draft.model = decoder
    draft.config = decoder.config = copy.deepcopy(target.config)
    # HF assisted generation rewrites its assistant's generation_config (num_assistant_tokens): own copy
    draft.generation_config = copy.deepcopy(target.generation_config)
    draft.config.num_hidden_layers = n_layers
    if getattr(draft.config, "layer_types", None) is not None:  # per-layer cache kinds, where the config has them
        draft.config.layer_types = draft.config.layer_types[:n_layers]
    return draft


class TruncatedDraft(ModelDraft):
    """A ModelDraft over the target's own first layers."""

    def __init__(self, target: torch.nn.Module, n_layers: int = 4):
        super().__init__(truncated_model(target, n_layers))
        self.n_layers = n_layers
