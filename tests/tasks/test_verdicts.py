"""HumanEval verdicts the checked code cannot forge, and the private /tmp of the sandbox."""

from __future__ import annotations

import ast
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from specrepro.tasks.humaneval import (
    HumanEvalProblem, check_completion, load_humaneval, pass_at_k, program_for,
)
from specrepro.tasks.sandbox import SandboxWarning, containment, inside, run_tests, run_untrusted, sandbox_info

PROJECT = Path(__file__).resolve().parents[2]
WRONG = "    return True\n"  # wrong for HumanEval/0: its second assert expects False
CORRECT = "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
EXIT = "import os, sys\nsys.stdout.flush()\nos._exit(0)\n"  # ends the program before check can fail

# cheating completion for HumanEval/0 -> the status it must get. None of them solves the problem.
CHEATS = {
    "sys.exit(0)": ("    import sys\n    sys.exit(0)\n", "failed"),
    "exit()": ("    exit()\n", "failed"),
    "quit()": ("    quit()\n", "failed"),
    "os._exit(0) in the body": ("    import os\n    os._exit(0)\n", "failed"),
    "os._exit(0) at top level": (WRONG + EXIT, "failed"),
    "raise SystemExit": ("    raise SystemExit\n", "failed"),
    "SystemExit in a finally": ("    try:\n        return True\n    finally:\n        raise SystemExit(0)\n",
                                "failed"),
    "exit in an if __name__ block": (WRONG + "if __name__ == '__main__':\n    raise SystemExit(0)\n", "failed"),
    "redefined check": (WRONG + "def check(candidate):\n    pass\n", "failed"),
    "check replaced while running": ("    globals()['check'] = lambda candidate: None\n    return True\n",
                                     "failed"),
    "patched builtins": (WRONG + "import builtins\nbuiltins.AssertionError = type('A', (Exception,), {})\n"
                         "builtins.abs = lambda x: 0\nbuiltins.len = lambda x: 0\n", "failed"),
    "always-equal result": ("    class Yes:\n        def __eq__(self, other):\n            return True\n"
                            "    return Yes()\n", "failed"),
    "int subclass with a lying __eq__": ("    class Yes(int):\n        def __eq__(self, other):\n"
                                         "            return True\n    return Yes(1)\n", "failed"),
    "printing a fake verdict": (WRONG + "print('passed')\nprint('PASSED', flush=True)\n" + EXIT, "failed"),
    "writing to every inherited fd": (
        WRONG + "import os\nfor fd in range(1024):\n    try:\n        os.write(fd, b'passed\\n' + b'0' * 64)\n"
        "    except OSError:\n        pass\n" + EXIT, "failed"),
    "writing to every fd in /proc/self/fd": (
        WRONG + "import os\ntry:\n    fds = [int(n) for n in os.listdir('/proc/self/fd')]\nexcept OSError:\n"
        "    fds = range(64)\nfor fd in fds:\n    try:\n        os.write(fd, b'passed')\n    except OSError:\n"
        "        pass\n" + EXIT, "failed"),
    "reading every fd and echoing it to every fd": (
        WRONG + "import os\nseen = b''\nfor fd in range(3, 64):\n    try:\n        os.set_blocking(fd, False)\n"
        "        seen += os.read(fd, 4096)\n    except OSError:\n        pass\nfor fd in range(3, 64):\n"
        "    try:\n        os.write(fd, seen)\n    except OSError:\n        pass\n" + EXIT, "failed"),
    "killing its own process group": (WRONG + "import os, signal\nos.killpg(os.getpgid(0), signal.SIGKILL)\n",
                                      "killed"),
    "a thread calling os._exit(0)": ("    import os, threading, time\n"
                                     "    threading.Thread(target=lambda: os._exit(0)).start()\n"
                                     "    time.sleep(2)\n", "failed"),
    "atexit hook exiting 0": (WRONG + "import atexit, os\natexit.register(lambda: os._exit(0))\n"
                              "raise RuntimeError\n", "failed"),
    "excepthook exiting 0": (WRONG + "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n"
                             "raise RuntimeError\n", "failed"),
    "harness frame via sys._getframe": ("    import sys\n    sys._getframe(2).f_locals\n    return True\n",
                                        "failed"),
    "harness frame via a traceback": ("    try:\n        1 / 0\n    except ZeroDivisionError as e:\n"
                                      "        e.__traceback__.tb_frame.f_back.f_locals\n    return True\n",
                                      "failed"),
    "token search with gc": ("    import gc\n    gc.get_objects()\n    return True\n", "failed"),
    "trace function on the harness": ("    import sys\n    sys.settrace(lambda *a: None)\n    return True\n",
                                      "failed"),
    "memory read with ctypes": ("    import ctypes\n    ctypes.string_at(id(numbers), 64)\n    return True\n",
                                "failed"),
    "/proc/self/mem": ("    open('/proc/self/mem', 'rb')\n    return True\n", "failed"),
    "spawning a process to read the harness": ("    import subprocess\n    subprocess.run(['/bin/cat', "
                                             "'/proc/1/mem'])\n    return True\n", "failed"),
    "starting a thread": ("    import threading\n    threading.Thread(target=print).start()\n"
                          "    return True\n", "failed"),
}


