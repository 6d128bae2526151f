"""What a trained draft's step costs against its head size: c (a draft step / a one-token target pass) of
the feature and heads drafts with the shipped 16,384-token head and heads cut to fewer tokens (load's
head_vocab), each timed interleaved with the target's one-token pass (specrepro.tuning.costs).

python -m specrepro.experiments.head_cost [--sizes 8192 4096 2048 1024 512] [--reps 40]
    [--out figures/drafts/head_cost.json]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..engines.lean import LeanRunner, set_threads
from ..files import write_json
from ..models import load_model
from ..tuning.costs import measure_cost_table
from .results import RunRecord
from .workloads import make_draft, news_items


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m specrepro.experiments.head_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", nargs="*", default=["feature", "heads"], choices=["feature", "heads"])
    parser.add_argument("--sizes", type=int, nargs="*", default=[8192, 4096, 2048, 1024, 512])
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="figures/drafts/head_cost.json")
    args = parser.parse_args(argv)
    if args.reps < 3 or any(n < 1 for n in args.sizes):
        parser.error("--reps must be >= 3 and every --sizes entry >= 1")
    record = RunRecord(args)  # before any output is written (the dirty flag)
    threads = set_threads(args.threads)
    model, tokenizer = load_model("smollm2-135m-instruct")
    prefix = news_items(tokenizer, 1)[0]["prompt_ids"].view(-1)
    rows = []
    for kind in args.kinds:
        for n in [None, *args.sizes]:
            spec = kind if n is None else f"{kind}:{n}"
            runner = LeanRunner(model, dtype=torch.bfloat16, backend="native")
            draft = make_draft(spec, model, dtype=torch.bfloat16)
            cost = measure_cost_table({spec: (runner, draft)}, prefix, [1], reps=args.reps)[spec]
            rows.append({"draft": spec, "head_tokens": int(draft.net.keep.numel()), "draft_ms": cost["draft_ms"],
                         "target_one_token_ms": cost["target_ms"][1], "c": cost["c"]})
            print(f"{spec:14s} head {rows[-1]['head_tokens']:6d} tokens: step {cost['draft_ms']:.2f} ms, "
                  f"target {cost['target_ms'][1]:.2f} ms, c {cost['c']:.3f}", flush=True)
    meta = {"what": f"medians of {args.reps} draft steps (one propose of one token after the first held-out news "
                    f"prompt, {len(prefix)} tokens) and of {args.reps} one-token native bfloat16 target passes after "
                    "it, interleaved; drafts in bfloat16"}
    write_json(Path(args.out), {"meta": record.meta(threads=threads, **meta), "rows": rows})
    return rows


if __name__ == "__main__":
    main()
