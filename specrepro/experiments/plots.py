"""Paper-style figures, drawn from the saved CSV numbers alone (so `make figures` can redraw them).

Each function reads `<out_dir>/<name>.csv` and writes `<name>.png` and `<name>.pdf` beside it.
Run `specrepro-plots DIR` to redraw every figure whose numbers are in DIR.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import matplotlib

if "matplotlib.pyplot" not in sys.modules and not sys.modules.get("ipykernel"):
    matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..files import atomic_path  # noqa: E402
from .results import read_csv  # noqa: E402

matplotlib.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42, "figure.dpi": 110, "font.size": 9})

TASK_STYLE = {"news": ("tab:orange", "XSum-style news"), "code": ("tab:blue", "HumanEval")}


def _save(fig, out_dir: Path, name: str) -> list[str]:
    paths = []
    for ext in ("png", "pdf"):
        path = out_dir / f"{name}.{ext}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, bbox_inches="tight", format=ext)
        paths.append(str(path))
    plt.close(fig)
    return paths


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x)) or isinstance(x, str)


def _band(ax, xs, rows, key, color):
    """Shade the bootstrap 95% CI of `key` where the rows carry it (key_ci_low / key_ci_high)."""
    lo = [r.get(f"{key}_ci_low") for r in rows]
    hi = [r.get(f"{key}_ci_high") for r in rows]
    if all(v is not None and not _nan(v) for v in lo + hi):
        ax.fill_between(xs, lo, hi, color=color, alpha=0.2, lw=0)


def _yerr(row, key):
    """[[below], [above]] for an error bar from the row's CI of `key`, or None without one."""
    lo, hi, mid = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high"), row.get(key)
    if any(v is None or _nan(v) for v in (lo, hi, mid)):
        return None
    return [[mid - lo], [hi - mid]]


def plot_losslessness(out_dir, name: str = "losslessness") -> list[str]:
    """p-values of each setting against the Bonferroni-corrected alpha; exact vs empirical joint beside."""
    out_dir = Path(out_dir)
    rows = read_csv(out_dir / f"{name}.csv")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"width_ratios": [1, 1.4]})
    ax = axes[0]
    labels = [r["setting"] for r in rows]
    pvals = [max(float(r["pvalue"]), 1e-300) for r in rows]
    colors = ["tab:green" if str(r["expected_to_pass"]) == "True" else "tab:red" for r in rows]
    ax.barh(labels, [-math.log10(p) for p in pvals], color=colors)
    alpha_c = float(rows[0]["alpha_corrected"])
    ax.axvline(-math.log10(alpha_c), color="k", ls="--", lw=1, label=f"Bonferroni alpha = {alpha_c:.2g}")
    ax.set_xscale("symlog")
    ax.set_xlabel("-log10 p (chi-square vs exact target joint)")
    ax.legend(loc="lower right", fontsize=7)
    ax.invert_yaxis()
    joint = out_dir / f"{name}_joint.csv"
    ax = axes[1]
    if joint.exists():
        jr = read_csv(joint)
        settings = [s for s in dict.fromkeys(r["setting"] for r in jr)]
        x = range(len([r for r in jr if r["setting"] == settings[0]]))
        exact = [r["exact"] for r in jr if r["setting"] == settings[0]]
        ax.bar(x, exact, color="lightgray", label="exact q joint")
        for s, m in zip(settings, "ox^s"):
            ax.plot(x, [r["empirical"] for r in jr if r["setting"] == s], m, ms=3, label=s)
        ax.set_xticks(list(x))
        ax.set_xticklabels([r["sequence"] for r in jr if r["setting"] == settings[0]], rotation=90, fontsize=5)
        ax.set_xlabel("first tokens")
        ax.set_ylabel("probability")
        ax.legend(fontsize=7)
    else:
        ax.axis("off")
    fig.suptitle("Losslessness: speculative samples vs the exact target distribution (tiny random models)")
    return _save(fig, out_dir, name)


