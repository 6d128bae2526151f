"""Resumable experiment bookkeeping: an append-only JSON-lines results file and atomic writes.

Each finished item is one JSON line, flushed and fsynced before the next item starts, so a run killed at
any moment loses at most the item in flight. On restart the items already present are skipped. A line
torn by the kill (no trailing newline) is dropped with a warning and cut from the file; a complete line that
is not a valid record is skipped with a warning (the records after it are kept).
Appends and that clean-up hold an exclusive lock on the file (fcntl.flock), so two runs sharing a results
file never interleave their lines, and one never cuts a line that the other is still writing.
Final tables are written to a temporary file in the same directory and moved into place with os.replace
(files.atomic_path), so readers see the old file or the new one, never half of one.

The run record: every writer of a result file starts a `RunRecord(args)` before it writes anything and puts
`record.meta()` into the file (the commit, dirty flag and code digest; the machine; the arguments with
portable paths; the load averages at the start and the end). `check_record` says what a result file lacks.

Shards (`specrepro-reproduce --shard i/n`): with $SPECREPRO_SHARD = "i/n" set, a ResultsFile
reports every item of another shard as present, so the experiments loop over their own share only; reading
such an item raises ShardComplete (the summaries need every shard: `--merge` makes them). The share is a
hash of the item's key without its method/K part, so ArS and SpS of one prompt, and every K of one prompt,
run on the same machine (their timings are compared). Keys under "costs/" (a machine's cost measurements,
not items) are made by every shard.
"""
from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import json
import math
import os
import re
import warnings
import zlib
from pathlib import Path
from typing import Iterable

from ..engines.machine import RUN_VARYING, RunRecord, check_record, end_of_run, machine_info  # noqa: F401 (the run record)
from ..files import _jsonable, atomic_write_text, code_digest, provenance  # noqa: F401


SHARD_ENV = "SPECREPRO_SHARD"
_SAME_MACHINE = re.compile(r"/(K\d+|ArS|SpS)(?=/|$)")  # key parts whose timings are compared with each other
_EVERY_SHARD = ("costs/",)


class ShardComplete(Exception):
    """This shard has done all its items; results that need other shards' items come from `--merge`."""


def parse_shard(text: str) -> tuple[int, int]:
    """ "i/n" -> (i, n) with 0 <= i < n, or a ValueError saying what a shard looks like."""
    i, sep, n = str(text).partition("/")
    try:
        i, n = int(i), int(n)
    except ValueError:
        i = n = -1
    if not sep or not 0 <= i < n:
        raise ValueError(f"a shard is I/N with 0 <= I < N (e.g. 0/4 ... 3/4), got {text!r}")
    return i, n


def shard_of(key: str, n: int) -> int | None:
    """Which of n shards does item `key` (None: every shard does it)."""
    if str(key).startswith(_EVERY_SHARD):
        return None
    return zlib.crc32(_SAME_MACHINE.sub("", str(key)).encode()) % n


def current_shard() -> tuple[int, int] | None:
    text = os.environ.get(SHARD_ENV)
    return parse_shard(text) if text else None


class _ShardRecords(dict):
    def __init__(self, mine):
        super().__init__()
        self.mine = mine

    def __missing__(self, key):
        if not self.mine(key):
            raise ShardComplete(f"item {key!r} belongs to another shard: this shard's items are done; "
                                "run `specrepro-reproduce --merge` once every shard has finished")
        raise KeyError(key)


class ResultsFile:
    """Per-item results of one experiment, keyed by `record[key]`."""

    def __init__(self, path: str | os.PathLike, key: str = "key", shard: tuple[int, int] | bool | None = None):
        """shard: (i, n) to do only share i of n of the items; False: all; None: $SPECREPRO_SHARD, else all."""
        self.path = Path(path)
        self.key = key
        self.shard = current_shard() if shard is None else (shard or None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records: dict[str, dict] = _ShardRecords(self._mine) if self.shard else {}
        self._load()

    def _mine(self, key) -> bool:
        if self.shard is None:
            return True
        owner = shard_of(key, self.shard[1])
        return owner is None or owner == self.shard[0]

    def _load(self) -> None:
        if not self.path.exists():
            return
        with _locked(self.path) as f:
            self._read_and_repair(f)

    def _read_and_repair(self, f) -> None:
        data = f.read()
        lines = data.splitlines(keepends=True)
        torn = lines.pop() if lines and not lines[-1].endswith(b"\n") else b""
        offset = 0
        for line in lines:
            record = self._parse(line)
            if record is None:
                warnings.warn(f"{self.path}: skipped a corrupt line at byte {offset} ({len(line)} bytes); "
                              "that item will be redone")
            else:
                self.records[str(record[self.key])] = record
            offset += len(line)
        if torn:
            warnings.warn(
                f"{self.path}: dropped a torn last line at byte {offset} "
                f"({len(torn)} bytes, an interrupted write); that item will be redone"
            )
            f.truncate(offset)
            os.fsync(f.fileno())

    def _parse(self, line: bytes) -> dict | None:
        """The record on one complete line, or None if the line is not a JSON object with the key."""
        try:
            record = json.loads(line)
        except ValueError:
            return None
        return record if isinstance(record, dict) and self.key in record else None

    def __contains__(self, key: str) -> bool:
        return str(key) in self.records or not self._mine(str(key))

    def __len__(self) -> int:
        return len(self.records)

    def append(self, record: dict) -> None:
        """Write one item durably (flush + fsync) and remember it."""
        line = (json.dumps(record, sort_keys=True, default=_jsonable) + "\n").encode()
        with _locked(self.path) as f:
            if not _ends_clean(f):
                line = b"\n" + line  # a writer killed mid-line left a torn tail: keep our line whole
            f.seek(0, os.SEEK_END)
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.records[str(record[self.key])] = record

    def values(self) -> list[dict]:
        """The records in key order: an uninterrupted run, a resumed one and merged shards summarise (and
        bootstrap) the same list."""
        return [self.records[k] for k in sorted(self.records)]


@contextlib.contextmanager
def _locked(path: Path):
    """The file opened for reading and writing (created if missing) under an exclusive flock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    with os.fdopen(fd, "r+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield f
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _ends_clean(f) -> bool:
    """True if the file is empty or ends with a newline."""
    end = f.seek(0, os.SEEK_END)
    if end == 0:
        return True
    f.seek(end - 1)
    return f.read(1) == b"\n"


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
