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
useless as a verdict. ``run_tests`` takes the verdict out of the untrusted
interpreter altogether:

* A separate, trusted judge process (``JUDGE``: ``python -I``, its own
  session and rlimits, outside the sandbox) receives the test and the
  trusted helpers (the HumanEval prompt) on its stdin, runs them and calls
  ``check(candidate)``. Its ``candidate`` is a proxy: each call sends the
  arguments down a pipe to the sandbox, whose harness calls the program's
  entry point and sends back the return value, or the name of the
  exception it raised. ``passed`` means the judge's ``check`` returned
  (exit status 0 and its own nonce as the last line of its stdout); the
  sandbox's exit status, output and fds count for nothing.
* The judge makes itself non-dumpable first (no ptrace, no /proc/<pid>/mem
  for anyone without CAP_SYS_PTRACE), which matters where the program runs
  as the judge's own user: without namespaces and without ``uid_drop``.
* Only exact builtin data crosses the pipe (None, bool, int, float, complex,
  str, bytes, list, tuple, set, frozenset, dict; tagged JSON, 16 MB a
  frame): an object with a lying ``__eq__`` cannot be sent, and the judge
  compares plain values it decoded itself.
* So the sandboxed interpreter holds no secret, no test, no expected value
  and no module the test uses: taking full control of it (a code object
  built from ``marshal``, raw memory through ``_ctypes``, patching
  ``random``) gains the adversary only what a candidate already has --
  choosing the values it returns. ``tests/tasks/test_forgery.py`` runs
  such an adversary with the audit hook removed: wrong values fail.
* Semantics this costs against the reference harness: the candidate gets
  copies of its arguments (a mutation is not seen by the test), its results
  must be builtin data, an exception in the candidate reaches the test as
  the builtin exception of the same name (else ``RuntimeError``), and a
  test that passes a function or other object to the candidate fails. All
  164 HumanEval canonical solutions pass (the slow test).
* Defence in depth (no verdict depends on it): before the program runs,
  the harness preloads the stdlib modules that peek at frames while
  loading, points ``sys.pycache_prefix`` at nothing (later imports compile
  from source, no ``.pyc`` is read), sets RLIMIT_NPROC 0 (no processes or
  threads) and installs a PEP 578 audit hook that refuses frame and ``gc``
  introspection, tracing, ``marshal.load(s)``, code and function
  construction (``code.__new__``, ``code.replace``, ``function.__new__``),
  ``ctypes``/``_ctypes`` under any dotted part of a module name or as the
  file of an extension module, and opening anything under /proc. The
  harness's own builtins are a copy, so a program that patches
  ``builtins`` breaks only itself.

What an adversary inside the interpreter can still do: answer from memory
what HumanEval's tests expect (the problems are public); use the full
power of the sandboxed process -- its CPU time, memory, files and output
up to the limits below -- including everything the audit hook is known
not to stop (audit hooks are not a security boundary: a CPython memory
bug, or ctypes-like access through some other extension, gives raw
memory); read whatever the filesystem view shows (system files under
/usr, readable by anyone on the host); and, on a machine without
namespaces, everything listed under "Not contained". None of these
changes a verdict: the values the judge compares are only the ones the
program chose to return.

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
  (``uid_drop``): the program runs as a fresh random host uid. Then
  RLIMIT_NPROC caps its process count (as root that limit is ignored by
  the kernel), it cannot write anywhere its uid has no permission, and
  after the run every process of that uid is killed, including ones that
  escaped the process group with ``setsid``/double fork. If
  ``sys.executable`` sits somewhere the uid cannot read (e.g. under
  /root), a system ``python3`` is used.
* ``unshare`` usable (``namespaces``): new user, net, pid, IPC and UTS
  namespaces. The net namespace has no interfaces up, so any connection
  fails at once; System V shared memory, semaphores and message queues
  are private and destroyed with the namespace (no host segment can be
  opened, none outlives the run); when the program (pid 1 there) exits,
  the kernel kills every process left in its pid namespace.
