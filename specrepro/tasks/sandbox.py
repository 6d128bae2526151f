"""Run untrusted, model-written Python in a throw-away subprocess, and judge it by its tests.

Every program gets its own fresh interpreter (``python -I``), its own
temporary directory (cwd, HOME and TMPDIR; deleted afterwards), a clean
environment (PATH, HOME, LANG, TMPDIR only) and its own session, and is
killed with everything it spawned once it ends or its wall-clock time
runs out. Inside, a small trusted harness (``HARNESS``) sets up what the
kernel layers below cannot, then runs the program.

Verdicts (``run_tests``; HumanEval uses it)
-------------------------------------------
``run_untrusted`` judges a plain program by its exit status, which the
program controls (``sys.exit(0)``, ``os._exit(0)``): fine for "did it run",
useless as a verdict. ``run_tests`` passes only when the trusted test's
``check(candidate)`` returned normally:

* The parent writes a fresh 256-bit token into a pipe and closes its end;
  the harness reads it and closes that fd before any untrusted code runs,
  so the token is in no fd, file, argv or environment the program sees.
  After ``check`` returns, the harness writes the token to a second pipe
  and calls ``os._exit(0)``. The parent says ``passed`` only if that pipe
  holds exactly the token and the exit status is 0. Exiting early with any
  status, raising ``SystemExit`` anywhere, dying by a signal, or writing
  anything (a fake verdict, junk, a guessed token) to any fd gives
  ``failed``/``killed``/``timed_out``; junk on the verdict pipe fails even a
  correct solution (fail closed).
* Before the program runs, the harness installs a PEP 578 audit hook,
  which cannot be removed from Python, refusing for the rest of the process
  the routes from the program to the harness's frame (and so to the token):
  ``sys._getframe``, ``sys._current_frames``, traceback/generator
  ``*_frame`` attributes, ``sys.settrace``/``setprofile``, ``gc``
  introspection, importing ``ctypes`` (never loaded in this process: the
  mount set-up that needs it runs in a launcher that then execs the
  harness), new code objects, setting ``__code__``, new audit hooks and
  opening anything under /proc (with the mount namespace /proc is also an
  empty read-only tmpfs). RLIMIT_NPROC 0 stops it from starting processes
  or threads, so no child can read or ptrace the harness (the reference
  harness disables ``fork`` and ``Popen`` too). Stdlib modules that peek at
  frames while loading (``types``, ``collections``...) are imported first.
* The test runs in its own namespace, with the builtins and the modules it
  imports as they were before the program ran, and with the helpers of the
  trusted prompt (not the program's redefinitions); the test and prompt
  files are deleted before the program runs. The candidate's results must
  be built from exact builtin types, so an object whose ``__eq__`` always
  says True fails.

What an adversary in the same interpreter can still do: anything that gets
past the audit hook -- a CPython memory-safety bug, a route to a frame or to
raw memory that the hook does not cover (audit hooks are documented as not
a security boundary), or, without the mount namespace, a race that swaps a
symlink to /proc/self/mem between the hook's check and the open. With the
token in hand it can forge a pass (the tests show such a forger passing
once the hook is removed). It can also answer from memory what the test
expects. Only running ``check`` in a separate process would close this, at
the cost of HumanEval's semantics (the test shares objects with the
candidate). Running as root without ``uid_drop``, RLIMIT_NPROC does not
apply, so the program can spawn a child that reads the harness's memory.

Containment, layer by layer (``sandbox_info()`` says which layers this machine has)
-------------------------------------------------------------------------------------
* Always: resource limits set before exec -- RLIMIT_AS (memory),
  RLIMIT_CPU (timeout + 1 s), RLIMIT_FSIZE (largest file it may write),
  RLIMIT_NOFILE, RLIMIT_CORE = 0 -- a wall-clock timeout enforced here,
  output read incrementally and capped, the process group killed
  afterwards, and a harness that makes ``socket.socket`` raise and turns
  ``faulthandler`` off. The socket patch is a speed bump only (``_socket``
  is still importable); the OS limits are the defence.
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
* A mount namespace usable too (``private_dirs``): the harness, as root of
  the new user namespace, mounts fresh tmpfs over /tmp, /dev/shm, /var/tmp
  and /run/lock (so whatever the program leaves there vanishes with it),
  an empty read-only tmpfs over the project tree, the caller's cwd and
  HOME (``hidden``; one under /tmp is simply absent under the fresh tmpfs;
  one holding the interpreter's standard library is
  bound read-only instead, ``read_only``), a fresh /proc showing only its
  own processes, then drops every capability (bounding set, securebits
  locked, no_new_privs), so it cannot unmount any of it. Packages
  installed inside a hidden tree (e.g. a venv in the project) cannot be
  imported by the program; the standard library can.

Not contained: reading any file its uid may read outside the hidden
paths; without ``private_dirs``, writing to world-writable places such as
/tmp or /dev/shm (files it leaves there survive the run, each capped by
RLIMIT_FSIZE); without ``uid_drop``, writing to any path the parent user
may write when it knows the absolute path; without ``uid_drop`` a fork bomb
is limited only by RLIMIT_NPROC, which counts *all* processes of the user
(so it is set relative to the current count) and does not apply to root at
all -- then only the timeout and the final kill bound it; without
``namespaces`` and without ``uid_drop``, a ``setsid`` escapee survives the
kill; no syscall (seccomp) or CPU-share isolation.
"""

