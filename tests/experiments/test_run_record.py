"""Every result file records the run that made it (results.RunRecord), and every file that must appear whole
is written through one helper (files.atomic_path)."""
import argparse
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from specrepro.experiments import records
from specrepro.experiments.results import RunRecord, check_record, end_of_run
from specrepro.files import atomic_path, atomic_write_text

ROOT = Path(__file__).resolve().parents[2]

# Files of the GPU run that wrote no commit, whose commit and code digest were filled in afterwards from
# the commit that added them with the fixes that run needed; each says so ("reconstructed": why) and the test
# recomputes the digest from that commit's sources.
RECONSTRUCTED = {"gpu-check/bench-135m.json", "gpu-check/bench-1_7b.json"}


def _git(*args):
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    return out.stdout if out.returncode == 0 else None


def figure_files() -> list[str]:
    """The JSON files under figures/: the tracked ones in a checkout (a local smoke run's are not the
    repository's), every one otherwise."""
    tracked = _git("ls-files", "figures")
    if tracked is not None:
        names = [line for line in tracked.splitlines() if line.endswith(".json")]
    else:
        names = [p.relative_to(ROOT).as_posix() for p in (ROOT / "figures").rglob("*.json")]
    return sorted(n.removeprefix("figures/") for n in names)


def test_every_figure_json_records_commit_digest_and_machine():
    files = figure_files()
    assert len(files) >= 20, files  # the walk found the figures
    problems = []
    for name in files:
        data = json.loads((ROOT / "figures" / name).read_text())
        missing = check_record(data)
        if missing:
            problems.append(f"{name} lacks {missing}")
        reconstructed = isinstance(data.get("meta"), dict) and "reconstructed" in data["meta"].get("provenance", {})
        if reconstructed != (name in RECONSTRUCTED):
            problems.append(f"{name}: {'says' if reconstructed else 'does not say'} its record was reconstructed, "
                            f"RECONSTRUCTED says otherwise")
    assert not problems, "\n".join(problems)
    assert not (RECONSTRUCTED - set(files)), "RECONSTRUCTED names files that are gone"


def _digest_at(commit: str, tmp_path) -> str | None:
    """files.code_digest over the package sources of `commit` (None where git cannot give them)."""
    import hashlib
    import tarfile
    archive = tmp_path / "src.tar"
    out = subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), commit, "specrepro"],
                         capture_output=True, timeout=60)
    if out.returncode != 0:
        return None
    with tarfile.open(archive) as tar:
        members = {m.name.removeprefix("specrepro/"): tar.extractfile(m).read()
                   for m in tar.getmembers() if m.isfile() and m.name.endswith((".py", ".cpp"))}
    h = hashlib.sha256()
    for rel in sorted(members):
        h.update(rel.encode() + b"\0" + members[rel] + b"\0")
    return h.hexdigest()[:12]


@pytest.mark.parametrize("name", sorted(RECONSTRUCTED))
def test_a_reconstructed_record_names_the_commit_that_added_the_file_and_that_commits_digest(name, tmp_path):
    if _git("rev-parse", "--is-inside-work-tree") is None:
        pytest.skip("not a git checkout: the commit cannot be read")
    if _git("cat-file", "-e", f"{json.loads((ROOT / 'figures' / name).read_text())['meta']['provenance']['commit']}^{{commit}}") is None:
        pytest.skip("a shallow clone without the reconstructed commit")
    prov = json.loads((ROOT / "figures" / name).read_text())["meta"]["provenance"]
    assert prov["reconstructed"] and prov["dirty"] is None  # what the run did not record stays unknown
    assert prov["commit"] in _git("log", "--format=%H", "--", f"figures/{name}").split()
    added = _git("log", "--diff-filter=A", "--format=%H", "--", f"figures/{name}").split()
    assert added[-1] == prov["commit"], "the reconstructed commit must be the one that added the file"
    assert _digest_at(prov["commit"], tmp_path) == prov["code_digest"]


def test_check_record_names_what_a_file_lacks():
    record = RunRecord(argparse.Namespace(out="x")).meta()
    if record["provenance"]["commit"] is None:
        pytest.skip("not a git checkout: no commit to record")
    assert check_record({"meta": record, "rows": []}) == []
    assert check_record(record) == []  # a file without "meta" carries the record at its top
    no_commit = {**record, "provenance": {**record["provenance"], "commit": None}}
    assert check_record({"meta": no_commit}) == ["commit"]
    no_machine = {k: v for k, v in record.items() if k != "machine"}
    assert check_record({"meta": no_machine}) == ["machine"]
    assert check_record({"meta": {}}) == ["commit", "code digest", "machine"]
    assert check_record([1, 2]) == ["commit", "code digest", "machine"]


