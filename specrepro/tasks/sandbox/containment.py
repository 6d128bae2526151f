"""Containment: which isolation layers this machine offers (probed once per process), how the sandbox's
command line is built from them, and what happens below the full level (a warning naming what is missing;
``SPECREPRO_SANDBOX=strict`` refuses instead). docs/sandbox.md describes each layer."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass

from specrepro.tasks.sandbox import cgroup, cleanup, inside, process

SAFE_PATH = "/usr/bin:/bin"
UNSHARE_FLAGS = ("--user", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child")
# uid and gid 1000 inside, not root; --keep-caps leaves the launcher the namespace's capabilities for the
# mounts, which it then drops for good before the program runs
INSIDE_UID = 1000
PRIVATE_FLAGS = (f"--map-user={INSIDE_UID}", f"--map-group={INSIDE_UID}", "--keep-caps", "--mount", "--mount-proc")
SECCOMP = os.uname().machine == "x86_64"  # the filter's syscall numbers are x86_64's
MODE_VARIABLE = "SPECREPRO_SANDBOX"  # "strict": refuse to run untrusted code with any protection missing
# The host paths a private root shows (read-only), those that exist; the interpreter's own are added.
SYSTEM_VIEW = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache")
HIDDEN = ("/usr/local",)  # shown empty (locally installed software), except the interpreter's own directories;
# so is every site-packages directory of the interpreter (see site_paths)
PRIVATE_DIRS = ("/tmp", "/dev/shm", "/var/tmp", "/run/lock")  # each replaced by a fresh tmpfs (make_private)
PROTECTIONS = {  # what each layer holds, as a warning names it when it is missing
    "namespaces": "user/net/pid/ipc namespaces (the network, the host's System V IPC and every host "
                  "process's command line are reachable)",
    "private_dirs": "a private read-only root (the host's files are readable as its uid may, and files it "
                    "leaves in /tmp or /dev/shm outlive the run)",
    "uid_drop": "a fresh uid (it runs as this user: it can write what this user can, the interpreter's "
                "files included, and RLIMIT_NPROC counts this user's processes)",
    "cgroup": "a cgroup memory and process cap (only RLIMIT_AS bounds its memory)",
    "seccomp": "the seccomp filter (exec, memfd, System V shared memory, POSIX message queues, sockets "
               "other than AF_UNIX, namespaces and ptrace stay open)",
}


class SandboxWarning(UserWarning):
    """Untrusted code runs with less isolation than this sandbox is built for."""


@dataclass(frozen=True)
class SandboxInfo:
    """Which containment layers this machine offers (see docs/sandbox.md)."""

    interpreter: str
    uid_drop: bool
    namespaces: bool
    unshare: str | None
    private_dirs: bool = False
    visible: tuple[str, ...] = ()  # with private_dirs: all the program sees of the host, read-only
    cgroup: str | None = None  # "v2" or "v1": the cgroup version that caps each run's memory and processes
    seccomp: bool = False  # the launcher's syscall filter (x86_64), at every level
    hidden: tuple[str, ...] = HIDDEN  # with private_dirs: shown as empty directories

    @property
    def containment(self) -> str:
        """One line naming the layers in force, for logs and reports."""
        layers = ["rlimits", "clean env", "session kill", "no_new_privs", "no exec after start" if self.seccomp
                  else "exec allowed"]
        if self.uid_drop:
            layers.append("fresh uid")
        if self.cgroup:
            layers.append(f"cgroup {self.cgroup} memory and process cap")
        else:
            layers.append("NO cgroup: memory bounded by RLIMIT_AS only")
        if self.namespaces:
            layers.append("user/net/pid/ipc/uts namespaces (no network, private System V IPC)")
        else:
            layers.append("NO namespaces: network, System V IPC and every host process visible")
        if self.private_dirs:
            layers.append(f"uid {INSIDE_UID} inside; private root showing only {', '.join(self.visible)} "
                          f"(read-only; {', '.join(self.hidden)} empty), a fresh /tmp, /dev/shm and /proc")
        else:
            layers.append("shared filesystem (no mount namespace)")
        layers.append("seccomp filter (AF_UNIX sockets only; no memfd, System V shm or POSIX mq)" if self.seccomp
                      else "no seccomp filter")
        return "; ".join(layers)

    @property
    def level(self) -> str:
        """``full`` (namespaces and private mounts), ``namespaces`` (no private mounts) or ``fallback``."""
        return "full" if self.private_dirs else "namespaces" if self.namespaces else "fallback"

    @property
    def lacking(self) -> tuple[str, ...]:
        """The protections this machine does not give (a full level may still lack a fresh uid)."""
        missing = [name for name in ("namespaces", "private_dirs", "cgroup", "seccomp") if not getattr(self, name)]
        if self.level != "full" and not self.uid_drop:
            missing.insert(2, "uid_drop")
        return tuple(missing)

    def record(self) -> dict:
        """What a results file holding pass@k records about the isolation its verdicts ran under."""
        return {"level": self.level, "containment": self.containment, "uid_drop": self.uid_drop,
                "namespaces": self.namespaces, "private_dirs": self.private_dirs, "seccomp": self.seccomp,
                "cgroup": self.cgroup, "lacking": list(self.lacking),
                "verdict": "judge process (check() outside the sandbox; builtin data across a pipe)"}

    @property
    def nproc_enforced(self) -> bool:
        return self.uid_drop or os.geteuid() != 0


def _probe(command: list[str], uid: int | None) -> bool:
    try:
        done = subprocess.run(command, env={"PATH": SAFE_PATH}, cwd="/", timeout=20,
                              preexec_fn=(lambda: process.drop_to(uid)) if uid is not None else None,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _interpreter_for(uid: int | None) -> str | None:
    candidates = [sys.executable, getattr(sys, "_base_executable", ""),
                  shutil.which("python3", path=SAFE_PATH) or ""]
    for path in dict.fromkeys(c for c in candidates if c):
        if _probe([path, "-I", "-S", "-c", "import json, socket"], uid):
            return path
    return None


def _interpreter_paths(interpreter: str, uid: int | None) -> list[str]:
    """The directories the interpreter runs from: its binary's, its standard library's and its libpython's."""
    try:
        done = subprocess.run([interpreter, "-I", "-S", "-c", "import os, sys, sysconfig; p = sysconfig.get_paths(); "
                               "print(p['stdlib']); print(p['platstdlib']); "
                               "print(os.path.dirname(os.path.realpath(sys.executable))); "
                               "print(sysconfig.get_config_var('LIBDIR') or '')"],
                              env={"PATH": SAFE_PATH}, cwd="/", timeout=20, capture_output=True, text=True,
                              preexec_fn=(lambda: process.drop_to(uid)) if uid is not None else None)
    except (OSError, subprocess.SubprocessError):
        return []
    return [os.path.realpath(line) for line in done.stdout.split() if os.path.isdir(line)]


