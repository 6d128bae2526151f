"""Files written atomically: a reader never sees half a result, and a killed writer leaves the old file.
Also what a result file says about the code that made it (`provenance`: commit, dirty flag, code digest).

Every file or folder that must appear whole is written through `atomic_path`: built at a temporary name
beside its destination, then moved into place with os.replace (the old one or the new one, never half).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator


def specrepro_home() -> Path:
    """Where converted models, trained drafts and other artifacts are cached: $SPECREPRO_HOME, or
    ~/.cache/specrepro where it is unset or empty (an empty one would otherwise mean the working directory,
    and a checkout would fill with a converted model)."""
    return Path(os.environ.get("SPECREPRO_HOME") or Path.home() / ".cache" / "specrepro").expanduser()


def temporary_name(path: str | os.PathLike) -> Path:
    """A fresh name beside `path` for building it: `.NAME.tmp-PID-RANDOM` plus NAME's own suffix (a writer
    that picks its format by the suffix, as matplotlib does, sees the destination's)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}{path.suffix}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; write a file (or build a folder) there. When the block ends
    without an error, a file is fsynced and the temporary path moved onto `path` (os.replace); on an error it
    is removed and `path` stays as it was.

        with atomic_path("figures/x.png") as tmp:
            fig.savefig(tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"nothing was written to {tmp} for {path}")
        if tmp.is_file():
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` atomically (atomic_path)."""
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "x", encoding="utf-8", newline="") as f:
        f.write(text)
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


def code_digest() -> str:
    """A hash of the package's sources (Python and the native pass's C++): results made by other code are
    never reused."""
    root = Path(__file__).resolve().parent  # the whole specrepro package
    h = hashlib.sha256()
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.cpp")]):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def provenance(root: str | os.PathLike | None = None) -> dict:
    """What code made a result: the git commit of the checkout (None outside one), whether the checkout had
    uncommitted changes outside figures/ (what a run writes: `make reproduce` rewrites the figures of the
    notebooks before it, which says nothing about the code), and the package's code digest."""
    root = Path(root) if root is not None else Path(__file__).resolve().parents[1]  # the checkout

    def git(*args):
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)figures") if commit else None
    return {"commit": commit, "dirty": bool(status) if commit else None, "code_digest": code_digest()}