def test_run_record_holds_portable_args_and_the_load_at_start_and_end(tmp_path):
    inside = ROOT / "figures" / "bench" / "x"
    record = RunRecord(argparse.Namespace(out=str(inside), cache=str(tmp_path / "y.jsonl"), n=3, ks=[1, 2]))
    meta = record.meta(extra="kept")
    assert meta["args"] == {"out": "figures/bench/x", "cache": "y.jsonl", "n": 3, "ks": [1, 2]}
    assert meta["extra"] == "kept"
    assert len(meta["load_average_start"]) == 3 and len(meta["load_average_end"]) == 3
    assert meta["machine"]["cpu_model"] and isinstance(meta["machine"]["cpu_flags"], list)
    assert meta["machine"]["torch_threads"] >= 1
    assert set(meta["provenance"]) == {"commit", "dirty", "code_digest"}
    assert str(ROOT) not in json.dumps(meta)  # no directory of this machine
    assert RunRecord({"a": 1}).meta()["args"] == {"a": 1} and "args" not in RunRecord().meta()
    later = end_of_run(meta)
    assert later["started"] == meta["started"] and later["finished"] >= meta["finished"]


def test_notebook_outputs_carry_the_record(tmp_path):
    meta = records.run_header("smoke", 0, None, notebook="test")
    out = records.write_outputs(tmp_path, "t", [{"a": 1}], meta)
    data = json.loads(Path(out["json"]).read_text())
    if data["meta"]["provenance"]["commit"] is not None:
        assert check_record(data) == []
    assert {"load_average_start", "load_average_end", "started", "finished"} <= set(data["meta"])


WRITERS = ["bench/harness.py", "bench/ops.py", "experiments/measure_drafts.py", "experiments/head_cost.py",
           "experiments/tree_tau.py", "experiments/records.py", "tuning/tune.py"]


def test_every_writer_of_a_result_file_uses_the_run_record():
    pkg = ROOT / "specrepro"
    for name in WRITERS:
        text = (pkg / name).read_text()
        assert "RunRecord(" in text, f"{name} writes a result file without the run record"
        # the pieces of the record by hand (what drifted before: raw vars(args), load averages, provenance())
        assert not re.search(r"os\.getloadavg|[^.\w]provenance\(\)|machine_info\(\)|vars\(args\)", text), name


# Temp-then-rename sites not yet moved to files.atomic_path: code that other work owns (the draft artifacts'
# writers, and the native pass's build)
ATOMIC_ELSEWHERE = ("specrepro/drafts/", "specrepro/training/", "specrepro/engines/native.py")


def test_one_atomic_write_helper():
    hand_written = []
    for path in sorted((ROOT / "specrepro").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "specrepro/files.py" or rel.startswith(ATOMIC_ELSEWHERE):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"os\.replace\(|os\.rename\(|\btmp\w*\.(replace|rename)\(", line):
                hand_written.append(f"{rel}:{i}: {line.strip()}")
    assert not hand_written, "use files.atomic_path:\n" + "\n".join(hand_written)


def test_atomic_path_replaces_whole_or_not_at_all(tmp_path):
    path = tmp_path / "fig.png"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            assert tmp.parent == tmp_path and tmp.suffix == ".png" and tmp.name.startswith(".fig.png.tmp-")
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["fig.png"]
    with atomic_path(path) as tmp:
        tmp.write_text("new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["fig.png"]
    with pytest.raises(FileNotFoundError, match="nothing was written"):
        with atomic_path(tmp_path / "empty.txt"):
            pass
    # a folder: built beside, moved into place; a failure removes the half-built folder
    with atomic_path(tmp_path / "model") as tmp:
        tmp.mkdir()
        (tmp / "w.bin").write_bytes(b"x")
    assert (tmp_path / "model" / "w.bin").read_bytes() == b"x"
    with pytest.raises(OSError):
        with atomic_path(tmp_path / "other") as tmp:
            tmp.mkdir()
            (tmp / "w.bin").write_bytes(b"x")
            raise OSError("disk full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png", "model"]
    assert os.listdir(tmp_path / "model") == ["w.bin"]
