"""Hostile programs must end with a clear status and leave the host unharmed."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from specrepro.tasks.sandbox import run_untrusted, sandbox_info

PROJECT = Path(__file__).resolve().parents[2]
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
    # A unique process name (at most 15 bytes) lets us find survivors from outside any pid namespace.
    return f"sbx{random.randrange(10**8, 10**9)}"


def _named(token: str) -> str:
    """Python that names the calling process ``token`` and sleeps (the sandbox lets no program exec)."""
    return f"import ctypes, time\nctypes.CDLL(None).prctl(15, b'{token}', 0, 0, 0)\ntime.sleep(29)\n"


def _alive_with(token: str) -> list[int]:
    alive = []
    for name in os.listdir("/proc"):
        try:
            comm = Path(f"/proc/{name}/comm").read_text().strip()
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if comm == token and state != b"Z":
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
        f"            exec({_named(token)!r})\n"
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
    error = "FileNotFoundError" if sandbox_info().private_dirs else "PermissionError"  # a private /tmp hides it
    assert result.stdout.split() == [error, error]
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
    # a connect that hung would take the socket's 5 s timeout; without a network it fails at once. The
    # bound leaves room for the sandbox's start-up (namespaces, mounts, two interpreters) on a loaded machine
    raw = "import _socket\ns = _socket.socket()\ns.settimeout(5)\ns.connect(('1.1.1.1', 80))"
    result = run_untrusted(raw, timeout=8.0)
    assert result.status != "passed"
    if sandbox_info().namespaces:
        assert result.status == "failed" and result.duration < 2.5


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
        f"        exec({_named(token)!r})\n"
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


def _tree_digest(root: Path, depth: int) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every entry of ``root`` down to ``depth`` levels (HOME is too big to walk whole)."""
    out = {}
    for entry in root.iterdir():
        stat = entry.lstat()
        out[str(entry)] = (stat.st_size, stat.st_mtime_ns)
        if depth > 1 and entry.is_dir() and not entry.is_symlink():
            try:
                out.update(_tree_digest(entry, depth - 1))
            except OSError:
                pass
    return out


def test_home_and_project_tree_untouched_by_absolute_paths(tmp_path):
    home, token = Path.home(), _token().replace(".", "")
    canaries = {home / f".specrepro-canary-{token}": b"home", PROJECT / f".specrepro-canary-{token}": b"project"}
    for path, data in canaries.items():
        path.write_bytes(data)
    try:
        before = {root: _tree_digest(root, 2) for root in (home, PROJECT)}
        targets = [str(p) for p in canaries] + [str(PROJECT / "specrepro" / "__init__.py"), str(home)]
        code = (
            "import os, shutil\n"
            f"for target in {targets!r}:\n"
            "    for attack in (lambda: open(target, 'a').write('pwned'), lambda: os.remove(target),\n"
            "                   lambda: shutil.rmtree(target), lambda: os.rename(target, target + '.x'),\n"
            f"                   lambda: open(os.path.join(target, 'intruder-{token}'), 'w').write('x')):\n"
            "        try:\n            attack()\n            print('DONE', target)\n"
            "        except OSError:\n            pass\n"
        )
        result = run_untrusted(code)
        assert result.status == "passed", result.stderr
        if not sandbox_info().uid_drop:
            pytest.skip("without a uid drop the program may write wherever the parent user can")
        assert "DONE" not in result.stdout
        for path, data in canaries.items():
            assert path.read_bytes() == data
        after = {root: _tree_digest(root, 2) for root in (home, PROJECT)}
        for root in (home, PROJECT):  # other work on this machine may touch HOME: compare only what we own
            assert not [p for p in after[root] if token in p and Path(p) not in canaries]
        assert after[PROJECT] == before[PROJECT]
    finally:
        for path in canaries:
            path.unlink(missing_ok=True)


def test_unbounded_fork_bomb_is_contained_and_reaped():
    if not sandbox_info().nproc_enforced:
        pytest.skip("as root without a uid drop RLIMIT_NPROC does not apply: a real fork bomb would hurt the host")
    token = _token()
    code = (
        "import os\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        f"            exec({_named(token)!r})\n"
        "    except OSError:\n        pass\n"
    )
    start = time.monotonic()
    result = run_untrusted(code, timeout=1.5, max_processes=16)
    assert result.status == "timed_out" and time.monotonic() - start < 5
    time.sleep(0.2)
    assert _alive_with(token) == []
    assert run_untrusted("print('still fine')").stdout == "still fine\n"  # the host can still start programs


def test_background_child_dies_with_the_sample():
    token = _token()
    code = f"import os\nif os.fork() == 0:\n    exec({_named(token)!r})\nprint('parent done')\n"
    result = run_untrusted(code, timeout=3.0)
    assert result.status == "passed" and result.stdout == "parent done\n" and result.duration < 2.5
    time.sleep(0.2)
    assert _alive_with(token) == []


HOSTILE_COMPLETIONS = {  # completion -> the status its sample must get
    "    return a + b\n": "passed",
    "    return a - b\n": "failed",
    "    while True:\n        pass\n": "timed_out",
    "    import os\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n":
        "timed_out",
    "    x = bytearray(4 * 1024**3)\n    return a + b\n": "failed",
    "    open('big', 'wb').write(b'x' * 64 * 1024**2)\n    return a + b\n": ("failed", "killed"),
    "    import sys\n    sys.stdout.write('y' * 8 * 1024**2)\n    sys.stderr.write('z' * 8 * 1024**2)\n"
    "    return a + b\n": "passed",
    "    import socket\n    socket.create_connection(('1.1.1.1', 80), timeout=5)\n    return a + b\n": "failed",
    "    import os\n    assert 'SPECREPRO_SECRET' not in os.environ\n    return a + b\n": "passed",
    # tests may not spawn processes (RLIMIT_NPROC 0, as the reference harness disables fork and Popen)
    "    import subprocess\n    subprocess.Popen(['/bin/sleep', '30'])\n    return a + b\n": "failed",
    "    open('/etc/passwd', 'a').write('x')\n    return a + b\n": "failed",
}


def test_a_batch_mixing_hostile_and_normal_completions(monkeypatch):
    from specrepro.tasks.humaneval import HumanEvalProblem, check_completion

    monkeypatch.setenv("SPECREPRO_SECRET", "hunter2-secret")
    problem = HumanEvalProblem("toy/add", "def add(a, b):\n", "    return a + b\n",
                               "def check(f):\n    assert f(2, 3) == 5\n", "add")
    statuses = {c: check_completion(problem, c, timeout=1.5) for c in HOSTILE_COMPLETIONS}
    for completion, expected in HOSTILE_COMPLETIONS.items():
        got = statuses[completion]
        assert got.status in (expected if isinstance(expected, tuple) else (expected,)), (completion, got)
        assert len(got.stdout) < 70_000 and len(got.stderr) < 70_000
        assert "hunter2" not in got.stdout + got.stderr
    # the run goes on after the hostile samples: a normal one still passes
    assert check_completion(problem, "    return b + a\n").status == "passed"
