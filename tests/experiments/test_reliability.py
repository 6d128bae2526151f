"""Long runs lose nothing: kills, concurrent writers and damaged caches.

- a SIGKILLed `python -m specrepro.experiments.reproduce` resumes to the same outputs as an uninterrupted run;
- two processes appending to one results file, or rewriting one JSON/CSV, never corrupt it;
- two processes converting the offline model cache convert it once;
- a damaged model directory or cache is a clear error or is rebuilt, never loaded as garbage.
"""
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import specrepro as sr
import specrepro.models as models
from specrepro.experiments import reproduce
from helpers import tiny_llama
from specrepro.experiments.results import RUN_VARYING, ResultsFile, read_csv, write_csv
from specrepro.files import write_json
from helpers import word_tokenizer

ROOT = Path(__file__).resolve().parents[2]
FORK = multiprocessing.get_context("fork")


def _run_all(processes, timeout=60):
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout)
    assert [p.exitcode for p in processes] == [0] * len(processes)


# --- concurrent writers ---------------------------------------------------------------------------------

PAYLOAD = 20_000  # bytes per record: several write() calls' worth, so a torn interleaving would show


def _append_records(path, writer, n):
    results = ResultsFile(path)
    for i in range(n):
        results.append({"key": f"w{writer}-{i}", "writer": writer, "i": i, "payload": str(writer) * PAYLOAD})


def _reopen_repeatedly(path, seconds):
    # each open may repair a torn tail: it must never cut a line another process is still writing
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ResultsFile(path)


def test_concurrent_appends_to_one_results_file(tmp_path):
    path = tmp_path / "r.jsonl"
    writers = [FORK.Process(target=_append_records, args=(path, w, 60)) for w in range(3)]
    _run_all(writers + [FORK.Process(target=_reopen_repeatedly, args=(path, 2.0))])
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 180 and all(line.endswith(b"\n") for line in lines)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        records = ResultsFile(path).records
    assert set(records) == {f"w{w}-{i}" for w in range(3) for i in range(60)}
    assert all(r["payload"] == str(r["writer"]) * PAYLOAD for r in records.values())


def test_append_after_a_torn_tail_keeps_the_new_line(tmp_path):
    path = tmp_path / "r.jsonl"
    survivor = ResultsFile(path)  # opened before the other writer died
    survivor.append({"key": "a"})
    with open(path, "ab") as f:
        f.write(b'{"key": "b", "x"')  # another run killed mid-line
    survivor.append({"key": "c"})
    with pytest.warns(UserWarning, match="corrupt line"):
        assert set(ResultsFile(path).records) == {"a", "c"}


def _rewrite_tables(directory, writer, n):
    rows = [{"writer": writer, "i": i, "text": "w" * 200} for i in range(300)]
    for _ in range(n):
        write_json(directory / "t.json", {"writer": writer, "rows": rows})
        write_csv(directory / "t.csv", rows)


def test_concurrent_atomic_writes_never_tear(tmp_path):
    writers = [FORK.Process(target=_rewrite_tables, args=(tmp_path, w, 80)) for w in range(2)]
    for p in writers:
        p.start()
    seen = set()
    while any(p.is_alive() for p in writers):
        for name in ("t.json", "t.csv"):
            if (tmp_path / name).exists():
                if name == "t.json":
                    data = json.loads((tmp_path / name).read_text())
                    assert {r["writer"] for r in data["rows"]} == {data["writer"]}
                    seen.add(data["writer"])
                else:
                    rows = read_csv(tmp_path / name)
                    assert len(rows) == 300 and len({r["writer"] for r in rows}) == 1
    for p in writers:
        p.join(60)
        assert p.exitcode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.json"]  # no temp files left
    assert seen


# --- the offline model cache ----------------------------------------------------------------------------

def _fake_convert(log):
    """A stand-in for the 20 s GGUF conversion: a real tiny model, logged, slow enough to overlap."""
    def convert(gguf, out):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        tiny_llama(0, vocab=4).save_pretrained(out)
        word_tokenizer(["<unk>", "</s>", "hello", "world"]).save_pretrained(out)
        models.write_marker(out, gguf)
    return convert


@pytest.fixture
def fake_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECREPRO_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(models, "_convert_gguf", _fake_convert(tmp_path / "conversions.log"))
    monkeypatch.setattr(models, "find_offline_gguf", lambda: tmp_path / "x.gguf")
    return tmp_path