* A mount namespace usable too (``private_dirs``, ``level == "full"``): the
  launcher runs as uid 1000 of the new user namespace (never root there:
  ``os.setuid(0)`` fails with EINVAL) with the namespace's capabilities
  kept for the set-up (``unshare --keep-caps``), builds a new root on a
  tmpfs holding read-only binds of only ``visible`` -- /usr, the top-level
  /bin, /sbin, /lib* (or their links into /usr), /etc/ld.so.cache, and the
  interpreter's own directories when they lie elsewhere -- plus a fresh
  size-limited /tmp and /dev/shm, /dev/null, zero, full, random and
  urandom, and /proc of its own pid namespace (an empty tmpfs while tests
  run); ``pivot_root``\s into it and detaches the old root, remounts the
  root read-only, sets the hostname to ``sandbox``, then drops every
  capability (bounding set, securebits locked, no_new_privs), so none of
  it can be undone, and (x86_64, ``seccomp``) installs a seccomp filter:
  EPERM for ptrace and process_vm_*, every namespace call (unshare, setns,
  clone with a CLONE_NEW* flag), mount calls, keys, BPF, perf,
  io_uring, userfaultfd, file handles, personality, modules and host
  administration, and the x32 ABI; ENOSYS for clone3 (libc falls back to
  clone, whose flags the filter can read); another architecture's
  syscalls kill the process. The filter is installed in the launcher, so
  it binds the harness and the program alike. The project, HOME, other checkouts, /etc, /opt, /work
  and the rest of the host are simply absent; packages outside the
  interpreter's standard library cannot be imported.
* Without namespaces (``level == "fallback"``), and with namespaces but
  neither a private root nor a fresh uid, every run warns
  (``SandboxWarning``) and ``SPECREPRO_SANDBOX=strict`` makes
  ``run_untrusted``/``run_tests`` raise instead. The second case matters
  for verdicts: the program then runs as the user who owns the
  interpreter, and a stdlib it can write (a pyenv or conda install in
  HOME) is one the judge imports, now or in a later run. The judge runs
  with ``-S`` (no ``site``, so no ``.pth`` file), but only a read-only
  view or another uid protects the standard library itself. ``SandboxInfo.containment``
  names the layers in force and ``record()`` gives what results files
  store; Table 1's records and pass@k rows carry the level.

Not contained: without ``private_dirs``, reading any file its uid may read
and writing to world-writable places such as /tmp or /dev/shm (files it
leaves there survive the run, each capped by RLIMIT_FSIZE); without
``namespaces``, the network (a 127.0.0.1 listener is reachable: the
socket patch is bypassable), the host's System V IPC (a host segment can
be opened by key; the run's own segments count against host RAM, not
RLIMIT_AS, until the run ends -- with ``uid_drop`` every IPC object of its
uid is removed then, without it they outlive the run) and every host
process's command line under /proc; without ``uid_drop``, writing to any path the parent
user may write when it knows the absolute path, and a fork bomb limited
only by RLIMIT_NPROC, which counts *all* processes of the user (so it is
set relative to the current count) and does not apply to root at all --
then only the timeout and the final kill bound it; without
``namespaces`` and without ``uid_drop``, a ``setsid`` escapee survives the
kill. Without ``seccomp`` (no private root, or not x86_64), every syscall
of the kernel is reachable within the namespaces' and capabilities'
limits; with it, the syscalls it allows still are (a kernel bug in one of
them is out of reach of anything here). No CPU-share isolation.
bubblewrap (Debian ``bubblewrap``) does what the private root does and
works on this machine; it is not used, since the launcher here needs no
extra package and adds the seccomp filter and the judge's pipes itself.
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
import warnings
from dataclasses import dataclass
from typing import Callable

