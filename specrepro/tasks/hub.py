"""Lazy, clearly failing access to Hugging Face datasets (the optional ``online`` extra)."""

from __future__ import annotations

import importlib
from typing import Any


def load_hub_split(name: str, split: str, **kwargs: Any) -> Any:
    """``datasets.load_dataset(name, split=split)``, or a RuntimeError saying why not."""
    try:
        datasets = importlib.import_module("datasets")
    except ImportError as error:
        raise RuntimeError(
            f"loading {name!r} needs the `datasets` package (pip install 'specrepro[online]'); "
            "use the offline source instead") from error
    try:
        return datasets.load_dataset(name, split=split, **kwargs)
    except Exception as error:  # the hub raises many types: connection, auth, missing split
        raise RuntimeError(
            f"could not load {name!r} split {split!r} from the Hugging Face Hub "
            f"(no network or no access?): {error}") from error
