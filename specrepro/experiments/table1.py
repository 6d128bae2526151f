"""Table 1: ArS against SpS at K = 4 on news summarisation (ROUGE-2) and HumanEval (pass@k), greedy and
nucleus, with the paper's numbers beside ours.

Resumable: each finished item is appended to a JSON-lines results file and skipped on a rerun.
"""
from __future__ import annotations

import difflib
import re
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ..algorithm.speculative import stop_at_text
from ..algorithm.tree import tree_specs
from ..generate import MAX_LOOKAHEAD
from ..stats.intervals import mean_ci, paired_test, ratio_ci, speedup_ci
from ..tasks.humaneval import STOP_SEQUENCES, check_completion, extract_completion, pass_at_k
from ..tasks.news import rouge2
from ..tasks.sandbox import sandbox_info
from .records import generate_item, generation_record, generator
from .results import ResultsFile
from .workloads import eos_ids, slug


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


def row_spec(name: str) -> tuple[str, int | str | None]:
    """A draft row's name -> (draft spec, its K): "SPEC@K" runs SPEC with chains of K tokens, "SPEC@tune" with
    the K row_lookaheads picks for it per setting, a bare spec at the table's lookahead (K None)."""
    spec, sep, k = name.rpartition("@")
    if not sep or not (k == "tune" or k.isdigit()):
        return name, None
    if not spec:
        raise ValueError(f"draft row {name!r} names no draft before '@'")
    return spec, k if k == "tune" else int(k)


PILOT_PROMPTS = {"news": "news", "humaneval": "code"}  # built-in prompts (never evaluation items) per benchmark


def row_lookaheads(runner, drafts: dict, settings: dict, tokenizer, max_lookahead: int = 6, reps: int = 15,
                   seed: int = 0) -> tuple[dict, dict]:
    """run_table1's `lookaheads` for the rows whose names carry a K (row_spec), and what each tuned K was
    chosen from: ({name: K or {"benchmark/decoding": K}}, {name: {"benchmark/decoding": choice}}). A "@tune"
    row gets, per setting, the K specrepro.tuning.lookahead.tuned_lookahead picks on this runner from that
    draft's measured proposals and its acceptance by position on the benchmark's built-in prompts at the
    setting's sampling."""
    from ..tuning.lookahead import tuned_lookahead
    from .workloads import builtin_prompts

    lookaheads, chosen = {}, {}
    for name, draft in drafts.items():
        _, k = row_spec(name)
        if k is None:
            continue
        if k != "tune":
            lookaheads[name] = k
            continue
        lookaheads[name], chosen[name] = {}, {}
        for bench, rows in settings.items():
            samplings = {decoding: {key: v for key, v in sampling.items() if key != "n_items"}
                         for decoding, sampling in rows.items()}
            prompts = builtin_prompts(PILOT_PROMPTS[bench], tokenizer)
            for decoding, choice in tuned_lookahead(runner, draft, prompts, samplings, max_lookahead, reps,
                                                    seed=seed).items():
                lookaheads[name][f"{bench}/{decoding}"] = choice["lookahead"]
                chosen[name][f"{bench}/{decoding}"] = choice
    return lookaheads, chosen