HARNESS_BODY = r'''
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
    """In a fresh user+mount namespace (with its capabilities): a new root that holds only the interpreter
    and its libraries (read-only), a private /tmp, /dev/shm and /proc; then no capabilities, for good.

    Runs in a launcher process that then execs the real harness, so ctypes (raw memory access) is
    never loaded where the program runs."""
    ctypes, lib = libc()
    rdonly, nosuid, nodev, remount, bind, rec, detach = 1, 2, 4, 32, 4096, 16384, 2

    def mount(source, target, fstype, flags, data=None):
        checked(ctypes, lib.mount(source, target.encode(), fstype, flags, data), f"mount {target}")

    def bind_read_only(source, target, writable=False):
        if os.path.isdir(source):
            os.makedirs(target, exist_ok=True)
        else:
            open(target, "a").close()
        mount(source.encode(), target, None, bind | rec)
        mount(None, target, None, remount | bind | nosuid | (0 if writable else rdonly | nodev))

    root = "/tmp"  # a fresh tmpfs over the host's /tmp (only in this namespace) becomes the new root
    mount(b"tmpfs", root, b"tmpfs", nosuid | nodev, b"mode=0755,size=1m,nr_inodes=1024")
    for path in private["visible"]:
        os.makedirs(os.path.dirname(root + path), exist_ok=True)
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        else:
            bind_read_only(path, root + path)
    size = f"size={private['tmp_bytes']},nr_inodes=4096".encode()
    for path in ("/tmp", "/dev", "/dev/shm"):
        os.makedirs(root + path, exist_ok=True)
        mount(b"tmpfs", root + path, b"tmpfs", nosuid | nodev * (path != "/dev"),
              (b"mode=0755,size=65536" if path == "/dev" else b"mode=1777," + size))
    for name in ("null", "zero", "full", "random", "urandom"):
        bind_read_only("/dev/" + name, root + "/dev/" + name, writable=True)
    os.makedirs(root + "/proc")
    if private["hide_proc"]:
        mount(b"tmpfs", root + "/proc", b"tmpfs", nosuid | nodev | rdonly, b"mode=0555,size=4096")
    else:
        mount(b"/proc", root + "/proc", None, bind | rec)  # the fresh /proc of its own pid namespace
    scratch = private["scratch"]
    os.mkdir(root + scratch, 0o700)
    files = {}
    for name, text in sources.items():
        files[name] = os.path.join(scratch, f"{name}.py")
        with open(root + files[name], "w", encoding="utf-8") as handle:
            handle.write(text)
    os.chdir(root)
    pivot_root = {"x86_64": 155, "aarch64": 41, "riscv64": 41}.get(os.uname().machine)
    if pivot_root is None:
        raise OSError(f"no pivot_root syscall number known for {os.uname().machine}")
    checked(ctypes, lib.syscall(pivot_root, b".", b"."), "pivot_root")  # the old root now lies over "/"
    checked(ctypes, lib.umount2(b".", detach), "umount the old root")
    os.chdir("/")
    mount(None, "/", None, remount | bind | rdonly | nosuid | nodev)
    socket.sethostname("sandbox")  # its own UTS namespace: the host's name is not its business
    os.chdir(scratch)
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
    if private["seccomp"]:
        install_seccomp(ctypes, lib)
    return files


# x86_64 syscalls a Python program has no business making: debugging and reading other processes, kernel
# modules and keys, namespaces and mounts, BPF, perf, io_uring, userfaultfd, handles, personality, host admin.
DENIED_SYSCALLS = {"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kexec_load": 246,
                   "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
                   "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
                   "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "userfaultfd": 323,
                   "perf_event_open": 298, "personality": 135, "io_uring_setup": 425, "io_uring_enter": 426,
                   "io_uring_register": 427, "open_by_handle_at": 304, "name_to_handle_at": 303, "acct": 163,
                   "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171,
                   "quotactl": 179, "lookup_dcookie": 212, "move_mount": 429, "open_tree": 428, "fsopen": 430,
                   "fsmount": 432, "fspick": 433, "mount_setattr": 442}


def install_seccomp(ctypes, lib):
    """A seccomp filter (x86_64): EPERM for DENIED_SYSCALLS, for clone() with namespace flags and for the
    x32 ABI; ENOSYS for clone3 (its flags sit in memory a filter cannot read; libc falls back to clone);
    any other architecture's syscalls kill the process."""
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill, errno = 0x7FFF0000, 0x80000000, 0x00050000
    eperm, enosys = 1, 38
    clone, clone3, namespace_flags = 56, 435, 0x7E020080  # CLONE_NEW{NS,CGROUP,UTS,IPC,USER,PID,NET,TIME}
    program = [(ld, 0, 0, 4), (jeq, 1, 0, 0xC000003E), (ret, 0, 0, kill), (ld, 0, 0, 0),
               (jge, "deny", 0, 0x40000000)]
    program += [(jeq, "deny", 0, number) for number in DENIED_SYSCALLS.values()]
    program += [(jeq, "nosys", 0, clone3), (jeq, 0, "allow", clone), (ld, 0, 0, 16),
                (jset, "deny", "allow", namespace_flags)]
    labels = {"allow": (ret, 0, 0, allow), "deny": (ret, 0, 0, errno | eperm),
              "nosys": (ret, 0, 0, errno | enosys)}
    where = {name: len(program) + i for i, name in enumerate(labels)}
    program += list(labels.values())

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    def offset(i, jump):
        return where[jump] - i - 1 if isinstance(jump, str) else jump

    table = (Filter * len(program))(*[Filter(code, offset(i, jt), offset(i, jf), k)
                                      for i, (code, jt, jf, k) in enumerate(program)])
    fprog = Program(len(program), table)
    set_seccomp, mode_filter = 22, 2
    checked(ctypes, lib.prctl(set_seccomp, mode_filter, ctypes.addressof(fprog), 0, 0), "seccomp")


def run_program(path, source):
    sys.argv = [path]
    code = compile(source, path, "exec")
    exec(code, {"__name__": "__main__", "__file__": path, "__builtins__": __import__("builtins")})


def audit_hook():
    """Refuse, for the rest of the process, introspection, raw memory and code not compiled from source.

    Defence in depth only: no verdict depends on it (the judge is another process)."""
    realpath, fsdecode, basename = os.path.realpath, os.fsdecode, os.path.basename
    refused = frozenset({"sys.settrace", "sys.setprofile", "sys._current_frames", "sys._current_exceptions",
                         "sys.addaudithook", "code.__new__", "function.__new__", "marshal.load", "marshal.loads"})
    raw_memory = ("ctypes", "_ctypes")

    def hook(event, args):
        if event == "sys._getframe":
            raise ValueError("frame introspection is disabled in this sandbox")
        if event == "import":
            # every dotted part and the file: an extension loaded under another name is still itself
            name, path = str(args[0]), basename(fsdecode(args[1])) if isinstance(args[1], (str, bytes)) else ""
            if any(part in raw_memory for part in name.split(".")) or path.split(".")[0] in raw_memory:
                raise RuntimeError(f"import of {name} ({path or 'no file'}) is disabled in this sandbox")
        if (event in refused or event.startswith(("gc.", "ctypes.", "cpython."))
                or (event == "object.__getattr__" and str(args[1]).endswith("_frame"))
                or (event in ("object.__setattr__", "object.__delattr__") and args[1] == "__code__")):
            raise RuntimeError(f"{event} is disabled in this sandbox")
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = realpath(fsdecode(args[0]))
            if path == "/proc" or path.startswith("/proc/"):
                raise PermissionError(f"{path}: /proc is hidden in this sandbox")
    return hook


PREIMPORTS = ("bisect", "collections", "copy", "dataclasses", "datetime", "decimal", "enum", "fractions",
              "functools", "hashlib", "heapq", "itertools", "math", "operator", "random", "re", "statistics",
              "string", "traceback", "types", "typing")


def lock_down():
    """Before the program: stdlib preloaded, later imports compiled from source, no processes, the hook."""
    for name in PREIMPORTS:  # some stdlib modules peek at frames while they load: load them before the hook
        __import__(name)
    import resource
    sys.dont_write_bytecode = True
    sys.pycache_prefix = "/nonexistent-specrepro-pycache"  # later imports find no .pyc: compiled from source
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # no processes or threads
    sys.addaudithook(audit_hook())


def serve(spec, path, source):
    """The program, then answer the judge's calls of the entry point, one frame per call, until EOF."""
    requests, answers, limit = spec["requests_fd"], spec["answers_fd"], spec["frame_bytes"]
    streams, exit_now, print_exception = (sys.stdout, sys.stderr), os._exit, __import__("traceback").print_exc
    sys.argv = [path]
    globals_ = {"__name__": "__main__", "__file__": path, "__builtins__": __import__("builtins")}
    program = compile(source, path, "exec")
    lock_down()
    exec(program, globals_)
    candidate = globals_[spec["entry_point"]]
    while True:
        message = recv_frame(requests, limit)
        if message is None:
            break
        try:
            reply = {"value": encode_value(candidate(*decode_value(message["args"]),
                                                     **decode_value(message["kwargs"])))}
        except BaseException as error:  # SystemExit too: the judge's call fails, the loop goes on
            print_exception()
            try:
                reply = {"error": type(error).__name__, "message": str(error)[:500]}
            except BaseException:
                reply = {"error": "Exception", "message": "(unprintable)"}
        send_frame(answers, reply)
    for stream in streams:
        try:
            stream.flush()
        except Exception:
            pass
    exit_now(0)


def main(spec):
    faulthandler.disable()
    sources = {name: read(path) for name, path in spec["files"].items()}
    if spec["private"]:
        files = make_private(spec["private"], sources)
        exe = sys.executable
        os.execv(exe, [exe, "-I", "-c", BOOT, HARNESS, json.dumps(dict(spec, files=files, private=None))])
    path = spec["files"]["program"]
    block_network()
    if spec["mode"] == "serve":
        serve(spec, path, sources["program"])
    else:
        run_program(path, sources["program"])


main(json.loads(sys.argv.pop(1)))
'''

