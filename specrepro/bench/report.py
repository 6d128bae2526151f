"""The bench's tables: per-configuration summaries with paired ratios, the headline comparisons, and the
CSV/JSON written beside them.
"""
from __future__ import annotations

import csv
import io
import json
import os
import statistics
from pathlib import Path

from ..files import atomic_write_text
from ..stats.intervals import ratio_ci
from ..stats.speedup import acceptance_mle, loop_cost_bound, predicted_speedup


def config_name(impl: str, runner: str, mode: str, k: int = 0, schedule: str = "") -> str:
    """A configuration's name in the tables, e.g. ours_sps/lean/greedy/K4."""
    parts = [impl, runner, mode] + ([f"K{k}"] if k else []) + [schedule]
    return "/".join(p for p in parts if p)

def summarise(rows: list[dict], costs: dict) -> list[dict]:
    by = {}
    for r in rows:
        by.setdefault(r["name"], []).append(r)
    per = {(r["name"], r["rep"], r["prompt"]): r["ms_per_token"] for r in rows}
    # ours vs ours: decode time only (the prompt pass, equal for both, would pull ratios toward 1)
    per_decode = {(r["name"], r["rep"], r["prompt"]): r["decode_ms_per_token"] for r in rows if "decode_ms_per_token" in r}
    peer_names = {}
    for r in rows:  # the first llama.cpp peer run per mode is the reference of speedup_vs_llamacpp
        if r["impl"] == "llamacpp":
            peer_names.setdefault(r["mode"], r["name"])
    out = []
    for name, rs in by.items():
        first = rs[0]
        mode, runner, k = first["mode"], first["runner"], first["k"]
        ms = statistics.median(r["ms_per_token"] for r in rs)

        def ratio(ref_name, table=per, key="ms_per_token"):  # paired: same prompt and repetition
            pairs = [table[(ref_name, r["rep"], r["prompt"])] / r[key] for r in rs
                     if (ref_name, r["rep"], r["prompt"]) in table]
            return statistics.median(pairs) if pairs else None

        row = dict(
            name=name, impl=first["impl"], runner=runner, mode=mode, k=k, schedule=first["schedule"], runs=len(rs),
            ms_per_token=ms, tokens_per_s=1e3 / ms,
            decode_ms_per_token=(
                statistics.median(r["decode_ms_per_token"] for r in rs) if "decode_ms_per_token" in first else None
            ),
            # time to first token: the prompt pass and the first token (None where a run could not tell)
            first_token_ms=(statistics.median(r["first_token_ms"] for r in rs)
                            if all(r.get("first_token_ms") is not None for r in rs) else None),
            ratio_to_ours_ars_hf=ratio(config_name("ours_ars", "hf", mode)),
            # > 1: faster than llama.cpp's plain decoding of the first peer file (--llamacpp's first kind)
            speedup_vs_llamacpp=ratio(peer_names[mode]) if peer_names.get(mode) else None,
            # the same on the decode loops alone (prompt pass excluded: llama.cpp's is slower than ours)
            decode_speedup_vs_llamacpp=(ratio(peer_names[mode], per_decode, "decode_ms_per_token")
                                        if peer_names.get(mode) and "decode_ms_per_token" in first else None),
            speedup_vs_same_runner_ars=(
                ratio(config_name("ours_ars", runner, mode), per_decode, "decode_ms_per_token")
                if first["impl"].startswith("ours") else None
            ),
        )
        proposed = sum(r["proposed"] for r in rs)
        tree = first["schedule"].startswith("tree")
        if first["impl"] == "ours_sps" and proposed and tree:  # loops propose trees: no chain model applies
            nodes = round(proposed / sum(len(r["loop_proposed"]) for r in rs))
            row.update(tau=sum(r["tokens"] for r in rs) / sum(r["target_calls"] for r in rs),
                       mean_proposed=proposed / sum(len(r["loop_proposed"]) for r in rs),
                       v=costs.get(runner, {}).get("v", {}).get(nodes))
        elif first["impl"] == "ours_sps" and proposed:
            loop_acc = sum((r["loop_accepted"] for r in rs), [])
            loop_prop = sum((r["loop_proposed"] for r in rs), [])
            tokens = sum(r["tokens"] for r in rs)
            a = acceptance_mle(loop_acc, loop_prop)
            row.update(acceptance_rate=sum(r["accepted"] for r in rs) / proposed, a=a,
                       tau=tokens / sum(r["target_calls"] for r in rs), mean_proposed=proposed / len(loop_prop))
            cost = costs.get(runner, {})
            if "c" in cost and k in cost.get("v", {}):
                row.update(c=cost["c"], v=cost["v"][k], bound=loop_cost_bound(tokens, loop_prop, cost["c"], cost["v"]))
                if first["schedule"] != "adaptive":  # the i.i.d. prediction assumes K drafts per loop
                    row["predicted"] = predicted_speedup(a, k, cost["c"], cost["v"][k])
                if row["speedup_vs_same_runner_ars"]:
                    if "predicted" in row:
                        row["measured_over_predicted"] = row["speedup_vs_same_runner_ars"] / row["predicted"]
                    row["measured_over_bound"] = row["speedup_vs_same_runner_ars"] / row["bound"]
        out.append(row)
    return out

