"""Issue 25: what the sandboxed program can see and keep -- System V IPC, the filesystem view, its uid and
hostname -- and the fallback without namespaces: loud, refusable, and recorded with pass@k."""

from __future__ import annotations

import ast
import ctypes
import dataclasses
import random
import warnings

import pytest

from specrepro.experiments.table1 import _pass_rates
from specrepro.tasks import sandbox
from specrepro.tasks.humaneval import check_completion, load_humaneval
from specrepro.tasks.sandbox import SandboxWarning, run_untrusted, sandbox_info

IPC_CREAT, IPC_RMID = 0o1000, 0


def _need(layer: str) -> None:
    if not getattr(sandbox_info(), layer):
        pytest.skip(f"this machine offers no {layer}: {sandbox_info().containment}")


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    return libc


SHM_PROGRAM = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
print(libc.shmget({host_key}, 0, 0), ctypes.get_errno())          # the host's segment, by its key
mine = libc.shmget({own_key}, {size}, 0o1600)                      # a segment of its own, 256 MB
address = libc.shmat(mine, None, 0)
ctypes.memset(address, 1, {size})                                  # touched: really in RAM
print(mine >= 0, libc.msgget({own_key}, 0o1600) >= 0, flush=True)  # and a message queue
"""


def test_system_v_ipc_is_private_and_gone_with_the_program():
    _need("namespaces")
    libc = _libc()
    host_key, own_key = random.randrange(1 << 20, 1 << 30), random.randrange(1 << 20, 1 << 30)
    host = libc.shmget(host_key, 4096, IPC_CREAT | 0o666)
    assert host >= 0, ctypes.get_errno()
    try:
        size = 256 << 20
        result = run_untrusted(SHM_PROGRAM.format(host_key=host_key, own_key=own_key, size=size), memory_mb=512)
        assert result.status == "passed", result.stderr
        host_line, own_line = result.stdout.splitlines()
        assert host_line.split()[0] == "-1" and host_line.split()[1] == "2"  # ENOENT: the host's is not there
        assert own_line == "True True"  # control: it could make its own (so the next check has teeth)
        assert libc.shmget(own_key, 0, 0) == -1 and libc.msgget(own_key, 0) == -1  # gone with its namespace
    finally:
        libc.shmctl(host, IPC_RMID, None)


def test_the_filesystem_view_holds_only_the_interpreter_and_system_libraries():
    _need("private_dirs")
    info = sandbox_info()
    program = ("import os\nfor path in ('/', '/etc', '/dev'):\n    print(sorted(os.listdir(path)))\n"
               "for path in ('/usr/x', '/x', '/etc/x'):\n"
               "    try:\n        open(path, 'w')\n    except OSError as error:\n        print(error.errno)\n")
    result = run_untrusted(program)
    assert result.status == "passed", result.stderr
    top, etc, dev, *errors = result.stdout.splitlines()
    expected = {v.strip("/").split("/")[0] for v in info.visible} | {"tmp", "dev", "proc"}
    top = set(ast.literal_eval(top))
    assert top == expected and not {"work", "root", "home", "opt", "srv", "var"} & top
    assert ast.literal_eval(etc) == ["ld.so.cache"]
    assert set(ast.literal_eval(dev)) == {"full", "null", "random", "shm", "urandom", "zero"}
    assert errors == ["30", "30", "30"]  # EROFS: /usr and the root itself are read-only
    for path in info.visible:  # and each host path it shows is a real system or interpreter path
        assert path in sandbox.SYSTEM_VIEW or any(path.startswith(p) for p in ("/usr", "/opt", "/root", "/home"))


def test_a_non_root_uid_and_its_own_hostname_inside():
    _need("private_dirs")
    program = ("import os, socket\nprint(os.getuid(), os.getgid(), socket.gethostname())\n"
               "try:\n    os.setuid(0)\nexcept OSError as error:\n    print('setuid', error.errno)\n")
    result = run_untrusted(program)
    assert result.stdout.splitlines() == [f"{sandbox.INSIDE_UID} {sandbox.INSIDE_UID} sandbox", "setuid 22"], result


# ---- the fallback without namespaces ------------------------------------------------------------------

@pytest.fixture
def fallback(monkeypatch):
    reduced = dataclasses.replace(sandbox_info(), namespaces=False, unshare=None, private_dirs=False, visible=())
    monkeypatch.setattr(sandbox, "sandbox_info", lambda: reduced)
    monkeypatch.delenv(sandbox.MODE_VARIABLE, raising=False)
    return reduced


def test_the_fallback_warns_and_says_what_it_lacks(fallback):
    assert fallback.level == "fallback" and "network" in fallback.containment
    assert "NO namespaces" in fallback.containment
    with pytest.warns(SandboxWarning, match="WITHOUT user/net/pid/ipc namespaces"):
        assert run_untrusted("print('ok')").stdout == "ok\n"


@pytest.mark.filterwarnings("ignore::specrepro.tasks.sandbox.SandboxWarning")
def test_in_the_fallback_ipc_left_by_the_fresh_uid_is_removed(fallback, monkeypatch):
    """No IPC namespace: the host's segment is reachable (so the run's own segment was really in the host's
    IPC), but what the run's uid made is removed after it."""
    if not fallback.uid_drop:
        pytest.skip("not root: no fresh uid whose IPC objects could be told apart from the user's own")
    libc = _libc()
    own_key = random.randrange(1 << 20, 1 << 30)
    result = run_untrusted(SHM_PROGRAM.format(host_key=own_key + 1, own_key=own_key, size=1 << 20))
    assert result.status == "passed", result.stderr
    assert result.stdout.splitlines()[1] == "True True"
    assert libc.shmget(own_key, 0, 0) == -1 and libc.msgget(own_key, 0) == -1
    # power: without the clean-up, the same run's segment and queue stay in the host's IPC
    monkeypatch.setattr(sandbox, "_remove_ipc", lambda uid: None)
    run_untrusted(SHM_PROGRAM.format(host_key=own_key + 1, own_key=own_key, size=1 << 20))
    segment, queue = libc.shmget(own_key, 0, 0), libc.msgget(own_key, 0)
    try:
        assert segment >= 0 and queue >= 0
    finally:
        libc.shmctl(segment, IPC_RMID, None)
        libc.msgctl(queue, IPC_RMID, None)


