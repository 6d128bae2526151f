"""What the native pass's structure costs by itself: an empty parallel region (each product and the attention of a
native pass opens one, ~151 a pass of the 30-layer target) and an OpenMP barrier (what one region per layer would
pay between its phases instead), timed in native.cpp at the given thread count, beside the one-token pass.

    python -m specrepro.bench.forkjoin [--threads 2] [--rounds 20000] [--out figures/bench/fork-join.json]

Time it with nothing else running.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from ..engines import native
from ..engines.lean import LeanRunner, set_threads
from ..experiments.results import RunRecord
from ..files import write_json
from ..tuning.costs import measure_costs


def regions_per_pass(layers: int) -> int:
    """Parallel regions of a one-token native pass: per layer the q/k/v, o, gate/up and down products and the
    attention, then the LM head."""
    return 5 * layers + 1


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m specrepro.bench.forkjoin", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--target", default="smollm2-135m-instruct", help="whose one-token pass to set beside it "
                    "(none: skip)")
    ap.add_argument("--out", default="figures/bench/fork-join.json")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1:
        ap.error("--rounds and --repeats must be >= 1")
    reason = native.unavailable_reason(torch.bfloat16, "cpu")
    if reason is not None:
        ap.error(f"the native module is unavailable here: {reason}")
    record = RunRecord(args)
    threads = set_threads(args.threads)
    module = native.load()
    costs = [module.fork_join_cost(args.rounds) for _ in range(args.repeats)]
    region = statistics.median(c[0] for c in costs)
    barrier = statistics.median(c[1] for c in costs)
    out = {"region_us": region, "barrier_us": barrier, "repeats_us": [list(c) for c in costs]}
    line = f"an empty parallel region {region:.2f} us, a barrier {barrier:.2f} us ({threads} threads)"
    if args.target != "none":
        from ..models import load_model

        model, _ = load_model(args.target)
        layers = model.config.num_hidden_layers
        runner = LeanRunner(model, dtype=torch.bfloat16, backend="native")
        prefix = torch.randint(0, runner.vocab_size, (300,), generator=torch.Generator().manual_seed(0))
        pass_ms = measure_costs(runner, None, prefix, [1], reps=40)["target_ms"][1]  # after 300 cached tokens
        n = regions_per_pass(layers)
        out |= {"target": args.target, "layers": layers, "regions_per_pass": n, "one_token_pass_ms": pass_ms,
                "regions_share_of_pass": n * region / 1e3 / pass_ms,
                "saving_one_region_per_layer_share": (n * region - (layers + 1) * region - 4 * layers * barrier)
                / 1e3 / pass_ms}
        line += (f"; {n} regions = {n * region / 1e3:.3f} ms of a {pass_ms:.2f} ms one-token pass "
                 f"({100 * out['regions_share_of_pass']:.1f}%); one region per layer with barriers would save "
                 f"{100 * out['saving_one_region_per_layer_share']:.1f}%")
    print(line, flush=True)
    meta = record.meta(threads=threads, native=native.describe(),
                       what=f"medians of {args.repeats} means over {args.rounds} empty regions / barriers each")
    write_json(Path(args.out), {"meta": meta, **out})
    return out


if __name__ == "__main__":
    main()
