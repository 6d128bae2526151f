"""Tokens per target call of token trees against chains (timing-free: tau needs no quiet machine).

specrepro-tree-tau [--drafts lookup] [--trees 2x4 3x6/16] [--ks 1-7] [--news 8] [--code 8]
    [--temps 0 1] [--new-tokens 64] [--dtype float32] [--out figures/drafts/tree_tau]

For each draft, task and temperature: tau = new tokens / target calls summed over the held-out prompts (news
eval articles, HumanEval) for the chain at every K and for each tree, all on the same prompts with the
same per-item seed; the table gives each tree's tau over the chain's best tau. Items are kept in a
results file, so an interrupted run resumes.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from tqdm import tqdm

from . import records as rec
from . import workloads as wl
from ..stats.intervals import ratio_ci, ratio_of_ratios_ci
from ..engines.lean import LeanRunner, set_threads
from ..models import load_model
from .results import ResultsFile, RunRecord, markdown_table
from ..generate import speculative_generate
from ..algorithm.tree import TreeSpec, parse_tree

COLUMNS = ["draft", "task", "temperature", "setting", "nodes", "tau", "tau_ci_low", "tau_ci_high", "vs_best_chain",
           "vs_best_chain_ci_low", "vs_best_chain_ci_high", "best_chain", "n_prompts", "tokens", "target_calls"]


def settings(ks, trees) -> list[tuple[str, int, TreeSpec | None]]:
    """(name, lookahead, tree): the chain at each K, then each tree."""
    return [(f"chain K={k}", k, None) for k in ks] + [(f"tree {t}", t.depth, t) for t in trees]


def run(target, drafts: dict, prompts: dict, ks, trees, temps, new_tokens: int, results_path, seed=0, eos=None):
    """Generate every (draft, task, temperature, setting, prompt) once; returns the per-item records."""
    store = ResultsFile(results_path)
    keys = []
    jobs = [(d, task, t, s, item) for d in drafts for task, items in prompts.items() for t in temps
            for s in settings(ks, trees) for item in items]
    for draft_name, task, temp, (name, k, tree), item in tqdm(jobs, desc="tree tau"):
        key = f"{draft_name}|{task}|T{temp:g}|{name}|{item['id']}|{new_tokens}"
        keys.append(key)
        if key in store:
            continue
        gen = speculative_generate(target, drafts[draft_name], item["prompt_ids"], max_new_tokens=new_tokens,
                                   lookahead=k, temperature=temp, eos_token_id=eos, tree=tree,
                                   generator=rec.generator(seed, f"{task}|{item['id']}|T{temp:g}"))
        store.append({"key": key, "draft": draft_name, "task": task, "temperature": temp, "setting": name,
                      "nodes": tree.nodes if tree else k, "item": item["id"], "tokens": len(gen.tokens),
                      "target_calls": gen.target_calls, "accepted": gen.accepted})
    return [store.records[key] for key in keys]


def summarise(records: list[dict]) -> list[dict]:
    """One row per (draft, task, temperature, setting): tau with a bootstrap 95% interval over prompts, and
    tau over the best chain's tau (the chain K with the highest tau on the same prompts) with a paired one."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in records:
        groups.setdefault((r["draft"], r["task"], r["temperature"], r["setting"]), {})[r["item"]] = r
    rows = []
    for (draft, task, temp, setting), items in sorted(groups.items()):
        rs = list(items.values())
        tokens, calls = sum(r["tokens"] for r in rs), sum(r["target_calls"] for r in rs)
        _, lo, hi = ratio_ci([r["tokens"] for r in rs], [r["target_calls"] for r in rs])
        rows.append({"draft": draft, "task": task, "temperature": temp, "setting": setting, "nodes": rs[0]["nodes"],
                     "tau": tokens / calls, "tau_ci_low": lo, "tau_ci_high": hi, "n_prompts": len(rs),
                     "tokens": tokens, "target_calls": calls})
    for row in rows:
        group = (row["draft"], row["task"], row["temperature"])
        chains = [r for r in rows if r["setting"].startswith("chain") and (r["draft"], r["task"], r["temperature"]) == group]
        best = max(chains, key=lambda r: r["tau"]) if chains else None
        row["best_chain"] = best["setting"] if best else ""
        row["vs_best_chain"] = row["vs_best_chain_ci_low"] = row["vs_best_chain_ci_high"] = float("nan")
        if best:
            mine, theirs = groups[(*group, row["setting"])], groups[(*group, best["setting"])]
            shared = sorted(mine.keys() & theirs.keys())  # paired over the prompts both ran
            row["vs_best_chain"], row["vs_best_chain_ci_low"], row["vs_best_chain_ci_high"] = ratio_of_ratios_ci(
                *([d[i][k] for i in shared] for d in (mine, theirs) for k in ("tokens", "target_calls")))
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="specrepro-tree-tau", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafts", nargs="*", default=["lookup"], help="specs of experiments.make_draft")
    parser.add_argument("--trees", nargs="*", default=["2x4", "3x4", "4x6/24"], help="WIDTHxDEPTH[/NODES]")
    parser.add_argument("--ks", default="1-7")
    parser.add_argument("--news", type=int, default=8)
    parser.add_argument("--code", type=int, default=8)
    parser.add_argument("--temps", type=float, nargs="*", default=[0.0, 1.0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", default="runs/tree_tau/records.jsonl")
    parser.add_argument("--out", default="figures/drafts/tree_tau")
    args = parser.parse_args(argv)
    from .workloads import parse_ks

    try:
        ks, trees = parse_ks(args.ks), [parse_tree(t) for t in args.trees]
    except ValueError as err:
        parser.error(str(err))
    record = RunRecord(args)  # before any output is written (the dirty flag)
    threads = set_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    model, tokenizer = load_model("smollm2-135m-instruct", dtype=dtype)
    target = LeanRunner(model, dtype=dtype)
    drafts = {spec: wl.make_draft(spec, model, dtype=dtype) for spec in args.drafts}
    prompts = {"news": wl.news_items(tokenizer, args.news), "code": wl.code_items(tokenizer, args.code)}
    prompts = {task: items for task, items in prompts.items() if items}
    records = run(target, drafts, prompts, ks, trees, args.temps, args.new_tokens, args.results, args.seed,
                  wl.eos_ids(tokenizer))
    rows = summarise(records)
    out = Path(args.out)
    rec.write_outputs(out.parent, out.name, rows, record.meta(threads=threads))
    print(markdown_table(rows, COLUMNS, digits=3))
    return rows


if __name__ == "__main__":
    main()
