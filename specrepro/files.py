"""Files written atomically: a reader never sees half a result, and a killed writer leaves the old file."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` via a temporary file in the same directory and os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True, default=_jsonable) + "\n")


def _jsonable(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def portable_path(path: str | os.PathLike) -> str:
    """How a result file names a path, so that it carries no machine's directories: relative to the checkout
    when inside it, `$SPECREPRO_HOME/...` inside the cache, otherwise the file's name alone."""
    from .models import specrepro_home

    p = Path(path)
    if not p.is_absolute():
        return p.as_posix()
    p = p.resolve()
    for root, label in ((Path(__file__).resolve().parents[1], None), (specrepro_home().resolve(), "$SPECREPRO_HOME")):
        if p.is_relative_to(root):
            rel = p.relative_to(root).as_posix()
            return rel if label is None else f"{label}/{rel}"
    return p.name


def portable_args(args: dict) -> dict:
    """Command-line arguments as a result file records them: every absolute path made portable."""
    def one(value):
        if isinstance(value, (list, tuple)):
            return [one(v) for v in value]
        if isinstance(value, (str, os.PathLike)) and os.path.isabs(os.fspath(value)):
            return portable_path(value)
        return value
    return {k: one(v) for k, v in args.items()}


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
