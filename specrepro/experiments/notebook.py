"""The experiments behind the notebooks: the lookahead sweep (Figure 1), Table 1 and the drafts table;
losslessness lives in specrepro.experiments.lossless, prompts and drafts in specrepro.experiments.workloads, run records in
specrepro.experiments.records (all reachable from here, which is what the notebooks import).

Notebooks only set parameters and call these functions. Every experiment is resumable: each finished
item is appended to a JSON-lines results file (`specrepro.experiments.results.ResultsFile`) and skipped on a rerun;
summary tables are written atomically next to the figures.
Notation as in the paper: p = draft, q = target.
"""
from __future__ import annotations

import difflib
import re
import statistics
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..engines.costs import from_json, measure_costs
from ..stats.intervals import mean_ci, paired_test, ratio_ci, speedup_ci
from .lossless import joint_table, run_losslessness, toy_models  # noqa: F401  (the notebooks' entry points)
from .records import (  # noqa: F401
    PROFILES, check_params, decode_ms_per_token, generate_item, generation_record, generator, per_token_latencies,
    profile_note, repo_root, results_folder, run_header, write_outputs,
)
from .results import ResultsFile, machine_info, markdown_table  # noqa: F401
from ..stats.speedup import acceptance_mle, expected_tokens, predicted_speedup  # noqa: F401
from ..speculative import stop_at_text
from ..tasks.humaneval import STOP_SEQUENCES, check_completion, extract_completion, pass_at_k
from ..tasks.sandbox import sandbox_info
from ..tasks.news import rouge2
from ..tree import tree_specs
from .workloads import (code_items, compute_dtype, eos_ids, load_target, make_draft, news_items, slug,  # noqa: F401
                        tuned_target)

# ---------------------------------------------------------------------------------------------------
# Figure 1: the lookahead sweep


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
                "ms_per_loop": 1000 * statistics.median(loops),
                "p50_ms": 1000 * float(np.percentile(lat, 50)), "p90_ms": 1000 * float(np.percentile(lat, 90)),
                "p99_ms": 1000 * float(np.percentile(lat, 99)),
                "a": a, "c": c, "v": v,
                "expected_tokens": float("nan") if tree else expected_tokens(a, k) if k else 1.0,
                "predicted_speedup": float("nan") if tree else predicted_speedup(a, k, c, v),
            })
    return rows


# ---------------------------------------------------------------------------------------------------
# Table 1: ArS vs SpS at K = 4 on news summarisation (ROUGE-2) and HumanEval (pass@k)

# Chen et al. 2023 (arXiv:2302.01318) Table 1: Chinchilla 70B target, 4B draft, 16 TPU v4, batch size 1,
# K = 4. Caption: XSum with nucleus p = 0.8; HumanEval with p = 0.95 and temperature 0.8.
PAPER_TABLE1 = [
    {"benchmark": "news", "decoding": "nucleus", "method": "ArS", "result": 0.112, "ms_per_token": 14.1, "speedup": 1.0},
    {"benchmark": "news", "decoding": "nucleus", "method": "SpS", "result": 0.114, "ms_per_token": 7.52, "speedup": 1.92},
    {"benchmark": "news", "decoding": "greedy", "method": "ArS", "result": 0.157, "ms_per_token": 14.1, "speedup": 1.0},
    {"benchmark": "news", "decoding": "greedy", "method": "SpS", "result": 0.156, "ms_per_token": 7.00, "speedup": 2.01},
    {"benchmark": "humaneval", "decoding": "nucleus", "method": "ArS", "result": 0.451, "ms_per_token": 14.1, "speedup": 1.0},
    {"benchmark": "humaneval", "decoding": "nucleus", "method": "SpS", "result": 0.470, "ms_per_token": 5.73, "speedup": 2.46},
]
PAPER_TABLE1_SOURCE = (
    "Chen et al. 2023, arXiv:2302.01318, Table 1 and its caption; transcribed from two independent secondary "
    "copies (a description of the Table 1 screenshot in stanford-cs336/lectures, and a research-notes "
    "transcription), not from the PDF itself on this offline machine"
)


