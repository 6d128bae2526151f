"""Run the reproduction notebooks in order with papermill.

    python -m specrepro.reproduce --profile cpu [--only NAME ...] [--figures-only] [--force] [--sync]
                                  [--output-root DIR] [--set NAME=VALUE ...]

Notebooks are jupytext percent files `notebooks/NN_name.py`; each run converts them to `.ipynb` (git-ignored)
and executes them with the parameters of `notebooks/params/<profile>.yaml` (one mapping per notebook name)
plus the profile's output folders. Executed notebooks go to `runs/<profile>/`. A notebook that finished with
the same parameters is skipped unless --force; inside a notebook, finished items are skipped via its results
files, so a rerun after a kill resumes where it stopped. --output-root DIR sends everything a run writes
(figures, results, executed notebooks) under DIR instead of the repository; --set overrides one parameter of
every selected notebook (checked like the params file: a name the notebook does not define is an error).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import yaml

from .experiments import PROFILES, check_params, repo_root
from .results import atomic_write_text, write_json

ROOT = repo_root()
NOTEBOOK_DIR = ROOT / "notebooks"
PARAMS_DIR = NOTEBOOK_DIR / "params"
KERNEL_NAME = "specrepro"
CELL_TIMEOUT = {"smoke": 600, "cpu": 3600, "gpu": 3600}  # seconds per cell before papermill gives up


def notebook_names() -> list[str]:
    return sorted(p.stem for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.py"))


def output_dirs(profile: str) -> dict:
    """cpu writes the committed figures/; smoke and gpu write figures/<profile>/ so they never clobber them."""
    return {"out_dir": "figures" if profile == "cpu" else f"figures/{profile}",
            "results_dir": f"runs/{profile}/results"}


def parse_overrides(pairs) -> dict:
    """["n_samples=40", "chunk=10"] -> {"n_samples": 40, "chunk": 10}; values are read as YAML."""
    out = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"--set expects NAME=VALUE, got {pair!r}")
        out[name.strip()] = yaml.safe_load(value)
    return out


def load_profile(profile: str, params_dir: Path | None = None) -> dict[str, dict]:
    """{notebook: parameters} for a profile; a clear error for an unknown profile or notebook name."""
    params_dir = params_dir or PARAMS_DIR
    path = Path(params_dir) / f"{profile}.yaml"
    if profile not in PROFILES or not path.is_file():
        known = sorted(p.stem for p in Path(params_dir).glob("*.yaml"))
        raise SystemExit(f"unknown profile {profile!r}: expected one of {known} (files in {params_dir})")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: expected a mapping of notebook name -> parameters")
    unknown = sorted(set(data) - set(notebook_names()))
    if unknown:
        raise SystemExit(f"{path}: unknown notebook name(s) {unknown}; notebooks are {notebook_names()}")
    return {name: dict(data.get(name) or {}) for name in notebook_names()}


def sync_notebooks(names=None) -> list[Path]:
    """Write notebooks/NAME.ipynb from notebooks/NAME.py (jupytext), when missing or older."""
    import jupytext

    out = []
    for name in names or notebook_names():
        src, dst = NOTEBOOK_DIR / f"{name}.py", NOTEBOOK_DIR / f"{name}.ipynb"
        if not dst.exists() or dst.stat().st_mtime < src.stat().st_mtime:
            nb = jupytext.read(src)
            nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
            atomic_write_text(dst, jupytext.writes(nb, fmt="ipynb"))
        out.append(dst)
    return out


def notebook_parameters(ipynb: Path) -> set[str]:
    import papermill

    return set(papermill.inspect_notebook(str(ipynb)))


def install_kernel() -> None:
    """A kernelspec for *this* Python under runs/jupyter, found through JUPYTER_PATH."""
    kernel_dir = ROOT / "runs" / "jupyter" / "kernels" / KERNEL_NAME
    kernel_dir.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "specrepro (this venv)", "language": "python"}
    # atomic: a second run starting at the same moment must never read a half-written kernel.json
    atomic_write_text(kernel_dir / "kernel.json", json.dumps(spec, indent=1))
    paths = [str(ROOT / "runs" / "jupyter")] + [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    os.environ["JUPYTER_PATH"] = os.pathsep.join(dict.fromkeys(paths))
    # the kernel imports this checkout's specrepro, and draws figures without a display
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    os.environ.setdefault("MPLBACKEND", "agg")


def plan(profile: str, only=None, overrides=None, output_root=None) -> list[tuple[str, dict]]:
    """[(notebook, parameters)] to run, every parameter checked against the notebook's parameters cell.

    overrides: parameters set for every selected notebook (after the params file); output_root: a folder
    that replaces the profile's output folders (its figures/ and results/).
    """
    per_notebook = load_profile(profile)
    names = notebook_names()
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise SystemExit(f"--only: unknown notebook(s) {unknown}; notebooks are {names}")
        names = [n for n in names if n in only]
    sync_notebooks(names)
    jobs = []
    for name in names:
        dirs = output_dirs(profile)
        if output_root is not None:
            root = Path(output_root).resolve()
            dirs = {"out_dir": str(root / "figures"), "results_dir": str(root / "results")}
        params = {"profile": profile, **dirs, **per_notebook[name], **(overrides or {})}
        try:
            check_params(params, notebook_parameters(NOTEBOOK_DIR / f"{name}.ipynb"))
        except ValueError as err:
            where = "--set" if set(overrides or {}) - set(per_notebook[name]) else f"notebooks/params/{profile}.yaml"
            raise SystemExit(f"{where}, notebook {name}: {err}") from None
        # results are keyed by the settings: a changed parameter (dtype, K, a draft...) never resumes from
        # items made under the old ones, while an interrupted run with the same settings does
        settings = {k: v for k, v in params.items() if k not in ("results_dir", "out_dir")}
        key = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]
        params["results_dir"] = str(Path(params["results_dir"]) / f"{name}-{key}")
        jobs.append((name, params))
    return jobs


def run(profile: str, only=None, force: bool = False, cell_timeout: int | None = None, overrides=None,
        output_root=None) -> list[Path]:
    import papermill

    jobs = plan(profile, only, overrides, output_root)
    install_kernel()
    run_dir = Path(output_root).resolve() if output_root is not None else ROOT / "runs" / profile
    run_dir.mkdir(parents=True, exist_ok=True)
    outputs = []
    for name, params in jobs:
        done = run_dir / f"{name}.done.json"
        digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()
                                + (NOTEBOOK_DIR / f"{name}.py").read_bytes()).hexdigest()
        if not force and done.exists() and json.loads(done.read_text()).get("digest") == digest:
            print(f"[reproduce] {name}: finished earlier with these parameters, skipped (--force reruns it)")
            continue
        output = run_dir / f"{name}.ipynb"
        print(f"[reproduce] {name} ({profile}) -> {output}", flush=True)
        start = time.time()
        try:
            papermill.execute_notebook(
                str(NOTEBOOK_DIR / f"{name}.ipynb"), str(output), parameters=params, kernel_name=KERNEL_NAME,
                cwd=str(ROOT), execution_timeout=cell_timeout or CELL_TIMEOUT[profile], progress_bar=False,
                log_output=False,
            )
        except papermill.PapermillExecutionError as err:
            raise SystemExit(f"[reproduce] {name} failed in cell {err.exec_count}: {err.ename}: {err.evalue}\n"
                             f"see {output}; rerun to resume (finished items are kept)") from None
        except TimeoutError as err:
            raise SystemExit(f"[reproduce] {name}: a cell ran longer than {cell_timeout or CELL_TIMEOUT[profile]} s "
                             f"({err}); raise --cell-timeout or shrink notebooks/params/{profile}.yaml") from None
        write_json(done, {"digest": digest, "seconds": time.time() - start, "params": params})
        print(f"[reproduce] {name}: {time.time() - start:.0f} s", flush=True)
        outputs.append(output)
    return outputs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=os.environ.get("PROFILE", "cpu"), help=f"one of {PROFILES} (default cpu)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these notebooks, e.g. 01_losslessness")
    ap.add_argument("--figures-only", action="store_true", help="redraw figures from the saved numbers, run nothing")
    ap.add_argument("--force", action="store_true", help="rerun notebooks that already finished")
    ap.add_argument("--sync", action="store_true", help="only write notebooks/*.ipynb from the jupytext .py files")
    ap.add_argument("--cell-timeout", type=int, help="seconds a cell may run (default by profile)")
    ap.add_argument("--output-root", metavar="DIR", help="write figures, results and executed notebooks under DIR")
    ap.add_argument("--set", action="append", metavar="NAME=VALUE", dest="overrides",
                    help="override a notebook parameter (YAML value), e.g. --set n_samples=40; repeatable")
    args = ap.parse_args(argv)
    if args.sync:
        for p in sync_notebooks():
            print(p.relative_to(ROOT))
        return
    if args.figures_only:
        from .plots import replot

        load_profile(args.profile)
        figures = Path(args.output_root) / "figures" if args.output_root else ROOT / output_dirs(args.profile)["out_dir"]
        for p in replot(figures):
            print(p)
        return
    run(args.profile, args.only, args.force, args.cell_timeout, parse_overrides(args.overrides), args.output_root)


if __name__ == "__main__":
    main()
