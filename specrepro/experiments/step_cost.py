"""What a trained draft's step costs in each way it can run: c (a draft step / a one-token target pass) of the
heads draft with its step in torch and in the native kernels (drafts.heads.NativeHeads), and of the small draft
in the HF runner and in the native pass (drafts.base.default_runner), all timed interleaved with the target's
one-token native bfloat16 pass in one process (specrepro.tuning.costs).

Besides c (a proposal of one token), each row gives proposals of --proposals tokens (default 3), each timed
right after a target pass as a loop's are, and c per drafted token (proposal_ms[K] / K / target pass): the
first step of a proposal reads the draft's weights from memory after the target's pass has streamed its own,
the later ones find them in cache.

python -m specrepro.experiments.step_cost [--drafts heads:1024 heads small] [--reps 40] [--proposals 3]
    [--out figures/drafts/step_cost.json]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..drafts import ModelDraft
from ..engines import native
from ..engines.lean import LeanRunner, set_threads
from ..engines.runners import HFRunner
from ..files import write_json
from ..models import load_model
from ..tuning.costs import measure_cost_table
from .results import RunRecord
from .workloads import make_draft, news_items


def step_variants(spec: str, model) -> dict:
    """{way: draft} for the ways this draft's step can run (bfloat16 drafts): 'native' and 'torch'."""
    fast = make_draft(spec, model, dtype=torch.bfloat16)
    if hasattr(fast, "native"):  # a heads draft: the same net, its step in torch
        slow = make_draft(spec, model, dtype=torch.bfloat16)
        slow.native = False
        return {"native": fast, "torch": slow}
    if isinstance(fast, ModelDraft) and isinstance(fast.runner, LeanRunner):  # a model draft run natively
        return {"native": fast, "torch": ModelDraft(HFRunner(fast.model))}
    return {"torch": fast}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m specrepro.experiments.step_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafts", nargs="*", default=["heads:1024", "heads", "small"])
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--proposals", type=int, nargs="*", default=[3],
                        help="also time proposals of these many tokens (>= 2)")
    parser.add_argument("--out", default="figures/drafts/step_cost.json")
    args = parser.parse_args(argv)
    if args.reps < 3:
        parser.error("--reps must be >= 3")
    if any(k < 2 for k in args.proposals):
        parser.error("--proposals takes token counts >= 2 (a proposal of one token is always timed)")
    record = RunRecord(args)  # before any output is written (the dirty flag)
    threads = set_threads(args.threads)
    model, tokenizer = load_model("smollm2-135m-instruct")
    prefix = news_items(tokenizer, 1)[0]["prompt_ids"].view(-1)
    pairs = {}
    for spec in args.drafts:
        for way, draft in step_variants(spec, model).items():
            pairs[f"{spec} {way}"] = (LeanRunner(model, dtype=torch.bfloat16, backend="native"), draft)
    costs = measure_cost_table(pairs, prefix, [1], reps=args.reps, proposal_sizes=args.proposals)
    rows = []
    for name, cost in costs.items():
        spec, way = name.rsplit(" ", 1)
        row = {"draft": spec, "step": way, "draft_ms": cost["draft_ms"],
               "target_one_token_ms": cost["target_ms"][1], "c": cost["c"]}
        if "proposal_ms" in cost:
            row |= {"proposal_ms": cost["proposal_ms"], "c_per_token": cost["c_per_token"]}
        rows.append(row)
        per_token = ", ".join(f"K={k} {c:.3f}" for k, c in row.get("c_per_token", {}).items())
        print(f"{spec:12s} {way:6s}: step {cost['draft_ms']:.2f} ms, target {cost['target_ms'][1]:.2f} ms, "
              f"c {cost['c']:.3f}; c per token {per_token}", flush=True)
    meta = {"what": f"medians of {args.reps} draft steps (one propose of one token after the first held-out news "
                    f"prompt, {len(prefix)} tokens), of {args.reps} proposals of each of {args.proposals} tokens "
                    f"(each right after a one-token target pass) and of {args.reps} one-token native bfloat16 "
                    "target passes, every pair interleaved in one process; drafts in bfloat16"}
    meta["native"] = native.describe()  # which kernels were built, with which flags ($SPECREPRO_NATIVE_CFLAGS)
    write_json(Path(args.out), {"meta": record.meta(threads=threads, **meta), "rows": rows})
    return rows


if __name__ == "__main__":
    main()