@pytest.fixture(scope="module")
def has_close_elements() -> HumanEvalProblem:
    return load_humaneval(n=1)[0]


@pytest.mark.parametrize("name", list(CHEATS))
def test_cheating_completion_does_not_pass(has_close_elements, name):
    completion, expected = CHEATS[name]
    result = check_completion(has_close_elements, completion, timeout=3.0)
    assert result.status == expected, (name, result)


FOOL_EXIT_STATUS = {name for name in CHEATS if "exit" in name or "SystemExit" in name} | {
    "quit()", "always-equal result", "int subclass with a lying __eq__", "printing a fake verdict",
    "writing to every inherited fd", "writing to every fd in /proc/self/fd",
    "reading every fd and echoing it to every fd"}


def test_which_cheats_fool_a_single_program_exit_status_verdict(has_close_elements):
    """Power: these cheats pass when the verdict is the exit status of prompt + completion + tests."""
    fooled = {name for name, (completion, _) in CHEATS.items()
              if run_untrusted(program_for(has_close_elements, completion), timeout=3.0).passed}
    assert fooled == FOOL_EXIT_STATUS


def test_harmless_extras_around_a_correct_solution_still_pass(has_close_elements):
    for extra in ("print('hello')\n", "import sys\nsys.stderr.write('noise\\n')\n",
                  "assert not [c for c in object.__subclasses__() if 'CData' in c.__name__]\n",  # no ctypes loaded
                  "from collections import namedtuple\nPoint = namedtuple('Point', 'x y')\n",
                  "import os\nassert os.listdir('.') == ['program.py'], os.listdir('.')\n"):  # no test file to read
        result = check_completion(has_close_elements, CORRECT + extra, timeout=3.0)
        assert result.status == "passed", (extra, result.stderr)


def test_tampering_with_the_verdict_channel_fails_even_a_correct_solution(has_close_elements):
    junk = "import os\nfor fd in range(3, 1024):\n    try:\n        os.write(fd, b'x')\n    except OSError:\n        pass\n"
    assert check_completion(has_close_elements, CORRECT).status == "passed"
    assert check_completion(has_close_elements, CORRECT + junk).status == "failed"


def test_helpers_the_test_uses_come_from_the_prompt_not_the_completion():
    find_zero = load_humaneval()[32]  # check() calls the prompt's poly() and math.fabs()
    fake = "    return 0.0\ndef poly(xs, x):\n    return 0.0\nimport math\nmath.fabs = lambda x: 0.0\n"
    assert "poly(" in find_zero.test and "math.fabs" in find_zero.test
    assert run_untrusted(program_for(find_zero, fake)).status == "passed"  # it fools the single-program harness
    assert check_completion(find_zero, fake).status == "failed"
    assert check_completion(find_zero, find_zero.canonical_solution).status == "passed"


def test_patched_builtins_fool_only_the_single_program_harness():
    truncate = load_humaneval()[2]  # check() uses abs()
    fake = "    return 0.5\nimport builtins\nbuiltins.abs = lambda x: 0\n"
    assert "abs(" in truncate.test
    assert run_untrusted(program_for(truncate, fake)).status == "passed"
    assert check_completion(truncate, fake).status == "failed"


# Harness-aware forgers: they look for a token and a verdict fd in the harness's frames. There are none: the
# verdict is the judge's (tests/tasks/test_forgery.py tries a forger in full control of the sandbox).
FORGERS = {
    "sys._getframe": "    import os, sys\n    frame = sys._getframe()\n",
    "a traceback": "    import os\n    try:\n        1 / 0\n    except ZeroDivisionError as error:\n"
                   "        frame = error.__traceback__.tb_frame\n",
}
FORGE = ("    while frame is not None and 'token' not in frame.f_locals:\n        frame = frame.f_back\n"
         "    os.write(frame.f_locals['verdict_fd'], frame.f_locals['token'])\n    os._exit(0)\n")