def _conversions(fake_home) -> int:
    log = fake_home / "conversions.log"
    return len(log.read_text().split()) if log.exists() else 0


def _convert_and_check():
    path = models.offline_target_dir()
    assert models._is_complete(path)


def test_two_processes_convert_the_cache_once(fake_home):
    _run_all([FORK.Process(target=_convert_and_check) for _ in range(2)])
    assert _conversions(fake_home) == 1
    assert sorted(p.name for p in (fake_home / "home" / "models").iterdir()) == [
        models.OFFLINE_TARGET, models.OFFLINE_TARGET + ".lock"]


def test_leftover_of_a_killed_conversion_is_removed(fake_home):
    stale = fake_home / "home" / "models" / f".{models.OFFLINE_TARGET}.tmp-99999999"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half" * 1000)
    models.offline_target_dir()
    assert not stale.exists() and _conversions(fake_home) == 1


def test_truncated_safetensors_is_a_clear_error(tmp_path):
    tiny_llama(0, vocab=4).save_pretrained(tmp_path)
    word_tokenizer(["<unk>", "</s>", "hello", "world"]).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    for damaged in (data[: len(data) // 2], data[:5], bytes(len(data))):
        weights.write_bytes(damaged)
        with pytest.raises(sr.ModelLoadError, match="weights file is damaged"):
            sr.load_model(str(tmp_path))


def test_garbled_cache_of_the_right_size_is_rebuilt(fake_home):
    model, _ = sr.load_model(models.OFFLINE_TARGET)
    ids = torch.tensor([[0, 2, 3]])
    expected = model(input_ids=ids).logits
    weights = models.offline_target_dir() / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(bytes(64) + weights.read_bytes()[64:])  # same size: the marker check passes
    assert weights.stat().st_size == size and models._is_complete(weights.parent)
    with pytest.warns(UserWarning, match="weights file is damaged.*rebuilding"):
        model, _ = sr.load_model(models.OFFLINE_TARGET)
    assert _conversions(fake_home) == 2
    assert torch.equal(model(input_ids=ids).logits, expected)


# --- a run killed in the middle of a notebook -------------------------------------------------------------

SMALL = ["--set", "n_samples=80", "--set", "chunk=10"]  # 4 settings x 8 chunks = 32 items


def _reproduce(output_root, **popen):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "agg"}
    cmd = [sys.executable, "-m", "specrepro.experiments.reproduce", "--profile", "smoke", "--only", "01_losslessness",
           "--output-root", str(output_root), *SMALL]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **popen)


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True) if path.exists() else []


def _kill_when_some_lines(proc, results: Path, at_least: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while len(_lines(results)) < at_least:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the run wrote no results"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the runner and its notebook kernel, as a power cut would
    proc.wait()


def _outputs(root: Path) -> dict:
    figures = root / "figures"
    out = {name: (figures / name).read_bytes() for name in ("losslessness.csv", "losslessness_joint.csv")}
    for name in ("losslessness.json", "losslessness_joint.json"):
        data = json.loads((figures / name).read_text())
        for key in RUN_VARYING:  # when the run started and ended, and the load then
            data["meta"].pop(key)
        out[name] = data
    return out


@pytest.mark.notebooks
def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    clean = _reproduce(tmp_path / "clean")
    killed = _reproduce(tmp_path / "killed", start_new_session=True)
    (job,) = reproduce.plan("smoke", ["01_losslessness"], {"n_samples": 80, "chunk": 10}, tmp_path / "killed")
    results = Path(job[1]["results_dir"]) / "losslessness.jsonl"  # keyed by the settings
    _kill_when_some_lines(killed, results, at_least=3)
    before = _lines(results)
    complete = [line for line in before if line.endswith(b"\n")]
    assert 3 <= len(complete) < 32, "killed too late: make the run bigger"
    assert not (tmp_path / "killed" / "figures" / "losslessness.csv").exists()

    resumed = _reproduce(tmp_path / "killed")
    assert resumed.wait(120) == 0, resumed.stderr.read().decode()[-2000:]
    assert clean.wait(120) == 0, clean.stderr.read().decode()[-2000:]
    after = _lines(results)
    assert after[: len(complete)] == complete  # finished items kept as they were, not recomputed
    keys = [json.loads(line)["key"] for line in after]
    assert len(keys) == len(set(keys)) == 32  # none lost, none twice
    assert _outputs(tmp_path / "killed") == _outputs(tmp_path / "clean")
