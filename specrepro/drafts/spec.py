"""A draft from a short spec string, as the command-line tools and notebooks name them."""
from __future__ import annotations

from pathlib import Path

import torch

from .truncated import truncated_model


# "datastore+<spec>": below this estimated first-token acceptance the trained draft proposes instead (about the
# shipped trained drafts' measured first-token acceptance, ~0.35-0.4: the datastore yields where it expects less)
HYBRID_MIN_ACCEPT = 0.4


def make_draft(spec: str, target, dtype: torch.dtype | None = None, device=None):
    """A draft from a short spec.

    "truncated:N": the target's first N layers with its final norm and LM head, sharing the target's
    modules (specrepro.drafts.lookup.truncated_model; in the target's dtype). "feature:N" / "heads:N": that
    trained draft with its LM head cut to the N most frequent tokens (load's head_vocab). "model:<HF id or dir>" or a
    local model directory: a causal LM with the target's tokenizer (its vocabulary may be padded
    differently from the target's, as Qwen2.5's 0.5B and 7B are: the model carries its tokenizer's length). "lookup+<spec>": prompt lookup, falling
    back to <spec> where the context has no n-gram match (specrepro.drafts.HybridDraft). "datastore+<spec>": the
    datastore draft where its first token's estimated acceptance reaches HYBRID_MIN_ACCEPT, <spec> elsewhere. Anything else: a
    kind of specrepro.drafts.load (lookup, datastore, truncated, small, seqkd, feature, heads); "lookup+datastore" is
    prompt lookup with the datastore draft where the context has no match.
    dtype: what a model draft computes in (default: the target model's); pass the tuned runner's dtype
    (`compute_dtype(runner)`) so the draft runs as cheaply as the target does.
    device: where a "model:" draft is loaded (default: the target's input device, so draft and target
    exchange no tensors between devices); trained kinds always go to the target's device.
    """
    if dtype is None:
        dtype = next(target.parameters()).dtype
    if spec.startswith("lookup+"):
        from .hybrid import HybridDraft

        return HybridDraft(make_draft(spec[len("lookup+"):], target, dtype, device))
    if spec.startswith("datastore+"):
        from .artifacts import load
        from .hybrid import HybridDraft

        first = load("datastore", target=target)
        first.min_accept = HYBRID_MIN_ACCEPT
        return HybridDraft(make_draft(spec[len("datastore+"):], target, dtype, device), lookup=first)
    if spec.startswith("truncated:"):
        return truncated_model(target, int(spec.split(":", 1)[1]))
    if spec.startswith("model:") or Path(spec).expanduser().is_dir():
        from ..engines.runners import input_device
        from ..models import load_model

        model, tokenizer = load_model(spec.removeprefix("model:"), dtype=dtype, device=device or input_device(target))
        if tokenizer is not None:  # rows past its length are padding (specrepro.drafts.base.ModelDraft)
            model.tokenizer_length = len(tokenizer)
        return model
    from .artifacts import load
    from .kinds import TABLE

    kind, _, n = spec.partition(":")
    if n and kind in TABLE and TABLE[kind].cuttable_head:
        if not n.isdigit():
            raise ValueError(f"draft spec {spec!r}: after {kind}: comes the head's token count, e.g. {kind}:4096")
        return load(kind, target=target, dtype=dtype, head_vocab=int(n))
    return load(spec, target=target, dtype=dtype)
