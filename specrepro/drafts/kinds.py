"""The table of draft kinds: one row per kind says what class proposes, what builds its net, its defaults
and whether its head can be cut. `load` (specrepro.drafts.artifacts) and the trainers
(specrepro.training) read this table instead of testing kind names one by one.

Trained kinds have an artifact (a net built by `build_net`, its weights, a config of `defaults` and
overrides); training-free kinds are made straight from the target by `make`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import feature, heads, small
from .datastore import DatastoreDraft
from .lookup import LookupDraft
from .truncated import TruncatedDraft
from ..engines.runners import context_window, vocab_size

TRUNCATED_LAYERS = 4  # the cheap self-speculative baseline; TruncatedDraft(target, n) for others


@dataclass(frozen=True)
class Kind:
    name: str
    draft: type  # the class that proposes
    trained: bool  # True: loaded from an artifact that specrepro.training makes
    build_net: Callable | None = None  # (target, cfg, keep) -> an untrained net (trained kinds)
    wrap: Callable | None = None  # (net, target) -> the draft (trained kinds)
    make: Callable | None = None  # (target, path) -> the draft (training-free kinds)
    defaults: dict = field(default_factory=dict)  # the net's and its training's settings
    cuttable_head: bool = False  # load(head_vocab=N) cuts its frozen LM head to N tokens (FR-Spec)
    hf_model: bool = False  # its net is a transformers model (saved as a model folder by the short trainer)


def target_name(target) -> str:
    """The name a target goes by in artifact configs: its model folder's or hub id's last part."""
    return Path(str(target.config.name_or_path)).name or "target"


def _small_net(target, cfg: dict, keep=None):
    return small.init_small(target, cfg, seed=cfg["seed"])


def _frozen_head_net(cls):
    def build(target, cfg: dict, keep: torch.Tensor | None = None):
        torch.manual_seed(cfg["seed"])
        return cls(target, cfg, keep)
    return build


def _datastore(target, path):
    from .datastore import load_datastore_draft

    return load_datastore_draft(target, path, target_name=target_name(target))


_SMALL = dict(draft=small.SmallDraft, trained=True, build_net=_small_net,
              wrap=lambda net, target: small.SmallDraft(net.eval()), hf_model=True)

TABLE: dict[str, Kind] = {k.name: k for k in (
    Kind("lookup", LookupDraft, trained=False,
         make=lambda target, path: LookupDraft(vocab_size(target), context_window=context_window(target))),
    Kind("datastore", DatastoreDraft, trained=False, make=_datastore),
    Kind("truncated", TruncatedDraft, trained=False,
         make=lambda target, path: TruncatedDraft(target, n_layers=TRUNCATED_LAYERS)),
    Kind("small", defaults=small.DEFAULTS, **_SMALL),
    # sequence-level distillation (Kim & Rush 2016): the small draft's net, trained on target-written text only
    Kind("seqkd", defaults=small.DEFAULTS | {"hard_weight": 0.5}, **_SMALL),
    Kind("feature", feature.FeatureDraft, trained=True, build_net=_frozen_head_net(feature.FeatureNet),
         wrap=feature.FeatureDraft, defaults=feature.DEFAULTS, cuttable_head=True),
    Kind("heads", heads.HeadsDraft, trained=True, build_net=_frozen_head_net(heads.HeadsNet),
         wrap=heads.HeadsDraft, defaults=heads.DEFAULTS, cuttable_head=True),
)}

KINDS = tuple(name for name, k in TABLE.items() if k.trained)  # need an artifact
FREE_KINDS = tuple(name for name, k in TABLE.items() if not k.trained)  # built straight from the target


def check_kind(kind: str, allowed=KINDS) -> Kind:
    """The table's row for `kind`, or a clear error naming the kinds allowed here."""
    if kind not in allowed:
        raise ValueError(f"unknown draft kind {kind!r}; choose one of {', '.join(allowed)}")
    return TABLE[kind]