# Values crossing between the sandbox and the judge: exact builtin data only, as tagged JSON.
CODEC = r'''
import json, os

TAGS = {list: "l", tuple: "t", set: "s", frozenset: "fs"}
KINDS = {tag: kind for kind, tag in TAGS.items()}


def encode_value(value, depth=0):
    kind = type(value)
    if depth > 200:
        raise ValueError("value nested too deeply (or cyclic)")
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return {"i": str(value)}
    if kind is float:
        return {"f": repr(value)}
    if kind is complex:
        return {"c": [repr(value.real), repr(value.imag)]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind in TAGS:
        return {TAGS[kind]: [encode_value(item, depth + 1) for item in value]}
    if kind is dict:
        return {"d": [[encode_value(k, depth + 1), encode_value(v, depth + 1)] for k, v in value.items()]}
    raise TypeError(f"only builtin data crosses the sandbox boundary, not a {kind.__name__!r}")


def decode_value(data, depth=0):
    if depth > 200:
        raise ValueError("value nested too deeply")
    if data is None or type(data) in (bool, str):
        return data
    if type(data) is not dict or len(data) != 1:
        raise ValueError(f"not an encoded value: {str(data)[:80]}")
    (tag, body), = data.items()
    if tag == "i" and type(body) is str:
        return int(body)
    if tag == "f" and type(body) is str:
        return float(body)
    if tag == "c" and type(body) is list and len(body) == 2:
        return complex(float(body[0]), float(body[1]))
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if tag in KINDS and type(body) is list:
        return KINDS[tag](decode_value(item, depth + 1) for item in body)
    if tag == "d" and type(body) is list:
        return {decode_value(k, depth + 1): decode_value(v, depth + 1) for k, v in body}
    raise ValueError(f"not an encoded value: {str(data)[:80]}")


def read_exact(fd, size):
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def send_frame(fd, message):
    body = json.dumps(message).encode()
    data = len(body).to_bytes(4, "big") + body
    while data:
        data = data[os.write(fd, data):]


def recv_frame(fd, limit):
    """One message, or None at end of file (the other side is gone)."""
    header = read_exact(fd, 4)
    if header is None:
        return None
    size = int.from_bytes(header, "big")
    if size > limit:
        raise ValueError(f"a frame of {size} bytes exceeds the limit of {limit}")
    body = read_exact(fd, size)
    return None if body is None else json.loads(body)
'''