COLUMNS = [
    "name", "impl", "runner", "mode", "k", "schedule", "runs", "ms_per_token", "tokens_per_s", "decode_ms_per_token",
    "first_token_ms", "ratio_to_ours_ars_hf", "speedup_vs_llamacpp", "decode_speedup_vs_llamacpp", "speedup_vs_same_runner_ars", "acceptance_rate", "a", "tau", "mean_proposed", "c", "v",
    "predicted", "measured_over_predicted", "bound", "measured_over_bound",
]

def paired_speedup(rows: list[dict], name: str, reference: str, key: str = "ms_per_token") -> float | None:
    """Median over (repetition, prompt) of reference ms/token / name ms/token: > 1 means `name` is faster.
    key: "ms_per_token" (whole generations) or "decode_ms_per_token" (the decode loops, prompt pass excluded)."""
    ms = {(r["name"], r["rep"], r["prompt"]): r[key] for r in rows if r.get(key) is not None}
    pairs = [ms[(reference, rep, pr)] / v for (n, rep, pr), v in ms.items() if n == name and (reference, rep, pr) in ms]
    return statistics.median(pairs) if pairs else None

def prompt_ratio_ci(rows: list[dict], name: str, reference: str, key: str = "ms_per_token") -> list[float] | None:
    """[ratio, low, high]: reference ms/token / name ms/token, each averaged over repetitions per prompt, then
    summed over prompts, with its 95% bootstrap interval resampling prompts (the unit that varies: repetitions
    of one prompt are not independent). None without at least one prompt that both ran."""
    per: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        if r["name"] in (name, reference) and r.get(key) is not None:
            per.setdefault((r["name"], r["prompt"]), []).append(r[key])
    prompts = sorted({p for n, p in per if n == name} & {p for n, p in per if n == reference})
    if not prompts:
        return None
    ref = [statistics.mean(per[(reference, p)]) for p in prompts]
    mine = [statistics.mean(per[(name, p)]) for p in prompts]
    return list(ratio_ci(ref, mine))