def test_strict_mode_refuses_the_fallback(fallback, monkeypatch):
    monkeypatch.setenv(sandbox.MODE_VARIABLE, "strict")
    problem = load_humaneval(n=1)[0]
    with pytest.raises(RuntimeError, match="strict"):
        run_untrusted("print('ok')")
    with pytest.raises(RuntimeError, match="strict"):
        check_completion(problem, problem.canonical_solution)
    monkeypatch.setenv(sandbox.MODE_VARIABLE, "sloppy")
    with pytest.raises(ValueError, match="SPECREPRO_SANDBOX"):
        run_untrusted("print('ok')")


def test_strict_mode_refuses_namespaces_that_leave_the_interpreter_writable(monkeypatch):
    """Namespaces but no private root and no fresh uid: the program could rewrite the judge's stdlib."""
    _need("namespaces")
    reduced = dataclasses.replace(sandbox_info(), uid_drop=False, private_dirs=False, visible=())
    monkeypatch.setattr(sandbox, "sandbox_info", lambda: reduced)
    monkeypatch.setenv(sandbox.MODE_VARIABLE, "strict")
    with pytest.raises(RuntimeError, match="neither a private read-only root nor a fresh uid"):
        run_untrusted("print('ok')")
    monkeypatch.delenv(sandbox.MODE_VARIABLE)
    with pytest.warns(SandboxWarning, match="the interpreter's files included"):
        run_untrusted("print('ok')")
    monkeypatch.setenv(sandbox.MODE_VARIABLE, "strict")
    with warnings.catch_warnings():  # control: either layer is enough, even under strict
        warnings.simplefilter("error", SandboxWarning)
        sandbox._require_isolation(dataclasses.replace(reduced, uid_drop=True))
        sandbox._require_isolation(dataclasses.replace(reduced, private_dirs=True))


def test_strict_mode_runs_where_namespaces_exist(monkeypatch):
    _need("namespaces")
    monkeypatch.setenv(sandbox.MODE_VARIABLE, "strict")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SandboxWarning)
        assert run_untrusted("print('ok')").stdout == "ok\n"


def test_pass_at_k_rows_record_the_isolation():
    records = [{"item": "HumanEval/0", "status": "passed", "sandbox": "full"},
               {"item": "HumanEval/1", "status": "failed", "sandbox": "fallback"}]
    assert _pass_rates(records, (1,))["sandbox"] == "fallback, full"
    assert _pass_rates([{"item": "a", "status": "passed"}], (1,))["sandbox"] == "unrecorded"
    record = sandbox_info().record()
    assert record["level"] == sandbox_info().level and record["containment"] == sandbox_info().containment


SECCOMP_PROGRAM = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def call(*args):
    return libc.syscall(*args), ctypes.get_errno()
print([line.split()[1] for line in open('/proc/self/status') if line.startswith('Seccomp:')][0])
print(call(272, 0x10000000), call(101, 0, 0, 0, 0), call(250, 0), call(0x40000000 + 39), call(435, 0, 0))
print(call(56, 0x10000000 | 17, 0, 0, 0, 0))  # clone(CLONE_NEWUSER | SIGCHLD)
pid = os.fork()  # control: a plain fork (clone without namespace flags) still works
if pid == 0:
    os._exit(7)
print(os.waitpid(pid, 0)[1] >> 8, call(39)[0] > 0)  # and an ordinary syscall (getpid)
"""


def test_seccomp_refuses_namespaces_ptrace_keys_and_x32_and_allows_the_rest():
    _need("seccomp")
    result = run_untrusted(SECCOMP_PROGRAM)
    assert result.status == "passed", result.stderr
    mode, denied, clone, control = result.stdout.splitlines()
    assert mode == "2"  # SECCOMP_MODE_FILTER
    eperm, enosys = (-1, 1), (-1, 38)
    assert ast.literal_eval(denied.replace(") (", "), (")) == (eperm, eperm, eperm, eperm, enosys)
    assert ast.literal_eval(clone) == eperm
    assert control == "7 True"

