"""Run the reproduction notebooks in order with papermill.

    specrepro-reproduce --profile cpu [--only NAME ...] [--figures-only] [--force] [--sync]
                                  [--output-root DIR] [--set NAME=VALUE ...]

Notebooks are jupytext percent files `notebooks/NN_name.py`; each run converts them to `runs/notebooks/*.ipynb`
(git-ignored, outside notebooks/ so that JupyterLab lists each notebook once) and executes them with the parameters of `notebooks/params/<profile>.yaml` (one mapping per notebook name)
plus the profile's output folders. Executed notebooks go to `runs/<profile>/`. A notebook that finished with
the same parameters is skipped unless --force; inside a notebook, finished items are skipped via its results
files, so a rerun after a kill resumes where it stopped. Items are keyed by the parameters and by a hash of
the package's sources (`results.code_digest`): after a change to specrepro/ nothing old is reused; a
notebook that names a trained draft kind is keyed by that kind's artifacts too (`drafts.artifacts.
artifacts_digest`), so a retrained or newly shipped draft recomputes it; and --force deletes the notebook's items too. --output-root DIR sends everything a run writes
(figures, results, executed notebooks) under DIR instead of the repository; --set overrides one parameter of
every selected notebook (checked like the params file: a name the notebook does not define is an error).

Across machines: `--shard I/N` runs share I of N of every notebook's items (see specrepro.experiments.results) into
runs/<profile>/shards/I-of-N/ (or DIR/shards/I-of-N/ with --output-root DIR); once all N have finished, and
their folders sit side by side, `--merge` combines their items and runs the notebooks once more, which then
only summarise: the same CSV/JSON and figures a single run writes.

A params file may start with `_base: <profile>`: it then holds only its differences from that profile.

A run that rewrites the committed figures/ (the cpu profile, `make reproduce`) ends by rendering the result
blocks of README.md and docs/results.md from them (specrepro.experiments.summary), so that `make test`, which
checks those blocks against figures/, passes after it; --render FILE ... chooses other files (none with no
file named). The prose around the blocks is the author's: reread it after a run whose numbers moved.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import yaml

from .records import PROFILES, check_params, repo_root
from .records import notebook_defaults, results_folder
from ..files import atomic_write_text, write_json
from .results import SHARD_ENV, ResultsFile, parse_shard

ROOT = repo_root()
NOTEBOOK_DIR = ROOT / "notebooks"
PARAMS_DIR = NOTEBOOK_DIR / "params"
SYNC_DIR = ROOT / "runs" / "notebooks"  # the generated .ipynb (papermill's input, nbval's files)
KERNEL_NAME = "specrepro"
KERNEL_DISPLAY_NAME = "Python (specrepro)"
CELL_TIMEOUT = {"smoke": 600, "cpu": 3600, "gpu": 3600}  # seconds per cell before papermill gives up (others: 3600)


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
    params_dir = Path(params_dir or PARAMS_DIR)
    path = params_dir / f"{profile}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in params_dir.glob("*.yaml"))
        raise SystemExit(f"unknown profile {profile!r}: expected one of {known} (files in {params_dir})")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: expected a mapping of notebook name -> parameters")
    base = data.pop("_base", None)
    unknown = sorted(set(data) - set(notebook_names()))
    if unknown:
        raise SystemExit(f"{path}: unknown notebook name(s) {unknown}; notebooks are {notebook_names()}")
    inherited = load_profile(base, params_dir) if base else {}
    return {name: {**inherited.get(name, {}), **dict(data.get(name) or {})} for name in notebook_names()}


def notebook_profile(profile: str, params_dir: Path | None = None) -> str:
    """The `profile` the notebooks are given: a derived profile's base when experiments does not know it."""
    if profile in PROFILES:
        return profile
    data = yaml.safe_load((Path(params_dir or PARAMS_DIR) / f"{profile}.yaml").read_text()) or {}
    if not data.get("_base"):
        raise SystemExit(f"profile {profile!r} is not one of {PROFILES} and names no _base profile")
    return notebook_profile(data["_base"], params_dir)


