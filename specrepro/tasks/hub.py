"""Lazy, clearly failing access to Hugging Face datasets (the optional ``online`` extra).

$SPECREPRO_DATASETS_DIR, when set, is a local mirror: ``<dir>/<hub name>/`` holds the data files (for example
``test.jsonl``, one split per file name), loaded by ``datasets`` without the network (a cluster without
internet access, or the gpu-test profile's XSum- and HumanEval-shaped files).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

MIRROR_ENV = "SPECREPRO_DATASETS_DIR"


def load_hub_split(name: str, split: str, **kwargs: Any) -> Any:
    """``datasets.load_dataset(name, split=split)``, or a RuntimeError saying why not."""
    try:
        datasets = importlib.import_module("datasets")
    except ImportError as error:
        raise RuntimeError(
            f"loading {name!r} needs the `datasets` package (pip install 'specrepro[online]'); "
            "use the offline source instead") from error
    mirror = os.environ.get(MIRROR_ENV)
    if mirror:
        local = Path(mirror).expanduser() / name
        if not local.is_dir():
            raise RuntimeError(f"${MIRROR_ENV} is {mirror}, which has no {name}/ folder; add it or unset ${MIRROR_ENV}")
        try:
            return datasets.load_dataset(str(local), split=split, **kwargs)
        except Exception as error:
            raise RuntimeError(f"could not load split {split!r} of the local copy {local}: {error}") from error
    try:
        return datasets.load_dataset(name, split=split, **kwargs)
    except Exception as error:  # the hub raises many types: connection, auth, missing split
        raise RuntimeError(
            f"could not load {name!r} split {split!r} from the Hugging Face Hub "
            f"(no network or no access?): {error}") from error