from __future__ import annotations

import functools
import json
import os
import random
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HARNESS = r'''
import faulthandler, json, os, socket, sys


def block_network():
    class NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in this sandbox")

    def no_connection(*args, **kwargs):
        raise PermissionError("network access is disabled in this sandbox")

    socket.socket = NoSocket
    socket.create_connection = no_connection


def read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def libc():
    import ctypes
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    lib.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return ctypes, lib


def checked(ctypes, result, what):
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def make_private(private, sources):
    """As root of a fresh user+mount namespace: private tmpfs dirs, hidden paths, then no capabilities.

    Runs in a launcher process that then execs the real harness, so ctypes (raw memory access) is
    never loaded where the program runs."""
    ctypes, lib = libc()
    rdonly, nosuid, nodev, remount, bind, rec = 1, 2, 4, 32, 4096, 16384

    def mount(source, target, fstype, flags, data=None):
        checked(ctypes, lib.mount(source, target.encode(), fstype, flags, data), f"mount {target}")

    size = f"size={private['tmp_bytes']},nr_inodes=4096".encode()
    for path in ("/tmp", "/dev/shm", "/var/tmp", "/run/lock"):
        if os.path.isdir(path):
            mount(b"tmpfs", path, b"tmpfs", nosuid | nodev, b"mode=1777," + size)
    for path in private["read_only"]:
        mount(path.encode(), path, None, bind | rec)
        mount(None, path, None, remount | bind | rdonly | nosuid | nodev)
    for path in private["hide"]:
        mount(b"tmpfs", path, b"tmpfs", nosuid | nodev | rdonly, b"mode=0555,size=4096")
    scratch = private["scratch"]
    os.mkdir(scratch, 0o700)
    os.chdir(scratch)
    files = {}
    for name, text in sources.items():
        files[name] = os.path.join(scratch, f"{name}.py")
        with open(files[name], "w", encoding="utf-8") as handle:
            handle.write(text)
    if private["hide_proc"]:
        mount(b"tmpfs", "/proc", b"tmpfs", nosuid | nodev | rdonly, b"mode=0555,size=4096")
    set_securebits, capbset_drop, no_new_privs = 28, 24, 38
    # noroot, no_setuid_fixup, keep_caps, no_cap_ambient_raise: each set and locked
    checked(ctypes, lib.prctl(set_securebits, 0xEF, 0, 0, 0), "securebits")
    for cap in range(64):
        if lib.prctl(capbset_drop, cap, 0, 0, 0) != 0:
            break

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    checked(ctypes, lib.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "capset")
    checked(ctypes, lib.prctl(no_new_privs, 1, 0, 0, 0), "no_new_privs")
    return files


def run_program(path, source):
    sys.argv = [path]
    code = compile(source, path, "exec")
    exec(code, {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__})


def audit_hook():
    """Refuse, for the rest of the process, the introspection that could reach the harness's token."""
    realpath, fsdecode = os.path.realpath, os.fsdecode
    refused = frozenset({"sys.settrace", "sys.setprofile", "sys._current_frames", "sys._current_exceptions",
                         "sys.addaudithook", "code.__new__"})

    def hook(event, args):
        if event == "sys._getframe":
            raise ValueError("frame introspection is disabled while the tests run")
        if (event in refused or event.startswith(("gc.", "ctypes.", "cpython."))
                or (event == "object.__getattr__" and str(args[1]).endswith("_frame"))
                or (event in ("object.__setattr__", "object.__delattr__") and args[1] == "__code__")
                or (event == "import" and str(args[0]).split(".")[0] in ("ctypes", "_ctypes"))):
            raise RuntimeError(f"{event} {args[0] if event == 'import' else ''} is disabled while the tests run")
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = realpath(fsdecode(args[0]))
            if path == "/proc" or path.startswith("/proc/"):
                raise PermissionError(f"{path}: /proc is hidden while the tests run")
    return hook


def plain_data_guard(candidate):
    """The candidate's results must be built from exact builtin types, so no __eq__ of its own can lie."""
    plain = frozenset({bool, int, float, complex, str, bytes, type(None), list, tuple, dict, set, frozenset})
    kind, ident, typeerror = type, id, TypeError

    def check_value(value, seen):
        if kind(value) not in plain:
            raise typeerror(f"the candidate returned a {kind(value).__name__!r}: only builtin data counts")
        if kind(value) in (list, tuple, set, frozenset, dict) and ident(value) not in seen:
            seen.add(ident(value))
            items = list(value.items()) if kind(value) is dict else value
            for item in items:
                check_value(item, seen)

    def guarded(*args, **kwargs):
        result = candidate(*args, **kwargs)
        check_value(result, set())
        return result
    return guarded


def trusted_namespace(helpers, test):
    """Builtins and the test's imported modules as they were before the program ran, plus the helpers."""
    import ast, builtins, types
    clones = {}
    for node in ast.walk(ast.parse(test)):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        for name in names:
            module = __import__(name, fromlist=["_"])
            clone = types.ModuleType(name)
            clone.__dict__.update(module.__dict__)
            clones[name] = clone
    real_import = builtins.__import__

    def test_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name in clones and (fromlist or "." not in name):
            return clones[name]
        return real_import(name, globals, locals, fromlist, level)

    safe_builtins = dict(builtins.__dict__, __import__=test_import)
    namespace = {"__name__": "__main__", "__builtins__": safe_builtins}
    exec(compile(helpers, "<helpers>", "exec"), namespace)
    return namespace


PREIMPORTS = ("bisect", "collections", "copy", "dataclasses", "datetime", "decimal", "enum", "fractions",
              "functools", "hashlib", "heapq", "itertools", "math", "operator", "random", "re", "statistics",
              "string", "traceback", "types", "typing")


def run_tests(spec, path, sources):
    """The program, then check(candidate); the token goes out only if check returned."""
    read_fd, write_fd, exit_now, streams = os.read, os.write, os._exit, (sys.stdout, sys.stderr)
    token = b""
    while len(token) < spec["token_bytes"]:
        chunk = read_fd(spec["key_fd"], spec["token_bytes"])
        if not chunk:
            break
        token += chunk
    os.close(spec["key_fd"])
    verdict_fd = spec["verdict_fd"]
    namespace = trusted_namespace(sources["helpers"], sources["test"])
    exec(compile(sources["test"], "<test>", "exec"), namespace)
    check = namespace["check"]
    program = compile(sources["program"], path, "exec")
    sys.argv = [path]
    globals_ = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    for name in PREIMPORTS:  # some stdlib modules peek at frames while they load: load them before the hook
        __import__(name)
    import resource
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # no processes or threads: none to read our memory
    sys.addaudithook(audit_hook())
    exec(program, globals_)
    candidate = namespace[spec["entry_point"]] = plain_data_guard(globals_[spec["entry_point"]])
    check(candidate)
    for stream in streams:
        try:
            stream.flush()
        except Exception:
            pass
    write_fd(verdict_fd, token)
    exit_now(0)


def main(spec):
    faulthandler.disable()
    sources = {name: read(path) for name, path in spec["files"].items()}
    for name in ("test", "helpers"):
        if name in spec["files"]:
            os.remove(spec["files"][name])  # the program must not read the expected answers from disk
    if spec["private"]:
        files = make_private(spec["private"], sources)
        exe = sys.executable
        os.execv(exe, [exe, "-I", "-c", BOOT, HARNESS, json.dumps(dict(spec, files=files, private=None))])
    path = spec["files"]["program"]
    block_network()
    if spec["mode"] == "tests":
        run_tests(spec, path, sources)
    else:
        run_program(path, sources["program"])


main(json.loads(sys.argv.pop(1)))
'''

