"""Trained draft artifacts shipped inside the repository (artifacts/drafts/<kind>/).

sr.drafts.load(kind) uses one when the cache ($SPECREPRO_HOME/drafts) has no trained artifact of that kind
for the target. A shipped folder has the cache's layout (config.json, net.safetensors, complete.json) plus
manifest.json (the data it was trained on), train_log.csv and tau.json; complete.json records the
weights' sha256, checked before loading, so a damaged or truncated file (or a Git LFS pointer left by a
clone without LFS) is reported as such instead of failing deep inside torch. `make drafts` retrains them
from scratch with their config.json (specrepro.training.longrun).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..files import file_sha256

MARKER = "complete.json"
WEIGHTS = "net.safetensors"


def shipped_root() -> Path:
    """$SPECREPRO_SHIPPED_DRAFTS, else the repository's artifacts/drafts (an editable install's checkout)."""
    env = os.environ.get("SPECREPRO_SHIPPED_DRAFTS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "artifacts" / "drafts"


def find_shipped(kind: str, target_name: str, root=None) -> Path | None:
    """The shipped artifact folder of `kind` for this target, or None (nothing shipped for it)."""
    folder = (Path(root) if root is not None else shipped_root()) / kind
    if not (folder / "config.json").exists():
        return None
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise RuntimeError(f"the shipped {kind!r} draft {folder} has an unreadable config.json ({err})") from None
    if cfg.get("kind") != kind or cfg.get("target") != target_name:
        return None
    return folder


def verify(folder: Path) -> None:
    """Raise a clear RuntimeError unless the folder is a complete artifact whose weights match their hash."""
    folder = Path(folder)
    fix = ("restore it (git checkout -- artifacts/drafts) or retrain it: make drafts")
    if not (folder / MARKER).exists():
        raise RuntimeError(f"the draft artifact {folder} is incomplete (no {MARKER}); {fix}")
    try:
        meta = json.loads((folder / MARKER).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise RuntimeError(f"the draft artifact {folder} has a damaged {MARKER} ({err}); {fix}") from None
    want = meta.get("weights_sha256")
    weights = folder / WEIGHTS
    if want is None or not weights.exists():
        raise RuntimeError(f"the draft artifact {folder} lacks {WEIGHTS} or its recorded hash; {fix}")
    got = file_sha256(weights)
    if got != want:
        raise RuntimeError(f"the draft artifact {folder} is damaged: {WEIGHTS} has sha256 {got[:12]}..., "
                           f"{MARKER} records {want[:12]}... (a truncated file or a Git LFS pointer?); {fix}")