# The judge: a separate, trusted process that runs the test's check() against a proxy whose calls are
# answered by the sandbox. The verdict is the judge's; no secret and no test object is in the sandbox.
JUDGE_BODY = r'''
import builtins, sys


def undumpable():
    """No ptrace and no /proc/<pid>/mem of the judge for anyone without CAP_SYS_PTRACE: without namespaces
    and a uid of its own, the program runs as the judge's user, and must not reach into the judge."""
    import ctypes
    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "the judge could not make itself non-dumpable")


def main():
    undumpable()
    spec = json.loads(sys.stdin.read())
    to_sandbox, from_sandbox, limit = spec["to_sandbox"], spec["from_sandbox"], spec["frame_bytes"]

    def candidate(*args, **kwargs):
        send_frame(to_sandbox, {"args": encode_value(list(args)), "kwargs": encode_value(dict(kwargs))})
        reply = recv_frame(from_sandbox, limit)
        if reply is None:
            raise RuntimeError("the sandboxed program ended before answering (it exited, crashed or was killed)")
        if "error" in reply:
            kind = getattr(builtins, str(reply["error"]), None)
            if not (isinstance(kind, type) and issubclass(kind, Exception)):
                kind = RuntimeError
            raise kind(f"raised in the sandbox: {reply['error']}: {reply['message']}")
        return decode_value(reply["value"])

    candidate.__name__ = spec["entry_point"]
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(spec["helpers"], "<helpers>", "exec"), namespace)
    exec(compile(spec["test"], "<test>", "exec"), namespace)
    namespace[spec["entry_point"]] = candidate
    namespace["check"](candidate)
    sys.stdout.flush()
    sys.stdout.write("\n" + spec["verdict"] + "\n")
    sys.stdout.flush()


main()
'''
JUDGE = CODEC + JUDGE_BODY
HARNESS = CODEC + HARNESS_BODY

