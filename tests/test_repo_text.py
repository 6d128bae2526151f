"""The repository speaks of the project only: no words about how it was built (issue numbers, who ran
what and when) and no directories of the machine a result was made on, in any tracked text file."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# built from pieces so that this file does not match itself
PROCESS = re.compile("|".join([
    r"\bis" + r"sue #?[0-9]+", r"\bthe is" + r"sue\b", r"\bis" + r"sue's\b", r"\bthis " + "session", r"\blater " + "session",
    r"\blent " + r"(gpu|machine)", r"\ba lent" + " ",
]), re.I)
# absolute directories of a build or CI machine (scratch folders, a user's home)
MACHINE_PATH = re.compile(r"(?<![\w.$])/(" + "wo" + r"rk|ro" + r"ot|ho" + r"me)/[\w.-]+|(?<![\w.$])/tm" + r"p/[\w.-]+/")
DATA = (".json", ".jsonl", ".csv", ".log", ".md", ".txt", ".yaml")


def tracked_text_files():
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not names:
        pytest.skip("not a git checkout")
    for name in names:
        path = ROOT / name
        if name.startswith(".ci/") or not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            yield name, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # weights, images


def offenders(pattern, names=None):
    out = []
    for name, text in tracked_text_files():
        if names is not None and not name.endswith(names):
            continue
        out += [f"{name}:{i}: {line.strip()[:100]}" for i, line in enumerate(text.splitlines(), 1)
                if pattern.search(line)]
    return out


def test_no_words_about_how_the_project_was_built():
    assert offenders(PROCESS) == []


def test_result_files_name_no_directories_of_the_machine_they_were_made_on():
    assert offenders(MACHINE_PATH, DATA) == []


def test_the_checks_find_what_they_look_for():
    assert PROCESS.search("as is" + "sue 27 asked") and PROCESS.search("on a le" + "nt GPU")
    assert not PROCESS.search("an issue with the cache")
    scratch = "/" + "work/scratch/rec.jsonl"
    assert MACHINE_PATH.search(f'"results": "{scratch}"') and MACHINE_PATH.search('"out": "/' + 'tmp/run1/x"')
    assert not MACHINE_PATH.search('"cache_file": "$SPECREPRO_HOME/tune/x.json"')