def headline(rows: list[dict], summary: list[dict]) -> list[dict]:
    """Per sampling mode, the comparisons the speed targets are stated in, each a paired ratio from this one run (> 1: ours faster);
    against llama.cpp also "..._ci": [ratio of per-prompt means, 95% low, high] over prompts.

    ars_vs_hf_generate: our fastest ArS against HF generate(). fastest_sps_vs_fastest_ars: our fastest SpS
    (any runner, any K) against our fastest ArS (any runner), whole generations including the prompt pass. sps_vs_hf_assisted: our fastest fixed-K SpS
    against HF assisted generation with the same draft at the same K (its fastest schedule). Also the
    speedup of that SpS over our ArS on the same runner with measured/predicted, and the adaptive
    lookahead against the best fixed K.
    """
    out = []
    for mode in sorted({r["mode"] for r in summary}):
        mine = [r for r in summary if r["mode"] == mode]
        pick = lambda rs: min(rs, key=lambda r: r["ms_per_token"]) if rs else None  # noqa: E731
        ars = pick([r for r in mine if r["impl"] == "ours_ars"])
        sps = pick([r for r in mine if r["impl"] == "ours_sps" and r["schedule"] != "adaptive"])
        gen = pick([r for r in mine if r["impl"] == "hf_generate"])
        line = {"mode": mode, "ours_ars": ars and ars["name"], "ours_sps": sps and sps["name"]}
        chains = [r for r in mine if r["impl"] == "ours_sps" and not r["schedule"]]
        trees = [r for r in mine if r["impl"] == "ours_sps" and r["schedule"].startswith("tree")]
        if chains and trees:  # the best tree against the best chain, and its tau against the chain's best tau
            best_chain, best_tree = pick(chains), pick(trees)
            line.update(best_chain=best_chain["name"], best_tree=best_tree["name"],
                        tree_vs_chain=paired_speedup(rows, best_tree["name"], best_chain["name"]),
                        tree_tau_over_chain_tau=max(r["tau"] for r in trees) / max(r["tau"] for r in chains))
        for peer in (r for r in mine if r["impl"] == "llamacpp"):  # > 1: ours faster than llama.cpp's plain decoding
            for label, mine_row in (("ars", ars), ("sps", sps)):
                if mine_row:
                    line[f"{label}_vs_llamacpp_{peer['runner']}"] = paired_speedup(rows, mine_row["name"], peer["name"])
                    line[f"{label}_decode_vs_llamacpp_{peer['runner']}"] = paired_speedup(
                        rows, mine_row["name"], peer["name"], key="decode_ms_per_token")
                    line[f"{label}_decode_vs_llamacpp_{peer['runner']}_ci"] = prompt_ratio_ci(
                        rows, mine_row["name"], peer["name"], key="decode_ms_per_token")
        if ars and gen:
            line["ars_vs_hf_generate"] = paired_speedup(rows, ars["name"], gen["name"])
        if sps and ars:  # what a user would pick: the fastest SpS against the fastest ArS, any runner each
            line["fastest_sps_vs_fastest_ars"] = paired_speedup(rows, sps["name"], ars["name"])
        if sps:
            line.update(best_k=sps["k"], sps_speedup=sps["speedup_vs_same_runner_ars"],
                        measured_over_predicted=sps.get("measured_over_predicted"),
                        measured_over_bound=sps.get("measured_over_bound"))
            assisted = pick([r for r in mine if r["impl"] == "hf_assisted" and r["k"] == sps["k"]])
            if assisted:
                line.update(hf_assisted=assisted["name"],
                            sps_vs_hf_assisted=paired_speedup(rows, sps["name"], assisted["name"]))
            best_any = pick([r for r in mine if r["impl"] == "hf_assisted"])
            if best_any:
                line.update(hf_assisted_best=best_any["name"],
                            sps_vs_hf_assisted_best=paired_speedup(rows, sps["name"], best_any["name"]))
            adaptive = pick([r for r in mine if r["schedule"] == "adaptive" and r["runner"] == sps["runner"]])
            if adaptive:
                line.update(adaptive=adaptive["name"], adaptive_vs_best_fixed=paired_speedup(rows, adaptive["name"], sps["name"]))
        out.append(line)
    return out

def format_table(summary: list[dict]) -> str:
    head = ["config", "ms/tok", "tok/s", "decode ms", "x ours-ArS", "x llama.cpp", "dec x l.cpp", "x same-ArS", "a", "tau", "c", "v(K)", "pred",
            "meas/pred", "bound", "meas/bnd"]
    keys = ["ms_per_token", "tokens_per_s", "decode_ms_per_token", "ratio_to_ours_ars_hf", "speedup_vs_llamacpp",
            "decode_speedup_vs_llamacpp", "speedup_vs_same_runner_ars",
            "a", "tau", "c", "v", "predicted", "measured_over_predicted", "bound", "measured_over_bound"]
    lines = [f"{head[0]:40s}" + "".join(f"{h:>11s}" for h in head[1:])]
    for row in summary:
        cells = [("" if row.get(k) is None else f"{row[k]:.3f}" if isinstance(row[k], float) else str(row[k])) for k in keys]
        lines.append(f"{row['name']:40s}" + "".join(f"{c:>11s}" for c in cells))
    return "\n".join(lines)

def write_results(result: dict, out: str | os.PathLike, meta: dict | None = None) -> tuple[Path, Path]:
    """<out>.csv (the summary) and <out>.json (summary, costs, every run, meta), each written atomically."""
    out = Path(out)
    csv_path, json_path = out.with_suffix(".csv"), out.with_suffix(".json")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\r\n")
    writer.writeheader()
    writer.writerows(result["summary"])
    atomic_write_text(csv_path, buf.getvalue())
    atomic_write_text(json_path, json.dumps({"meta": meta or {}, **result}, indent=1, default=str))
    return csv_path, json_path
