"""The limits around the verdict: memory, concurrent runs, clean-up, exec, imports, the filesystem view and
sockets. Each route a program once used to get past them is a test that must fail, beside a control: the same
program doing the harmless thing passes (so the refusal is the sandbox's, not a broken program's)."""

from __future__ import annotations

import dataclasses
import os
import random
import socket
import time
import warnings

import pytest
from test_isolation import fallback  # noqa: F401  (a fixture)

from specrepro.tasks.humaneval import HumanEvalProblem, check_completion
from specrepro.tasks.sandbox import SandboxWarning, cgroup, cleanup, containment, process, run_untrusted, sandbox_info

ADD = HumanEvalProblem("toy/add", "def add(a, b):\n", "    return a + b\n",
                       "def check(f):\n    assert f(2, 3) == 5\n    assert f(-1, 1) == 0\n", "add")


def _need(layer: str) -> None:
    if not getattr(sandbox_info(), layer):
        pytest.skip(f"this machine offers no {layer}: {sandbox_info().containment}")


LEVELS = {"full": {}, "fallback": {"namespaces": False, "unshare": None, "private_dirs": False, "visible": ()}}


@pytest.fixture(params=list(LEVELS))
def level(request, monkeypatch):
    """The machine's own level, and the fallback forced (no namespaces): the seccomp filter binds both."""
    if request.param == "full" and sandbox_info().level != "full":
        pytest.skip(f"this machine's level is {sandbox_info().level}")
    reduced = dataclasses.replace(sandbox_info(), **LEVELS[request.param])
    monkeypatch.setattr(containment, "sandbox_info", lambda: reduced)
    monkeypatch.delenv(containment.MODE_VARIABLE, raising=False)
    return reduced


def _run(code: str, **limits):
    """run_untrusted at the level in force, which warns exactly when it lacks a protection."""
    if containment.sandbox_info().lacking:
        with pytest.warns(SandboxWarning):
            return run_untrusted(code, **limits)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SandboxWarning)
        return run_untrusted(code, **limits)


# ---- memory beyond memory_mb ------------------------------------------------------------------------

def _touching_children(megabytes: int) -> str:
    """Four forked children, each touching ``megabytes`` of its own; their exit statuses."""
    return ("import os\nkids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
            f"        block = bytearray({megabytes} << 20)\n"
            "        for i in range(0, len(block), 4096):\n            block[i] = 1\n        os._exit(0)\n"
            "    kids.append(pid)\nprint([os.waitpid(p, 0)[1] for p in kids])\n")


def test_memory_spread_over_processes_is_capped_by_the_cgroup():
    """RLIMIT_AS is per process: four children of 200 MB each held 800 MB. The cgroup caps the run."""
    _need("cgroup")
    memory_mb = 256
    result = run_untrusted(_touching_children(200), memory_mb=memory_mb)
    cap = (memory_mb + cgroup.MARGIN_MB) << 20
    assert result.isolation["cgroup"].startswith(f"cgroup {sandbox_info().cgroup}: {cap >> 20} MiB")
    assert result.isolation["memory_peak"] <= cap
    assert result.status == "killed" or "9" in result.stdout, result  # some were killed by the kernel
    control = run_untrusted(_touching_children(20), memory_mb=memory_mb)
    assert control.stdout == "[0, 0, 0, 0]\n", control
    assert 20 << 20 <= control.isolation["memory_peak"] <= cap  # a child's block was counted


TMPFS_FILLER = """
import os
written = 0
try:
    for directory in ('/dev/shm', '/tmp', '.'):
        for i in range({files}):
            with open(os.path.join(directory, f'fill{{i}}'), 'wb') as handle:
                handle.write(b'x' * (60 << 20))
            written += 60
except OSError as error:
    print('stopped', error.errno)
print(written, flush=True)
"""


def test_files_in_tmpfs_count_against_the_cap():
    """Files in the private /tmp and /dev/shm are memory RLIMIT_AS does not count; the cgroup does."""
    _need("cgroup")
    memory_mb = 256  # the private /tmp and /dev/shm may hold 256 MB each (4 x max_file_bytes)
    result = run_untrusted(TMPFS_FILLER.format(files=4), memory_mb=memory_mb, max_file_bytes=64 << 20)
    assert result.isolation["memory_peak"] <= (memory_mb + cgroup.MARGIN_MB) << 20
    assert result.status != "passed" or "stopped" in result.stdout, result  # it never wrote all 720 MB
    control = run_untrusted(TMPFS_FILLER.format(files=1), memory_mb=memory_mb, max_file_bytes=64 << 20)
    assert control.status == "passed" and control.stdout == "180\n", control


