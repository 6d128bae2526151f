"""The GPU session's rehearsal (tests/gpu_session.sh): run as it runs on a bare GPU image, from a clean export
of the tracked tree (without the shipped drafts, which need not travel), with `PY` pointing at a python that
has torch and nothing of a virtual environment on PATH, DEVICE=cpu and tiny shapes; then the summary is read."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def export(dest: Path) -> Path:
    """The tracked files (as a fresh clone has them), the shipped drafts left out."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("the rehearsal exports the tracked tree with git: run it from a git clone")
    files = subprocess.run(["git", "ls-files", "-z", "--cached"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if name and not name.startswith("artifacts/drafts/") and (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def rehearse(tree: Path, out: Path, **env) -> subprocess.CompletedProcess:
    clean = {"HOME": os.environ.get("HOME", "/tmp"), "PATH": "/usr/bin:/bin", "PY": sys.executable,
             "DEVICE": "cpu", "SIZES": "tiny", "OUT": str(out), **env}
    return subprocess.run(["bash", "tests/gpu_session.sh"], cwd=tree, env=clean, capture_output=True, text=True,
                          timeout=300)


def test_rehearsal_writes_one_summary_and_one_tarball(tmp_path):
    tree = export(tmp_path / "tree")
    assert not (tree / "artifacts" / "drafts").exists()
    proc = rehearse(tree, tmp_path / "out", STAGES="versions,headline,costs,compile")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu-check.tar.gz", "summary.json"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ok"] and [s["stage"] for s in summary["stages"]] == ["versions", "headline", "costs", "compile"]
    assert all(s["status"] == "ok" and s["expected_h200_s"] > 0 and s["seconds"] > 0 for s in summary["stages"])
    head = summary["results"]["headline"]
    assert head["graphs"] == "none" and head["weights"] == "random" and len(head["rows"]) == 2
    assert all(r["greedy_equal_to_hf"] for r in head["rows"])  # our ArS = HF static-cache generate, greedy
    assert head["hf_graphs_compiled_while_timed"] == 0 and set(head["v"]) >= {"1", "4", "8", "64"}
    costs = summary["results"]["costs"]
    assert set(costs) == {"135m", "1.7b", "7b"}
    for shape, entry in costs.items():
        assert not entry["errors"], (shape, entry["errors"])
        kinds = {"feature", "heads", "small", "truncated:4"} | ({"model:135m"} if shape == "1.7b" else set()) | (
            {"model:0.5b"} if shape == "7b" else set())
        assert set(entry["c"]) == kinds and all(c > 0 for c in entry["c"].values())
    assert summary["results"]["compile"]["graphs"] == ["compile", "compile"]
    with tarfile.open(tmp_path / "out" / "gpu-check.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"versions.json", "headline.log", "costs.json", "compile.json"} <= names


def test_the_deadline_stops_stages_and_fails_the_run(tmp_path):
    tree = export(tmp_path / "tree")
    proc = rehearse(tree, tmp_path / "out", STAGES="versions,headline", DEADLINE="2")
    assert proc.returncode == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert not summary["ok"] and {s["status"] for s in summary["stages"]} == {"not run"}


def test_notebooks_are_skipped_without_papermill(monkeypatch, tmp_path):
    import importlib.util

    import gpu_session  # tests/ is on the path (pytest's rootdir conftest, as for helpers)

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "papermill" else real(name, *a))
    args = type("Args", (), {"json": str(tmp_path / "n.json"), "device": "cpu", "out": str(tmp_path)})()
    assert gpu_session.stage_notebooks(args, None) == {"status": "skipped", "reason": "not installed here: papermill"}


def test_unknown_stage_is_a_clear_error(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu_session.py"), "--stages", "headline,fast",
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode != 0 and "unknown stage(s) ['fast']" in proc.stderr
