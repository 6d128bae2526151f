"""Figure 1: the lookahead sweep. Every prompt generated at every K (K = 0 is ArS) and at every token tree,
with the measured c and v(K), and the summary the notebook plots (speedup, acceptance, time per loop).

Resumable: each finished item is appended to a JSON-lines results file and skipped on a rerun.
Notation as in the paper: p = draft, q = target.
"""
from __future__ import annotations

import statistics

import numpy as np
from tqdm.auto import tqdm

from ..algorithm.tree import tree_specs
from ..stats.intervals import ratio_ci, speedup_ci
from ..stats.speedup import acceptance_mle, expected_tokens, predicted_speedup
from ..tuning.costs import from_json, measure_costs
from .records import decode_ms_per_token, generate_item, generation_record, generator, per_token_latencies
from .results import ResultsFile


def run_lookahead_sweep(target, draft, prompts: dict[str, list[dict]], lookaheads, max_new_tokens: int,
                        sampling: dict, results_path, seed: int = 0, eos=None, repeats: int = 1,
                        cost_repeats: int = 7, trees=()) -> dict:
    """Generate every prompt at every K (K = 0 is ArS), interleaving K per prompt so load drifts hit all K.

    prompts: {task: [{id, prompt_ids}]}. trees: token trees (TreeSpecs or 'WIDTHxDEPTH[/NODES]') run beside
    the chains, each on the same prompts and seeds, with its pass over nodes + 1 tokens costed too.
    Returns {"rows": per (task, K or tree) summary, "costs": per task}.
    """
    results = ResultsFile(results_path)
    lookaheads = sorted(set(lookaheads) | {0})
    trees = tree_specs(trees)
    settings = [(k, None) for k in lookaheads] + [(t.depth, t) for t in trees]
    sizes = [t.nodes + 1 for t in trees]
    costs = {}
    for task, items in prompts.items():
        key = f"costs/{task}"
        if key in results and not all(n - 1 in from_json(results.records[key])["v"] for n in sizes):
            key = f"costs/{task}/trees{'-'.join(map(str, trees))}"  # measured before these trees were asked for
        if key not in results:
            measured = measure_costs(target, draft, items[0]["prompt_ids"], lookaheads, cost_repeats,
                                     extra_sizes=sizes)
            results.append({"key": key, **measured})
        costs[task] = from_json({k: v for k, v in results.records[key].items() if k != "key"})
    todo = [(task, it, r, k, t) for task, items in prompts.items() for it in items for r in range(repeats)
            for k, t in settings]
    for task, it, r, k, t in tqdm(todo, desc="lookahead sweep"):
        key = f"{task}/{it['id']}/rep{r}/" + (f"tree{t}" if t else f"K{k}")
        if key in results:
            continue
        gen = generate_item(target, draft, it["prompt_ids"], k, max_new_tokens, sampling, eos,
                            generator(seed, f"{task}/{it['id']}/rep{r}"), tree=t)
        results.append(generation_record(gen, key, task=task, item=it["id"], lookahead=k, rep=r,
                                         **({"tree": str(t), "nodes": t.nodes} if t else {})))
    rows = summarise_sweep(results.values(), costs, lookaheads, trees)
    return {"rows": rows, "costs": costs}


def acceptance_by_position(accepted: list[int], proposed: list[int]) -> list[float]:
    """Acceptance of the i-th proposed token given that tokens 1..i-1 were accepted, i = 1..max proposed, from
    the per-loop counts of a chain: loop j reached position i when accepted[j] >= i - 1 and proposed[j] >= i, and
    accepted it when accepted[j] >= i (nan where no loop reached it)."""
    if len(accepted) != len(proposed) or any(not 0 <= a <= p for a, p in zip(accepted, proposed)):
        raise ValueError("accepted and proposed must be per-loop counts with 0 <= accepted <= proposed")
    rates = []
    for i in range(1, max(proposed, default=0) + 1):
        reached = sum(1 for a, p in zip(accepted, proposed) if a >= i - 1 and p >= i)
        rates.append(sum(1 for a, p in zip(accepted, proposed) if a >= i and p >= i) / reached if reached
                     else float("nan"))
    return rates