def run_table1(target, draft, tokenizer, news: list[dict], code: list[dict], settings: dict, results_path,
               lookahead: int = 4, news_max_new_tokens: int = 64, code_max_new_tokens: int = 128,
               code_samples: int = 1, pass_k=(1,), check_timeout: float = 5.0, seed: int = 0,
               tree=None) -> list[dict]:
    """ArS and SpS on each benchmark/decoding setting; one resumable item per (row, example, sample).

    settings: {"news": {"nucleus": {...sampling...}, "greedy": {...}}, "humaneval": {"nucleus": {...}}}; a
    setting's optional "n_items" runs it on the first n items only (e.g. nucleus samples on a subset).
    tree: SpS verifies this token tree (a TreeSpec or 'WIDTHxDEPTH[/NODES]') per target call instead of a
    chain of `lookahead` tokens. The summary covers exactly this call's items.
    """
    results = ResultsFile(results_path)
    tree = tree_specs([tree])[0] if tree is not None else None
    eos = eos_ids(tokenizer)
    # a code answer ends where extract_completion cuts it (the closing fence, a new top-level statement):
    # the tokens after it are never scored, so neither method spends time on them
    code_stop = stop_at_text(tokenizer, *STOP_SEQUENCES)
    todo = []
    for bench, items, samples, max_new in (("news", news, 1, news_max_new_tokens),
                                           ("humaneval", code, code_samples, code_max_new_tokens)):
        for decoding, sampling in settings.get(bench, {}).items():
            sampling = dict(sampling)
            n_items = sampling.pop("n_items", None)  # a setting may run on the first n items only
            n_samples = 1 if sampling.get("temperature", 1.0) == 0 else samples
            for it in items[:n_items]:
                for s in range(n_samples):
                    for method, k in (("ArS", 0), ("SpS", lookahead)):
                        todo.append((bench, decoding, sampling, max_new, it, s, method, k))
    keys = []
    for bench, decoding, sampling, max_new, it, s, method, k in tqdm(todo, desc="table 1"):
        shape = tree if method == "SpS" else None
        key = f"{bench}/{decoding}/{method}/{it['id']}/s{s}" + (f"/tree{shape}" if shape else "")
        keys.append(key)
        if key in results:
            continue
        gen = generate_item(target, draft, it["prompt_ids"], k, max_new, sampling, eos,
                            generator(seed, f"{bench}/{decoding}/{it['id']}/s{s}/{method}"), tree=shape,
                            stop_when=code_stop if bench == "humaneval" else None)
        text = tokenizer.decode(gen.tokens, skip_special_tokens=True)
        extra = {"benchmark": bench, "decoding": decoding, "method": method, "item": it["id"], "sample": s,
                 "text": text, **({"tree": str(shape)} if shape else {})}
        if bench == "news":
            extra["score"] = rouge2(text, it["reference"])
        else:
            completion = extract_completion(text, it["prompt"])
            extra["status"] = check_completion(it["problem"], completion, timeout=check_timeout).status
            extra["sandbox"] = sandbox_info().level  # the isolation this verdict ran under (full/.../fallback)
            extra["similarity"] = code_similarity(completion, it["problem"].canonical_solution)
        results.append(generation_record(gen, key, **extra))
    # in key order, as every summary bootstraps (resumed runs and merged shards alike); in a shard, a foreign
    # item raises ShardComplete here: the summary needs every shard's items and comes from --merge
    return summarise_table1([results.records[k] for k in sorted(set(keys))], pass_k)


