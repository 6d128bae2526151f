"""The result tables of README.md and docs/results.md, rendered from the figures' CSV and JSON files alone.

    python -m specrepro.experiments.summary                       # print every block
    python -m specrepro.experiments.summary --write README.md docs/results.md
    python -m specrepro.experiments.summary --check README.md docs/results.md

In a Markdown file, the text between `<!-- summary:NAME -->` and `<!-- /summary -->` is the block NAME
(see BLOCKS): --write replaces it with the rendering of the files in --figures, --check fails where it
differs. `<!-- summary:NAME@SUB -->` renders from the subfolder SUB of --figures instead (figures/avx2: the
same reproduction with the native pass built for AVX2 only; kept as it is where SUB is absent).
tests/experiments/test_summary.py runs --check on the committed files, so a number in those blocks cannot
drift from the file it cites. `make reproduce` (the cpu profile, which rewrites figures/) ends by rendering
README.md's and docs/results.md's blocks from the new files, so `make test` passes after it.
The prose around the blocks is written by hand.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from .results import read_csv
from .table1 import PAPER_TABLE1

# What the paper's Figure 1 says, for our Figure 1 table: the caption and text give the best K for XSum and
# the trend; its per-K speedups are bars in a plot that were not transcribed (no copy of the PDF offline).
# K = 4 is Table 1's setting, whose speedups the paper does state (nucleus, PAPER_TABLE1).
PAPER_FIGURE1 = {
    3: "XSum: the best K",
    4: "XSum {news}x, HumanEval {humaneval}x (its Table 1, nucleus)",
}
PAPER_FIGURE1_TREND = ("acceptance per token falls and the loop time grows about linearly with K (per-K bars "
                       "not transcribed)")

BENCHMARK = {"news": "news", "humaneval": "HumanEval", "code": "code"}


def _read(figures: Path, name: str) -> tuple[dict, list[dict]]:
    """(meta, rows) of figures/<name>.json and .csv; a clear error where either is missing."""
    meta_path, csv_path = figures / f"{name}.json", figures / f"{name}.csv"
    for path in (meta_path, csv_path):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run `make reproduce` (or its notebook) first")
    return json.loads(meta_path.read_text())["meta"], read_csv(csv_path)


def _ok(x) -> bool:
    """A number to print (read_csv gives ints, floats, nan, strings or None)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def _ci(row: dict, key: str, digits: int = 2) -> str:
    """'1.46 [1.33, 1.61]' (the interval where the row has one)."""
    if not _ok(row.get(key)):
        return ""
    text = f"{row[key]:.{digits}f}"
    lo, hi = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
    return text + (f" [{lo:.{digits}f}, {hi:.{digits}f}]" if _ok(lo) and _ok(hi) else "")


def minutes(meta: dict) -> float | None:
    """How long the run behind a file took, from its record's start and end (None where it has no end)."""
    from datetime import datetime

    try:
        start, end = (datetime.fromisoformat(str(meta[k]).replace(" ", "T")) for k in ("started", "finished"))
    except (KeyError, ValueError):
        return None
    return (end - start).total_seconds() / 60


def run_line(meta: dict) -> str:
    """Commit, date, machine and tuned setting of one notebook's run, as a sentence."""
    prov, machine, tune = meta.get("provenance", {}), meta.get("machine", {}), meta.get("tune") or {}
    commit = (prov.get("commit") or "unknown")[:7] + (" with uncommitted changes" if prov.get("dirty") else "")
    flags = " ".join(f for f in machine.get("cpu_flags", []))
    native = tune.get("native_cflags")
    setting = tune.get("setting", meta.get("dtype", "?"))
    one = tune.get("one_token_ms")
    took = minutes(meta)
    return (f"notebook {meta.get('notebook', '?')} of commit {commit} (code digest {prov.get('code_digest', '?')}), "
            f"started {meta.get('started', '?')} UTC" + (f", {took:.1f} min" if took is not None else "")
            + f"; {machine.get('cpu_model', '?')}, "
            f"{machine.get('cpu_count', '?')} cores, {flags}; torch {machine.get('torch', '?')}, "
            f"{machine.get('torch_threads', '?')} threads; tuned setting {setting}"
            + (f" (one-token pass {one:.1f} ms)" if isinstance(one, (int, float)) else "")
            + (f"; native pass built with {native}" if native else ""))


def _result(row: dict) -> str:
    metric = row.get("metric") or ""
    return f"{metric} {row['result']:.3f}" if _ok(row.get("result")) else ""