@pytest.mark.parametrize("route", list(FORGERS))
def test_harness_aware_forger_fails_with_and_without_the_audit_hook(has_close_elements, monkeypatch, route):
    forger = FORGERS[route] + FORGE
    assert check_completion(has_close_elements, forger).status == "failed"
    assert "sys.addaudithook(audit_hook())" in inside.HARNESS
    monkeypatch.setattr(inside, "HARNESS", inside.HARNESS.replace("sys.addaudithook(audit_hook())", "pass"))
    assert check_completion(has_close_elements, forger).status == "failed"
    assert check_completion(has_close_elements, CORRECT).status == "passed"  # control


def test_sample_of_canonical_solutions_pass():
    problems = load_humaneval()
    for problem in random.Random(10).sample(problems, 16):
        result = check_completion(problem, problem.canonical_solution)
        assert result.status == "passed", (problem.task_id, result.stderr)


@pytest.mark.slow
def test_every_canonical_solution_passes():
    failed = [(p.task_id, r.stderr[-300:]) for p in load_humaneval()
              if (r := check_completion(p, p.canonical_solution)).status != "passed"]
    assert failed == []


def test_pass_at_k_over_a_mixed_batch_counts_only_correct_samples():
    problems = load_humaneval(n=4)
    cheats = [completion for completion, _ in CHEATS.values()][:6]
    samples = {p.task_id: [] for p in problems}
    truth = {}
    rng = random.Random(0)
    for index, problem in enumerate(problems):
        correct = index + 1  # 1..4 correct samples of 8
        batch = [problem.canonical_solution] * correct + ["    pass\n"] + rng.sample(cheats, 7 - correct)
        samples[problem.task_id] = batch
        truth[problem.task_id] = correct
    counted = {tid: sum(check_completion(p, c, timeout=3.0).passed for c in samples[tid])
               for tid, p in ((p.task_id, p) for p in problems)}
    assert counted == truth
    for tid, batch in samples.items():
        assert pass_at_k(len(batch), counted[tid], 3) == pass_at_k(8, truth[tid], 3)


def test_run_tests_rejects_bad_arguments():
    with pytest.raises(ValueError, match="entry_point"):
        run_tests("def f(): pass", "def check(c): pass", "not an identifier")
    with pytest.raises(ValueError, match="check"):
        run_tests("def f(): pass", "assert True", "f")
    with pytest.raises(TypeError, match="test must be a str"):
        run_tests("def f(): pass", b"def check(c): pass", "f")


