"""Run untrusted, model-written Python in a throw-away subprocess.

Every program gets its own fresh interpreter (``python -I``), its own
temporary directory (cwd, HOME and TMPDIR; deleted afterwards), a clean
environment (PATH, HOME, LANG, TMPDIR only) and its own session, and is
killed with everything it spawned once it ends or its wall-clock time
runs out.

What is contained, layer by layer (``sandbox_info()`` says which layers
this machine has):

* Always: resource limits set before exec -- RLIMIT_AS (memory),
  RLIMIT_CPU (timeout + 1 s), RLIMIT_FSIZE (largest file it may write),
  RLIMIT_NOFILE, RLIMIT_CORE = 0 -- a wall-clock timeout enforced here,
  output read incrementally and capped, the process group killed
  afterwards, and a prelude that makes ``socket.socket`` raise and turns
  ``faulthandler`` off. The prelude is a speed bump only (``_socket`` is
  still importable); the OS limits are the defence.
* Running as root with an interpreter an unprivileged user can execute
  (``uid_drop``): the program runs as a fresh random uid. Then
  RLIMIT_NPROC caps its process count (as root that limit is ignored by
  the kernel), it cannot write anywhere its uid has no permission
  (e.g. the project tree or a root-owned tmp dir), and after the run every
  process of that uid is killed, including ones that escaped the process
  group with ``setsid``/double fork. If ``sys.executable`` sits somewhere
  the uid cannot read (e.g. under /root), a system ``python3`` is used.
* ``unshare`` usable (``namespaces``): the program runs in new user, net
  and pid namespaces. The net namespace has no interfaces up, so any
  connection fails at once; when the program (pid 1 there) exits, the
  kernel kills every process left in its pid namespace.

Not contained: reading any file its uid may read; writing to world-writable
places such as /tmp or /dev/shm (files it leaves there survive the run, each
capped by RLIMIT_FSIZE); without ``uid_drop``,
writing to any path the parent user may write when it knows the absolute
path; without ``uid_drop`` a fork bomb is limited only by RLIMIT_NPROC,
which counts *all* processes of the user (so it is set relative to the
current count) and does not apply to root at all -- then only the
timeout and the final kill bound it; without ``namespaces`` and without
``uid_drop``, a ``setsid`` escapee survives the kill; no filesystem,
syscall (seccomp) or CPU-share isolation.
"""

from __future__ import annotations

import functools
import os
import random
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

PRELUDE = r"""
import faulthandler, socket, sys
faulthandler.disable()

class _NoSocket(socket.socket):
    def __init__(self, *args, **kwargs):
        raise PermissionError("network access is disabled in this sandbox")

def _no_connection(*args, **kwargs):
    raise PermissionError("network access is disabled in this sandbox")

socket.socket = _NoSocket
socket.create_connection = _no_connection
_path = sys.argv[1]
sys.argv = [_path]
with open(_path, encoding="utf-8") as _f:
    _code = compile(_f.read(), _path, "exec")
del faulthandler, socket, _NoSocket, _no_connection, _f
exec(_code, {"__name__": "__main__", "__file__": _path, "__builtins__": __builtins__})
"""

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
PROGRAM_NAME = "program.py"
UNSHARE_FLAGS = ("--user", "--net", "--pid", "--fork", "--kill-child")


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one program: passed, failed, timed_out or killed."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    duration: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass(frozen=True)
class SandboxInfo:
    """Which containment layers this machine offers (see module docstring)."""

    interpreter: str
    uid_drop: bool
    namespaces: bool
    unshare: str | None

    @property
    def nproc_enforced(self) -> bool:
        return self.uid_drop or os.geteuid() != 0


def _fresh_uid() -> int:
    # Far above any real account, so the uid owns nothing and no one else runs as it.
    return random.randrange(1_500_000_000, 2_000_000_000)


