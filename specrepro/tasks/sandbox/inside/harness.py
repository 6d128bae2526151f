"""What runs inside the sandbox: the launcher, then the harness around the program.

Launched as text (``python -I -S -c BOOT HARNESS SPEC``, with ``codec`` and ``seccomp`` placed before this
text), in two stages of one process:

* ``launch``: builds the private root where the spec asks for one (a fresh user and mount namespace),
  drops every capability, sets no_new_privs, installs the seccomp filter and then executes a fresh
  interpreter for the second stage through the one descriptor the filter lets ``execveat`` use. ``ctypes``
  is loaded only here, never where the program runs.
* ``run``: the program itself (``program`` mode), or the program and then the judge's calls of its entry
  point (``serve`` mode, behind ``lock_down``).
"""

import faulthandler
import json
import os
import socket
import sys

if __name__ != "__sandbox__":  # imported by the project; when launched, the texts of these precede this one
    from specrepro.tasks.sandbox.inside.codec import decode_value, encode_value, recv_frame, send_frame
    from specrepro.tasks.sandbox.inside.seccomp import install_seccomp


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


def make_private(ctypes, lib, private, sources):
    """In a fresh user+mount namespace (with its capabilities): a new root that holds only the interpreter
    and its libraries (read-only; /usr/local an empty directory unless the interpreter lives there), a
    private /tmp, /dev/shm and /proc. Returns where the program's files now lie."""
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

    def show(path):
        os.makedirs(os.path.dirname(root + path), exist_ok=True)
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        else:
            bind_read_only(path, root + path)

    root = "/tmp"  # a fresh tmpfs over the host's /tmp (only in this namespace) becomes the new root
    mount(b"tmpfs", root, b"tmpfs", nosuid | nodev, b"mode=0755,size=1m,nr_inodes=1024")
    hidden = private["hidden"]
    inside_hidden = [p for p in private["visible"] if any(p.startswith(h + "/") for h in hidden)]
    for path in private["visible"]:
        if path not in inside_hidden:
            show(path)
    for path in hidden:  # an empty tmpfs over it, then only the interpreter's own directories within it
        if os.path.isdir(root + path):
            mount(b"tmpfs", root + path, b"tmpfs", nosuid | nodev, b"mode=0755,size=65536,nr_inodes=256")
            for inner in inside_hidden:
                if inner.startswith(path + "/"):
                    show(inner)
            mount(None, root + path, None, remount | nosuid | nodev | rdonly)
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
    return files


def drop_capabilities(ctypes, lib):
    """No capabilities, for good: securebits set and locked, bounding set emptied, capset to nothing. Only a
    process that holds some (root in the fallback, the launcher in its own namespace) has any to drop."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    held = (Data * 2)()
    checked(ctypes, lib.capget(ctypes.byref(Header(0x20080522, 0)), held), "capget")
    if not any(d.permitted or d.effective for d in held):
        return
    set_securebits, capbset_drop = 28, 24
    # noroot, no_setuid_fixup, keep_caps, no_cap_ambient_raise: each set and locked
    checked(ctypes, lib.prctl(set_securebits, 0xEF, 0, 0, 0), "securebits")
    for cap in range(64):
        if lib.prctl(capbset_drop, cap, 0, 0, 0) != 0:
            break
    checked(ctypes, lib.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "capset")


def launch(spec):
    """Stage one: the private root (if asked), no capabilities, no_new_privs, the seccomp filter; then the
    harness in a fresh interpreter, executed through ``exec_fd``, the only descriptor the filter lets
    ``execveat`` use (close-on-exec, and above the RLIMIT_NOFILE the program gets)."""
    ctypes, lib = libc()
    files = spec["files"]
    if spec["private"]:
        files = make_private(ctypes, lib, spec["private"], {name: read(path) for name, path in files.items()})
    drop_capabilities(ctypes, lib)
    no_new_privs = 38
    checked(ctypes, lib.prctl(no_new_privs, 1, 0, 0, 0), "no_new_privs")
    exe, exec_fd, nofile = sys.executable, spec["exec_fd"], spec["nofile"]
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, (exec_fd + 1, exec_fd + 1))
    interpreter = os.open(exe, os.O_RDONLY | os.O_CLOEXEC)
    os.dup2(interpreter, exec_fd, inheritable=False)
    os.close(interpreter)
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    if spec["seccomp"]:
        install_seccomp(ctypes, lib, exec_fd)
    stage = json.dumps(dict(spec, files=files, private=None, stage="run"))
    boot, harness = globals()["BOOT"], globals()["HARNESS"]  # set by the boot line (see inside/__init__.py)
    os.execve(exec_fd, [exe, "-I", "-S", "-c", boot, harness, stage], dict(os.environ))


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
    if spec["stage"] == "launch":
        launch(spec)
    import site
    site.setquit()  # exit() and quit(), which -S leaves out along with site-packages
    path = spec["files"]["program"]
    source = read(path)
    block_network()
    if spec["mode"] == "serve":
        serve(spec, path, source)
    else:
        run_program(path, source)


if __name__ == "__sandbox__":
    main(json.loads(sys.argv.pop(1)))
