"""The GPU headline, one run: our ArS and SpS against HF generate with a static cache.

    python tests/gpu_bench.py --out figures/gpu-check/headline [--device cuda] [--n-prompts 5] ...

On the real target and held-out prompts (news summaries from specrepro.tasks.news' eval split, HumanEval
prompts), batch 1, in --dtype, greedy and T = 1 (no top-k/top-p), for every prompt:
- HF `generate()` eager and `generate(cache_implementation="static")` (HF compiles its decode step), after
  one untimed warm-up call per prompt shape;
- our ArS on each runner: "lean" (eager LeanRunner), "graphs-cuda" and "graphs-compile" (StaticRunner);
- our SpS with each --drafts spec (chain at each K in --ks, and each --trees) on each graph runner.
Times are wall clock with CUDA synchronised, ms per new token; each prompt's run is repeated --reps times
and its median kept; ratios are paired per prompt, reported as ratio of sums with a bootstrap 95% CI
(specrepro.stats.intervals.ratio_ci) over prompts. Also: the pass costs (v(K)) of each runner and each
draft's step cost c = draft step / one-token target pass (specrepro.tuning.costs), the capture seconds,
and whether greedy SpS reproduced greedy ArS token for token on the same runner.
--random-weights: the target's config and tokenizer from the --target directory (no weights needed there:
what fits in a device call's 64 MiB), its weights random (seed 0). Pass costs, c, v(K), ArS and HF times do
not depend on the weights; tau and every SpS speedup do, so with random weights read those as meaningless
(the drafts still load: they are keyed by the directory's name, e.g. smollm2-135m-instruct).
This is a benchmark: nothing is asserted about timings. --device cpu runs the same code uncaptured (the
CPU proof of gpu_check.sh; its timings say nothing about a GPU).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, reps):
    """(median seconds, last result) of fn() over reps runs."""
    times, out = [], None
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def hf_generate(model, ids, n, greedy, static, seed, max_cache_len=None):
    kw = dict(max_new_tokens=n, min_new_tokens=n, pad_token_id=model.config.eos_token_id)
    if static:  # one cache size for every prompt: HF compiles its decode step once, not per prompt length
        kw["cache_implementation"] = "static"
        if max_cache_len and hasattr(model.generation_config, "max_cache_len"):  # transformers has it
            kw["max_cache_len"] = max_cache_len
    if greedy:
        kw.update(do_sample=False)
    else:
        torch.manual_seed(seed)
        kw.update(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    return model.generate(ids.view(1, -1), **kw)[0, ids.shape[0]:]


def main(argv=None) -> dict:
    import specrepro as sr
    from specrepro.drafts.spec import make_draft
    from specrepro.tuning.costs import measure_cost_table
    from specrepro.engines.lean import LeanRunner
    from specrepro.engines.static import StaticRunner
    from specrepro.experiments.workloads import code_items, news_items
    from specrepro.stats.intervals import ratio_ci
    from specrepro.algorithm.tree import parse_tree

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--drafts", default="lookup,feature,heads,small,lookup+feature,truncated:4")
    ap.add_argument("--ks", default="2,4,8")
    ap.add_argument("--trees", default="4x6/32")
    ap.add_argument("--runners", default="lean,graphs-cuda", help="lean, graphs-cuda, graphs-compile")
    ap.add_argument("--n-prompts", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", default="greedy,sample")
    ap.add_argument("--random-weights", action="store_true", help="random weights from --target's config")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    n, reps = args.max_new_tokens, args.reps
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args.random_weights:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        config = AutoConfig.from_pretrained(args.target)
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
        model.config.name_or_path = str(Path(args.target).resolve())  # the shipped drafts are keyed by its name
        tok = AutoTokenizer.from_pretrained(args.target)
    else:
        model, tok = sr.load_model(args.target, dtype=dtype, device=device)
    prompts = [("news", it["id"], it["prompt_ids"]) for it in news_items(tok, args.n_prompts)]
    prompts += [("code", it["id"], it["prompt_ids"]) for it in code_items(tok, args.n_prompts)]
    capacity = max(p.shape[0] for _, _, p in prompts) + n + 80
    runners = {}
    for name in args.runners.split(","):
        if name == "lean":
            runners[name] = LeanRunner(model, dtype=dtype, capacity=capacity)
        elif name.startswith("graphs-"):
            graphs = name.removeprefix("graphs-") if device.type == "cuda" else "none"
            if graphs == "none" and any(r.graphs == "none" for r in runners.values() if isinstance(r, StaticRunner)):
                continue  # on a CPU both graph runners are the same uncaptured runner
            runners[name] = StaticRunner(model, dtype=dtype, capacity=capacity, graphs=graphs)
        else:
            sys.exit(f"unknown runner {name!r}")
    drafts = {}
    for spec in [s for s in args.drafts.split(",") if s]:
        try:
            drafts[spec] = make_draft(spec, model, dtype=dtype)
        except Exception as err:  # noqa: BLE001 - a draft that cannot load is reported, the rest still run
            drafts[spec] = f"{type(err).__name__}: {err}"
            print(f"draft {spec}: not loaded ({drafts[spec]})", flush=True)
    ks = [int(k) for k in args.ks.split(",") if k]
    trees = [parse_tree(t) for t in args.trees.split(",") if t]
    rows = []

    def record(kind, pid, impl, runner, mode, k, tree, seconds, gen_tokens, extra=None):
        rows.append(dict(task=kind, prompt=pid, impl=impl, runner=runner, mode=mode, k=k, tree=tree,
                         ms_per_token=1e3 * seconds / max(gen_tokens, 1), tokens=gen_tokens, **(extra or {})))

    # warm-ups: every graph bucket captured, HF's static cache compiled, before anything is timed
    capture = {name: r.warmup(tuple(range(1, 65))) for name, r in runners.items() if isinstance(r, StaticRunner)}
    longest = max((p for _, _, p in prompts), key=len).to(device)
    hf_generate(model, longest, n, True, True, 0, capacity)  # HF's static cache sized once, at its largest
    for mode in args.modes.split(","):
        greedy = mode == "greedy"
        temperature = 0.0 if greedy else 1.0

        def rng():  # draws on the device (a CPU generator would copy every q row to the host to sample it)
            return None if greedy else torch.Generator(device).manual_seed(0)
        for kind, pid, ids in prompts:
            ids = ids.to(device)
            for static in (False, True):
                hf_generate(model, ids, n, greedy, static, 0, capacity)  # warm-up
                s, toks = timed(lambda: hf_generate(model, ids, n, greedy, static, 0, capacity), device, reps)
                record(kind, pid, "hf_generate_static" if static else "hf_generate", "hf", mode, 0, None, s, len(toks))
            ars_tokens = {}
            for rname, runner in runners.items():
                def ars():
                    return sr.autoregressive_generate(runner, ids, max_new_tokens=n, temperature=temperature,
                                                      generator=rng())
                ars()
                s, gen = timed(ars, device, reps)
                ars_tokens[rname] = gen.tokens.cpu()
                record(kind, pid, "ours_ars", rname, mode, 0, None, s, len(gen.tokens))
            for rname, runner in runners.items():
                if rname == "lean" and len(runners) > 1:
                    continue  # SpS on the graph runners only (the eager one is the baseline)
                for spec, draft in drafts.items():
                    if isinstance(draft, str):
                        continue
                    for k, tree in [(k, None) for k in ks] + [(t.depth, t) for t in trees]:
                        def sps():
                            return sr.speculative_generate(runner, draft, ids, max_new_tokens=n, lookahead=k,
                                                           temperature=temperature, tree=tree, generator=rng())
                        try:
                            sps()
                            s, gen = timed(sps, device, reps)
                        except Exception as err:  # noqa: BLE001 - recorded, the run goes on
                            rows.append(dict(task=kind, prompt=pid, impl="ours_sps", runner=rname, mode=mode,
                                             draft=spec, k=k, tree=str(tree) if tree else None,
                                             error=f"{type(err).__name__}: {err}"))
                            continue
                        extra = dict(draft=spec, tau=gen.tau)
                        if greedy:
                            extra["equals_ars"] = bool(torch.equal(gen.tokens.cpu(), ars_tokens[rname]))
                        record(kind, pid, "ours_sps", rname, mode, k, str(tree) if tree else None, s,
                               len(gen.tokens), extra)
            print(f"{mode} {kind} {pid}: {len(rows)} rows", flush=True)
            (out / "rows.json").write_text(json.dumps(rows, default=str))  # kept if a later step fails

    # pass costs and each draft's c on every runner
    prefix = prompts[0][2][:64].to(device)
    costs = {}
    for rname, runner in runners.items():
        costs[rname] = measure_cost_table({rname: (runner, None)}, prefix, range(1, 9), reps=5,
                                          extra_sizes=[16, 33, 65] + [t.nodes + 1 for t in trees])[rname]
        for spec, draft in drafts.items():
            if not isinstance(draft, str) and spec != "lookup":
                entry = measure_cost_table({spec: (runner, draft)}, prefix, [1], reps=5)[spec]
                costs[rname].setdefault("c", {})[spec] = entry.get("c")
                costs[rname].setdefault("draft_ms", {})[spec] = entry.get("draft_ms")
    summary = summarise(rows, ratio_ci)
    info = {"gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "transformers": __import__("transformers").__version__, "host": platform.node(),
            "cpu": __import__("specrepro.engines.machine", fromlist=["describe_cpu"]).describe_cpu(),
            "args": vars(args), "capture_seconds": capture, "weights": "random" if args.random_weights else "real",
            "drafts_not_loaded": {k: v for k, v in drafts.items() if isinstance(v, str)}}
    result = {"info": info, "summary": summary, "costs": _jsonable(costs), "rows": rows}
    (out / "headline.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "headline.md").write_text(table(summary, info))
    print(table(summary, info))
    return result


def summarise(rows, ratio_ci) -> list[dict]:
    """Per (task, mode, impl, runner, draft, K, tree): median ms/token over prompts, and the paired speedup
    over HF static-cache generate (ratio of summed ms/token, bootstrap CI over prompts)."""
    ok = [r for r in rows if "error" not in r]
    base = {(r["task"], r["mode"], r["prompt"]): r["ms_per_token"] for r in ok if r["impl"] == "hf_generate_static"}
    groups = {}
    for r in ok:
        key = (r["task"], r["mode"], r["impl"], r["runner"], r.get("draft"), r["k"], r["tree"])
        groups.setdefault(key, []).append(r)
    out = []
    for (task, mode, impl, runner, draft, k, tree), rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        paired = [(base[(task, mode, r["prompt"])], r["ms_per_token"]) for r in rs if (task, mode, r["prompt"]) in base]
        speedup = ratio_ci([a for a, _ in paired], [b for _, b in paired]) if paired else (None, None, None)
        row = dict(task=task, mode=mode, impl=impl, runner=runner, draft=draft, k=k, tree=tree, n=len(rs),
                   ms_per_token=statistics.median(r["ms_per_token"] for r in rs),
                   x_hf_static=speedup[0], ci=list(speedup[1:]))
        if impl == "ours_sps":
            row["tau"] = statistics.median(r["tau"] for r in rs)
            if mode == "greedy":
                row["greedy_equal_to_ars"] = sum(r["equals_ars"] for r in rs)
        out.append(row)
    errors = {}
    for r in rows:
        if "error" in r:
            errors.setdefault((r["runner"], r.get("draft"), r["k"], r["tree"]), r["error"])
    out += [dict(error=e, runner=k[0], draft=k[1], k=k[2], tree=k[3]) for k, e in errors.items()]
    return out


def table(summary, info) -> str:
    head = (f"{'RANDOM weights: tau and SpS speedups are meaningless here; ' if info['weights'] == 'random' else ''}"
            f"GPU {info['gpu']}; torch {info['torch']} (CUDA {info['cuda']}); transformers {info['transformers']}; "
            f"host CPU {info['cpu']}\n\n| task | mode | what | runner | K / tree | n | ms/token | x HF static [95% CI] | tau |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in summary:
        if "error" in r:
            lines.append(f"| | | {r['draft']} FAILED: {r['error'][:80]} | {r['runner']} | {r['tree'] or r['k']} | | | | |")
            continue
        what = r["impl"] + (f" {r['draft']}" if r.get("draft") else "")
        x = "" if r["x_hf_static"] is None else f"{r['x_hf_static']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"
        tau = f"{r['tau']:.2f}" if "tau" in r else ""
        lines.append(f"| {r['task']} | {r['mode']} | {what} | {r['runner']} | {r['tree'] or r['k'] or ''} | {r['n']} "
                     f"| {r['ms_per_token']:.2f} | {x} | {tau} |")
    return head + "\n".join(lines) + "\n"


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


if __name__ == "__main__":
    main()