# The harness runs in a dict of its own: nothing of it is left in __main__ for the program to find.
# Its builtins are a copy, so a program that patches the builtins module does not reach the harness's.
BOOT = ('import sys; exec(compile(sys.argv[1], "<sandbox>", "exec"), {"__name__": "__sandbox__", '
        '"__builtins__": dict(vars(__builtins__)), "BOOT": sys.orig_argv[sys.orig_argv.index("-c") + 1], '
        '"HARNESS": sys.argv.pop(1)})')

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
PROGRAM_NAME = "program.py"
UNSHARE_FLAGS = ("--user", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child")
# uid and gid 1000 inside, not root; --keep-caps leaves the launcher the namespace's capabilities for the
# mounts, which it then drops for good before the program runs
INSIDE_UID = 1000
PRIVATE_FLAGS = (f"--map-user={INSIDE_UID}", f"--map-group={INSIDE_UID}", "--keep-caps", "--mount", "--mount-proc")
SECCOMP = os.uname().machine == "x86_64"  # the filter's syscall numbers are x86_64's
MODE_VARIABLE = "SPECREPRO_SANDBOX"  # "strict": refuse to run untrusted code without namespaces
FRAME_BYTES = 16 * 1024 * 1024  # largest encoded call or answer between judge and sandbox
# The host paths a private root shows (read-only), those that exist; the interpreter's own are added.
SYSTEM_VIEW = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache")
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
    visible: tuple[str, ...] = ()  # with private_dirs: all the program sees of the host, read-only

    @property
    def containment(self) -> str:
        """One line naming the layers in force, for logs and reports."""
        layers = ["rlimits", "clean env", "session kill"]
        if self.uid_drop:
            layers.append("fresh uid")
        if self.namespaces:
            layers.append("user/net/pid/ipc/uts namespaces (no network, private System V IPC)")
        else:
            layers.append("NO namespaces: network, System V IPC and every host process visible and reachable")
        if self.private_dirs:
            layers.append(f"uid {INSIDE_UID} inside; private root showing only {', '.join(self.visible)} "
                          "(read-only), a fresh /tmp, /dev/shm and /proc")
            layers.append("seccomp filter" if self.seccomp else "no seccomp filter (not x86_64)")
        else:
            layers.append("shared filesystem (no mount namespace)")
        return "; ".join(layers)

    @property
    def seccomp(self) -> bool:
        """The launcher installs its syscall filter along with the private root, on x86_64."""
        return self.private_dirs and SECCOMP

    @property
    def level(self) -> str:
        """``full`` (namespaces and private mounts), ``namespaces`` (no private mounts) or ``fallback``."""
        return "full" if self.private_dirs else "namespaces" if self.namespaces else "fallback"

    def record(self) -> dict:
        """What a results file holding pass@k records about the isolation its verdicts ran under."""
        return {"level": self.level, "containment": self.containment, "uid_drop": self.uid_drop,
                "namespaces": self.namespaces, "private_dirs": self.private_dirs, "seccomp": self.seccomp,
                "verdict": "judge process (check() outside the sandbox; builtin data across a pipe)"}

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
    """The directories the interpreter runs from: its binary's, its standard library's and its libpython's."""
    try:
        done = subprocess.run([interpreter, "-I", "-c", "import os, sys, sysconfig; p = sysconfig.get_paths(); "
                               "print(p['stdlib']); print(p['platstdlib']); "
                               "print(os.path.dirname(os.path.realpath(sys.executable))); "
                               "print(sysconfig.get_config_var('LIBDIR') or '')"],
                              env={"PATH": SAFE_PATH}, cwd="/", timeout=20, capture_output=True, text=True,
                              preexec_fn=(lambda: _drop_to(uid)) if uid is not None else None)
    except (OSError, subprocess.SubprocessError):
        return []
    return [os.path.realpath(line) for line in done.stdout.split() if os.path.isdir(line)]


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _visible_paths(interpreter: str, uid: int | None) -> tuple[str, ...]:
    """What the private root shows, read-only: /usr, the top-level library and binary directories (or the
    links into /usr that stand for them), ld.so's cache, and wherever else the interpreter lives."""
    candidates = [*SYSTEM_VIEW, *_interpreter_paths(interpreter, uid)]
    visible: list[str] = []
    for path in candidates:
        if not os.path.lexists(path) or path in visible:
            continue
        if not os.path.islink(path) and any(_within(path, v) for v in visible if not os.path.islink(v)):
            continue
        visible.append(path)
    return tuple(visible)


def _harness(interpreter: str, spec: dict) -> list[str]:
    return [interpreter, "-I", "-c", BOOT, HARNESS, json.dumps(spec)]


def _probe_private(interpreter: str, unshare: str, uid: int | None, visible) -> bool:
    with tempfile.TemporaryDirectory(prefix="specrepro-sandbox-", ignore_cleanup_errors=True) as scratch:
        program = _prepare_scratch(scratch, "import os\nopen('probe', 'w').write('x')\n", uid)
        spec = {"mode": "program", "files": {"program": program},
                "private": _private_spec(scratch, visible, 1 << 20, hide_proc=True)}
        return _probe([unshare, *UNSHARE_FLAGS, *PRIVATE_FLAGS, *_harness(interpreter, spec)], uid)


def _private_spec(scratch: str, visible, tmp_bytes: int, hide_proc: bool) -> dict:
    return {"scratch": "/tmp/" + os.path.basename(scratch), "visible": list(visible), "tmp_bytes": tmp_bytes,
            "hide_proc": hide_proc, "seccomp": SECCOMP}


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
    # The interpreter by its real path: a venv's python is a link, and the private root shows no venv.
    interpreter = os.path.realpath(interpreter)
    visible = _visible_paths(interpreter, uid)
    if any(_within(v, p) for v in visible for p in PRIVATE_DIRS) or not _probe_private(
            interpreter, unshare, uid, visible):
        return SandboxInfo(interpreter, uid_drop, True, unshare)
    return SandboxInfo(interpreter, uid_drop, True, unshare, True, visible)


class SandboxWarning(UserWarning):
    """Untrusted code runs with less isolation than this sandbox is built for."""


def _sandbox_mode() -> str:
    mode = os.environ.get(MODE_VARIABLE, "")
    if mode not in ("", "strict"):
        raise ValueError(f"{MODE_VARIABLE} must be unset, empty or 'strict', got {mode!r}")
    return mode


def _require_isolation(info: SandboxInfo) -> None:
    """Under SPECREPRO_SANDBOX=strict, refuse to run without namespaces, or where the program would run as the
    user who owns the interpreter's files (no fresh uid, no private read-only root); otherwise warn."""
    if info.namespaces and (info.private_dirs or info.uid_drop):
        return
    if not info.namespaces:
        lack = "no user namespaces (unshare missing or refused)"
        message = f"running untrusted code WITHOUT user/net/pid/ipc namespaces ({info.containment})"
    else:
        lack = "neither a private read-only root nor a fresh uid"
        message = (f"running untrusted code as this user with the host's filesystem ({info.containment}): "
                   "it can write what this user can, the interpreter's files included")
    if _sandbox_mode() == "strict":
        raise RuntimeError(f"{MODE_VARIABLE}=strict: this machine offers {lack}, so untrusted code is not run")
    warnings.warn(f"{message}; set {MODE_VARIABLE}=strict to refuse instead", SandboxWarning, stacklevel=4)


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
        _remove_ipc(uid)


def _remove_ipc(uid: int) -> None:
    """Remove the System V segments, queues and semaphores the run's fresh uid created or owns: without an
    IPC namespace they would outlive it (and their memory is not counted by its RLIMIT_AS)."""
    import ctypes

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


def _status(timed_out: bool, returncode: int, judged: bool | None, killed: bool = False) -> str:
    """``judged`` None: a plain program, judged by its exit status; else whether the judge's check returned."""
    if timed_out:
        return "timed_out"
    if judged is None:
        return "passed" if returncode == 0 else "killed" if returncode < 0 else "failed"
    if judged:
        return "passed"
    return "killed" if killed else "failed"


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


def _start_judge(tests: dict, timeout: float, memory_mb: int, fds: tuple[int, int],
                 cwd: str) -> tuple[subprocess.Popen, str]:
    """The trusted judge: the test's check() in its own interpreter, its candidate a proxy to the sandbox.

    The test and helpers go in through stdin (no file, argv or environment a program could read)."""
    verdict = "specrepro-judge-passed-" + secrets.token_hex(8)
    limits = _rlimits(timeout, max(memory_mb, 512), 16 * 1024 * 1024, 1, uid_drop=True)
    del limits[resource.RLIMIT_NPROC]
    # -S: no site module, so no .pth file in a site-packages directory runs code in the judge
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", JUDGE], cwd=cwd, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env={"PATH": SAFE_PATH, "LANG": "C.UTF-8"}, pass_fds=fds, close_fds=True,
                            preexec_fn=_preexec(limits, None))
    spec = dict(tests, to_sandbox=fds[0], from_sandbox=fds[1], frame_bytes=FRAME_BYTES, verdict=verdict)
    try:
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    return proc, verdict


