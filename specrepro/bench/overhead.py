"""The work per token outside the target's pass: ArS with the native bfloat16 runner, each forward timed inside
the same generations, so that (loop time - forward time) / forward time is the share of sampling and
bookkeeping, greedy and with the paper's news nucleus sampling (T = 1, top-p 0.8), the nucleus drawn both by the
native module's one-call draw and by torch ops (nucleus-torch-draw), interleaved.

    python -m specrepro.bench.overhead [--prompts 6] [--tokens 64] [--reps 2] [--threads 2]
        [--out figures/bench/ars-overhead.json]

Prompts: held-out news articles and HumanEval problems (workloads.news_items, code_items). Each row is one
generation; the summary gives the median share per mode over them. Time it with nothing else running.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path
from unittest import mock

import torch

from ..engines import native
from ..engines.lean import LeanRunner, set_threads
from ..experiments.results import RunRecord
from ..experiments.workloads import code_items, news_items
from ..files import write_json
from ..generate import autoregressive_generate
from ..models import load_model

MODES = {"greedy": dict(temperature=0.0), "nucleus": dict(temperature=1.0, top_p=0.8),
         "nucleus-torch-draw": dict(temperature=1.0, top_p=0.8)}
TORCH_DRAW = {"nucleus-torch-draw"}  # the same sampling drawn by torch ops, as without the native one-call draw


@contextlib.contextmanager
def draw_path(mode: str):
    """For a TORCH_DRAW mode, SamplingConfig.draw's torch path: sampling.native_draw sees no loaded module."""
    if mode not in TORCH_DRAW:
        yield
        return
    with mock.patch.object(native, "loaded", lambda: None):
        yield


class TimedForwards:
    """A runner proxy that sums the wall time of its one-token forwards (the prompt's prefill apart)."""

    def __init__(self, runner):
        self.__dict__.update(_runner=runner, forward_seconds=0.0, forwards=0)

    def forward(self, ids):
        t = time.perf_counter()
        out = self._runner.forward(ids)
        self.__dict__["forward_seconds"] += time.perf_counter() - t
        self.__dict__["forwards"] += 1
        return out

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def __setattr__(self, name, value):
        setattr(self._runner, name, value)


def overhead(runner, prompt_ids, tokens: int, sampling: dict, seed: int) -> dict:
    """One ArS generation: its decode-loop seconds, the forwards' seconds inside them, and the share outside."""
    if not hasattr(runner, "prefill"):
        raise ValueError("the runner has no prefill: the prompt's forward cannot be told from the loops'")
    timed = TimedForwards(runner)
    gen = autoregressive_generate(timed, prompt_ids, max_new_tokens=tokens, generator=torch.Generator().manual_seed(seed),
                                  **sampling)
    loops = sum(gen.loop_seconds)
    forwards = timed.forward_seconds  # the loops' one-token forwards (the prompt went through prefill)
    return {"tokens": len(gen.tokens), "loop_ms_per_token": 1e3 * loops / len(gen.tokens),
            "forward_ms_per_token": 1e3 * forwards / max(timed.forwards, 1),
            "outside_share": (loops - forwards) / forwards}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m specrepro.bench.overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=6, help="held-out prompts per task (news, HumanEval)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="figures/bench/ars-overhead.json")
    args = ap.parse_args(argv)
    if args.prompts < 1 or args.tokens < 2 or args.reps < 1:
        ap.error("--prompts and --reps must be >= 1 and --tokens >= 2")
    record = RunRecord(args)
    threads = set_threads(args.threads)
    model, tokenizer = load_model("smollm2-135m-instruct")
    runner = LeanRunner(model, dtype=torch.bfloat16, backend="native")
    prompts = [("news", it["prompt_ids"].view(-1)) for it in news_items(tokenizer, args.prompts)]
    prompts += [("code", it["prompt_ids"].view(-1)) for it in code_items(tokenizer, args.prompts)]
    overhead(runner, prompts[0][1], 8, MODES["greedy"], 0)  # warm-up (first call: caches, threads)
    rows = []
    for rep in range(args.reps):
        for i, (task, ids) in enumerate(prompts):
            for mode, sampling in MODES.items():  # interleaved: each prompt in every mode before the next
                with draw_path(mode):
                    rows.append({"task": task, "prompt": i, "rep": rep, "mode": mode,
                                 **overhead(runner, ids, args.tokens, sampling, seed=1000 * rep + i)})
    summary = {}
    for mode in MODES:
        shares = [r["outside_share"] for r in rows if r["mode"] == mode]
        summary[mode] = {"median_outside_share": statistics.median(shares), "max_outside_share": max(shares),
                         "median_forward_ms": statistics.median(r["forward_ms_per_token"] for r in rows if r["mode"] == mode),
                         "median_loop_ms": statistics.median(r["loop_ms_per_token"] for r in rows if r["mode"] == mode),
                         "n": len(shares)}
        print(f"{mode:18s}: the work outside the pass is {100 * summary[mode]['median_outside_share']:.1f}% of it "
              f"(median of {len(shares)}; forward {summary[mode]['median_forward_ms']:.2f} ms, loop "
              f"{summary[mode]['median_loop_ms']:.2f} ms per token)", flush=True)
    meta = record.meta(threads=threads, native=native.describe(),
                       what="ArS decode loops with the native bfloat16 runner; outside_share = (loop time - "
                            "one-token forward time) / forward time, per generation; nucleus-torch-draw: the "
                            "nucleus drawn by torch ops instead of native.cpp's nucleus_sample")
    data = {"meta": meta, "summary": summary, "rows": rows}
    write_json(Path(args.out), data)
    return data


if __name__ == "__main__":
    main()
