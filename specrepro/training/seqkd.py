"""Sequence-level distillation (Kim & Rush 2016) for the small draft.

The corpus is text the target itself wrote: news summarisation chat prompts (train articles) and stdlib
code prefixes, continued by the target, half greedily and half sampled at T=1 (distill.gen_data). The
draft is the same small Llama as `small.py`; it trains on the continuation positions only, with the hard
labels the target sampled, mixed 50/50 with the target's cached top-k distribution there (free, since
the target pass over these sequences is cached anyway). `specrepro-drafts train seqkd`.
"""
from __future__ import annotations

from .distill import DATA_DEFAULTS, distill_data
from ..drafts.small import SmallDraft

SeqKDDraft = SmallDraft


def seqkd_corpus(target, tokenizer, cfg: dict | None = None) -> dict:
    """The cached target-written sequences with the target pass over them (gen_mask marks continuations)."""
    return distill_data(target, tokenizer, "gen", DATA_DEFAULTS | (cfg or {}))