def run_table1(target, drafts, tokenizer, news: list[dict], code: list[dict], settings: dict, results_dir,
               lookahead: int = 4, news_max_new_tokens: int = 64, code_max_new_tokens: int = 128,
               code_samples: int = 1, pass_k=(1,), check_timeout: float = 5.0, seed: int = 0,
               tree=None, draft_items: dict | None = None, lookaheads: dict | None = None) -> list[dict]:
    """ArS and SpS with each draft on each benchmark/decoding setting; one resumable item per (row, example,
    sample, method, draft).

    drafts: {name: draft} (a bare draft is named "draft"); every draft's SpS is timed against the one ArS
    baseline, whose items are shared. results_dir: a folder holding `table1-ArS.jsonl` and one
    `table1-<slug(name)>.jsonl` per draft, so a run with another set of drafts reuses what it shares.
    settings: {"news": {"nucleus": {...sampling...}, "greedy": {...}}, "humaneval": {"nucleus": {...}}}; a
    setting's optional "n_items" runs it on the first n items only (e.g. nucleus samples on a subset).
    draft_items: {name: n}: that draft's SpS runs on the first n items of each setting only (a slow draft);
    its speedup and paired tests use the ArS items it shares.
    lookaheads: {name: K} or {name: {"benchmark/decoding": K}}: that draft's chain is K tokens long (in every
    setting, or in each one named; the rest at `lookahead`), e.g. the K specrepro.tuning.lookahead chose for it;
    it runs that chain even where `tree` gives the other drafts a token tree.
    Its items' keys and records carry K, so a run at another K never reuses them.
    tree: SpS verifies this token tree (a TreeSpec or 'WIDTHxDEPTH[/NODES]') per target call instead of a
    chain of `lookahead` tokens. The summary covers exactly this call's items.
    """
    if not isinstance(drafts, dict):
        drafts = {"draft": drafts}
    if not drafts:
        raise ValueError("run_table1 needs at least one draft: drafts is empty")
    draft_items = dict(draft_items or {})
    unknown = sorted(set(draft_items) - set(drafts))
    if unknown:
        raise ValueError(f"draft_items names drafts that are not run: {unknown}; the drafts are {list(drafts)}")
    for name, n in draft_items.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"draft_items[{name!r}] must be a positive integer, got {n!r}")
    lookaheads = dict(lookaheads or {})
    unknown = sorted(set(lookaheads) - set(drafts))
    if unknown:
        raise ValueError(f"lookaheads names drafts that are not run: {unknown}; the drafts are {list(drafts)}")

    def k_of(name, bench, decoding) -> int:
        k = lookaheads.get(name, lookahead)
        if isinstance(k, dict):
            k = k.get(f"{bench}/{decoding}", lookahead)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_LOOKAHEAD:
            raise ValueError(f"lookaheads[{name!r}] gives K = {k!r} for {bench}/{decoding}: K must be an integer in "
                             f"1..{MAX_LOOKAHEAD}")
        return k

    results_dir = Path(results_dir)
    files = {None: ResultsFile(results_dir / "table1-ArS.jsonl")}
    files.update({name: ResultsFile(results_dir / f"table1-{slug(name)}.jsonl") for name in drafts})
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
            for i, it in enumerate(items[:n_items]):
                for s in range(n_samples):
                    todo.append((bench, decoding, sampling, max_new, it, s, None))  # ArS, then each draft's SpS
                    todo += [(bench, decoding, sampling, max_new, it, s, name) for name in drafts
                             if i < draft_items.get(name, len(items))]
                for name in lookaheads:
                    k_of(name, bench, decoding)  # a bad K fails before any item runs
    keys = []
    for bench, decoding, sampling, max_new, it, s, name in tqdm(todo, desc="table 1"):
        method, k = ("ArS", 0) if name is None else ("SpS", k_of(name, bench, decoding))
        shape = tree if method == "SpS" and name not in lookaheads else None  # a draft at its own K: a chain
        key = (f"{bench}/{decoding}/{method}/{it['id']}/s{s}" + (f"/tree{shape}" if shape else "")
               + (f"/k{k}" if name in lookaheads else ""))
        results = files[name]
        keys.append((name, key))
        if key in results:
            continue
        # the same random numbers for every draft (common random numbers: the drafts differ only in the draft)
        gen = generate_item(target, None if name is None else drafts[name], it["prompt_ids"], k, max_new, sampling,
                            eos, generator(seed, f"{bench}/{decoding}/{it['id']}/s{s}/{method}"), tree=shape,
                            stop_when=code_stop if bench == "humaneval" else None)
        text = tokenizer.decode(gen.tokens, skip_special_tokens=True)
        extra = {"benchmark": bench, "decoding": decoding, "method": method, "item": it["id"], "sample": s,
                 "text": text, "lookahead": shape.depth if shape else k, **({"draft": name} if name is not None else {}),
                 **({"tree": str(shape)} if shape else {})}
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
    records = [{**files[name].records[key], **({"draft": name} if name is not None else {})}
               for name, key in sorted(set(keys), key=lambda nk: (nk[0] is not None, nk[0] or "", nk[1]))]
    return summarise_table1(records, pass_k, drafts=list(drafts))


def code_similarity(completion: str, canonical: str) -> float:
    """How close a completion is to the problem's canonical solution: difflib's ratio over their Python tokens
    (names, numbers and single punctuation characters; whitespace and layout ignored), 0..1.

    A metric that varies where pass@k of a 135M target is almost always 0, so that ArS and SpS can be
    compared on code; it is a similarity, not a correctness measure.
    """
    def tokens(text):
        return re.findall(r"\w+|[^\w\s]", text)

    return difflib.SequenceMatcher(None, tokens(completion), tokens(canonical), autojunk=False).ratio()


def summarise_table1(records: list[dict], pass_k=(1,), drafts=None) -> list[dict]:
    """Per (benchmark, decoding, method, draft): the result with its bootstrap 95% CI over items, ms/token and
    (SpS) the speedup over ArS on the same items with CIs, tau, and paired tests of SpS vs ArS quality.

    SpS records name their draft in "draft" (records without one belong to a draft named "draft"); every
    draft's SpS row is compared with the one ArS row of its benchmark and decoding. drafts: the row order
    (default: the order the drafts first appear in). The ArS row's draft is empty."""
    rows = []
    spec = {r.get("draft", "draft") for r in records if r["method"] == "SpS"}
    order = list(drafts) if drafts is not None else list(dict.fromkeys(
        r.get("draft", "draft") for r in records if r["method"] == "SpS"))
    order += sorted(spec - set(order))
    groups = sorted({(r["benchmark"], r["decoding"]) for r in records}, key=lambda g: (g[0] != "news", g))
    for bench, decoding in groups:
        mine = [r for r in records if (r["benchmark"], r["decoding"]) == (bench, decoding)]
        ars = {(r["item"], r["sample"]): r for r in mine if r["method"] == "ArS"}
        for method, draft in [("ArS", None)] + [("SpS", d) for d in order]:
            by = {(r["item"], r["sample"]): r for r in mine
                  if r["method"] == method and (draft is None or r.get("draft", "draft") == draft)}
            rs = list(by.values())
            if not rs:
                continue
            paired = sorted(set(ars) & set(by))
            seconds = [sum(r["loop_seconds"]) for r in rs]
            tokens = [r["n_tokens"] for r in rs]
            ms, ms_lo, ms_hi = (1000 * v for v in ratio_ci(seconds, tokens))
            tau, tau_lo, tau_hi = ratio_ci(tokens, [r["target_calls"] for r in rs])
            row = {"benchmark": bench, "decoding": decoding, "method": method, "draft": draft or "",
                   "tree": rs[0].get("tree", ""), "lookahead": rs[0].get("lookahead", ""), "n_generations": len(rs),
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
                a = [ars[key] for key in paired]
                b = [by[key] for key in paired]
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