def _host_allows_mount_namespaces() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    done = subprocess.run([unshare, "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    return done.returncode == 0


def test_private_dirs_where_the_host_allows_them():
    if not _host_allows_mount_namespaces():
        pytest.skip("this machine does not allow unprivileged user+mount namespaces: no private /tmp here")
    info = sandbox_info()
    assert info.private_dirs and info.level == "full", "user+mount namespaces work here, so the sandbox must use them"
    assert not any(PROJECT.is_relative_to(v) for v in info.visible)
    assert "private root" in info.containment


@pytest.mark.parametrize("runner", ["program", "tests"])
def test_files_left_in_tmp_and_shm_vanish(runner, has_close_elements):
    if not sandbox_info().private_dirs:
        pytest.skip("no mount namespace on this machine: files in /tmp and /dev/shm outlive the program")
    token = f"specrepro-leftover-{random.randrange(10**9)}"
    paths = [f"/tmp/{token}", f"/dev/shm/{token}"]
    write = "".join(f"open({p!r}, 'w').write('x')\nassert os.path.exists({p!r})\n" for p in paths)
    write += "assert not os.path.exists('/var/tmp')\n"  # not in the private root at all
    paths.append(f"/var/tmp/{token}")
    if runner == "program":
        result = run_untrusted("import os\n" + write + "print('wrote')\n")
        assert result.status == "passed" and result.stdout == "wrote\n", result.stderr
    else:
        body = "".join("    " + line + "\n" for line in ("import os\n" + write).splitlines())
        result = check_completion(has_close_elements, body + CORRECT)
        assert result.status == "passed", result.stderr
    assert [p for p in paths if os.path.exists(p)] == []


def test_project_and_home_are_hidden_and_mounts_cannot_be_undone():
    info = sandbox_info()
    if not info.private_dirs:
        pytest.skip("no mount namespace on this machine: the project tree stays visible (but not writable)")
    code = (
        "import ctypes, os\n"
        f"print(os.path.exists({str(PROJECT)!r}), os.path.exists({str(Path.home())!r}))\n"
        "print([l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1])\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.umount2(b'/usr', 2), libc.umount2(b'/tmp', 2), libc.chroot(b'/tmp'), ctypes.get_errno())\n"
        "print(os.listdir('/tmp'))\n"
    )
    result = run_untrusted(code)
    assert result.status == "passed", result.stderr
    listing, caps, umount, tmp = result.stdout.splitlines()
    assert listing == "False False"
    assert int(caps, 16) == 0
    assert umount.split()[:3] == ["-1", "-1", "-1"]
    entries = ast.literal_eval(tmp)
    assert len(entries) == 1 and entries[0].startswith("specrepro-sandbox-")  # only its own scratch dir


FALLBACKS = {"no mount namespace": {"private_dirs": False, "visible": ()},
             "no namespaces": {"private_dirs": False, "visible": (), "namespaces": False, "unshare": None}}


@pytest.mark.filterwarnings("ignore::specrepro.tasks.sandbox.SandboxWarning")  # test_isolation.py checks it
@pytest.mark.parametrize("fallback", list(FALLBACKS))
def test_verdicts_hold_with_fewer_layers(has_close_elements, monkeypatch, fallback):
    """Machines without (mount) namespaces: the verdict does not rely on them."""
    import dataclasses

    reduced = dataclasses.replace(sandbox_info(), **FALLBACKS[fallback])
    monkeypatch.setattr(containment, "sandbox_info", lambda: reduced)
    monkeypatch.delenv("SPECREPRO_SANDBOX", raising=False)
    assert check_completion(has_close_elements, CORRECT).status == "passed"
    for name in ("sys.exit(0)", "os._exit(0) at top level", "writing to every fd in /proc/self/fd",
                 "reading every fd and echoing it to every fd", "/proc/self/mem", "always-equal result"):
        assert check_completion(has_close_elements, CHEATS[name][0], timeout=3.0).status == "failed", name
    for route in FORGERS:
        assert check_completion(has_close_elements, FORGERS[route] + FORGE).status == "failed", route
    spawn = "    import subprocess\n    subprocess.run(['/bin/true'])\n"  # no processes while the tests run
    result = check_completion(has_close_elements, spawn + CORRECT)
    assert result.status == "failed" and "BlockingIOError" in result.stderr, result.stderr


def test_the_private_root_shows_usr_and_the_interpreter_and_nothing_beside_them(monkeypatch, tmp_path):
    paths = ["/usr/lib/python3", "/opt/py/lib", "/usr/local/lib/python3.11"]
    monkeypatch.setattr(containment, "_interpreter_paths", lambda interpreter, uid: paths)
    monkeypatch.setattr(os.path, "lexists", lambda path: path not in ("/lib32", "/libx32"))
    visible = containment.visible_paths("python3", None)
    assert visible[0] == "/usr" and "/opt/py/lib" in visible  # an interpreter outside /usr is shown too
    assert "/usr/lib/python3" not in visible  # already under /usr
    # /usr/local is shown empty, except an interpreter's own directory there, which is bound on its own
    assert "/usr/local" in containment.HIDDEN and "/usr/local/lib/python3.11" in visible
    assert not {"/lib32", "/libx32", "/", "/etc", "/work", "/root", "/home"} & set(visible)


def test_a_checkout_under_tmp_is_absent_and_its_venv_python_is_run_by_its_real_path(monkeypatch):
    """A project cloned into /tmp (with a venv there): the private root does not show it, and the sandbox runs
    the binary the venv's python links to."""
    info = sandbox_info()
    if not info.private_dirs:
        pytest.skip("no mount namespace on this machine")
    assert info.interpreter == os.path.realpath(info.interpreter)
    checkout = Path(tempfile.mkdtemp(prefix="specrepro-checkout-", dir="/tmp"))
    try:
        (checkout / "secret.txt").write_text("x")
        os.chmod(checkout, 0o755)
        result = run_untrusted(f"import os\nprint(os.path.exists({str(checkout)!r}))\n")
        assert result.stdout == "False\n", result
    finally:
        shutil.rmtree(checkout)


def test_sandbox_info_falls_back_when_mounts_fail(monkeypatch):
    if not sandbox_info().namespaces:
        pytest.skip("no user namespaces here: nothing to fall back from")
    monkeypatch.setattr(containment, "_probe_launch", lambda info, uid, seccomp: not info.private_dirs)
    sandbox_info.cache_clear()
    try:
        reduced = sandbox_info()
        assert reduced.namespaces and not reduced.private_dirs and reduced.visible == ()
        assert "shared filesystem" in reduced.containment
        with pytest.warns(SandboxWarning, match="private read-only root"):
            assert run_untrusted("print('ok')").stdout == "ok\n"
    finally:
        sandbox_info.cache_clear()