# The harness runs in a dict of its own: nothing of it is left in __main__ for the program to find.
BOOT = ('import sys; exec(compile(sys.argv[1], "<sandbox>", "exec"), {"__name__": "__sandbox__", '
        '"__builtins__": __builtins__, "BOOT": sys.orig_argv[sys.orig_argv.index("-c") + 1], '
        '"HARNESS": sys.argv.pop(1)})')

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
PROGRAM_NAME = "program.py"
UNSHARE_FLAGS = ("--user", "--net", "--pid", "--fork", "--kill-child")
PRIVATE_FLAGS = ("--map-root-user", "--mount", "--mount-proc")
TOKEN_BYTES = 64  # hex characters of a 256-bit secret
SYSTEM_PATHS = ("/proc", "/sys", "/dev", "/tmp", "/var/tmp", "/run/lock")
PRIVATE_DIRS = ("/tmp", "/dev/shm", "/var/tmp", "/run/lock")  # each replaced by a fresh tmpfs (make_private)


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
    private_dirs: bool = False
    hidden: tuple[str, ...] = ()
    read_only: tuple[str, ...] = ()

    @property
    def containment(self) -> str:
        """One line naming the layers in force, for logs and reports."""
        layers = ["rlimits", "clean env", "session kill"]
        if self.uid_drop:
            layers.append("fresh uid")
        if self.namespaces:
            layers.append("user/net/pid namespaces")
        if self.private_dirs:
            layers.append("private /tmp and /dev/shm, hidden: " + (", ".join(self.hidden) or "none")
                          + ("; read-only: " + ", ".join(self.read_only) if self.read_only else ""))
        else:
            layers.append("shared filesystem (no mount namespace)")
        return "; ".join(layers)

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