def code_similarity(completion: str, canonical: str) -> float:
    """How close a completion is to the problem's canonical solution: difflib's ratio over their Python tokens
    (names, numbers and single punctuation characters; whitespace and layout ignored), 0..1.

    A metric that varies where pass@k of a 135M target is almost always 0, so that ArS and SpS can be
    compared on code; it is a similarity, not a correctness measure.
    """
    def tokens(text):
        return re.findall(r"\w+|[^\w\s]", text)

    return difflib.SequenceMatcher(None, tokens(completion), tokens(canonical), autojunk=False).ratio()


def summarise_table1(records: list[dict], pass_k=(1,)) -> list[dict]:
    """Per (benchmark, decoding, method): the result with its bootstrap 95% CI over items, ms/token and
    (SpS) the speedup over ArS on the same items with CIs, tau, and paired tests of SpS vs ArS quality."""
    rows = []
    groups = sorted({(r["benchmark"], r["decoding"]) for r in records}, key=lambda g: (g[0] != "news", g))
    for bench, decoding in groups:
        by = {m: {(r["item"], r["sample"]): r for r in records
                  if (r["benchmark"], r["decoding"], r["method"]) == (bench, decoding, m)} for m in ("ArS", "SpS")}
        paired = sorted(set(by["ArS"]) & set(by["SpS"]))
        for method in ("ArS", "SpS"):
            rs = list(by[method].values())
            if not rs:
                continue
            seconds = [sum(r["loop_seconds"]) for r in rs]
            tokens = [r["n_tokens"] for r in rs]
            ms, ms_lo, ms_hi = (1000 * v for v in ratio_ci(seconds, tokens))
            tau, tau_lo, tau_hi = ratio_ci(tokens, [r["target_calls"] for r in rs])
            row = {"benchmark": bench, "decoding": decoding, "method": method, "tree": rs[0].get("tree", ""),
                   "n_generations": len(rs),
                   "n_items": len({r["item"] for r in rs}), "ms_per_token": ms, "ms_per_token_ci_low": ms_lo,
                   "ms_per_token_ci_high": ms_hi, "tau": tau, "tau_ci_low": tau_lo, "tau_ci_high": tau_hi}
            if bench == "news":
                mean, lo, hi = mean_ci([r["score"] for r in rs])
                row.update(metric="ROUGE-2", result=mean, result_ci_low=lo, result_ci_high=hi)
            else:
                row.update(_pass_rates(rs, pass_k))
                if all("similarity" in r for r in rs):
                    sim, lo, hi = mean_ci([r["similarity"] for r in rs])
                    row.update(similarity=sim, similarity_ci_low=lo, similarity_ci_high=hi)
            if method == "SpS" and paired:
                a = [by["ArS"][key] for key in paired]
                b = [by["SpS"][key] for key in paired]
                sp, lo, hi = speedup_ci([sum(r["loop_seconds"]) for r in a], [r["n_tokens"] for r in a],
                                        [sum(r["loop_seconds"]) for r in b], [r["n_tokens"] for r in b])
                row.update(speedup=sp, speedup_ci_low=lo, speedup_ci_high=hi, n_pairs=len(paired),
                           identical_text=sum(x["tokens"] == y["tokens"] for x, y in zip(a, b)) / len(paired))
                quality = ([("score", "quality")] if bench == "news" else
                           [("similarity", "quality"), ("passed", "pass")])
                for field, label in quality:
                    values = [[_quality(r, field) for r in rs_] for rs_ in (a, b)]
                    if all(v is not None for v in values[0] + values[1]):
                        test = paired_test(*values)
                        row.update({f"{label}_{k}": v for k, v in test.items() if k != "n_pairs"})
            elif method == "ArS":
                row.update(speedup=1.0)
            paper = next((p for p in PAPER_TABLE1 if (p["benchmark"], p["decoding"], p["method"]) ==
                          (bench, decoding, method)), None)
            if paper:
                row.update(paper_result=paper["result"], paper_ms_per_token=paper["ms_per_token"],
                           paper_speedup=paper["speedup"])
            rows.append(row)
    return rows