def sync_notebooks(names=None, dest: Path | None = None) -> list[Path]:
    """Write runs/notebooks/NAME.ipynb from notebooks/NAME.py (jupytext), when missing or older.

    The copies carry no jupytext pairing metadata (nothing pairs them back to the .py) and live outside
    notebooks/, so JupyterLab lists each notebook once: there the .py itself opens as a notebook.
    """
    import jupytext

    dest = Path(dest or SYNC_DIR)
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names or notebook_names():
        src, dst = NOTEBOOK_DIR / f"{name}.py", dest / f"{name}.ipynb"
        if not dst.exists() or dst.stat().st_mtime < src.stat().st_mtime:
            nb = jupytext.read(src)
            nb.metadata.pop("jupytext", None)
            nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": KERNEL_DISPLAY_NAME,
                                         "language": "python"}
            atomic_write_text(dst, jupytext.writes(nb, fmt="ipynb"))
        out.append(dst)
    return out


def notebook_parameters(name: str) -> set[str]:
    """The names the notebook's parameters cell defines (what papermill would inspect)."""
    return set(notebook_defaults(name, NOTEBOOK_DIR))


def install_kernel(scripted: bool = True) -> None:
    """A kernelspec for *this* Python under runs/jupyter, found through JUPYTER_PATH (the notebooks name it).

    scripted: the kernels draw figures without a display (MPLBACKEND=agg, unless set); JupyterLab's kernels
    keep matplotlib's own (inline) backend, so a user's plt.show() shows the figure.
    """
    kernel_dir = ROOT / "runs" / "jupyter" / "kernels" / KERNEL_NAME
    kernel_dir.mkdir(parents=True, exist_ok=True)
    # the kernel logs errors only: its start-up warning about TCP without encryption concerns a kernel that
    # listens on the loopback interface of this machine, and gives a user nothing to act on
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                     "--IPKernelApp.log_level=ERROR"],
            "display_name": KERNEL_DISPLAY_NAME, "language": "python"}
    # atomic: a second run starting at the same moment must never read a half-written kernel.json
    atomic_write_text(kernel_dir / "kernel.json", json.dumps(spec, indent=1))
    paths = [str(ROOT / "runs" / "jupyter")] + [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    os.environ["JUPYTER_PATH"] = os.pathsep.join(dict.fromkeys(paths))
    # the kernel imports this checkout's specrepro, and draws figures without a display
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    if scripted:
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
        params = {"profile": notebook_profile(profile), **dirs, **per_notebook[name], **(overrides or {})}
        try:
            check_params(params, notebook_parameters(name))
        except ValueError as err:
            where = "--set" if set(overrides or {}) - set(per_notebook[name]) else f"notebooks/params/{profile}.yaml"
            raise SystemExit(f"{where}, notebook {name}: {err}") from None
        # results are keyed by the effective settings (the notebook's defaults with these parameters over
        # them), the code and the trained drafts it names: the rule the notebook itself applies
        # (records.results_folder), so nbval, papermill and JupyterLab runs share it
        params["results_dir"] = results_folder(name, {**notebook_defaults(name, NOTEBOOK_DIR), **params},
                                               NOTEBOOK_DIR)
        jobs.append((name, params))
    return jobs


def shard_root(profile: str, shard: tuple[int, int], output_root=None) -> Path:
    base = Path(output_root).resolve() if output_root is not None else ROOT / "runs" / profile
    return base / "shards" / f"{shard[0]}-of-{shard[1]}"


# the files whose summary blocks render the committed figures (specrepro.experiments.summary)
DOCS = ("README.md", "docs/results.md")


def docs_to_render(profile: str, output_root=None, shard=None) -> list[Path]:
    """The docs a run renders when it ends: README.md and docs/results.md where the run rewrote the committed
    figures/ (the cpu profile, no --output-root, not one shard of several); none otherwise."""
    if profile == "cpu" and output_root is None and shard is None:
        return [ROOT / d for d in DOCS]
    return []


def render_docs(figures: Path, docs) -> list[Path]:
    """Rewrite the summary blocks of `docs` from `figures`, saying what it did (a missing figure file is said,
    not raised: the notebooks' own outputs are written by then)."""
    from . import summary

    if not docs:
        return []
    shown = ", ".join(str(Path(d).relative_to(ROOT)) if Path(d).resolve().is_relative_to(ROOT) else str(d) for d in docs)
    try:
        changed = summary.write_blocks(docs, figures)
    except FileNotFoundError as err:
        print(f"[reproduce] {shown}: not rendered: {err}", flush=True)
        return []
    print(f"[reproduce] {shown}: result blocks rendered from {figures} ({len(changed)} changed; the same as "
          f"`python -m specrepro.experiments.summary --figures {figures} --write {' '.join(map(str, docs))}`)",
          flush=True)
    return changed


def run(profile: str, only=None, force: bool = False, cell_timeout: int | None = None, overrides=None,
        output_root=None, shard: tuple[int, int] | None = None, rerun: bool = False, render=None) -> list[Path]:
    """Run the notebooks. force: delete their items and rerun; rerun: rerun finished notebooks, keeping items
    (what --merge needs); shard (i, n): only share i of n of the items, under shard_root(). render: the docs
    whose summary blocks are rendered from the run's figures at the end (None: docs_to_render's choice)."""
    if render is None:
        render = docs_to_render(profile, output_root, shard)
    import logging

    import papermill

    # papermill's line-by-line reader of the parameters cell warns on every continuation line of a value that
    # spans lines (notebook 01's settings list); the parameters are injected as a cell and read correctly
    logging.getLogger("papermill.translators").setLevel(logging.ERROR)
    if shard is not None:
        output_root = shard_root(profile, shard, output_root)
    jobs = plan(profile, only, overrides, output_root)
    install_kernel()
    run_dir = Path(output_root).resolve() if output_root is not None else ROOT / "runs" / profile
    run_dir.mkdir(parents=True, exist_ok=True)
    timeout = cell_timeout or CELL_TIMEOUT.get(profile, 3600)
    previous = os.environ.pop(SHARD_ENV, None)
    if shard is not None:
        os.environ[SHARD_ENV] = f"{shard[0]}/{shard[1]}"  # the kernels inherit it; ResultsFile reads it
    reference, pass_ratio, took = reference_run(profile), None, {}
    if reference[0] and reference[1] and jobs:
        pass_ratio = pass_ratio_here(reference[1])
    try:
        outputs = []
        started = time.time()
        for index, (name, params) in enumerate(jobs):
            done = run_dir / f"{name}.done.json"
            digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()
                                    + (NOTEBOOK_DIR / f"{name}.py").read_bytes()).hexdigest()
            if not (force or rerun) and done.exists() and json.loads(done.read_text()).get("digest") == digest:
                print(f"[reproduce] {name}: finished earlier with these parameters, skipped (--force reruns it)")
                continue
            if force:  # recompute the items too, not only the summaries
                shutil.rmtree(params["results_dir"] if Path(params["results_dir"]).is_absolute()
                              else ROOT / params["results_dir"], ignore_errors=True)
            output = run_dir / f"{name}.ipynb"
            where = f", shard {shard[0]}/{shard[1]}" if shard else ""
            left = remaining_minutes(profile, [n for n, _ in jobs[index:]], took, pass_ratio, reference[0])
            shown = output.relative_to(ROOT) if output.is_relative_to(ROOT) else output
            print(f"[reproduce] {index + 1}/{len(jobs)} {name} ({profile}{where}) -> {shown}; "
                  f"{(time.time() - started) / 60:.1f} min so far" + (f", about {left:.0f} min left" if left else ""),
                  flush=True)
            start = time.time()
            try:
                # a bar per cell (cell i/N, elapsed, papermill's estimate) where a person watches a terminal
                papermill.execute_notebook(
                    str(SYNC_DIR / f"{name}.ipynb"), str(output), parameters=params, kernel_name=KERNEL_NAME,
                    cwd=str(ROOT), execution_timeout=timeout, progress_bar=sys.stderr.isatty(), log_output=False,
                )
            except papermill.PapermillExecutionError as err:
                if not (shard is not None and err.ename == "ShardComplete"):
                    raise SystemExit(f"[reproduce] {name} failed in cell {err.exec_count}: {err.ename}: {err.evalue}\n"
                                     f"see {output}; rerun to resume (finished items are kept)") from None
                print(f"[reproduce] {name}: this shard's items are done; its summary comes with --merge")
            except TimeoutError as err:
                raise SystemExit(f"[reproduce] {name}: a cell ran longer than {timeout} s ({err}); raise "
                                 f"--cell-timeout or shrink notebooks/params/{profile}.yaml") from None
            write_json(done, {"digest": digest, "seconds": time.time() - start, "params": params,
                              "shard": list(shard) if shard else None})
            took[name] = time.time() - start
            print(f"[reproduce] {name}: {time.time() - start:.0f} s", flush=True)
            outputs.append(output)
        out_dir = Path(output_root).resolve() / "figures" if output_root is not None else ROOT / output_dirs(profile)["out_dir"]
        render_docs(out_dir, render)
        return outputs
    finally:
        os.environ.pop(SHARD_ENV, None)
        if previous is not None:
            os.environ[SHARD_ENV] = previous


