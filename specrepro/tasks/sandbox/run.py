"""Running a program in the sandbox: ``run_untrusted`` (judged by its exit status) and ``run_tests`` (judged
by a trusted test in another process)."""

from __future__ import annotations

import os
import subprocess
import time
import warnings

from specrepro.tasks.sandbox import cleanup, containment, process, verdict
from specrepro.tasks.sandbox.cgroup import Leaf
from specrepro.tasks.sandbox.containment import SandboxWarning
from specrepro.tasks.sandbox.verdict import SandboxResult

PROGRAM_NAME = "program.py"
PIDS_MARGIN = 4  # beyond max_processes: unshare and the launcher


def _check_arguments(code, timeout, memory_mb, max_output_bytes, max_file_bytes, max_processes) -> None:
    if not isinstance(code, str):
        raise TypeError(f"code must be a str of Python source, got {type(code).__name__}")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    for name, value, low in (("memory_mb", memory_mb, 1), ("max_output_bytes", max_output_bytes, 0),
                             ("max_file_bytes", max_file_bytes, 0), ("max_processes", max_processes, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _make_leaf(info: containment.SandboxInfo, memory_mb: int, max_processes: int) -> Leaf | None:
    if not info.cgroup:
        return None
    try:
        return Leaf.make(memory_mb, max_processes + PIDS_MARGIN)
    except OSError as error:
        warnings.warn(f"no cgroup for this run ({error}): its memory is bounded by RLIMIT_AS only",
                      SandboxWarning, stacklevel=4)
        return None


def _clean_up(parent: str, leaf: Leaf | None) -> bool:
    """Remove the run's cgroup and files by one deadline; False (what is left stays in place) if they could not
    all be removed in time."""
    deadline = time.monotonic() + cleanup.DEADLINE_SECONDS
    try:
        files = cleanup.remove_tree(parent, deadline)
    except OSError:
        files = False
    return (leaf is None or leaf.remove(deadline)) and files


def _launch_spec(info: containment.SandboxInfo, sources: dict[str, str], mode: str, scratch: str,
                 uid: int | None, max_file_bytes: int) -> tuple[dict, dict]:
    """The launcher's spec (the program's files written into ``scratch``) and the program's environment."""
    files = {name: cleanup.write_file(scratch, f"{name}.py", text, uid) for name, text in sources.items()}
    private, home = None, scratch
    if info.private_dirs:
        private = containment.private_spec(scratch, info, max(4 * max_file_bytes, 1 << 20),
                                           hide_proc=mode == "serve")
        home = private["scratch"]
    env = {"PATH": containment.SAFE_PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
    return containment.launch_spec(mode, files, info.seccomp, private), env


def _start(info: containment.SandboxInfo, spec: dict, env: dict, tests: dict | None, cwd: str, judge_dir: str,
           limits: dict, uid: int | None, leaf: Leaf | None, timeout: float,
           memory_mb: int) -> tuple[subprocess.Popen, subprocess.Popen | None, str]:
    """Start the sandbox and, with ``tests``, the judge, joined by two pipes: (sandbox, judge, judge's nonce)."""
    own_fds: tuple[int, ...] = ()
    sandbox_fds: tuple[int, ...] = ()
    if tests is not None:
        requests_read, requests_write = os.pipe()
        answers_read, answers_write = os.pipe()
        sandbox_fds, own_fds = (requests_read, answers_write), (requests_write, answers_read)
        spec = dict(spec, entry_point=tests["entry_point"], requests_fd=requests_read, answers_fd=answers_write,
                    frame_bytes=verdict.FRAME_BYTES)
    try:
        proc = subprocess.Popen(containment.command(info, spec), cwd=cwd, env=env, pass_fds=sandbox_fds,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=process.preexec(limits, uid, leaf),
                                close_fds=True)
        if tests is None:
            return proc, None, ""
        judge, nonce = verdict.start_judge(tests, timeout, memory_mb, own_fds, judge_dir)
        return proc, judge, nonce
    finally:
        for fd in sandbox_fds + own_fds:
            os.close(fd)


def _finish(proc: subprocess.Popen, judge: subprocess.Popen | None, nonce: str, uid: int | None,
            leaf: Leaf | None, timeout: float, max_output_bytes: int) -> tuple[str, str, str]:
    """Wait (reading output) until the judge, or the program, ends or time runs out; kill everything; the
    status, stdout and stderr (the judge's appended)."""
    streams = [proc.stdout, proc.stderr] + ([judge.stdout, judge.stderr] if judge else [])
    reader = process.CappedReader([stream.fileno() for stream in streams], max_output_bytes)
    killed = False
    try:
        timed_out = process.wait(judge or proc, reader, timeout)
        if judge is not None and process.exited(proc.pid):
            killed = process.killed_by_signal(proc.pid)
    finally:
        deadline = time.monotonic() + cleanup.DEADLINE_SECONDS
        process.kill_everything(proc, uid, leaf, deadline)
        if judge is not None:
            process.kill_everything(judge, None, None, deadline)
    drain_until = time.monotonic() + 1.0
    while time.monotonic() < drain_until and reader.poll(0.05):
        pass
    for stream in streams:
        stream.close()
    passed, stderr = None, reader.text(1)
    if judge is not None:
        passed = verdict.judged(judge, reader.raw(2), nonce)
        if judge_err := reader.text(3):
            stderr += "\n[judge]\n" + judge_err
    return verdict.status(timed_out, proc.returncode, passed, killed), reader.text(0), stderr


def _execute(sources: dict[str, str], tests: dict | None, timeout: float, memory_mb: int,
             max_output_bytes: int, max_file_bytes: int, max_processes: int) -> SandboxResult:
    """Run the harness on ``sources``; with ``tests`` the judge's check() gives the verdict."""
    info = containment.sandbox_info()
    containment.require_isolation(info)
    uid = process.fresh_uid() if info.uid_drop else None
    limits = process.rlimits(timeout, memory_mb, max_file_bytes, max_processes, info.uid_drop)
    start = time.monotonic()
    parent, scratch = cleanup.make_scratch(uid)
    leaf = None
    try:
        judge_dir = os.path.join(parent, "judge")
        os.mkdir(judge_dir, 0o700)
        mode = "program" if tests is None else "serve"
        spec, env = _launch_spec(info, sources, mode, scratch, uid, max_file_bytes)
        leaf = _make_leaf(info, memory_mb, max_processes)
        proc, judge, nonce = _start(info, spec, env, tests, scratch, judge_dir, limits, uid, leaf, timeout,
                                    memory_mb)
        status, stdout, stderr = _finish(proc, judge, nonce, uid, leaf, timeout, max_output_bytes)
        isolation = {"level": info.level, "seccomp": info.seccomp, "cgroup": leaf.held if leaf else None,
                     "memory_peak": leaf.peak() if leaf else None}
    finally:
        cleaned = _clean_up(parent, leaf)
        if not cleaned:
            warnings.warn(f"the sandbox's clean-up ran out of time: {parent} (or its cgroup) was left in place",
                          SandboxWarning, stacklevel=3)
    isolation["cleaned"] = cleaned
    return SandboxResult(status, proc.returncode, stdout, stderr, time.monotonic() - start, isolation)


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
    definitions, never the code's. docs/sandbox.md says what this costs and what it stops.
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