def summarise_sweep(records: list[dict], costs: dict, lookaheads, trees=()) -> list[dict]:
    """Per (task, K), then per (task, tree): ms/token, speedup over K = 0 on the same prompts and tau, each
    with a bootstrap 95% CI over prompts; acceptance, latency percentiles, and for chains the Leviathan
    prediction from a, c and v(K) (a tree row's v is its pass over nodes + 1 tokens; no prediction)."""
    gens = [r for r in records if "lookahead" in r]
    settings = [(k, None) for k in lookaheads] + [(t.depth, str(t)) for t in tree_specs(trees)]
    rows = []
    for task in sorted({r["task"] for r in gens}):
        mine = [r for r in gens if r["task"] == task]
        spec = [r for r in mine if r["lookahead"] > 0 and not r.get("tree")]
        a = acceptance_mle(sum((r["accepted"] for r in spec), []), sum((r["proposed"] for r in spec), []))
        base = {(r["item"], r["rep"]): r for r in mine if r["lookahead"] == 0}
        for k, tree in settings:
            rs = [r for r in mine if r["lookahead"] == k and r.get("tree") == tree]
            if not rs:
                continue
            tokens = sum(r["n_tokens"] for r in rs)
            seconds = sum(r["seconds"] for r in rs)
            lat = per_token_latencies(rs)
            loops = sum((r["loop_seconds"] for r in rs), [])
            acc = sum((r["accepted"] for r in rs), [])
            prop = sum((r["proposed"] for r in rs), [])
            tau, tau_lo, tau_hi = ratio_ci([r["n_tokens"] for r in rs], [r["target_calls"] for r in rs])
            pairs = [(base[(r["item"], r["rep"])], r) for r in rs if (r["item"], r["rep"]) in base]
            if pairs:
                speedup, sp_lo, sp_hi = speedup_ci(
                    [sum(b["loop_seconds"]) for b, _ in pairs], [b["n_tokens"] for b, _ in pairs],
                    [sum(r["loop_seconds"]) for _, r in pairs], [r["n_tokens"] for _, r in pairs])
            else:
                speedup = sp_lo = sp_hi = float("nan")
            c = costs[task].get("c", float("nan"))
            nodes = rs[0]["nodes"] if tree else k
            v = costs[task]["v"].get(nodes, float("nan")) if nodes else 1.0
            rows.append({
                "task": task, "K": k, "tree": tree or "", "nodes": nodes,
                "n_generations": len(rs), "n_items": len({r["item"] for r in rs}),
                "tokens": tokens, "total_seconds": seconds, "ms_per_token": decode_ms_per_token(rs),
                "speedup": speedup, "speedup_ci_low": sp_lo, "speedup_ci_high": sp_hi,
                "tau": tau, "tau_ci_low": tau_lo, "tau_ci_high": tau_hi, "tau_over_K1": tau / (k + 1),
                "acceptance_rate": (sum(acc) / sum(prop)) if sum(prop) else float("nan"),
                "acceptance_mle_K": acceptance_mle(acc, prop) if k and not tree else float("nan"),
                # chains: acceptance of proposed token i given 1..i-1 accepted (a draft with a stop rule
                # proposes fewer than K on some loops; each position counts the loops that reached it)
                "acceptance_by_position": acceptance_by_position(acc, prop) if k and not tree else [],
                "ms_per_loop": 1000 * statistics.median(loops),
                "p50_ms": 1000 * float(np.percentile(lat, 50)), "p90_ms": 1000 * float(np.percentile(lat, 90)),
                "p99_ms": 1000 * float(np.percentile(lat, 99)),
                "a": a, "c": c, "v": v,
                "expected_tokens": float("nan") if tree else expected_tokens(a, k) if k else 1.0,
                "predicted_speedup": float("nan") if tree else predicted_speedup(a, k, c, v),
            })
    return rows