def _interpreter_paths(interpreter: str, uid: int | None) -> list[str]:
    """The directories the sandbox interpreter imports its standard library from."""
    try:
        done = subprocess.run([interpreter, "-I", "-c", "import sysconfig; p = sysconfig.get_paths(); "
                               "print(p['stdlib']); print(p['platstdlib'])"],
                              env={"PATH": SAFE_PATH}, cwd="/", timeout=20, capture_output=True, text=True,
                              preexec_fn=(lambda: _drop_to(uid)) if uid is not None else None)
    except (OSError, subprocess.SubprocessError):
        return []
    return [os.path.realpath(line) for line in done.stdout.split()]


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _private_paths(interpreter: str, uid: int | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(hidden, read_only): the project tree, the caller's cwd and HOME; read-only where the stdlib lives."""
    project = Path(__file__).resolve().parents[2]
    candidates = [project] if (project / "pyproject.toml").exists() else []
    candidates += [Path.cwd(), Path.home()]
    needed = _interpreter_paths(interpreter, uid)
    hidden: list[str] = []
    read_only: list[str] = []
    for path in sorted({os.path.realpath(c) for c in candidates}, key=len):
        if path == "/" or not os.path.isdir(path) or any(_within(path, h) for h in hidden):
            continue
        if any(_within(path, p) for p in PRIVATE_DIRS):
            hidden.append(path)  # under a dir the sandbox replaces by a fresh tmpfs: absent there, no mount needed
            continue
        if any(_within(path, s) for s in SYSTEM_PATHS):
            continue
        if not any(_within(n, path) for n in needed):
            hidden.append(path)  # mounted after the read-only binds, so this works inside one too
        elif not any(_within(path, r) for r in read_only):
            read_only.append(path)
    return tuple(hidden), tuple(read_only)


def _harness(interpreter: str, spec: dict) -> list[str]:
    return [interpreter, "-I", "-c", BOOT, HARNESS, json.dumps(spec)]


def _probe_private(interpreter: str, unshare: str, uid: int | None, hidden, read_only) -> bool:
    with tempfile.TemporaryDirectory(prefix="specrepro-sandbox-", ignore_cleanup_errors=True) as scratch:
        program = _prepare_scratch(scratch, "import os\nopen('probe', 'w').write('x')\n", uid)
        spec = {"mode": "program", "files": {"program": program},
                "private": _private_spec(scratch, hidden, read_only, 1 << 20, hide_proc=True)}
        return _probe([unshare, *UNSHARE_FLAGS, *PRIVATE_FLAGS, *_harness(interpreter, spec)], uid)


def _visible_interpreter(interpreter: str, hidden) -> str | None:
    """The interpreter as a path the private namespace still shows: a venv's python inside a hidden tree
    or under /tmp (e.g. a checkout in /tmp) is replaced by the binary it links to; None if that is hidden too."""
    for path in (interpreter, os.path.realpath(interpreter)):
        if not any(_within(path, h) for h in (*hidden, *PRIVATE_DIRS)):
            return path
    return None


def _private_spec(scratch: str, hidden, read_only, tmp_bytes: int, hide_proc: bool) -> dict:
    mounts = [h for h in hidden if not any(_within(h, p) for p in PRIVATE_DIRS)]
    return {"scratch": "/tmp/" + os.path.basename(scratch), "hide": mounts, "read_only": list(read_only),
            "tmp_bytes": tmp_bytes, "hide_proc": hide_proc}


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
    if not namespaces:
        return SandboxInfo(interpreter, uid_drop, False, None)
    hidden, read_only = _private_paths(interpreter, uid)
    visible = _visible_interpreter(interpreter, hidden)
    if visible is not None and visible != interpreter:
        hidden, read_only = _private_paths(visible, uid)
    if visible is None or not _probe_private(visible, unshare, uid, hidden, read_only):
        return SandboxInfo(interpreter, uid_drop, True, unshare)
    return SandboxInfo(visible, uid_drop, True, unshare, True, hidden, read_only)


def _command(info: SandboxInfo, spec: dict) -> list[str]:
    python = _harness(info.interpreter, spec)
    if not info.namespaces:
        return python
    return [info.unshare, *UNSHARE_FLAGS, *(PRIVATE_FLAGS if info.private_dirs else ()), *python]


class _CappedReader:
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


def _status(timed_out: bool, returncode: int, verdict: bool | None) -> str:
    """``verdict`` None: a plain program, judged by its exit status; else the harness's token arrived."""
    if timed_out:
        return "timed_out"
    if returncode == 0 and verdict is not False:
        return "passed"
    return "killed" if returncode < 0 else "failed"


def _prepare_scratch(scratch: str, code: str, uid: int | None, name: str = PROGRAM_NAME) -> str:
    path = os.path.join(scratch, name)
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


def _execute(sources: dict[str, str], tests: dict | None, timeout: float, memory_mb: int,
             max_output_bytes: int, max_file_bytes: int, max_processes: int) -> SandboxResult:
    """Run the harness on ``sources``; ``tests`` (entry point) switches from exit-status to token verdicts."""
    info = sandbox_info()
    uid = _fresh_uid() if info.uid_drop else None
    limits = _rlimits(timeout, memory_mb, max_file_bytes, max_processes, info.uid_drop)
    start = time.monotonic()
    pipes: list[int] = []
    with tempfile.TemporaryDirectory(prefix="specrepro-sandbox-", ignore_cleanup_errors=True) as scratch:
        files = {name: _prepare_scratch(scratch, text, uid, f"{name}.py") for name, text in sources.items()}
        spec = {"mode": "program" if tests is None else "tests", "files": files, "private": None}
        home = scratch
        if info.private_dirs:
            spec["private"] = _private_spec(scratch, info.hidden, info.read_only,
                                            max(4 * max_file_bytes, 1 << 20), hide_proc=tests is not None)
            home = spec["private"]["scratch"]
        token = b""
        if tests is not None:
            token = secrets.token_hex(TOKEN_BYTES // 2).encode()
            key_read, key_write = os.pipe()
            verdict_read, verdict_write = os.pipe()
            pipes = [key_read, verdict_write]
            os.write(key_write, token)  # 64 bytes: fits the pipe buffer, so this never blocks
            os.close(key_write)
            spec.update(tests, key_fd=key_read, verdict_fd=verdict_write, token_bytes=TOKEN_BYTES)
        env = {"PATH": SAFE_PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
        try:
            proc = subprocess.Popen(_command(info, spec), cwd=scratch, env=env, pass_fds=tuple(pipes),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    preexec_fn=_preexec(limits, uid), close_fds=True)
        finally:
            for fd in pipes:
                os.close(fd)
        fds = [proc.stdout.fileno(), proc.stderr.fileno()] + ([verdict_read] if tests is not None else [])
        reader = _CappedReader(fds, max_output_bytes)
        try:
            timed_out = _wait(proc, reader, timeout)
        finally:
            _kill_everything(proc, uid)
        drain_until = time.monotonic() + 1.0
        while time.monotonic() < drain_until and reader.poll(0.05):
            pass
        proc.stdout.close()
        proc.stderr.close()
        verdict = None
        if tests is not None:
            os.close(verdict_read)
            verdict = secrets.compare_digest(reader.raw(2), token)
    return SandboxResult(_status(timed_out, proc.returncode, verdict), proc.returncode,
                         reader.text(0), reader.text(1), time.monotonic() - start)


def run_untrusted(code: str, timeout: float = 5.0, memory_mb: int = 512,
                  max_output_bytes: int = 64_000, max_file_bytes: int = 16 * 1024 * 1024,
                  max_processes: int = 32) -> SandboxResult:
    """Run ``code`` as a Python program under every containment layer available here.

    ``passed`` here means only that the program exited with status 0, which the program itself
    controls; use ``run_tests`` when the status is a verdict on the code.
    """
    _check_arguments(code, timeout, memory_mb, max_output_bytes, max_file_bytes, max_processes)
    return _execute({"program": code}, None, timeout, memory_mb, max_output_bytes, max_file_bytes,
                    max_processes)


def run_tests(code: str, test: str, entry_point: str, helpers: str = "", timeout: float = 5.0,
              memory_mb: int = 512, max_output_bytes: int = 64_000,
              max_file_bytes: int = 16 * 1024 * 1024, max_processes: int = 32) -> SandboxResult:
    """Run ``code``, then the trusted ``test``'s ``check(code's entry_point)``: ``passed`` only if check returned.

    ``helpers`` is trusted source (a HumanEval prompt) run before ``code``: the test sees its
    definitions, never ones the untrusted code redefines. See the module docstring for the verdict
    channel and what it does not stop.
    """
    _check_arguments(code, timeout, memory_mb, max_output_bytes, max_file_bytes, max_processes)
    for name, value in (("test", test), ("helpers", helpers)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str of Python source, got {type(value).__name__}")
    if not isinstance(entry_point, str) or not entry_point.isidentifier():
        raise ValueError(f"entry_point must be a Python identifier, got {entry_point!r}")
    if "def check" not in test:
        raise ValueError("test must define check(candidate)")
    return _execute({"program": code, "test": test, "helpers": helpers}, {"entry_point": entry_point},
                    timeout, memory_mb, max_output_bytes, max_file_bytes, max_processes)
