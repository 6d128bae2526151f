"""Resumable experiment bookkeeping: an append-only JSON-lines results file and atomic writes.

Each finished item is one JSON line, flushed and fsynced before the next item starts, so a run killed at
any moment loses at most the item in flight. On restart the items already present are skipped. A line
torn by the kill (no trailing newline, or not valid JSON) is dropped with a warning and cut from the file.
Final tables are written to a temporary file in the same directory and moved into place with os.replace,
so readers see the old file or the new one, never half of one.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterable


class ResultsFile:
    """Per-item results of one experiment, keyed by `record[key]`."""

    def __init__(self, path: str | os.PathLike, key: str = "key"):
        self.path = Path(path)
        self.key = key
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records: dict[str, dict] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        good_end = 0  # byte offset after the last complete, parseable line
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            try:
                record = json.loads(line)
            except ValueError:
                break
            self.records[str(record[self.key])] = record
            good_end += len(line)
        if good_end < len(data):
            dropped = data[good_end:]
            warnings.warn(
                f"{self.path}: dropped a torn or corrupt line at byte {good_end} "
                f"({len(dropped)} bytes, an interrupted write); that item will be redone"
            )
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
                f.flush()
                os.fsync(f.fileno())

    def __contains__(self, key: str) -> bool:
        return str(key) in self.records

    def __len__(self) -> int:
        return len(self.records)

    def append(self, record: dict) -> None:
        """Write one item durably (flush + fsync) and remember it."""
        line = json.dumps(record, sort_keys=True, default=_jsonable) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.records[str(record[self.key])] = record

    def values(self) -> list[dict]:
        return list(self.records.values())


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


def write_csv(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    """Rows of dicts -> CSV; the columns are the union of keys, in first-seen order."""
    rows = list(rows)
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: _cell(row.get(c)) for c in columns})
    return atomic_write_text(path, buf.getvalue())


def read_csv(path: str | os.PathLike) -> list[dict]:
    """CSV -> rows of dicts with numbers parsed back (ints, floats, nan); empty cells become None."""
    with open(path, newline="", encoding="utf-8") as f:
        return [{k: _parse(v) for k, v in row.items()} for row in csv.DictReader(f)]


def machine_info() -> dict:
    """Where the numbers were measured."""
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def _cell(value):
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return "" if value is None else value


def _parse(text: str):
    if text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _jsonable(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def markdown_table(rows: list[dict], columns: list[str] | None = None, digits: int = 4) -> str:
    """A Markdown table of rows (notebooks display it with IPython.display.Markdown)."""
    columns = columns or list(dict.fromkeys(c for r in rows for c in r))

    def fmt(v):
        if isinstance(v, float):
            return "nan" if math.isnan(v) else f"{v:.{digits}g}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