def plot_lookahead(out_dir, name: str = "lookahead_sweep") -> list[str]:
    """Figure 1 of Chen et al.: mean sampling time, accepted/(K+1), time per loop; plus speedup vs prediction."""
    out_dir = Path(out_dir)
    rows = read_csv(out_dir / f"{name}.csv")
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.2))
    for task in dict.fromkeys(r["task"] for r in rows):
        rs = sorted((r for r in rows if r["task"] == task and not r.get("tree")), key=lambda r: r["K"])
        color, label = TASK_STYLE.get(task, (None, task))
        for t in (r for r in rows if r["task"] == task and r.get("tree")):  # token trees: one marker each, at K = depth
            for ax, key in ((axes[0], "ms_per_token"), (axes[1], "tau_over_K1"), (axes[2], "ms_per_loop"),
                            (axes[3], "speedup")):
                ax.plot([t["K"]], [t[key]], "*", color=color, ms=8, label=f"{label} tree {t['tree']}")
        ks = [r["K"] for r in rs]
        axes[0].plot(ks, [r["ms_per_token"] for r in rs], "--o", color=color, label=label, ms=3)
        axes[0].fill_between(ks, [r["p50_ms"] for r in rs], [r["p90_ms"] for r in rs], color=color, alpha=0.15)
        axes[1].plot(ks, [r["tau_over_K1"] for r in rs], "--o", color=color, label=label, ms=3)
        axes[2].plot(ks, [r["ms_per_loop"] for r in rs], "--o", color=color, label=label, ms=3)
        axes[3].plot(ks, [r["speedup"] for r in rs], "-o", color=color, label=f"{label} measured (95% CI)", ms=3)
        _band(axes[3], ks, rs, "speedup", color)
        axes[3].plot(ks, [r["predicted_speedup"] for r in rs], ":", color=color, label=f"{label} predicted")
    axes[0].set(title="Mean token time (band: P50-P90)", ylabel="ms / token")
    axes[1].set(title="Mean accepted tokens / (K+1)", ylim=(0, 1.05))
    axes[2].set(title="Median time per loop", ylabel="ms")
    axes[3].set(title="Speedup vs K=0 (pred.: Leviathan et al.)")
    axes[3].axhline(1, color="gray", lw=0.5)
    for ax in axes:
        ax.set_xlabel("lookahead K")
        ax.legend(fontsize=6)
    fig.text(0.5, -0.04, "Chen et al. Fig. 1 (Chinchilla 70B, 4B draft, TPU): XSum best at K=3; HumanEval keeps "
             "improving to K~6; loop time grows ~linearly with K", ha="center", fontsize=7, color="gray")
    return _save(fig, out_dir, name)


