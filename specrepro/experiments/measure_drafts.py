"""Measure drafts side by side: acceptance, tau at each K, c, v(K), measured and predicted speedup.

specrepro-drafts measure [--drafts lookup small feature ...] [--ks 1-7] [--news 2] [--code 2]
    [--temps 0 1] [--new-tokens 24] [--dtype bfloat16] [--threads 2] [--out figures/drafts/measure]
    [--tree 3x4 ...]   (each draft also verifies these token trees, timed and on the same prompts)
    [--no-stop-rule]   (datastore drafts propose every token a match allows, instead of stopping where the
                        tuned runner's measured v(n) says one more token does not pay)

Held-out prompts: news eval articles (chat template, summarisation request) and HumanEval prompts. Each
(draft, temperature) is one lookahead sweep with ArS as its baseline, timed in this run; items are kept in
runs/measure/ so an interrupted run resumes. Notebook 04 runs the same measurement for `make reproduce`.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..algorithm.tree import parse_tree
from ..drafts.kinds import FREE_KINDS, KINDS
from ..engines.lean import set_threads
from .drafts_table import measure_drafts
from .records import write_outputs
from .results import RunRecord, markdown_table
from .workloads import code_items, eos_ids, load_target, make_draft, news_items, parse_ks, tuned_target

COLUMNS = ["draft", "task", "temperature", "K", "tree", "a", "acceptance_rate", "tau", "c", "v", "speedup",
           "predicted_speedup", "ms_per_token"]


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="specrepro-drafts measure", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafts", nargs="*", default=list(FREE_KINDS + KINDS),
                        help="kinds of specrepro.drafts.load, truncated:N or model:<id or dir>")
    parser.add_argument("--ks", default="1-7")
    parser.add_argument("--news", type=int, default=2, help="held-out news prompts")
    parser.add_argument("--code", type=int, default=2, help="HumanEval prompts")
    parser.add_argument("--temps", type=float, nargs="*", default=[0.0, 1.0])
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="the target's compute dtype; auto: sr.tune measures both here and keeps the faster")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the usable CPUs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", default="runs/measure/drafts.jsonl", help="per-item records, for resuming")
    parser.add_argument("--out", default="figures/drafts/measure", help="writes <out>.csv and <out>.json")
    parser.add_argument("--tree", nargs="*", default=[], metavar="WIDTHxDEPTH",
                        help="also verify these token trees per target call (rows with the tree set; "
                             "for tau alone, timing-free: specrepro-tree-tau)")
    parser.add_argument("--no-stop-rule", action="store_true",
                        help="do not give datastore drafts the tuned runner's v(n) (their stop rule is off)")
    args = parser.parse_args(argv)
    try:
        ks = parse_ks(args.ks)
        trees = [parse_tree(t) for t in args.tree]
    except ValueError as err:
        parser.error(str(err))
    for name in ("news", "code"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be >= 0, got {getattr(args, name)}")
    if args.new_tokens < 1:
        parser.error(f"--new-tokens must be >= 1, got {args.new_tokens}")
    if any(t < 0 for t in args.temps):
        parser.error(f"--temps must be >= 0, got {args.temps}")
    record = RunRecord(args)  # before any output is written (the dirty flag)
    threads = set_threads(args.threads)
    target, tokenizer = load_target("smollm2-135m-instruct", args.dtype)
    # one tuned runner for every draft, so all rows share one ArS baseline (tuned for a free draft)
    runner, tuned = tuned_target(target, make_draft("lookup", target), args.dtype, threads)
    prompts = {"news": news_items(tokenizer, args.news), "code": code_items(tokenizer, args.code)}
    prompts = {task: items for task, items in prompts.items() if items}
    rows = measure_drafts(target, args.drafts, prompts, ks, args.new_tokens, args.temps, args.results,
                             seed=args.seed, eos=eos_ids(tokenizer), runner=runner,  # drafts in the runner's dtype
                             trees=trees, pass_costs=None if args.no_stop_rule else tuned["v"])
    meta = record.meta(threads=threads, tune=tuned)
    out = Path(args.out)
    write_outputs(out.parent, out.name, rows, meta)
    print(markdown_table(rows, COLUMNS, digits=3))
    return rows


if __name__ == "__main__":
    main()