def _execute(sources: dict[str, str], tests: dict | None, timeout: float, memory_mb: int,
             max_output_bytes: int, max_file_bytes: int, max_processes: int) -> SandboxResult:
    """Run the harness on ``sources``; with ``tests`` the judge's check() gives the verdict."""
    info = sandbox_info()
    _require_isolation(info)
    uid = _fresh_uid() if info.uid_drop else None
    limits = _rlimits(timeout, memory_mb, max_file_bytes, max_processes, info.uid_drop)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="specrepro-sandbox-", ignore_cleanup_errors=True) as scratch, \
            tempfile.TemporaryDirectory(prefix="specrepro-judge-", ignore_cleanup_errors=True) as judge_dir:
        files = {name: _prepare_scratch(scratch, text, uid, f"{name}.py") for name, text in sources.items()}
        spec = {"mode": "program" if tests is None else "serve", "files": files, "private": None}
        home = scratch
        if info.private_dirs:
            spec["private"] = _private_spec(scratch, info.visible, max(4 * max_file_bytes, 1 << 20),
                                            hide_proc=tests is not None)
            home = spec["private"]["scratch"]
        sandbox_fds: tuple[int, ...] = ()
        judge = None
        if tests is not None:
            requests_read, requests_write = os.pipe()
            answers_read, answers_write = os.pipe()
            sandbox_fds = (requests_read, answers_write)
            spec.update(entry_point=tests["entry_point"], requests_fd=requests_read, answers_fd=answers_write,
                        frame_bytes=FRAME_BYTES)
        env = {"PATH": SAFE_PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
        try:
            proc = subprocess.Popen(_command(info, spec), cwd=scratch, env=env, pass_fds=sandbox_fds,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    preexec_fn=_preexec(limits, uid), close_fds=True)
            if tests is not None:
                judge, verdict = _start_judge(tests, timeout, memory_mb, (requests_write, answers_read), judge_dir)
        finally:
            for fd in sandbox_fds:
                os.close(fd)
            if tests is not None:
                os.close(requests_write)
                os.close(answers_read)
        fds = [proc.stdout.fileno(), proc.stderr.fileno()]
        if judge is not None:
            fds += [judge.stdout.fileno(), judge.stderr.fileno()]
        reader = _CappedReader(fds, max_output_bytes)
        killed = False
        try:
            timed_out = _wait(judge or proc, reader, timeout)
            if judge is not None and _exited(proc.pid):
                state = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                killed = state is not None and state.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
        finally:
            _kill_everything(proc, uid)
            if judge is not None:
                _kill_everything(judge, None)
        drain_until = time.monotonic() + 1.0
        while time.monotonic() < drain_until and reader.poll(0.05):
            pass
        for stream in (proc.stdout, proc.stderr) + ((judge.stdout, judge.stderr) if judge else ()):
            stream.close()
        judged = None
        stderr = reader.text(1)
        if judge is not None:
            judged = judge.returncode == 0 and reader.raw(2).endswith(f"\n{verdict}\n".encode())
            judge_err = reader.text(3)
            if judge_err:
                stderr += "\n[judge]\n" + judge_err
    return SandboxResult(_status(timed_out, proc.returncode, judged, killed), proc.returncode,
                         reader.text(0), stderr, time.monotonic() - start)


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
    """``passed`` only if the trusted ``test``'s ``check`` returned, run by a judge process outside the sandbox
    whose candidate calls ``code``'s ``entry_point`` in the sandbox, with builtin data both ways.

    ``helpers`` is trusted source (a HumanEval prompt) the judge runs before ``test``: the test sees its
    definitions, never the code's. See the module docstring for what this costs and what it stops.
    """
    _check_arguments(code, timeout, memory_mb, max_output_bytes, max_file_bytes, max_processes)
    for name, value in (("test", test), ("helpers", helpers)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str of Python source, got {type(value).__name__}")
    if not isinstance(entry_point, str) or not entry_point.isidentifier():
        raise ValueError(f"entry_point must be a Python identifier, got {entry_point!r}")
    if "def check" not in test:
        raise ValueError("test must define check(candidate)")
    return _execute({"program": code}, {"entry_point": entry_point, "test": test, "helpers": helpers},
                    timeout, memory_mb, max_output_bytes, max_file_bytes, max_processes)
