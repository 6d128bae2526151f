"""The routes that once turned a wrong HumanEval answer into ``passed``, each as a test that must fail.

The verdict now comes from a judge process that runs the test's ``check`` and calls the candidate in the
sandbox through a pipe carrying builtin data only: there is no token, no test and no test module in the
sandboxed interpreter. Each route is tried twice: against the real harness (must be ``failed``) and, where it
shows the attack is real, against the single-program reference harness (prompt + completion + test in one
interpreter, judged by its exit status), where it passes. Every route has a control: a right answer passes.
"""

from __future__ import annotations

import os

import pytest

from specrepro.tasks.sandbox import inside, process
from specrepro.tasks.humaneval import check_completion, load_humaneval, program_for
from specrepro.tasks.sandbox import run_untrusted

CORRECT_0 = "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
NO_HOOK = "    sys.addaudithook(audit_hook())\n"


@pytest.fixture(scope="module")
def problems():
    return {int(p.task_id.split("/")[1]): p for p in load_humaneval()}


@pytest.fixture
def without_audit_hook(monkeypatch):
    """The harness with no audit hook at all: an adversary in full control of the sandboxed interpreter."""
    assert NO_HOOK in inside.HARNESS
    monkeypatch.setattr(inside, "HARNESS", inside.HARNESS.replace(NO_HOOK, "    pass\n"))


# ---- route 1: bytecode that did not come from compiling source ------------------------------------------

# Takes over the judge's channel from the harness's frame and answers every call itself, then exits.
# ANSWER is the value it sends: a wrong one (always True) or, as the control, the right one.
PROTOCOL_FORGER = """
import os, sys
def _forge():
    frame = sys._getframe(2)          # the harness's serve() frame, two up from this function
    spec, g = frame.f_locals["spec"], frame.f_globals
    while (message := g["recv_frame"](spec["requests_fd"], 1 << 20)) is not None:
        args = g["decode_value"](message["args"])
        g["send_frame"](spec["answers_fd"], {"value": g["encode_value"](ANSWER(*args))})
    os._exit(0)
"""
MARSHALLED = """
import marshal
_code = marshal.loads(marshal.dumps(compile(_FORGER, "<forged>", "exec")))
exec(_code)
_forge()
"""


def _forger(answer: str, via_marshal: bool) -> str:
    body = "    return True\n"
    run = (f"_FORGER = {PROTOCOL_FORGER!r}\n" + MARSHALLED) if via_marshal else (PROTOCOL_FORGER + "_forge()\n")
    return body + f"ANSWER = {answer}\n" + run


@pytest.mark.parametrize("via_marshal", [False, True], ids=["plain", "marshal"])
def test_full_control_of_the_sandbox_cannot_forge_a_wrong_answer(problems, without_audit_hook, via_marshal):
    """With no audit hook, a program that owns the channel still fails with wrong values: the verdict is
    the judge's comparison, and nothing in the sandbox knows the expected answers."""
    wrong = check_completion(problems[0], _forger("lambda numbers, threshold: True", via_marshal))
    assert wrong.status == "failed", wrong
    # control: the same forger sending the right values passes, so it really does speak for the candidate
    right = _forger("lambda numbers, threshold: any(abs(a - b) < threshold for i, a in enumerate(numbers) "
                    "for b in numbers[i + 1:])", via_marshal)
    assert check_completion(problems[0], right).status == "passed"


CODE_ROUTES = {
    "marshal.loads": "import marshal\nmarshal.loads(marshal.dumps(compile('1', 'x', 'eval')))\n",
    "code.replace": "def _f():\n    pass\n_f.__code__.replace(co_name='g')\n",
    "types.CodeType": ("import types\nc = (lambda: 0).__code__\ntypes.CodeType(*[getattr(c, 'co_' + n) for n in "
                       "('argcount posonlyargcount kwonlyargcount nlocals stacksize flags code consts names varnames '"
                       "'filename name qualname firstlineno linetable exceptiontable freevars cellvars').split()])\n"),
    "types.FunctionType": "import types\ntypes.FunctionType(compile('1', 'x', 'eval'), {})\n",
    "a .pyc without source": ("import importlib.util, marshal, sys\n"
                              "data = importlib._bootstrap_external._code_to_timestamp_pyc("
                              "compile('x = 1', 'm.py', 'exec'))\nopen('forged_mod.pyc', 'wb').write(data)\n"
                              "sys.path.insert(0, '.')\nimport forged_mod\n"),
}


@pytest.mark.parametrize("route", list(CODE_ROUTES))
def test_code_not_compiled_from_source_is_refused(problems, route):
    result = check_completion(problems[0], CORRECT_0 + CODE_ROUTES[route])
    assert result.status == "failed" and "disabled in this sandbox" in result.stderr, result


def test_control_imports_after_the_harness_compile_from_source(problems):
    """A stdlib module the harness did not preload still imports (from source: no .pyc is read)."""
    code = CORRECT_0 + "import textwrap, csv, fnmatch\nassert textwrap.dedent('  a') == 'a'\n"
    result = check_completion(problems[0], code)
    assert result.status == "passed", result.stderr


# ---- route 2: state the test shares with the program (random) -----------------------------------------

