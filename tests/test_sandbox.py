"""Hostile programs must end with a clear status and leave the host unharmed."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from specrepro.tasks.sandbox import run_untrusted, sandbox_info

PROJECT = Path(__file__).resolve().parents[1]
IGNORED = {"__pycache__", ".pytest_cache", ".hypothesis", ".git"}


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in IGNORED]
        for name in filenames:
            stat = os.stat(os.path.join(dirpath, name))
            files[os.path.join(dirpath, name)] = (stat.st_size, stat.st_mtime_ns)
    return files


@pytest.fixture(scope="module", autouse=True)
def project_untouched():
    before = _snapshot(PROJECT)
    yield
    assert _snapshot(PROJECT) == before


def _token() -> str:
    # A unique `sleep` argument lets us find survivors from outside any pid namespace.
    return f"29.{random.randrange(10**8, 10**9)}"


def _alive_with(token: str) -> list[int]:
    alive = []
    for name in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if token.encode() in cmdline and state != b"Z":
            alive.append(int(name))
    return alive


def test_passing_and_failing_programs():
    ok = run_untrusted("print('hello')")
    assert (ok.status, ok.returncode, ok.stdout) == ("passed", 0, "hello\n")
    bad = run_untrusted("assert 1 + 1 == 3")
    assert bad.status == "failed" and bad.returncode == 1
    assert "AssertionError" in bad.stderr


def test_infinite_loop_times_out_on_time():
    start = time.monotonic()
    result = run_untrusted("while True:\n    pass", timeout=1.0)
    assert result.status == "timed_out"
    assert time.monotonic() - start < 3.0


def test_bounded_fork_bomb_is_contained_and_reaped():
    token = _token()
    code = (
        "import os\nn = 0\n"
        "try:\n"
        "    for _ in range(200):\n"
        "        if os.fork() == 0:\n"
        f"            os.execv('/bin/sleep', ['sleep', '{token}'])\n"
        "        n += 1\n"
        "except OSError:\n    pass\n"
        "print(n, flush=True)\n"
    )
    result = run_untrusted(code, timeout=5.0, max_processes=32)
    assert result.status == "passed", result.stderr
    if sandbox_info().nproc_enforced:
        assert int(result.stdout) < 32
    time.sleep(0.2)
    assert _alive_with(token) == []


def test_allocating_4gb_fails_without_hurting_host():
    result = run_untrusted("block = bytearray(4 * 1024**3)\nprint('allocated')", memory_mb=512)
    assert result.status in ("failed", "killed")
    assert "allocated" not in result.stdout


def test_huge_file_is_stopped_by_file_size_limit():
    limit = 1024 * 1024
    code = (
        "import os\n"
        "try:\n"
        "    with open('big.bin', 'wb') as f:\n"
        "        for _ in range(100):\n"
        "            f.write(b'x' * 1024 * 1024)\n"
        "except OSError:\n"
        "    print(os.path.getsize('big.bin'))\n"
        "    raise\n"
    )
    result = run_untrusted(code, max_file_bytes=limit)
    assert result.status in ("failed", "killed")
    if result.stdout:
        assert int(result.stdout) <= limit


def test_scratch_dir_is_cwd_home_and_removed():
    code = "import os\nprint(os.getcwd())\nprint(os.environ['HOME'])\nopen('scratch.txt', 'w').write('x')"
    result = run_untrusted(code)
    assert result.status == "passed", result.stderr
    cwd, home = result.stdout.split()
    assert cwd == home and Path(cwd).name.startswith("specrepro-sandbox-")
    assert not Path(cwd).exists()


def test_writing_outside_scratch(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    intruder = tmp_path / "intruder.txt"
    code = (
        "import os\n"
        f"for action in (lambda: open({str(intruder)!r}, 'w').write('x'),\n"
        f"               lambda: os.remove({str(victim)!r})):\n"
        "    try:\n        action()\n    except OSError as error:\n        print(type(error).__name__)\n"
    )
    result = run_untrusted(code)
    assert result.status == "passed", result.stderr
    if not sandbox_info().uid_drop:
        pytest.skip("without a uid drop the program may write wherever the parent user can")
    assert result.stdout.split() == ["PermissionError", "PermissionError"]
    assert victim.read_text() == "keep me" and not intruder.exists()


def test_parent_environment_does_not_leak(monkeypatch):
    monkeypatch.setenv("SPECREPRO_SECRET", "hunter2-secret")
    code = (
        "import os\n"
        "print('env' if 'SPECREPRO_SECRET' in os.environ else '')\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        if b'hunter2-secret' in open(f'/proc/{pid}/environ', 'rb').read():\n"
        "            print('proc', pid)\n"
        "    except OSError:\n        pass\n"
    )
    result = run_untrusted(code)
    assert result.status == "passed", result.stderr
    assert "env" not in result.stdout
    if sandbox_info().uid_drop:
        assert "proc" not in result.stdout


def test_network_socket_fails_fast():
    result = run_untrusted("import socket\nsocket.socket()", timeout=3.0)
    assert result.status == "failed" and "PermissionError" in result.stderr
    raw = "import _socket\ns = _socket.socket()\ns.settimeout(2)\ns.connect(('1.1.1.1', 80))"
    result = run_untrusted(raw, timeout=3.0)
    assert result.status != "passed"
    if sandbox_info().namespaces:
        assert result.status == "failed" and result.duration < 1.0


def test_setsid_double_fork_escapee_is_killed():
    info = sandbox_info()
    if not (info.uid_drop or info.namespaces):
        pytest.skip("setsid escapees survive without a uid drop or a pid namespace")
    token = _token()
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/bin/sleep', ['sleep', '{token}'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n"
    )
    result = run_untrusted(code, timeout=3.0)
    assert result.status == "passed", result.stderr
    for _ in range(2):
        time.sleep(0.2)
        assert _alive_with(token) == []


def test_megabytes_of_output_are_truncated():
    result = run_untrusted("import sys\nfor _ in range(20):\n    sys.stdout.write('y' * 1024 * 1024)",
                           max_output_bytes=10_000)
    assert result.status == "passed"
    assert result.stdout.startswith("y" * 10_000)
    assert len(result.stdout) < 10_200 and "truncated" in result.stdout
