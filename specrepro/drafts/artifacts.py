"""Trained draft artifacts and `load`: where artifacts live, how they are found, checked and turned into drafts.

An artifact lives in <root>/<kind>-<hash of its config>/ (root defaults to specrepro_home()/drafts):
config.json, the weights, and complete.json, written last, which marks it usable. specrepro.training makes
them; loading one imports nothing from it. With no artifact in the cache, `load` takes the one shipped in the
repository (specrepro.drafts.shipped).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from . import shipped
from .common import FrozenTargetParts
from .kinds import FREE_KINDS, KINDS, check_kind, target_name
from ..models import load_model, specrepro_home

VERSION = 2  # bump when a code change makes old artifacts and checkpoints incompatible
MARKER = shipped.MARKER


def config_hash(cfg: dict) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:10]


def artifact_dir(cfg: dict, root: str | os.PathLike | None = None) -> Path:
    root = Path(root) if root is not None else specrepro_home() / "drafts"
    return root / f"{cfg['kind']}-{config_hash(cfg)}"


def draft_device(target) -> torch.device:
    """Where a draft for `target` runs: the device of the target's input ids (its embedding's)."""
    from ..engines.runners import input_device

    return input_device(target)


def tied_head(net) -> set[str]:
    """The state-dict key of net's LM head when it is tied to the embedding (an HF model's config says so):
    the same tensor, so an artifact stores it once, as the embedding."""
    return {"lm_head.weight"} if getattr(getattr(net, "config", None), "tie_word_embeddings", False) else set()


def load_weights(net, weights: dict, new=()) -> None:
    """Load exported weights (any float dtype) into net; a tied LM head may be absent (it is the embedding), and
    so may the parameters named in `new` (a net that adds them to the one exported keeps their initial values)."""
    missing, unexpected = net.load_state_dict(weights, strict=False)
    tied = tied_head(net) | set(new)
    if set(missing) - tied or unexpected:
        raise ValueError(f"weights do not fit this draft: missing {sorted(set(missing) - tied)}, "
                         f"unexpected {sorted(unexpected)}")


def find_artifact(kind: str, target_name_: str, root=None) -> Path | None:
    """The most recently completed artifact of `kind` for this target."""
    root = Path(root) if root is not None else specrepro_home() / "drafts"
    found = []
    for d in root.glob(f"{kind}-*"):
        if (d / MARKER).exists() and (d / "config.json").exists():
            cfg = json.loads((d / "config.json").read_text())
            if cfg.get("kind") == kind and cfg.get("target") == target_name_:
                found.append(((d / MARKER).stat().st_mtime, d))
    return max(found)[1] if found else None


def artifacts_digest(kinds, root=None) -> str:
    """A hash of every trained artifact of these kinds that `load` could pick (the cache's and the shipped
    one, for any target): results keyed by it are recomputed when a draft is retrained or a new one ships."""
    cache = Path(root) if root is not None else specrepro_home() / "drafts"
    h = hashlib.sha256()
    for kind in sorted(set(kinds) & set(KINDS)):
        folders = sorted(cache.glob(f"{kind}-*")) + [shipped.shipped_root() / kind]
        for marker in (d / MARKER for d in folders):
            if marker.exists():
                h.update(f"{kind}\0{marker.parent.name}\0".encode() + marker.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def load(kind: str, target="smollm2-135m-instruct", path=None, root=None, dtype: torch.dtype | None = None,
         head_vocab: int | None = None, token_counts=None):
    """A ready Draft from a trained artifact (the newest for this kind and target unless `path`).

    With no `path` and no `root`, a kind the cache has no artifact of comes from the repository's shipped
    artifacts (drafts/shipped.py), whose weights are checked against their recorded hash first.
    Training-free kinds (lookup, datastore, truncated) are built from the target (`path`: a datastore build).
    dtype: what the draft computes in; default the target model's. Give the target runner's compute dtype
    when it differs from the model's (a float32 model run by a bfloat16 LeanRunner): a bfloat16 draft step
    costs about half a float32 one on CPU. The target model itself is never cast.
    head_vocab (kinds whose head can be cut: feature, heads): cut the head to this many of its tokens, the most
    frequent by token_counts ([V] counts; default: the tokens in the shipped datastore's target-written text, for
    the target that wrote it), EOS always kept: FR-Spec's frequency-ranked head, a cheaper step for a lower
    acceptance; lossless either way."""
    row = check_kind(kind, KINDS + FREE_KINDS)
    if head_vocab is not None and not row.cuttable_head:
        raise ValueError(f"head_vocab cuts the frozen LM head of the feature and heads drafts; a {kind!r} draft "
                         "has none to cut")
    if isinstance(target, str):
        target, _ = load_model(target)
    if not row.trained:
        return row.make(target, path)
    name = target_name(target)
    if path is None:
        path = find_artifact(kind, name, root)
    if path is None and root is None:  # nothing trained here: the artifact shipped with the repository
        path = shipped.find_shipped(kind, name)
        if path is not None:
            shipped.verify(path)
    path = Path(path) if path is not None else None
    if path is None or not (path / MARKER).exists():
        raise FileNotFoundError(
            f"no trained {kind!r} draft for target {name!r} under {root or specrepro_home() / 'drafts'} "
            f"and none shipped in {shipped.shipped_root()}; "
            f"train one with: specrepro-drafts train {kind} --budget-minutes 5"
        )
    cfg = json.loads((path / "config.json").read_text())
    if cfg["kind"] != kind or cfg["target"] != name:
        raise ValueError(f"{path} holds a {cfg['kind']} draft for {cfg['target']}, not {kind} for {name}")
    if dtype is None:
        dtype = next(target.parameters()).dtype  # the draft computes in the target's dtype (bfloat16 too)
    elif not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype such as torch.bfloat16, got {dtype!r}")
    try:
        net = _load_net(row, path, cfg, target, dtype)
    except Exception as err:  # noqa: BLE001 - never hand out a draft built from a damaged file
        raise RuntimeError(
            f"the {kind!r} draft artifact {path} is damaged ({type(err).__name__}: {err}); delete that directory "
            f"and train again: specrepro-drafts train {kind}"
        ) from None
    if head_vocab is not None:
        from .datastore import written_token_counts

        counts = written_token_counts(name, net.vocab) if token_counts is None else token_counts
        net.restrict(head_vocab, counts, special=eos_of(target))
    return row.wrap(net, target)


def _load_net(row, path: Path, cfg: dict, target, dtype: torch.dtype):
    """The artifact's net beside the target, in `dtype`: an HF model folder (the short trainer's small
    drafts) or net.safetensors (everything longrun exports, the shipped artifacts)."""
    from safetensors.torch import load_file

    if row.hf_model and (path / "model").is_dir():
        from transformers import LlamaForCausalLM

        return LlamaForCausalLM.from_pretrained(path / "model").to(device=draft_device(target), dtype=dtype)
    weights = load_file(str(path / "net.safetensors"))
    keep = weights["keep"] if "keep" in weights and weights["keep"].numel() else None
    net = row.build_net(target, cfg, keep)
    load_weights(net, weights)
    net.to(device=draft_device(target), dtype=dtype)  # beside the target: no per-step copies
    if isinstance(net, FrozenTargetParts):
        net.attach(target, dtype)  # the borrowed embedding and head in the draft's dtype too
    return net


def eos_of(target) -> list[int]:
    """The target's end-of-sequence ids (its config's and generation config's)."""
    ids = []
    for cfg in (target.config, getattr(target, "generation_config", None)):
        eos = getattr(cfg, "eos_token_id", None)
        ids += [eos] if isinstance(eos, int) else list(eos or [])
    return sorted(set(ids))