MEMORY_ROUTES = {  # a way to hold memory outside RLIMIT_AS -> the same program's harmless twin
    "memfd_create": ("import os\nos.memfd_create('hold')\n",
                     "import os, tempfile\ntempfile.TemporaryFile().write(b'x')\n"),
    "System V shared memory": ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                               "assert libc.shmget(0, 1 << 20, 0o1600) >= 0, ctypes.get_errno()\n",
                               "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                               "assert libc.msgget(0, 0o1600) >= 0, ctypes.get_errno()\n"),
    "POSIX message queue": ("import ctypes\nlibrt = ctypes.CDLL('librt.so.1', use_errno=True)\n"
                            "assert librt.mq_open(b'/specrepro', 0o102, 0o600, None) >= 0, ctypes.get_errno()\n",
                            "open('queue', 'wb').write(b'x')\n"),
}


@pytest.mark.parametrize("route", list(MEMORY_ROUTES))
def test_memory_routes_are_refused_at_every_level(level, route):
    _need("seccomp")
    hold, harmless = MEMORY_ROUTES[route]
    result = _run(hold)
    assert result.status == "failed", result
    assert "PermissionError" in result.stderr or "AssertionError: 1" in result.stderr, result.stderr
    assert _run(harmless).status == "passed"


# ---- two checks at once from a seeded process ------------------------------------------------------

SLOW_ADD = "import time\ntime.sleep({delay})\n\ndef add(a, b):\n    return a + b\n"


def _seeded_checks(delays: list[float]) -> list[str]:
    """Each check in a forked process that calls random.seed(0) first (as transformers' set_seed does), all
    at once; their statuses."""
    pipes = []
    for delay in delays:
        read, write = os.pipe()
        if os.fork() == 0:
            try:
                os.close(read)
                random.seed(0)
                result = check_completion(ADD, "    pass\n" + SLOW_ADD.format(delay=delay), timeout=10)
                os.write(write, result.status.encode())
            finally:
                os._exit(0)
        os.close(write)
        pipes.append(read)
    statuses = []
    for read in pipes:
        with os.fdopen(read, "rb") as handle:
            statuses.append(handle.read().decode())
    for _ in pipes:
        os.wait()
    return statuses


def test_two_checks_at_once_from_seeded_processes_both_pass(monkeypatch):
    _need("uid_drop")
    sandbox_info()  # probed before the fork, so that the children share it
    assert _seeded_checks([0, 1.5]) == ["passed", "passed"]
    # power: with the uid drawn from the seeded global random, the first run's clean-up kills the second
    monkeypatch.setattr(process, "fresh_uid", lambda: process.UID_RANGE[0] + random.randrange(10**8))
    first, second = _seeded_checks([0, 1.5])
    assert first == "passed" and second in ("failed", "killed")


def test_a_uid_that_owns_processes_is_never_drawn(monkeypatch):
    busy = os.getpid()
    draws = iter([busy, busy, 7])
    monkeypatch.setattr(process.secrets, "randbelow", lambda n: next(draws))
    monkeypatch.setattr(process, "uid_in_use", lambda uid: uid == process.UID_RANGE[0] + busy)
    assert process.fresh_uid() == process.UID_RANGE[0] + 7
    monkeypatch.undo()
    assert process.uid_in_use(os.getuid()) and not process.uid_in_use(process.fresh_uid())  # for real


def test_draws_do_not_follow_the_global_random():
    uids = []
    for _ in range(2):
        random.seed(0)
        uids.append(process.fresh_uid())
    assert uids[0] != uids[1]


# ---- a FIFO in place of the scratch directory ------------------------------------------------------

FIFO_SWAP = """
import os
here = os.getcwd()
try:
    os.rename(here, here + '.moved')
    os.mkfifo(here)
    print('swapped')
except OSError as error:
    print('refused', error.errno)
os.mkfifo('pipe')
os.symlink('/etc', 'etc-link')
os.makedirs('a/b/c')
os.chmod('a/b', 0)
"""