def _quality(record: dict, field: str) -> float | None:
    if field == "passed":
        return None if record.get("status") is None else float(record["status"] == "passed")
    return record.get(field)


def _pass_rates(records: list[dict], pass_k) -> dict:
    if any(r.get("status") is None for r in records):
        return {"metric": "pass@k (not evaluated: no sandboxed humaneval.check_completion here)",
                "result": float("nan")}
    by_item: dict[str, list[str]] = {}
    for r in records:
        by_item.setdefault(r["item"], []).append(r["status"])
    n = min(len(v) for v in by_item.values())
    out = {}
    for k in [k for k in pass_k if k <= n]:
        out[f"pass@{k}"] = float(np.mean([pass_at_k(len(v), v.count("passed"), k) for v in by_item.values()]))
    k_main = max([k for k in pass_k if k <= n], default=1)
    if k_main <= n:  # the CI of the main pass@k: resample problems
        _, lo, hi = mean_ci([pass_at_k(len(v), v.count("passed"), k_main) for v in by_item.values()])
        out.update(result_ci_low=lo, result_ci_high=hi)
    out.update(metric=f"pass@{k_main}", result=out.get(f"pass@{k_main}", float("nan")), samples_per_problem=n)
    # the isolation the verdicts ran under; records written before it was recorded say "unrecorded"
    out["sandbox"] = ", ".join(sorted({r.get("sandbox", "unrecorded") for r in records}))
    return out


# ---------------------------------------------------------------------------------------------------
# Draft strategies


def measure_drafts(target, draft_specs: list[str], prompts: dict[str, list[dict]], lookaheads, max_new_tokens: int,
                   temperatures, results_path, seed: int = 0, eos=None, top_p=None, dtype=None,
                   runner=None, trees=()) -> list[dict]:
    """Per draft, task and temperature: acceptance a (MLE), tau at each K, c, v(K), measured and predicted speedup;
    with `trees` (TreeSpecs or 'WIDTHxDEPTH[/NODES]'), also each token tree's tau and speedup per draft.

    prompts: {task: [{id, prompt_ids}]} (held-out news and HumanEval). Each (draft, temperature) is one
    resumable lookahead sweep (K = 0, ArS, is its baseline), so c and v(K) are measured in the same run.
    runner: what generates as the target (e.g. a tuned LeanRunner); default the HF model itself. Drafts are
    built from the HF model `target`, computing in `dtype` (default: the runner's, see compute_dtype).
    """
    if dtype is None:
        dtype = compute_dtype(runner if runner is not None else target)
    rows = []
    path = Path(results_path)
    for spec in draft_specs:
        draft = make_draft(spec, target, dtype=dtype)
        for temp in temperatures:
            sweep_path = path.with_name(f"{path.stem}-{slug(spec)}-T{temp:g}{path.suffix}")
            out = run_lookahead_sweep(runner if runner is not None else target, draft, prompts, lookaheads, max_new_tokens,
                                      {"temperature": temp, "top_p": top_p}, sweep_path, seed=seed, eos=eos,
                                      trees=trees)
            for r in out["rows"]:
                if r["K"] > 0:
                    rows.append({"draft": spec, "task": r["task"], "temperature": temp, "K": r["K"],
                                 "tree": r["tree"], "nodes": r["nodes"], "a": r["a"],
                                 "acceptance_rate": r["acceptance_rate"], "tau": r["tau"],
                                 "tau_ci_low": r["tau_ci_low"], "tau_ci_high": r["tau_ci_high"], "c": r["c"],
                                 "v": r["v"], "speedup": r["speedup"], "speedup_ci_low": r["speedup_ci_low"],
                                 "speedup_ci_high": r["speedup_ci_high"], "predicted_speedup": r["predicted_speedup"],
                                 "ms_per_token": r["ms_per_token"], "n_generations": r["n_generations"],
                                 "n_items": r["n_items"]})
    return rows


