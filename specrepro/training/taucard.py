"""Tokens per target call (tau) of a shipped draft, with bootstrap 95% intervals over prompts.

specrepro-drafts taucard --results RUN.jsonl --out artifacts/drafts/feature/tau_ci.json

RUN.jsonl: the per-item records a `specrepro-drafts measure` run wrote (its --results file, one
per draft and temperature). tau per (task, K) is total tokens / total target calls over the prompts, and its
interval resamples prompts with replacement (percentile bootstrap, 10,000 resamples, fixed seed).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np


def tau_with_ci(records: list[dict], resamples: int = 10_000, seed: int = 0) -> list[dict]:
    gens = [r for r in records if "lookahead" in r and r["lookahead"] > 0]
    if not gens:
        raise ValueError("no speculative generations (K > 0) in these records")
    rng = np.random.default_rng(seed)
    rows = []
    for task, k, tree in sorted({(r["task"], r["lookahead"], r.get("tree", "")) for r in gens}):
        mine = [r for r in gens if (r["task"], r["lookahead"], r.get("tree", "")) == (task, k, tree)]
        tokens = np.array([r["n_tokens"] for r in mine], dtype=float)
        calls = np.array([r["target_calls"] for r in mine], dtype=float)
        pick = rng.integers(0, len(mine), size=(resamples, len(mine)))
        boot = tokens[pick].sum(1) / calls[pick].sum(1)
        lo, hi = np.percentile(boot, [2.5, 97.5])
        rows.append({"task": task, "K": k, **({"tree": tree} if tree else {}), "n_prompts": len(mine), "tau": tokens.sum() / calls.sum(),
                     "ci95": [float(lo), float(hi)], "tokens": int(tokens.sum()), "target_calls": int(calls.sum())})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="specrepro-drafts taucard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", required=True, nargs="+", help="measure's per-item jsonl file(s)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--note", default="", help="settings to record with the numbers")
    args = parser.parse_args(argv)
    records = []
    for path in args.results:
        try:
            records += [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        except (OSError, json.JSONDecodeError) as err:
            parser.error(f"cannot read {path}: {err}")
    rows = tau_with_ci(records)
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"note": args.note, "rows": rows}, indent=1))
    os.replace(tmp, out)
    for r in rows:
        print(f"{r['task']:5s} K={r['K']} tau {r['tau']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] "
              f"over {r['n_prompts']} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