SWAP_LEVELS = {"fallback, fresh uid": {"namespaces": False, "unshare": None, "private_dirs": False, "visible": ()},
               "fallback, this user": {"namespaces": False, "unshare": None, "private_dirs": False, "visible": (),
                                       "uid_drop": False},
               "namespaces": {"private_dirs": False, "visible": ()}}


@pytest.mark.filterwarnings("ignore::specrepro.tasks.sandbox.SandboxWarning")
@pytest.mark.parametrize("where", list(SWAP_LEVELS))
def test_a_fifo_in_place_of_the_scratch_directory_does_not_block_clean_up(monkeypatch, where):
    info = dataclasses.replace(sandbox_info(), **SWAP_LEVELS[where])
    if info.namespaces and not sandbox_info().namespaces:
        pytest.skip("no namespaces on this machine")
    monkeypatch.setattr(containment, "sandbox_info", lambda: info)
    made = []
    real = cleanup.make_scratch
    monkeypatch.setattr(cleanup, "make_scratch", lambda uid: made.append(real(uid)) or made[-1])
    start = time.monotonic()
    result = run_untrusted(FIFO_SWAP, timeout=3)
    assert time.monotonic() - start < 4 and result.status == "passed", result
    if info.uid_drop:
        assert result.stdout.split()[0] == "refused"  # the parent is not its uid's to write
    assert result.isolation["cleaned"] and not os.path.lexists(made[0][0])
    assert os.path.isdir("/etc")
    control = run_untrusted("import os\nos.makedirs('a/b/c')\nprint('ok')\n")
    assert control.stdout == "ok\n" and control.isolation["cleaned"]