CLASS_PATCH = "import random\nrandom.Random._randbelow = lambda self, n: 0\n"  # every Random draws its lowest
HIDDEN_PATCH = "import random\nrandom._inst._randbelow = lambda n: 0\n"  # the module functions' instance
WRONG = {32: "    return -1.0\n",  # a root only of the polynomial the patched draws build: -10 - 10x
         38: "    return s\n",  # identity: right only when every letter is the same
         50: "    return 'a' * len(s)\n",
         53: "    return (x + y) % 64\n"}  # right on the fixed asserts, wrong on large random pairs
RANDOM_CHEATS = [(32, CLASS_PATCH), (38, CLASS_PATCH), (38, HIDDEN_PATCH), (50, HIDDEN_PATCH), (53, CLASS_PATCH),
                 (53, HIDDEN_PATCH)]


@pytest.mark.parametrize("task, patch", RANDOM_CHEATS,
                         ids=[f"{t}-{'class' if p == CLASS_PATCH else 'instance'}" for t, p in RANDOM_CHEATS])
def test_patching_random_does_not_reach_the_test(problems, task, patch):
    problem = problems[task]
    cheat = WRONG[task] + patch
    # power: where the test shares the interpreter (the reference harness), the patch makes it pass
    assert run_untrusted(program_for(problem, cheat), timeout=10).status == "passed"
    assert check_completion(problem, cheat, timeout=10).status == "failed"
    # control: the right answer passes, with the patch too (the test's random is not the program's)
    assert check_completion(problem, problem.canonical_solution + patch, timeout=10).status == "passed"


# ---- route 3: an extension module loaded under another dotted name -------------------------------------

RENAMED_CTYPES = ("import importlib.machinery, importlib.util\n"
                  "path = importlib.machinery.PathFinder.find_spec('_ctypes').origin\n"
                  "spec = importlib.util.spec_from_file_location({name!r}, path)\n"
                  "importlib.util.module_from_spec(spec)\n")


@pytest.mark.parametrize("name", ["something._ctypes", "_ctypes_elsewhere", "a.b.c"])
def test_ctypes_under_another_name_is_refused(problems, name):
    result = check_completion(problems[0], CORRECT_0 + RENAMED_CTYPES.format(name=name))
    assert result.status == "failed" and "disabled in this sandbox" in result.stderr, result


def test_control_other_extension_modules_still_load(problems):
    code = CORRECT_0 + ("import importlib, sys\nimportlib.import_module('_bisect')\nimport _json, array\n"
                        "open('ctypes_notes.py', 'w').write('x = 1')\nsys.path.insert(0, '.')\nimport ctypes_notes\n")
    assert check_completion(problems[0], code).status == "passed"


def test_raw_memory_reads_forge_nothing(problems, without_audit_hook):
    """With ctypes loaded (no hook), reading the whole address space finds no answer to send."""
    scan = "import ctypes\nctypes.string_at(id(ctypes), 4096)\n"
    assert check_completion(problems[0], "    return True\n" + scan).status == "failed"
    assert check_completion(problems[0], CORRECT_0 + scan).status == "passed"


# ---- the verdict channel itself ---------------------------------------------------------------------------

def test_nothing_of_the_test_reaches_the_sandbox(problems):
    """What the program can read of its argv, environment and files holds neither the test nor its answers."""
    probe = ("import os, sys\n"
             "seen = ' '.join(sys.argv) + repr(dict(os.environ))\n"
             "for root, dirs, files in os.walk('/tmp'):\n"
             "    for f in files:\n"
             "        seen += open(os.path.join(root, f), errors='replace').read()\n"
             # the needles are built, so that the probe's own source does not hold them
             "print('def ' + 'check' in seen, 'assert ' + 'candidate' in seen, flush=True)\n")
    result = check_completion(problems[0], CORRECT_0 + probe)
    assert result.status == "passed" and result.stdout == "False False\n", result
    # power: the same probe sees the test when it is part of the program (the reference harness)
    assert run_untrusted(program_for(problems[0], CORRECT_0) + probe).stdout == "True True\n"


def _judge_mem_owner(source: str) -> tuple[int, int]:
    """Start the judge's code (stopped before it reads its spec); the uid it runs as, and the owner of its
    /proc/<pid>/mem. As root, it runs as a fresh uid, so that the two differ exactly when it is non-dumpable."""
    import subprocess

    uid = process.fresh_uid() if os.geteuid() == 0 else os.getuid()
    ready = source.replace("spec = json.loads(sys.stdin.read())",
                           "print('ready', flush=True); sys.stdin.read(); return")
    judge = subprocess.Popen(["/usr/bin/env", "python3", "-I", "-c", ready], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd="/",
                             preexec_fn=(lambda: process.drop_to(uid)) if os.geteuid() == 0 else None)
    try:
        assert judge.stdout.readline() == "ready\n"
        return uid, os.stat(f"/proc/{judge.pid}/mem").st_uid
    finally:
        judge.kill()
        judge.wait()


def test_the_judge_cannot_be_read_or_traced():
    """The judge makes itself non-dumpable, so a program that shares its uid (the fallback without namespaces
    or a uid of its own) can neither ptrace it nor open /proc/<judge>/mem: the kernel then shows those files
    as root's and lets only CAP_SYS_PTRACE past."""
    JUDGE = inside.JUDGE
    assert "    undumpable()\n" in JUDGE
    uid, owner = _judge_mem_owner(JUDGE)
    assert uid != 0 and owner == 0
    uid, owner = _judge_mem_owner(JUDGE.replace("    undumpable()\n", "    pass\n"))  # power: without it
    assert owner == uid