def site_paths(interpreter: str, uid: int | None) -> tuple[str, ...]:
    """HIDDEN and the interpreter's site-packages directories (non-standard packages), those that exist."""
    try:
        done = subprocess.run([interpreter, "-I", "-c", "import site; print(*site.getsitepackages(), sep='\\n')"],
                              env={"PATH": SAFE_PATH}, cwd="/", timeout=20, capture_output=True, text=True,
                              preexec_fn=(lambda: process.drop_to(uid)) if uid is not None else None)
    except (OSError, subprocess.SubprocessError):
        return HIDDEN
    found = [os.path.realpath(line) for line in done.stdout.splitlines() if os.path.isdir(line)]
    return (*HIDDEN, *dict.fromkeys(p for p in found if not any(within(p, h) for h in HIDDEN)))


def within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def visible_paths(interpreter: str, uid: int | None) -> tuple[str, ...]:
    """What the private root shows, read-only: /usr, the top-level library and binary directories (or the
    links into /usr that stand for them), ld.so's cache, and wherever else the interpreter lives (also
    within HIDDEN, which is otherwise shown empty)."""
    candidates = [*SYSTEM_VIEW, *_interpreter_paths(interpreter, uid)]
    visible: list[str] = []
    for path in candidates:
        if not os.path.lexists(path) or path in visible:
            continue
        shown = [v for v in visible if not os.path.islink(v)]
        if not os.path.islink(path) and any(within(path, v) for v in shown) and not any(
                within(path, h) for h in HIDDEN):
            continue
        visible.append(path)
    return tuple(visible)


def harness_command(interpreter: str, spec: dict) -> list[str]:
    return [interpreter, "-I", "-S", "-c", inside.BOOT, inside.HARNESS, json.dumps(spec)]