def test_remove_tree_opens_only_directories_and_keeps_what_links_point_to(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    tree = tmp_path / "tree"
    deep = tree.joinpath(*["d"] * 300)
    deep.mkdir(parents=True)
    os.mkfifo(tree / "fifo")  # opening it for reading would block forever: nobody writes
    os.mkfifo(deep / "fifo")
    (tree / "link").symlink_to(outside)
    (tree / "locked").mkdir()
    (tree / "locked" / "f").write_text("x")
    os.chmod(tree / "locked", 0)
    start = time.monotonic()
    assert cleanup.remove_tree(str(tree), time.monotonic() + 5)
    assert time.monotonic() - start < 2 and not tree.exists()
    assert (outside / "keep").read_text() == "x"


def test_clean_up_stops_at_its_deadline_and_warns(tmp_path, monkeypatch):
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    assert not cleanup.remove_tree(str(tree), time.monotonic() - 1)  # past the deadline: left in place
    assert tree.exists()
    assert cleanup.remove_tree(str(tree), time.monotonic() + 5) and not tree.exists()  # control
    monkeypatch.setattr(cleanup, "DEADLINE_SECONDS", -1.0)
    made = []
    real = cleanup.make_scratch
    monkeypatch.setattr(cleanup, "make_scratch", lambda uid: made.append(real(uid)) or made[-1])
    try:
        with pytest.warns(SandboxWarning, match="clean-up ran out of time"):
            result = run_untrusted("print('ok')")
        assert result.stdout == "ok\n" and not result.isolation["cleaned"]
    finally:
        monkeypatch.undo()
        cleanup.remove_tree(made[0][0], time.monotonic() + 5)


# ---- exec after start -----------------------------------------------------------------------------

EXECS = {
    "os.execv": "import os, sys\nos.execv(sys.executable, [sys.executable, '-c', 'print(1)'])\n",
    "fexecve": "import os, sys\nfd = os.open(sys.executable, os.O_RDONLY)\nos.execve(fd, ['python3'], {})\n",
    "subprocess": "import subprocess\nsubprocess.run(['/bin/true'], check=True)\n",
    "posix_spawn": "import os\nos.waitpid(os.posix_spawn('/bin/true', ['true'], {}), 0)\n",
}


@pytest.mark.parametrize("route", list(EXECS))
def test_no_exec_once_the_interpreter_runs(level, route):
    _need("seccomp")
    result = _run(EXECS[route])
    assert result.status == "failed" and "PermissionError" in result.stderr, result
    # control: processes still start (fork without exec), and exit as they please
    control = _run("import os\npid = os.fork()\nif pid == 0:\n    os._exit(3)\nprint(os.waitpid(pid, 0)[1] >> 8)\n")
    assert control.stdout == "3\n", control


EXEC_FD_FORGER = """
import os, resource, sys
fd = os.open(sys.executable, os.O_RDONLY)
for attempt in (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, ({exec_fd} + 1, {exec_fd} + 1)),
                lambda: os.dup2(fd, {exec_fd}),
                lambda: os.execve({exec_fd}, ['python3'], {{}})):
    try:
        attempt()
        print('done')
    except (OSError, ValueError) as error:
        print(type(error).__name__)
print(os.dup2(fd, 10))
"""


def test_the_launcher_s_exec_descriptor_cannot_be_made_again(level):
    """The filter lets execveat use one descriptor number, which lies above RLIMIT_NOFILE once the harness runs:
    no raising the limit (no capabilities), no dup2 up there, so no exec through it."""
    _need("seccomp")
    result = _run(EXEC_FD_FORGER.format(exec_fd=process.EXEC_FD))
    assert result.stdout.split() == ["ValueError", "OSError", "OSError", "10"], result  # control: dup2 below


def test_exec_of_a_fresh_interpreter_does_not_escape_the_judge():
    _need("seccomp")
    completion = "    return a + b\nimport os, sys\nos.execv(sys.executable, [sys.executable, '-c', 'pass'])\n"
    result = check_completion(ADD, completion)
    assert result.status == "failed" and "PermissionError" in result.stderr, result
    assert check_completion(ADD, "    return a + b\nimport os, sys\n").status == "passed"


# ---- imports, the view, sockets, no_new_privs -------------------------------------------------------

def test_only_the_standard_library_is_importable(level):
    code = ("import sys, sysconfig\nstd = sysconfig.get_paths()\n"
            "print(all(p.startswith((std['stdlib'], std['platstdlib'])) or p.endswith('.zip') for p in sys.path))\n"
            "import json, sqlite3, decimal\n")
    control = _run(code)
    assert control.stdout == "True\n", control  # the standard library, extension modules included
    result = _run("import _cffi_backend\n")
    assert result.status == "failed" and "ModuleNotFoundError" in result.stderr


def test_usr_local_and_site_packages_are_empty_in_the_view():
    _need("private_dirs")
    hidden = sandbox_info().hidden
    assert "/usr/local" in hidden
    code = (f"import os, sys\nprint([os.listdir(p) for p in {list(hidden)!r}])\n"
            "sys.path.extend(" + repr(list(hidden[1:])) + ")\n"
            "try:\n    import _cffi_backend\nexcept ImportError:\n    print('no cffi')\n"
            "print('lib' in os.listdir('/usr'), 'python3' in os.listdir('/usr/bin'))\n")
    result = run_untrusted(code)
    assert result.stdout.splitlines() == [repr([[]] * len(hidden)), "no cffi", "True True"], result


SOCKETS = {"AF_INET": "(2, 1)", "AF_INET6": "(10, 1)", "AF_NETLINK": "(16, 3, 0)", "AF_PACKET": "(17, 3)",
           "AF_VSOCK": "(40, 1)", "AF_INET socketpair": None}


@pytest.mark.parametrize("family", list(SOCKETS))
def test_only_unix_sockets_open(level, family):
    _need("seccomp")
    args = SOCKETS[family]
    code = f"import _socket\n_socket.socket{args}\n" if args else "import _socket\n_socket.socketpair(2, 1)\n"
    result = _run(code)
    assert result.status == "failed" and "PermissionError" in result.stderr, result
    control = _run("import _socket\na, b = _socket.socketpair(1, 1)\na.send(b'x')\nprint(b.recv(1))\n"
                   "_socket.socket(1, 1).close()\n")
    assert control.stdout == "b'x'\n", control


@pytest.mark.filterwarnings("ignore::specrepro.tasks.sandbox.SandboxWarning")
def test_the_fallback_reaches_no_listener_on_this_host(fallback):
    _need("seccomp")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # power: the listener is reachable
        code = f"import _socket\ns = _socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))\n"
        result = run_untrusted(code)
        assert result.status == "failed" and "PermissionError" in result.stderr, result
    finally:
        server.close()


def test_no_new_privs_at_every_level(level):
    result = _run("print([l.split()[1] for l in open('/proc/self/status') if l.startswith(('NoNewPrivs', "
                  "'Seccomp:', 'CapEff'))])\n")
    assert result.stdout.strip() == repr(["0000000000000000", "1", "2" if level.seccomp else "0"]), result


# ---- the cgroup leaf on either cgroup version ------------------------------------------------------

MOUNTINFO = """25 1 0:23 / /sys/fs/cgroup rw,nosuid shared:4 - tmpfs tmpfs rw,mode=755
30 25 0:27 / /sys/fs/cgroup/memory rw,relatime shared:8 - cgroup cgroup rw,memory
31 25 0:28 / /sys/fs/cgroup/pids rw,relatime shared:9 - cgroup cgroup rw,pids
33 25 0:30 / /sys/fs/cgroup/unified rw,relatime shared:11 - cgroup2 cgroup2 rw,nsdelegate
"""


def test_the_hierarchies_and_this_process_s_place_in_them_are_read():
    assert cgroup.mounts(MOUNTINFO) == {"memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids",
                                        "v2": "/sys/fs/cgroup/unified"}
    assert cgroup.own_paths("8:pids:/\n4:memory:/jobs/a\n1:cpu,cpuacct:/\n0::/user.slice\n") == {
        "pids": "/", "memory": "/jobs/a", "v2": "/user.slice"}


INTERFACE = {  # the files the kernel puts in a new cgroup of each hierarchy (those the leaf uses)
    "unified": ("cgroup.procs", "memory.max", "memory.swap.max", "memory.oom.group", "pids.max", "memory.peak"),
    "memory": ("cgroup.procs", "memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.max_usage_in_bytes"),
    "pids": ("cgroup.procs", "pids.max"),
}


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_a_leaf_writes_its_limits_where_each_version_wants_them(tmp_path, monkeypatch, version):
    """A stand-in for the kernel's files (this machine has one version at most): what goes where."""
    bases = {"both": tmp_path / "unified"} if version == "v2" else {"memory": tmp_path / "memory",
                                                                      "pids": tmp_path / "pids"}
    for base in bases.values():
        base.mkdir()
    monkeypatch.setattr(cgroup, "parents", lambda: (version, {k: str(v) for k, v in bases.items()}))
    real_mkdir = os.mkdir

    def mkdir(path, mode=0o777):
        real_mkdir(path, mode)
        for name in INTERFACE[os.path.basename(os.path.dirname(path))]:
            with open(os.path.join(path, name), "w") as handle:
                handle.write("4096" if "peak" in name or "usage" in name else "")

    monkeypatch.setattr(cgroup.os, "mkdir", mkdir)
    leaf = cgroup.Leaf.make(100, 10)
    written = {os.path.relpath(os.path.join(d, n), tmp_path): open(os.path.join(d, n)).read()
               for d in leaf.dirs.values() for n in os.listdir(d)}
    cap = str((100 + cgroup.MARGIN_MB) << 20)
    if version == "v2":
        assert {k.split("/", 2)[2]: v for k, v in written.items()} == {
            "cgroup.procs": "", "memory.max": cap, "memory.swap.max": "0", "memory.oom.group": "1",
            "pids.max": "10", "memory.peak": "4096"}
    else:
        assert {k.split("/", 2)[0] + "/" + k.split("/", 2)[2]: v for k, v in written.items()} == {
            "memory/cgroup.procs": "", "memory/memory.limit_in_bytes": cap,
            "memory/memory.memsw.limit_in_bytes": cap, "memory/memory.max_usage_in_bytes": "4096",
            "pids/cgroup.procs": "", "pids/pids.max": "10"}
    assert leaf.held == f"cgroup {version}: 132 MiB of memory, no swap, 10 processes"
    assert leaf.peak() == 4096


def test_no_hierarchy_no_leaf(monkeypatch):
    monkeypatch.setattr(cgroup, "parents", lambda: None)
    with pytest.raises(OSError, match="no cgroup hierarchy"):
        cgroup.Leaf.make(100, 10)