# minutes each notebook took in the run behind the committed cpu figures (commit f217b02's fresh-clone run on
# the 2-core AVX512-BF16 EPYC: 01-03 from the started times of consecutive notebooks in figures/*.json, 00 and 04
# from that run's log); a figure that records its own start and finish (the run record) replaces its entry
MINUTES = {"cpu": {"00_train_drafts": 0.1, "01_losslessness": 3.3, "02_lookahead_sweep": 3.3, "03_table1": 12.3,
                   "04_drafts": 7.4}}
# the figure each notebook writes, whose record gives its minutes and the tuned one-token pass of that run
FIGURES = {"01_losslessness": "losslessness.json", "02_lookahead_sweep": "lookahead_sweep.json",
           "03_table1": "table1.json", "04_drafts": "drafts.json"}


def reference_run(profile: str, figures=None) -> tuple[dict[str, float], float | None]:
    """(minutes per notebook, one-token pass in ms) of the run behind the committed figures of `profile` (cpu
    only: the other profiles' outputs are not committed): a figure's own record where it has one (started ..
    finished; its tuned setting's one-token pass), MINUTES elsewhere."""
    from . import summary

    minutes = dict(MINUTES.get(profile, {}))
    passes = []
    for name, file in FIGURES.items() if minutes else ():
        try:
            meta = json.loads(((Path(figures) if figures else ROOT / "figures") / file).read_text())["meta"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        took = summary.minutes(meta)
        if took is not None:  # None: a figure written before the run record, without a finish time
            minutes[name] = took
        one = (meta.get("tune") or {}).get("one_token_ms") if isinstance(meta.get("tune"), dict) else None
        if one:
            passes.append(float(one))
    return minutes, (sorted(passes)[len(passes) // 2] if passes else None)


def one_token_ms(model, reps: int = 20, prefix: int = 100) -> float:
    """This machine's one-token pass of `model` (median ms after a `prefix`-token context) in the setting tune
    picks on most CPUs, the native bfloat16 pass, or the lean bfloat16 runner where that cannot be built."""
    import torch

    from ..engines import native
    from ..engines.lean import LeanRunner

    backend = "native" if native.unavailable_reason(torch.bfloat16, "cpu") is None else "eager"
    runner = LeanRunner(model, dtype=torch.bfloat16, backend=backend)
    ids = torch.arange(prefix + 1) % min(1000, runner.vocab_size)
    runner.forward(ids[:prefix])
    times = []
    for _ in range(reps):
        runner.rollback(prefix)
        start = time.perf_counter()
        runner.forward(ids[prefix:])
        times.append(time.perf_counter() - start)
    return sorted(times)[reps // 2] * 1000


def pass_ratio_here(reference_ms: float) -> float | None:
    """This machine's one-token pass of the offline target / the reference run's, printed; None (and the
    reference run's times as they are) where the target cannot be loaded here."""
    import gc

    from ..models import load_model

    try:
        model, _ = load_model("smollm2-135m-instruct")  # converted once; the notebooks reuse the cached copy
        here = one_token_ms(model)
    except Exception as err:  # noqa: BLE001 - an estimate is never worth failing a run for
        print(f"[reproduce] no pass time measured here ({type(err).__name__}: {err}); estimates are the reference "
              "run's times")
        return None
    del model
    gc.collect()
    print(f"[reproduce] one-token pass here {here:.1f} ms, {reference_ms:.1f} ms in the run behind the committed "
          f"figures: time estimates x{here / reference_ms:.2f} until a notebook has finished", flush=True)
    return here / reference_ms


def remaining_minutes(profile: str, names, took: dict[str, float] | None = None, pass_ratio: float | None = None,
                      reference: dict[str, float] | None = None) -> float | None:
    """About how long the notebooks `names` take here: the reference run's minutes (reference_run) scaled to
    this machine, by this run's finished notebooks against theirs (`took`: seconds per notebook, counted where
    the reference took a minute or more) or, before any has finished, by the ratio of this machine's
    one-token pass to the reference run's (`pass_ratio`). None for a profile without a reference run."""
    table = reference if reference is not None else reference_run(profile)[0]
    if not table:
        return None
    base = sum(table.get(n, 0.0) for n in names)
    timed = {n: s for n, s in (took or {}).items() if table.get(n, 0.0) >= 1.0}
    if timed:
        return base * sum(timed.values()) / 60 / sum(table[n] for n in timed)
    return base * (pass_ratio or 1.0)


def finished_shards(profile: str, only=None, output_root=None) -> list[Path]:
    """The folders of shards 0..n-1 of one run; a SystemExit naming what is missing or unfinished."""
    base = (Path(output_root).resolve() if output_root is not None else ROOT / "runs" / profile) / "shards"
    found = {}
    for d in base.glob("*-of-*"):
        try:
            found[parse_shard(d.name.replace("-of-", "/"))] = d
        except ValueError:
            continue
    counts = {n for _, n in found}
    if not found:
        raise SystemExit(f"--merge: no shard folders under {base} (run --shard I/N first)")
    if len(counts) > 1:
        raise SystemExit(f"--merge: {base} holds shards of different counts {sorted(counts)}; keep one set")
    n = counts.pop()
    missing = [i for i in range(n) if (i, n) not in found]
    if missing:
        raise SystemExit(f"--merge: shard(s) {[f'{i}/{n}' for i in missing]} missing under {base}")
    names = [name for name in notebook_names() if not only or name in only]
    unfinished = [f"{i}/{n} {name}" for i in range(n) for name in names
                  if not (found[(i, n)] / f"{name}.done.json").exists()]
    if unfinished:
        raise SystemExit(f"--merge: not finished yet: {unfinished}")
    return [found[(i, n)] for i in range(n)]


def merge(profile: str, only=None, cell_timeout: int | None = None, overrides=None, output_root=None,
          render=None) -> list[Path]:
    """Combine every shard's items into the run's results folder, then run the notebooks to summarise them."""
    shards = finished_shards(profile, only, output_root)
    dest_root = Path(output_root).resolve() / "results" if output_root is not None else (
        ROOT / output_dirs(profile)["results_dir"])
    added = 0
    for shard_dir in shards:  # shard 0 first: an item every shard made (a cost measurement) is kept from it
        for src in sorted((shard_dir / "results").rglob("*.jsonl")):
            dest = ResultsFile(dest_root / src.relative_to(shard_dir / "results"), shard=False)
            for record in ResultsFile(src, shard=False).values():
                if str(record["key"]) not in dest.records:
                    dest.append(record)
                    added += 1
    print(f"[reproduce] merged {added} items from {len(shards)} shards into {dest_root}", flush=True)
    return run(profile, only, cell_timeout=cell_timeout, overrides=overrides, output_root=output_root, rerun=True,
               render=render)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="specrepro-reproduce", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=os.environ.get("PROFILE", "cpu"), help=f"one of {PROFILES} (default cpu)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these notebooks, e.g. 01_losslessness")
    ap.add_argument("--figures-only", action="store_true", help="redraw figures from the saved numbers, run nothing")
    ap.add_argument("--force", action="store_true", help="rerun notebooks that already finished")
    ap.add_argument("--sync", action="store_true", help="only write runs/notebooks/*.ipynb from the jupytext .py files (nbval's input)")
    ap.add_argument("--cell-timeout", type=int, help="seconds a cell may run (default by profile)")
    ap.add_argument("--output-root", metavar="DIR", help="write figures, results and executed notebooks under DIR")
    ap.add_argument("--set", action="append", metavar="NAME=VALUE", dest="overrides",
                    help="override a notebook parameter (YAML value), e.g. --set n_samples=40; repeatable")
    ap.add_argument("--shard", metavar="I/N", help="run share I of N (0 <= I < N) of every notebook's items")
    ap.add_argument("--merge", action="store_true", help="combine the finished shards and write the summaries")
    ap.add_argument("--render", nargs="*", metavar="FILE",
                    help="at the end, render these files' summary blocks from the run's figures (default: README.md "
                         "and docs/results.md when the run rewrites the committed figures/, i.e. the cpu profile "
                         "without --output-root or --shard; none otherwise); --render with no file renders none")
    args = ap.parse_args(argv)
    render = None if args.render is None else [Path(f) for f in args.render]
    if args.shard and (args.merge or args.force):
        raise SystemExit("--shard runs one share; --merge (and --force) are separate steps")
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
    if args.merge:
        merge(args.profile, args.only, args.cell_timeout, parse_overrides(args.overrides), args.output_root, render)
        return
    try:
        shard = parse_shard(args.shard) if args.shard else None
    except ValueError as err:
        raise SystemExit(f"--shard: {err}") from None
    run(args.profile, args.only, args.force, args.cell_timeout, parse_overrides(args.overrides), args.output_root,
        shard, render=render)


if __name__ == "__main__":
    main()
