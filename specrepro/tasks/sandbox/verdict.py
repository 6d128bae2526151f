"""Verdicts: a run's result, and the trusted judge process whose ``check()`` decides ``passed`` for
``run_tests`` (docs/sandbox.md: why nothing the program does in the sandbox reaches it)."""

from __future__ import annotations

import json
import resource
import secrets
import subprocess
import sys
from dataclasses import dataclass, field

from specrepro.tasks.sandbox import containment, inside, process

FRAME_BYTES = 16 * 1024 * 1024  # largest encoded call or answer between judge and sandbox


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one program: passed, failed, timed_out or killed.

    ``isolation`` says what held for this run: the containment ``level``, the ``cgroup`` cap (None if none
    was made), ``memory_peak`` (bytes, from the cgroup), ``seccomp`` and whether its files were
    ``cleaned`` up within the deadline."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    duration: float
    isolation: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def status(timed_out: bool, returncode: int, judged: bool | None, killed: bool = False) -> str:
    """``judged`` None: a plain program, judged by its exit status; else whether the judge's check returned."""
    if timed_out:
        return "timed_out"
    if judged is None:
        return "passed" if returncode == 0 else "killed" if returncode < 0 else "failed"
    if judged:
        return "passed"
    return "killed" if killed else "failed"


def start_judge(tests: dict, timeout: float, memory_mb: int, fds: tuple[int, int],
                cwd: str) -> tuple[subprocess.Popen, str]:
    """The trusted judge: the test's check() in its own interpreter, its candidate a proxy to the sandbox.

    The test and helpers go in through stdin (no file, argv or environment a program could read)."""
    verdict = "specrepro-judge-passed-" + secrets.token_hex(8)
    limits = process.rlimits(timeout, max(memory_mb, 512), 16 * 1024 * 1024, 1, uid_drop=True)
    del limits[resource.RLIMIT_NPROC]
    # -S: no site module, so no .pth file in a site-packages directory runs code in the judge
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", inside.JUDGE], cwd=cwd, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env={"PATH": containment.SAFE_PATH, "LANG": "C.UTF-8"}, pass_fds=fds, close_fds=True,
                            preexec_fn=process.preexec(limits, None))
    spec = dict(tests, to_sandbox=fds[0], from_sandbox=fds[1], frame_bytes=FRAME_BYTES, verdict=verdict)
    try:
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    return proc, verdict


def judged(judge: subprocess.Popen, stdout: bytes, verdict: str) -> bool:
    """Passed: the judge exited 0 with its own nonce as the last line of its (complete) stdout."""
    return judge.returncode == 0 and stdout.endswith(f"\n{verdict}\n".encode())