def table1(figures: Path) -> str:
    meta, rows = _read(figures, "table1")
    out = ["| benchmark, decoding | paper: ArS -> SpS | paper speedup | n | draft | K | ours: ArS -> SpS "
           "| our speedup [CI] | our tau [CI] | greedy text = ArS |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for bench, decoding in dict.fromkeys((r["benchmark"], r["decoding"]) for r in rows):
        mine = [r for r in rows if (r["benchmark"], r["decoding"]) == (bench, decoding)]
        ars = next(r for r in mine if r["method"] == "ArS")
        paper = {p["method"]: p for p in PAPER_TABLE1 if (p["benchmark"], p["decoding"]) == (bench, decoding)}
        paper_text = (f"{paper['ArS']['result']:.3f} -> {paper['SpS']['result']:.3f}" if paper
                      else "(not in the paper)")
        paper_speed = f"{paper['SpS']['speedup']:.2f}x" if paper else ""
        for i, sps in enumerate(r for r in mine if r["method"] == "SpS"):
            same = sps.get("identical_text")
            out.append("| " + " | ".join([
                f"{BENCHMARK[bench]} {decoding}" if i == 0 else "", paper_text if i == 0 else "",
                paper_speed if i == 0 else "", f"{int(sps['n_items'])}" if i == 0 else "", str(sps["draft"]),
                _k(sps), f"{_result(ars)} -> {sps['result']:.3f}", f"**{_ci(sps, 'speedup')}**", _ci(sps, "tau"),
                f"{same:.0%}" if decoding == "greedy" and _ok(same) else "",
            ]) + " |")
    return "\n".join(out)


def _k(row: dict) -> str:
    """A Table 1 row's chain length (its tree where it verified one; empty in files written before rows had K)."""
    if row.get("tree"):
        return str(row["tree"])
    k = row.get("lookahead")
    return f"{int(k)}" if _ok(k) else ""


QUALITY_MEASURE = {"news": "ROUGE-2", "humaneval": "similarity of the text (difflib), not pass@k"}


def detectable_difference(ci_low: float, ci_high: float, tests: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true mean difference a paired test at level alpha / tests (Bonferroni) detects with the
    given power, in the normal approximation: (z(1 - alpha / 2 tests) + z(power)) x the standard error that a
    95% interval of this width implies. An approximation for the Wilcoxon test, stated as such."""
    from scipy.stats import norm

    se = (ci_high - ci_low) / (2 * norm.ppf(0.975))
    return (norm.ppf(1 - alpha / (2 * tests)) + norm.ppf(power)) * se


def table1_quality(figures: Path) -> str:
    """The paired quality tests of Table 1 (one family; notebook 03 prints the verdicts), each with the
    difference it could detect (detectable_difference)."""
    meta, rows = _read(figures, "table1")
    out = ["| benchmark, decoding | draft | n pairs | ArS ms/token | SpS ms/token | quality measure "
           "| SpS - ArS [CI] | Wilcoxon p | detectable at 80% power |", "|---|---|---|---|---|---|---|---|---|"]
    family = sum(1 for r in rows if r["method"] == "SpS")
    for sps in (r for r in rows if r["method"] == "SpS"):
        ars = next(r for r in rows if (r["benchmark"], r["decoding"], r["method"]) ==
                   (sps["benchmark"], sps["decoding"], "ArS"))
        key = "quality" if _ok(sps.get("quality_mean_difference")) else "pass"
        diff = sps.get(f"{key}_mean_difference")
        lo, hi = sps.get(f"{key}_difference_ci_low"), sps.get(f"{key}_difference_ci_high")
        p = sps.get(f"{key}_wilcoxon_p")
        if not (_ok(lo) and _ok(hi)):
            detectable = ""
        elif hi - lo == 0:
            detectable = "none: texts identical"
        else:
            detectable = f"{detectable_difference(lo, hi, family):.4f}"
        out.append("| " + " | ".join([
            f"{BENCHMARK[sps['benchmark']]} {sps['decoding']}", str(sps["draft"]),
            f"{int(sps['n_pairs'])}" if _ok(sps.get("n_pairs")) else "",
            _ci(ars, "ms_per_token", 1), _ci(sps, "ms_per_token", 1),
            QUALITY_MEASURE.get(sps["benchmark"], "") if key == "quality" else "pass",
            (f"{diff:+.4f} [{lo:+.4f}, {hi:+.4f}]" if _ok(diff) and _ok(lo) else ""),
            f"{p:.3g}" if _ok(p) else "", detectable,
        ]) + " |")
    return "\n".join(out)


def figure1(figures: Path) -> str:
    meta, rows = _read(figures, "lookahead_sweep")
    paper_speed = {p["benchmark"]: f"{p['speedup']:.2f}" for p in PAPER_TABLE1
                   if p["method"] == "SpS" and p["decoding"] == "nucleus"}
    tasks = [t for t in ("news", "code") if any(r["task"] == t for r in rows)]
    out = ["| K | paper | " + " | ".join(f"ours, {t}: SpS / ArS [CI] (tau)" for t in tasks) + " |",
           "|---|---|" + "---|" * len(tasks)]

    def cell(r):
        return f"{_ci(r, 'speedup')} ({r['tau']:.2f})" if r else ""

    chains = sorted({int(r["K"]) for r in rows if not r.get("tree") and r["K"] > 0})
    best = {t: max((r for r in rows if r["task"] == t and not r.get("tree") and r["K"] > 0),
                   key=lambda r: r["speedup"]) for t in tasks}
    for k in chains:
        paper = PAPER_FIGURE1.get(k, "").format(**paper_speed)
        cells = []
        for t in tasks:
            r = next(r for r in rows if r["task"] == t and int(r["K"]) == k and not r.get("tree"))
            cells.append(("**" + cell(r) + "** (best)") if r is best[t] else cell(r))
        out.append(f"| {k} | {paper} | " + " | ".join(cells) + " |")
    for tree in sorted({r["tree"] for r in rows if r.get("tree")}):
        cells = [cell(next((r for r in rows if r["task"] == t and r.get("tree") == tree), None)) for t in tasks]
        out.append(f"| tree {tree} | | " + " | ".join(cells) + " |")
    out.append(f"| trend | {PAPER_FIGURE1_TREND} | " + " | ".join("" for _ in tasks) + " |")
    return "\n".join(out)


def figure1_settings(figures: Path) -> str:
    meta, _ = _read(figures, "lookahead_sweep")
    return (f"draft: {meta.get('draft')}; {meta.get('n_news')} news + {meta.get('n_code')} HumanEval prompts, "
            f"{meta.get('max_new_tokens')} new tokens, temperature {meta.get('temperature')}, "
            f"top-p {meta.get('top_p')}; {run_line(meta)}")


def table1_settings(figures: Path) -> str:
    meta, _ = _read(figures, "table1")
    tuned = "".join(
        f"; {name} at the K chosen for it per row before any item ran (specrepro.tuning.lookahead on built-in "
        "prompts: " + ", ".join(f"{where.replace('/', ' ')} K = {c['lookahead']}, expected "
                                f"{c['expected_speedup']:.2f}x" for where, c in rows.items()) + ")"
        for name, rows in (meta.get("tuned_lookaheads") or {}).items())
    return (f"K = {meta.get('lookahead')}{tuned}; drafts: {', '.join(meta.get('drafts') or [])}; news nucleus "
            f"temperature {meta.get('news_temperature')}, top-p {meta.get('news_top_p')}; HumanEval nucleus "
            f"temperature {meta.get('code_temperature')}, top-p {meta.get('code_top_p')}, "
            f"{meta.get('code_samples')} samples per problem; {run_line(meta)}")


def kernel_kind(tune: dict, machine: dict) -> str:
    """Which products the native pass ran: the build's flags where they were set, else the CPU's kind."""
    cflags = tune.get("native_cflags") or ""
    flags = set(machine.get("cpu_flags") or tune.get("cpu_flags") or [])
    if "-mno-avx512f" in cflags.split():
        return "AVX2 kernels (`-mno-avx512f` build)"
    if "avx512_bf16" in flags:
        return "AVX512-BF16"
    return "AVX512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "other"


OTHER_BUILDS = ("avx2",)  # subfolders of figures/ holding the reproduction with another build of the native pass


def cpu_kinds(figures: Path) -> str:
    """Per run (figures/ and each build beside it in OTHER_BUILDS): what tune measured in Figure 1's run
    and the K that was fastest there, so a reader sees what their kind of CPU gets and why."""
    runs = [figures] + [figures / b for b in OTHER_BUILDS if (figures / b / "lookahead_sweep.json").exists()]
    out = ["| native products | setting tune picked | one-token pass | v(1), v(2), v(4), v(8) "
           "| Figure 1's fastest K (T = 1): news, code | run |", "|---|---|---|---|---|---|"]
    for run in runs:
        meta, rows = _read(run, "lookahead_sweep")
        tune = meta.get("tune") or {}
        v = {int(k): x for k, x in (tune.get("v") or {}).items()}
        best = []
        for task in ("news", "code"):
            chain = [r for r in rows if r["task"] == task and not r.get("tree") and r["K"] > 0]
            if chain:
                top = max(chain, key=lambda r: r["speedup"])
                best.append(f"K = {int(top['K'])} ({top['speedup']:.2f}x)")
        prov = meta.get("provenance", {})
        out.append("| " + " | ".join([
            kernel_kind(tune, meta.get("machine", {})), str(tune.get("setting", "?")),
            f"{tune['one_token_ms']:.1f} ms" if _ok(tune.get("one_token_ms")) else "",
            ", ".join(f"{v[k]:.2f}" for k in (1, 2, 4, 8) if k in v), ", ".join(best),
            f"`{(run.relative_to(figures.parent) if run != figures else Path(figures.name)).as_posix()}/`, "
            f"commit {(prov.get('commit') or '?')[:7]}",
        ]) + " |")
    return "\n".join(out)


NOTEBOOK_FILES = {"01_losslessness": "losslessness", "02_lookahead_sweep": "lookahead_sweep",
                  "03_table1": "table1", "04_drafts": "drafts"}


def run_minutes(figures: Path) -> str:
    """How long each notebook of the run behind `figures` took, and in all, from the files' records."""
    parts, total = [], 0.0
    missing = [nb for nb, name in NOTEBOOK_FILES.items() if not (figures / f"{name}.json").exists()]
    if missing:
        return f"(the run behind {figures.name}/ has no file of {', '.join(missing)})"
    for notebook, name in NOTEBOOK_FILES.items():
        meta, _ = _read(figures, name)
        took = minutes(meta)
        if took is None:
            return f"(the run behind {figures.name}/ did not record when each notebook finished)"
        parts.append(f"{notebook} {took:.1f}")
        total += took
    return f"notebooks {total:.0f} min in all ({', '.join(parts)} min; each from its file's started and finished)"


BLOCKS = {"cpu_kinds": cpu_kinds, "run_minutes": run_minutes, "table1": table1, "table1_settings": table1_settings,
          "table1_quality": table1_quality, "figure1": figure1, "figure1_settings": figure1_settings}
BLOCK = re.compile(r"(<!-- summary:(\w+)(?:@([\w-]+))? -->\n)(.*?)(<!-- /summary -->)", re.S)


def render_file(text: str, figures: Path) -> str:
    """text with every summary block rendered from `figures`."""
    def fill(m):
        name, sub = m.group(2), m.group(3)
        if name not in BLOCKS:
            raise ValueError(f"unknown summary block {name!r}; known: {', '.join(BLOCKS)}")
        if sub and not (figures / sub).is_dir():  # another build's run, not part of this one: kept as it is
            return m.group(0)
        return m.group(1) + BLOCKS[name](figures / sub if sub else figures) + "\n" + m.group(5)
    return BLOCK.sub(fill, text)


def write_blocks(paths, figures: Path) -> list[Path]:
    """Rewrite the blocks of each file from `figures` (atomically); the files that changed."""
    from ..files import atomic_write_text

    changed = []
    for path in map(Path, paths):
        text = path.read_text()
        new = render_file(text, Path(figures))
        if new != text:
            atomic_write_text(path, new)
            changed.append(path)
    return changed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specrepro.experiments.summary", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--figures", default="figures", help="the results folder (default: figures)")
    ap.add_argument("--write", nargs="*", default=[], metavar="FILE", help="rewrite the blocks in these files")
    ap.add_argument("--check", nargs="*", default=[], metavar="FILE", help="fail where a block is out of date")
    args = ap.parse_args(argv)
    figures = Path(args.figures)
    if not args.write and not args.check:
        for name, fn in BLOCKS.items():
            print(f"<!-- summary:{name} -->\n{fn(figures)}\n<!-- /summary -->\n")
        return 0
    for path in map(Path, args.write + args.check):
        if not BLOCK.search(path.read_text()):
            ap.error(f"{path} has no <!-- summary:NAME --> block")
    for path in write_blocks(args.write, figures):
        print(f"updated {path}")
    stale = [str(path) for path in map(Path, args.check) if render_file(path.read_text(), figures) != path.read_text()]
    if stale:
        print(f"out of date with {figures}/: {', '.join(stale)} (run with --write)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
