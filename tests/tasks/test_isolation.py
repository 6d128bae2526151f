"""What the sandboxed program can see and keep -- System V IPC, the filesystem view, its uid and
hostname -- and the fallback without namespaces: loud, refusable, and recorded with pass@k."""

from __future__ import annotations

import ast
import ctypes
import dataclasses
import random
import warnings

import pytest

from specrepro.experiments.table1 import _pass_rates
from specrepro.tasks.humaneval import check_completion, load_humaneval
from specrepro.tasks.sandbox import SandboxWarning, containment, process, run_untrusted, sandbox_info

IPC_CREAT, IPC_RMID = 0o1000, 0


def _need(layer: str) -> None:
    if not getattr(sandbox_info(), layer):
        pytest.skip(f"this machine offers no {layer}: {sandbox_info().containment}")


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    return libc


IPC_PROGRAM = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.msgget({host_key}, 0), ctypes.get_errno())                        # the host's queue, by its key
print(libc.msgget({own_key}, 0o1600) >= 0, libc.semget({own_key}, 1, 0o1600) >= 0, flush=True)  # its own
"""


def test_system_v_ipc_is_private_and_gone_with_the_program():
    _need("namespaces")
    libc = _libc()
    host_key, own_key = random.randrange(1 << 20, 1 << 30), random.randrange(1 << 20, 1 << 30)
    host = libc.msgget(host_key, IPC_CREAT | 0o666)
    assert host >= 0, ctypes.get_errno()
    try:
        result = run_untrusted(IPC_PROGRAM.format(host_key=host_key, own_key=own_key))
        assert result.status == "passed", result.stderr
        host_line, own_line = result.stdout.splitlines()
        assert host_line.split() == ["-1", "2"]  # ENOENT: the host's queue is not there
        assert own_line == "True True"  # control: it could make its own (so the next check has teeth)
        assert libc.msgget(own_key, 0) == -1 and libc.semget(own_key, 0, 0) == -1  # gone with its namespace
    finally:
        libc.msgctl(host, IPC_RMID, None)


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
        assert path in containment.SYSTEM_VIEW or any(path.startswith(p) for p in ("/usr", "/opt", "/root", "/home"))


def test_a_non_root_uid_and_its_own_hostname_inside():
    _need("private_dirs")
    program = ("import os, socket\nprint(os.getuid(), os.getgid(), socket.gethostname())\n"
               "try:\n    os.setuid(0)\nexcept OSError as error:\n    print('setuid', error.errno)\n")
    result = run_untrusted(program)
    assert result.stdout.splitlines() == [f"{containment.INSIDE_UID} {containment.INSIDE_UID} sandbox", "setuid 22"], result


# ---- the fallback without namespaces ------------------------------------------------------------------

@pytest.fixture
def fallback(monkeypatch):
    """This machine's sandbox with no namespaces (and so no private root): the fallback level, forced."""
    reduced = dataclasses.replace(sandbox_info(), namespaces=False, unshare=None, private_dirs=False, visible=())
    monkeypatch.setattr(containment, "sandbox_info", lambda: reduced)
    monkeypatch.delenv(containment.MODE_VARIABLE, raising=False)
    return reduced


def test_the_fallback_warns_and_says_what_it_lacks(fallback):
    assert fallback.level == "fallback" and "network" in fallback.containment
    assert "NO namespaces" in fallback.containment
    with pytest.warns(SandboxWarning, match="'fallback' level, WITHOUT user/net/pid/ipc namespaces") as caught:
        assert run_untrusted("print('ok')").stdout == "ok\n"
    assert "private read-only root" in str(caught[0].message)


@pytest.mark.filterwarnings("ignore::specrepro.tasks.sandbox.SandboxWarning")
def test_in_the_fallback_ipc_left_by_the_fresh_uid_is_removed(fallback, monkeypatch):
    """No IPC namespace: the host's IPC is reachable (so the run's own queue was really in the host's IPC),
    but what the run's uid made is removed after it."""
    if not fallback.uid_drop:
        pytest.skip("not root: no fresh uid whose IPC objects could be told apart from the user's own")
    libc = _libc()
    own_key = random.randrange(1 << 20, 1 << 30)
    result = run_untrusted(IPC_PROGRAM.format(host_key=own_key + 1, own_key=own_key))
    assert result.status == "passed", result.stderr
    assert result.stdout.splitlines()[1] == "True True"
    assert libc.msgget(own_key, 0) == -1 and libc.semget(own_key, 0, 0) == -1
    # power: without the clean-up, the same run's queue and semaphore stay in the host's IPC
    monkeypatch.setattr(process, "remove_ipc", lambda uid: None)
    run_untrusted(IPC_PROGRAM.format(host_key=own_key + 1, own_key=own_key))
    queue, semaphore = libc.msgget(own_key, 0), libc.semget(own_key, 0, 0)
    try:
        assert queue >= 0 and semaphore >= 0
    finally:
        libc.msgctl(queue, IPC_RMID, None)
        libc.semctl(semaphore, 0, IPC_RMID)


def test_strict_mode_refuses_the_fallback(fallback, monkeypatch):
    monkeypatch.setenv(containment.MODE_VARIABLE, "strict")
    problem = load_humaneval(n=1)[0]
    with pytest.raises(RuntimeError, match="strict"):
        run_untrusted("print('ok')")
    with pytest.raises(RuntimeError, match="strict"):
        check_completion(problem, problem.canonical_solution)
    monkeypatch.setenv(containment.MODE_VARIABLE, "sloppy")
    with pytest.raises(ValueError, match="SPECREPRO_SANDBOX"):
        run_untrusted("print('ok')")


LESSER = {  # a machine that offers less than this one -> what the warning must name
    "namespaces, fresh uid": ({"private_dirs": False, "visible": ()}, ["private read-only root"]),
    "namespaces, no fresh uid": ({"private_dirs": False, "visible": (), "uid_drop": False},
                                 ["private read-only root", "the interpreter's files included"]),
    "full, no cgroup": ({"cgroup": None}, ["cgroup memory and process cap"]),
    "full, no seccomp": ({"seccomp": False}, ["seccomp filter"]),
}


@pytest.mark.parametrize("lesser", list(LESSER))
def test_every_level_below_full_warns_and_strict_mode_refuses_it(monkeypatch, lesser):
    """The namespaces level too, and a full level missing the cgroup or the filter."""
    _need("namespaces")
    changes, named = LESSER[lesser]
    reduced = dataclasses.replace(sandbox_info(), **changes)
    monkeypatch.setattr(containment, "sandbox_info", lambda: reduced)
    monkeypatch.setenv(containment.MODE_VARIABLE, "strict")
    with pytest.raises(RuntimeError, match="strict"):
        run_untrusted("print('ok')")
    monkeypatch.delenv(containment.MODE_VARIABLE)
    with pytest.warns(SandboxWarning) as caught:
        assert run_untrusted("print('ok')").stdout == "ok\n"
    assert all(text in str(caught[0].message) for text in named), str(caught[0].message)


def test_strict_mode_runs_where_nothing_is_lacking(monkeypatch):
    if sandbox_info().lacking:
        pytest.skip(f"this machine's sandbox lacks {sandbox_info().lacking}")
    monkeypatch.setenv(containment.MODE_VARIABLE, "strict")
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