def command(info: SandboxInfo, spec: dict) -> list[str]:
    python = harness_command(info.interpreter, spec)
    if not info.namespaces:
        return python
    return [info.unshare, *UNSHARE_FLAGS, *(PRIVATE_FLAGS if info.private_dirs else ()), *python]


def private_spec(scratch: str, info: SandboxInfo, tmp_bytes: int, hide_proc: bool) -> dict:
    return {"scratch": "/tmp/" + os.path.basename(scratch), "visible": list(info.visible),
            "hidden": list(info.hidden),
            "tmp_bytes": tmp_bytes, "hide_proc": hide_proc}


def launch_spec(mode: str, files: dict, seccomp: bool, private: dict | None = None) -> dict:
    return {"stage": "launch", "mode": mode, "files": files, "private": private, "seccomp": seccomp,
            "exec_fd": process.EXEC_FD, "nofile": process.NOFILE}


def _probe_launch(info: SandboxInfo, uid: int | None, seccomp: bool) -> bool:
    """Run the launcher and a trivial program at ``info``'s level, with or without the seccomp filter."""
    parent, scratch = cleanup.make_scratch(uid)
    try:
        program = cleanup.write_file(scratch, "program.py", "import os\nopen('probe', 'w').write('x')\n", uid)
        private = private_spec(scratch, info, 1 << 20, hide_proc=True) if info.private_dirs else None
        spec = launch_spec("program", {"program": program}, seccomp, private)
        limits = process.rlimits(10, 512, 1 << 20, 8, uid is not None)
        try:
            done = subprocess.run(command(info, spec), env={"PATH": SAFE_PATH}, cwd=scratch, timeout=20,
                                  preexec_fn=process.preexec(limits, uid), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            return False
        return done.returncode == 0
    finally:
        cleanup.remove_tree(parent, time.monotonic() + cleanup.DEADLINE_SECONDS)


def _probe_cgroup() -> str | None:
    try:
        leaf = cgroup.Leaf.make(64, 8)
    except OSError:
        return None
    leaf.remove(time.monotonic() + 1.0)
    return leaf.version


@functools.lru_cache(maxsize=1)
def sandbox_info() -> SandboxInfo:
    """Probe (once per process) which isolation layers work here."""
    uid = process.fresh_uid() if os.geteuid() == 0 else None
    interpreter = _interpreter_for(uid) if uid is not None else None
    uid_drop = interpreter is not None
    if not uid_drop:
        uid, interpreter = None, sys.executable
    unshare = shutil.which("unshare", path=SAFE_PATH)
    namespaces = bool(unshare) and _probe([unshare, *UNSHARE_FLAGS, interpreter, "-I", "-S", "-c", "pass"], uid)
    info = SandboxInfo(interpreter, uid_drop, namespaces, unshare if namespaces else None,
                       cgroup=_probe_cgroup())
    if namespaces:
        # The interpreter by its real path: a venv's python is a link, and the private root shows no venv.
        interpreter = os.path.realpath(interpreter)
        visible = visible_paths(interpreter, uid)
        if not any(within(v, p) for v in visible for p in PRIVATE_DIRS):
            private = SandboxInfo(interpreter, uid_drop, True, unshare, True, visible, info.cgroup,
                                  hidden=site_paths(interpreter, uid))
            if _probe_launch(private, uid, seccomp=False):
                info = private
    seccomp = SECCOMP and _probe_launch(info, uid, seccomp=True)
    return dataclasses.replace(info, seccomp=seccomp)


def mode() -> str:
    value = os.environ.get(MODE_VARIABLE, "")
    if value not in ("", "strict"):
        raise ValueError(f"{MODE_VARIABLE} must be unset, empty or 'strict', got {value!r}")
    return value


def require_isolation(info: SandboxInfo) -> None:
    """Warn (``SandboxWarning``) naming every protection this machine lacks; under SPECREPRO_SANDBOX=strict,
    refuse to run instead."""
    strict = mode() == "strict"
    if not info.lacking:
        return
    missing = "; ".join(PROTECTIONS[name] for name in info.lacking)
    if strict:
        raise RuntimeError(f"{MODE_VARIABLE}=strict: this machine's sandbox (level {info.level!r}) lacks "
                           f"{missing}, so untrusted code is not run")
    warnings.warn(f"running untrusted code at the {info.level!r} level, WITHOUT {missing}; set "
                  f"{MODE_VARIABLE}=strict to refuse instead", SandboxWarning, stacklevel=4)
