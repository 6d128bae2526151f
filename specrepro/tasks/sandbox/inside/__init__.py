"""Code that runs inside the sandbox (``harness``, with ``seccomp``) and in the judge process (``judge``),
both speaking ``codec``. They are real modules, read here as text and launched with ``python -c``: the
sandbox's private root shows no project files, and the judge imports nothing of the project."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def source(*names: str) -> str:
    """The texts of these modules, in order, as one program."""
    return "\n".join((HERE / f"{name}.py").read_text(encoding="utf-8") for name in names)


HARNESS = source("codec", "seccomp", "harness")
JUDGE = source("codec", "judge")

# The harness runs in a dict of its own: nothing of it is left in __main__ for the program to find. Its
# builtins are a copy, so a program that patches the builtins module does not reach the harness's.
BOOT = ('import sys; exec(compile(sys.argv[1], "<sandbox>", "exec"), {"__name__": "__sandbox__", '
        '"__builtins__": dict(vars(__builtins__)), "BOOT": sys.orig_argv[sys.orig_argv.index("-c") + 1], '
        '"HARNESS": sys.argv.pop(1)})')
