"""Process control: the run's uid, its resource limits, reading its output, waiting for it and killing
everything it started."""

from __future__ import annotations

import ctypes
import os
import resource
import secrets
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Iterable

from specrepro.tasks.sandbox.cgroup import Leaf

UID_RANGE = (1_500_000_000, 2_000_000_000)  # far above any real account
EXEC_FD = 1000  # the launcher's descriptor for the interpreter (see inside/seccomp.py); above NOFILE
NOFILE = 64
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child between fork and exec only calls it
_PRCTL.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
PR_SET_NO_NEW_PRIVS = 38


def fresh_uid() -> int:
    """A uid no process runs as, drawn from ``secrets`` (a caller's ``random.seed`` cannot repeat it)."""
    for _ in range(100):
        uid = UID_RANGE[0] + secrets.randbelow(UID_RANGE[1] - UID_RANGE[0])
        if not uid_in_use(uid):
            return uid
    raise RuntimeError("found no unused uid for the sandbox in 100 draws")


def uid_in_use(uid: int) -> bool:
    return any(owner(pid) == uid for pid in proc_pids())


def drop_to(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def proc_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def user_process_count() -> int:
    uid = os.getuid()
    return sum(1 for pid in proc_pids() if owner(pid) == uid)


def rlimits(timeout: float, memory_mb: int, max_file_bytes: int, max_processes: int,
            uid_drop: bool) -> dict[int, tuple[int, int]]:
    """(soft, hard) limits. NOFILE's hard limit leaves the launcher room to place the interpreter at EXEC_FD;
    it lowers both to NOFILE before the program runs."""
    nproc = max_processes if uid_drop else user_process_count() + max_processes
    limits = {
        resource.RLIMIT_AS: memory_mb * 1024 * 1024,
        resource.RLIMIT_CPU: int(timeout) + 1,
        resource.RLIMIT_FSIZE: max_file_bytes,
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_NPROC: nproc,
    }
    return {**{k: (v, v) for k, v in limits.items()}, resource.RLIMIT_NOFILE: (NOFILE, EXEC_FD + 1)}


def preexec(limits: dict[int, tuple[int, int]], uid: int | None, leaf: Leaf | None = None) -> Callable[[], None]:
    """What the child does between fork and exec: enter the run's cgroup (still as root), take its limits,
    set no_new_privs (no setuid or file-capability binary gains anything), become ``uid``."""
    def setup() -> None:
        if leaf is not None:
            leaf.enter()
        for which, value in limits.items():
            resource.setrlimit(which, value)
        if _PRCTL(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "no_new_privs")
        if uid is not None:
            drop_to(uid)
    return setup


class CappedReader:
    """Drains a child's pipes, keeping only the first ``cap`` bytes of each."""

    def __init__(self, fds: list[int], cap: int) -> None:
        self.cap = cap
        self.selector = selectors.DefaultSelector()
        self.fds = fds
        self.buffers: dict[int, bytearray] = {fd: bytearray() for fd in fds}
        self.dropped: dict[int, int] = dict.fromkeys(fds, 0)
        for fd in fds:
            self.selector.register(fd, selectors.EVENT_READ)

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

    def raw(self, index: int) -> bytes:
        return bytes(self.buffers[self.fds[index]]) if not self.dropped[self.fds[index]] else b""

    def text(self, index: int) -> str:
        """Captured stdout (0) or stderr (1), with a note if bytes were dropped."""
        fd = self.fds[index]
        text = self.buffers[fd].decode("utf-8", errors="replace")
        if self.dropped[fd]:
            text += f"\n[... {self.dropped[fd]} more bytes truncated by the sandbox]"
        return text


def exited(pid: int) -> bool:
    # WNOWAIT leaves the zombie in place, so its pid (the process group id) cannot be reused
    # before the group is killed.
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def killed_by_signal(pid: int) -> bool:
    state = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return state is not None and state.si_code in (os.CLD_KILLED, os.CLD_DUMPED)


def wait(proc: subprocess.Popen, reader: CappedReader, timeout: float) -> bool:
    """Pump output until the program exits; True if the wall clock ran out first."""
    deadline = time.monotonic() + timeout
    while not exited(proc.pid):
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        if not reader.poll(min(left, 0.05)):
            time.sleep(min(left, 0.01))
    return False


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def kill_until_gone(find: Callable[[], Iterable[int]], deadline: float) -> None:
    """SIGKILL every process ``find`` lists, again and again, until it lists none or ``deadline`` passes (at
    least one pass)."""
    while pids := list(find()):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if time.monotonic() >= deadline:
            return
        time.sleep(0.005)


def live_processes_of(uid: int) -> list[int]:
    return [pid for pid in proc_pids() if owner(pid) == uid and not _is_zombie(pid)]


def kill_everything(proc: subprocess.Popen, uid: int | None, leaf: Leaf | None, deadline: float) -> None:
    """The process group, then every process in the run's cgroup and every process of its uid; the System V
    IPC objects its uid made."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if leaf is not None:
        leaf.kill_all()
        kill_until_gone(leaf.members, deadline)
    if uid is not None:
        kill_until_gone(lambda: live_processes_of(uid), deadline)
        remove_ipc(uid)


def remove_ipc(uid: int) -> None:
    """Remove the System V segments, queues and semaphores the run's fresh uid created or owns: without an
    IPC namespace they would outlive it."""
    libc = None
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}") as handle:
                header, *rows = [line.split() for line in handle]
        except OSError:
            continue
        for row in rows:
            fields = dict(zip(header, row))
            if str(uid) not in (fields.get("uid"), fields.get("cuid")):
                continue
            libc = libc or ctypes.CDLL(None, use_errno=True)
            ident = int(row[1])
            if kind == "shm":
                libc.shmctl(ident, 0, None)  # IPC_RMID
            elif kind == "msg":
                libc.msgctl(ident, 0, None)
            else:
                libc.semctl(ident, 0, 0)