def plot_table1(out_dir, name: str = "table1") -> list[str]:
    """Ours vs the paper: task result and speedup per benchmark/decoding row, one bar per draft's SpS."""
    out_dir = Path(out_dir)
    rows = read_csv(out_dir / f"{name}.csv")
    groups = list(dict.fromkeys((r["benchmark"], r["decoding"]) for r in rows))
    drafts = list(dict.fromkeys(r.get("draft") or "draft" for r in rows if r["method"] == "SpS"))
    series = [("ArS", None)] + [("SpS", d) for d in drafts]  # the ArS baseline, then each draft's SpS
    colors = ["tab:gray", "tab:purple", "tab:orange", "tab:green", "tab:blue"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    width = 0.8 / (2 * len(series))  # ours and the paper's bar per series
    for gi, (bench, decoding) in enumerate(groups):
        in_group = [r for r in rows if (r["benchmark"], r["decoding"]) == (bench, decoding)]
        for si, (method, draft) in enumerate(series):
            r = next((r for r in in_group if r["method"] == method
                      and (draft is None or (r.get("draft") or "draft") == draft)), None)
            if r is None:
                continue
            color = colors[si % len(colors)]
            label = method if draft is None else f"SpS, {draft}"
            x = gi - 0.4 + (2 * si + 0.5) * width
            if not _nan(r.get("result")):
                axes[0].bar(x, r["result"], width, color=color, label=f"ours {label}" if gi == 0 else None,
                            yerr=_yerr(r, "result"), capsize=2)
            if not _nan(r.get("paper_result")) and si < 2:  # the paper has one ArS and one SpS number
                axes[0].bar(x + width, r["paper_result"], width, color=color, alpha=0.35, hatch="//",
                            label=f"paper {method}" if gi == 0 else None)
            if method == "SpS":
                xs = gi - 0.4 + (si - 1 + 0.5) * (0.8 / (len(drafts) + 1))
                axes[1].bar(xs, r["speedup"], 0.8 / (len(drafts) + 1), color=color,
                            label=f"ours, {draft} (95% CI)" if gi == 0 else None, yerr=_yerr(r, "speedup"), capsize=2)
        paper = next((r for r in in_group if r["method"] == "SpS" and not _nan(r.get("paper_speedup"))), None)
        if paper is not None:
            xs = gi - 0.4 + (len(drafts) + 0.5) * (0.8 / (len(drafts) + 1))
            axes[1].bar(xs, paper["paper_speedup"], 0.8 / (len(drafts) + 1), color="tab:purple", alpha=0.35,
                        hatch="//", label="paper (Chinchilla 70B, 4B draft)" if gi == 0 else None)
    ticks = [f"{b}\n{d}" for b, d in groups]
    axes[0].set(xticks=range(len(groups)), xticklabels=ticks, title="Result (ROUGE-2 / pass@k)")
    axes[1].set(xticks=range(len(groups)), xticklabels=ticks, title="SpS speedup over ArS (K=4)")
    axes[1].axhline(1, color="gray", lw=0.5)
    for ax in axes:
        ax.legend(fontsize=7)
    return _save(fig, out_dir, name)


def plot_drafts(out_dir, name: str = "drafts") -> list[str]:
    """tau and measured/predicted speedup against K, one line per draft; one column per (task, temperature)."""
    out_dir = Path(out_dir)
    rows = read_csv(out_dir / f"{name}.csv")
    panels = list(dict.fromkeys((r.get("task", ""), r.get("temperature", "")) for r in rows))
    fig, axes = plt.subplots(2, len(panels), figsize=(3.6 * len(panels), 5.6), squeeze=False)
    for col, (task, temp) in enumerate(panels):
        mine = [r for r in rows if (r.get("task", ""), r.get("temperature", "")) == (task, temp)]
        for d in dict.fromkeys(r["draft"] for r in mine):
            rs = sorted((r for r in mine if r["draft"] == d and not r.get("tree")), key=lambda r: r["K"])
            ks = [r["K"] for r in rs]
            line, = axes[0, col].plot(ks, [r["tau"] for r in rs], "-o", ms=3, label=d)
            for t in (r for r in mine if r["draft"] == d and r.get("tree")):  # trees: stars at K = depth
                axes[0, col].plot([t["K"]], [t["tau"]], "*", ms=8, color=line.get_color(), label=f"{d} tree {t['tree']}")
                if not _nan(t.get("speedup")):
                    axes[1, col].plot([t["K"]], [t["speedup"]], "*", ms=8, color=line.get_color())
            _band(axes[0, col], ks, rs, "tau", line.get_color())
            if all(not _nan(r.get("speedup")) for r in rs):
                axes[1, col].plot(ks, [r["speedup"] for r in rs], "-o", ms=3, color=line.get_color(), label=f"{d}")
                _band(axes[1, col], ks, rs, "speedup", line.get_color())
            if all(not _nan(r.get("predicted_speedup")) for r in rs):
                axes[1, col].plot(ks, [r["predicted_speedup"] for r in rs], ":", color=line.get_color())
        title = " ".join(str(x) for x in (task, f"T={temp}" if temp != "" else "") if x)
        axes[0, col].set(xlabel="K", ylabel="tokens per target call (tau)", title=title)
        axes[1, col].set(xlabel="K (trees: depth)", ylabel="speedup vs ArS (dotted: predicted; bands: 95% CI)")
        axes[1, col].axhline(1, color="gray", lw=0.5)
        axes[0, col].legend(fontsize=6)
    fig.tight_layout()
    return _save(fig, out_dir, name)


PLOTTERS = {"losslessness": plot_losslessness, "lookahead_sweep": plot_lookahead, "table1": plot_table1,
            "drafts": plot_drafts}


def replot(out_dir) -> list[str]:
    """Redraw every figure whose CSV is present in out_dir."""
    done = []
    for name, fn in PLOTTERS.items():
        if (Path(out_dir) / f"{name}.csv").exists():
            done += fn(out_dir)
    return done


def main(argv=None) -> int:
    """specrepro-plots [DIR ...]: redraw the figures of each results folder (default: figures)."""
    import argparse

    ap = argparse.ArgumentParser(prog="specrepro-plots", description=main.__doc__)
    ap.add_argument("dirs", nargs="*", default=["figures"], help="results folders holding the figures' CSVs")
    for d in ap.parse_args(argv).dirs:
        for p in replot(d):
            print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