def _drop_to(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _user_process_count() -> int:
    uid = os.getuid()
    return sum(1 for pid in _proc_pids() if _owner(pid) == uid)


def _proc_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _rlimits(timeout: float, memory_mb: int, max_file_bytes: int, max_processes: int,
             uid_drop: bool) -> dict[int, int]:
    nproc = max_processes if uid_drop else _user_process_count() + max_processes
    return {
        resource.RLIMIT_AS: memory_mb * 1024 * 1024,
        resource.RLIMIT_CPU: int(timeout) + 1,
        resource.RLIMIT_FSIZE: max_file_bytes,
        resource.RLIMIT_NOFILE: 64,
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_NPROC: nproc,
    }


def _preexec(limits: dict[int, int], uid: int | None) -> Callable[[], None]:
    def setup() -> None:
        for which, value in limits.items():
            resource.setrlimit(which, (value, value))
        if uid is not None:
            _drop_to(uid)
    return setup


def _probe(command: list[str], uid: int | None) -> bool:
    try:
        done = subprocess.run(command, env={"PATH": SAFE_PATH}, cwd="/", timeout=20,
                              preexec_fn=(lambda: _drop_to(uid)) if uid is not None else None,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _interpreter_for(uid: int | None) -> str | None:
    candidates = [sys.executable, getattr(sys, "_base_executable", ""),
                  shutil.which("python3", path=SAFE_PATH) or ""]
    for path in dict.fromkeys(c for c in candidates if c):
        if _probe([path, "-I", "-c", "import json, socket"], uid):
            return path
    return None


@functools.lru_cache(maxsize=1)
def sandbox_info() -> SandboxInfo:
    """Probe (once per process) which isolation layers work here."""
    uid = _fresh_uid() if os.geteuid() == 0 else None
    interpreter = _interpreter_for(uid) if uid is not None else None
    uid_drop = interpreter is not None
    if not uid_drop:
        uid, interpreter = None, sys.executable
    unshare = shutil.which("unshare", path=SAFE_PATH)
    namespaces = bool(unshare) and _probe([unshare, *UNSHARE_FLAGS, interpreter, "-I", "-c", "pass"], uid)
    return SandboxInfo(interpreter, uid_drop, namespaces, unshare if namespaces else None)


def _command(info: SandboxInfo, program: str) -> list[str]:
    python = [info.interpreter, "-I", "-c", PRELUDE, program]
    return [info.unshare, *UNSHARE_FLAGS, *python] if info.namespaces else python


class _CappedReader:
    """Drains a child's pipes, keeping only the first ``cap`` bytes of each."""

    def __init__(self, proc: subprocess.Popen, cap: int) -> None:
        self.cap = cap
        self.selector = selectors.DefaultSelector()
        self.buffers: dict[int, bytearray] = {}
        self.dropped: dict[int, int] = {}
        self.fds = [proc.stdout.fileno(), proc.stderr.fileno()]
        for stream in (proc.stdout, proc.stderr):
            self.selector.register(stream.fileno(), selectors.EVENT_READ)
            self.buffers[stream.fileno()] = bytearray()
            self.dropped[stream.fileno()] = 0

    def poll(self, wait: float) -> bool:
        """Read what is ready within ``wait`` seconds; False once all pipes hit EOF."""
        if not self.selector.get_map():
            return False
        for key, _ in self.selector.select(wait):
            data = os.read(key.fd, 65536)
            if not data:
                self.selector.unregister(key.fd)
                continue
            buffer = self.buffers[key.fd]
            room = max(self.cap - len(buffer), 0)
            buffer += data[:room]
            self.dropped[key.fd] += len(data) - len(data[:room])
        return True

    def text(self, index: int) -> str:
        """Captured stdout (0) or stderr (1), with a note if bytes were dropped."""
        fd = self.fds[index]
        text = self.buffers[fd].decode("utf-8", errors="replace")
        if self.dropped[fd]:
            text += f"\n[... {self.dropped[fd]} more bytes truncated by the sandbox]"
        return text


def _exited(pid: int) -> bool:
    # WNOWAIT leaves the zombie in place, so its pid (the process group id) cannot be reused
    # before the group is killed.
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def _kill_uid(uid: int) -> None:
    for _ in range(100):
        pids = [pid for pid in _proc_pids() if _owner(pid) == uid and not _is_zombie(pid)]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def _kill_everything(proc: subprocess.Popen, uid: int | None) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if uid is not None:
        _kill_uid(uid)


def _wait(proc: subprocess.Popen, reader: _CappedReader, timeout: float) -> bool:
    """Pump output until the program exits; True if the wall clock ran out first."""
    deadline = time.monotonic() + timeout
    while not _exited(proc.pid):
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        if not reader.poll(min(left, 0.05)):
            time.sleep(min(left, 0.01))
    return False


def _status(timed_out: bool, returncode: int) -> str:
    if timed_out:
        return "timed_out"
    if returncode == 0:
        return "passed"
    return "killed" if returncode < 0 else "failed"


def _prepare_scratch(scratch: str, code: str, uid: int | None) -> str:
    path = os.path.join(scratch, PROGRAM_NAME)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(code)
    if uid is not None:
        os.chown(scratch, uid, uid)
        os.chown(path, uid, uid)
    os.chmod(scratch, 0o700)
    return path


def _check_arguments(code, timeout, memory_mb, max_output_bytes, max_file_bytes, max_processes) -> None:
    if not isinstance(code, str):
        raise TypeError(f"code must be a str of Python source, got {type(code).__name__}")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    for name, value, low in (("memory_mb", memory_mb, 1), ("max_output_bytes", max_output_bytes, 0),
                             ("max_file_bytes", max_file_bytes, 0), ("max_processes", max_processes, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def run_untrusted(code: str, timeout: float = 5.0, memory_mb: int = 512,
                  max_output_bytes: int = 64_000, max_file_bytes: int = 16 * 1024 * 1024,
                  max_processes: int = 32) -> SandboxResult:
    """Run ``code`` as a Python program under every containment layer available here."""
    _check_arguments(code, timeout, memory_mb, max_output_bytes, max_file_bytes, max_processes)
    info = sandbox_info()
    uid = _fresh_uid() if info.uid_drop else None
    limits = _rlimits(timeout, memory_mb, max_file_bytes, max_processes, info.uid_drop)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="specrepro-sandbox-", ignore_cleanup_errors=True) as scratch:
        program = _prepare_scratch(scratch, code, uid)
        env = {"PATH": SAFE_PATH, "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8"}
        proc = subprocess.Popen(_command(info, program), cwd=scratch, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=_preexec(limits, uid), close_fds=True)
        reader = _CappedReader(proc, max_output_bytes)
        try:
            timed_out = _wait(proc, reader, timeout)
        finally:
            _kill_everything(proc, uid)
        drain_until = time.monotonic() + 1.0
        while time.monotonic() < drain_until and reader.poll(0.05):
            pass
        proc.stdout.close()
        proc.stderr.close()
    return SandboxResult(_status(timed_out, proc.returncode), proc.returncode,
                         reader.text(0), reader.text(1), time.monotonic() - start)
