"""Where a one-token pass of the lean runner goes, per op (torch.profiler), at each thread count.

    python -m specrepro.bench.ops --threads 1,2 --context 300 --out figures/bench/ops-profile

Per thread count: the unprofiled median ms of a one-token pass after `context` cached tokens (every runner
and llama.cpp peer interleaved, pass by pass), and the
profiler's self CPU time per op name per pass, grouped into what the pass does (linear layers, attention
products, RoPE and elementwise, norms, cache writes, views and copies). The profiler adds its own cost per
op, so the groups sum to more than the unprofiled pass: read them as shares. With --llamacpp, llama.cpp's
one-token pass over the same GGUF kinds at the same context is timed beside (its ops are not visible here).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

# op name -> group; anything else is "other"
GROUPS = {
    "linear": ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm", "aten::linear", "mkldnn::_linear"),
    "attention": ("aten::bmm", "aten::_softmax", "aten::masked_fill", "aten::_scaled_dot_product"),
    "elementwise": ("aten::mul", "aten::add", "aten::neg", "aten::silu", "aten::cat", "aten::sub"),
    "norm": ("aten::_fused_rms_norm", "aten::rms_norm", "aten::pow", "aten::mean", "aten::rsqrt", "aten::sum",
             "aten::div_"),
    "copy": ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::index"),
    "views": ("aten::slice", "aten::view", "aten::reshape", "aten::transpose", "aten::expand", "aten::as_strided",
              "aten::select", "aten::narrow", "aten::split", "aten::unsqueeze", "aten::t", "aten::_unsafe_view",
              "aten::empty_strided", "aten::empty", "aten::to", "aten::embedding"),
}


def group_of(name: str) -> str:
    for group, names in GROUPS.items():
        if any(name.startswith(n) for n in names):
            return group
    return "other"


def one_token_ms(runner, context: int, reps: int = 30, warmup: int = 3, n: int = 1) -> float:
    """Median ms of runner.forward over one token (or n) after `context` cached tokens (rolled back each time)."""
    tok = torch.arange(5, 5 + n)
    for _ in range(warmup):
        runner.rollback(context)
        runner.forward(tok)
    times = []
    for _ in range(reps):
        runner.rollback(context)
        t = time.perf_counter()
        runner.forward(tok)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def profile_ops(runner, context: int, passes: int = 10) -> dict:
    """{op name: self CPU ms per one-token pass} and the same per group, under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    tok = torch.tensor([5])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(passes):
            runner.rollback(context)
            runner.forward(tok)
    ops = {e.key: dict(ms=e.self_cpu_time_total / 1e3 / passes, calls=e.count / passes)
           for e in prof.key_averages() if e.self_cpu_time_total > 0}
    groups: dict[str, float] = {}
    for name, v in ops.items():
        groups[group_of(name)] = groups.get(group_of(name), 0.0) + v["ms"]
    return {"ops": dict(sorted(ops.items(), key=lambda kv: -kv[1]["ms"])), "groups": groups,
            "profiled_ms": sum(groups.values())}


def stream_gbps(reps: int = 5, mb: int = 256) -> float:
    """Measured memory bandwidth, GB/s: the median time of a sum over `mb` MB of float32 (read once)."""
    x = torch.ones(mb * 2**18)
    x.sum()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t)
    return x.numel() * 4 / statistics.median(times) / 1e9


def native_gmacs(rows: int = 12, reps: int = 20, weights: str = "bfloat16") -> float:
    """Measured multiply-adds per second (G) of the native product kernel with its weights in cache: `rows` rows
    times an 8192 x 576 bfloat16 (or int8: weights="int8") weight (9 MB / 5 MB, resident in the last-level cache
    after the first call)."""
    from ..engines import native

    g = torch.Generator().manual_seed(0)
    packed = (native.pack_int8 if weights == "int8" else native.pack)([torch.randn(8192, 576, generator=g)])
    x = torch.randn(rows, 576, generator=g)
    native.linear(x, packed)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        native.linear(x, packed)
        times.append(time.perf_counter() - t)
    return rows * 8192 * 576 / statistics.median(times) / 1e9


def roofline(model, context: int, sizes, measured: dict, weights: str = "bfloat16") -> dict:
    """Per number of rows n: the memory floor (the bytes a pass must stream: bfloat16 weights with the LM head, or
    int8 ones with a float32 scale per 32, and the float32 KV cache it reads, over the measured bandwidth), the
    compute roof (its multiply-adds over the native kernel's measured rate for that weight kind) and the
    measured pass (ms)."""
    c = model.config
    heads, kv = c.num_attention_heads, c.num_key_value_heads
    d = getattr(c, "head_dim", None) or c.hidden_size // heads
    h, inter, layers = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    params = layers * (h * (heads + 2 * kv) * d + heads * d * h + 3 * h * inter) + c.vocab_size * h
    kv_bytes = 2 * layers * kv * d * 4 * context
    weight_bytes = params + params // 32 * 4 if weights == "int8" else 2 * params
    gbps, gmacs = stream_gbps(), native_gmacs() if weights == "bfloat16" else native_gmacs(weights=weights)
    rows = {}
    for n in sizes:
        macs = n * params + 2 * layers * heads * d * (n * context + n * (n + 1) // 2)
        floor = (weight_bytes + kv_bytes) / gbps / 1e6
        roof = macs / gmacs / 1e6
        rows[n] = {"floor_ms": floor, "roof_ms": roof, "measured_ms": measured.get(n),
                   "measured_over_bound": measured[n] / max(floor, roof) if n in measured else None}
    return {"stream_gbps": gbps, "kernel_gmacs": gmacs, "weights": weights, "weight_bytes": weight_bytes,
            "kv_bytes": kv_bytes, "rows": rows}


def greedy_agreement(model, tokenizer, runners: dict, prompts: int, new_tokens: int = 64) -> dict:
    """How alike two targets write: greedy ArS from `prompts` held-out news summarisation prompts (the offline
    news set) with each runner; per prompt, the fraction of the new-token positions where the runners' tokens
    agree and the length of their common prefix. runners: {name: runner}, the first the reference."""
    from ..generate import autoregressive_generate
    from ..tasks.news import load_news, summarisation_prompt

    names = list(runners)
    rows = []
    for example in load_news("eval", n=prompts):
        text = summarisation_prompt(example, tokenizer, max_document_tokens=200)
        ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
        out = {name: autoregressive_generate(r, ids, max_new_tokens=new_tokens, temperature=0.0).tokens
               for name, r in runners.items()}
        ref = out[names[0]]
        row = {"id": example.id, "prompt_tokens": len(ids)}
        for name in names[1:]:
            n = min(len(ref), len(out[name]))
            same = (ref[:n] == out[name][:n]).long()
            row[name] = {"identical_fraction": same.float().mean().item() if n else 1.0,
                         "common_prefix": int(same.cumprod(0).sum()), "tokens": n}
        rows.append(row)
    summary = {name: {"identical_fraction_mean": statistics.mean(r[name]["identical_fraction"] for r in rows),
                      "common_prefix_mean": statistics.mean(r[name]["common_prefix"] for r in rows)}
               for name in names[1:]}
    return {"reference": names[0], "new_tokens": new_tokens, "prompts": rows, "summary": summary}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m specrepro.bench.ops", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--runners", default="onednn@bfloat16,lean@bfloat16,onednn@float32",
                    help="lean, onednn or native (LeanRunner's backend) or frozen (specrepro.engines.frozen) @ float32 "
                         "or bfloat16 (native: bfloat16 only; its pass is one C++ op here); int8@bfloat16 is the "
                         "native pass with int8 weights (another target, LeanRunner(weights='int8'))")
    ap.add_argument("--int8", action="store_true",
                    help="also run int8@bfloat16 (the native pass with int8 weights) beside the other runners, "
                         "interleaved with them")
    ap.add_argument("--llamacpp", default="", help="also time llama.cpp's one-token pass of these GGUF kinds, e.g. q4_1,f16")
    ap.add_argument("--passes", type=int, default=10, help="one-token passes under the profiler per runner")
    ap.add_argument("--reps", type=int, default=20, help="interleaved unprofiled one-token passes per runner")
    ap.add_argument("--sizes", default="1",
                    help="also time passes over these numbers of tokens (interleaved like the one-token pass), e.g. "
                         "1,2,3,4,5,9,17: v(K) = pass(K + 1) / pass(1)")
    ap.add_argument("--roofline", action="store_true",
                    help="for each native runner and thread count, print per --sizes the memory floor, the compute "
                         "roof and the measured pass")
    ap.add_argument("--agreement", type=int, default=0,
                    help="also generate 64 greedy tokens from this many held-out news prompts with every runner and "
                         "report how often each agrees with the first (e.g. int8 against bfloat16)")
    ap.add_argument("--out", default="figures/bench/ops-profile")
    args = ap.parse_args(argv)
    from ..engines.lean import LeanRunner
    from ..engines.machine import cpu_info, describe_cpu
    from ..files import write_json
    from ..models import load_model
    from . import llamacpp

    if args.context < 1:
        ap.error(f"--context must be >= 1, got {args.context}")
    threads = [int(t) for t in args.threads.split(",")]
    kinds = llamacpp.check_peers(args.llamacpp.split(","))
    model, tokenizer = load_model("smollm2-135m-instruct")
    prefix = torch.randint(0, model.config.vocab_size, (args.context,), generator=torch.Generator().manual_seed(0))
    runners = {}
    specs = args.runners.split(",") + (["int8@bfloat16"] if args.int8 and "int8@bfloat16" not in args.runners else [])
    for spec in specs:
        kind, _, dtype = spec.partition("@")
        if kind not in ("lean", "onednn", "native", "frozen", "int8") or dtype not in ("float32", "bfloat16"):
            ap.error(f"--runners: {spec!r} is not lean|onednn|native|frozen|int8@float32|bfloat16")
        if kind == "int8":
            if dtype != "bfloat16":
                ap.error(f"--runners: {spec!r}: the int8 native pass runs with dtype bfloat16")
            runners[spec] = LeanRunner(model, dtype=torch.bfloat16, backend="native", weights="int8",
                                       capacity=args.context + 8)
            continue
        if kind == "frozen":  # the compiled one-token step (specrepro.engines.frozen); compiled on first use
            from ..engines.frozen import FrozenRunner

            runners[spec] = FrozenRunner(model, dtype=getattr(torch, dtype), capacity=args.context + 8)
            continue
        runners[spec] = LeanRunner(model, dtype=getattr(torch, dtype), backend="eager" if kind == "lean" else kind,
                                   capacity=args.context + 8)
    from ..experiments.results import RunRecord

    record = RunRecord(args)
    result = {"cpu": describe_cpu(), "cpu_info": cpu_info(), "context": args.context, "by_threads": {}}
    if any(spec.startswith(("native", "int8")) for spec in runners):
        from ..engines import native

        result["native"] = native.describe()
    for n in threads:
        torch.set_num_threads(n)
        entry = {}
        peers = {kind: llamacpp.LlamaCppPeer(llamacpp.peer_path(kind), threads=n, n_ctx=args.context + 64, name=kind)
                 for kind in kinds}
        for spec, r in runners.items():
            r.reset()
            r.prefill(prefix)
            if getattr(r, "compile_seconds", 0) is None:  # compile (or load from inductor's cache) outside the timing
                r.forward(torch.tensor([5]))
                result.setdefault("compile_seconds", {})[spec] = r.compile_seconds
        # the one-token passes interleaved (ours and llama.cpp's), so that load from other work hits all alike
        times: dict[str, list[float]] = {name: [] for name in [*runners, *(f"llamacpp:{k}" for k in peers)]}
        for _ in range(args.reps):
            for spec, r in runners.items():
                times[spec].append(one_token_ms(r, args.context, reps=1, warmup=0))
            for kind, peer in peers.items():
                times[f"llamacpp:{kind}"].append(peer.pass_ms(prefix, 1, reps=1))
        entry = {name: {"one_token_ms": statistics.median(t), "samples": len(t)} for name, t in times.items()}
        sizes = sorted({int(k) for k in args.sizes.split(",")} | {1})
        if len(sizes) > 1:  # passes over 1 and more tokens, interleaved across runners and sizes: v(K) is a ratio
            # of passes timed side by side
            blocks = {spec: {k: [] for k in sizes} for spec in runners}
            for _ in range(args.reps):
                for spec, r in runners.items():
                    for k in sizes:
                        blocks[spec][k].append(one_token_ms(r, args.context, reps=1, warmup=0, n=k))
            for spec in runners:
                ms = {k: statistics.median(v) for k, v in blocks[spec].items()}
                entry[spec]["pass_ms"] = ms
                entry[spec]["v"] = {k - 1: ms[k] / ms[1] for k in ms if k > 1}
        if args.roofline:
            for spec in runners:
                if spec.startswith(("native", "int8")) and "pass_ms" in entry[spec]:
                    entry[spec]["roofline"] = roofline(model, args.context, sorted(entry[spec]["pass_ms"]),
                                                       entry[spec]["pass_ms"],
                                                       weights="int8" if spec.startswith("int8") else "bfloat16")
        for spec, r in runners.items():
            entry[spec].update(profile_ops(r, args.context, args.passes))
        result["by_threads"][n] = entry
        for spec, e in entry.items():
            groups = " ".join(f"{g} {ms:.1f}" for g, ms in sorted(e.get("groups", {}).items(), key=lambda kv: -kv[1]))
            print(f"{n} thread(s) {spec:22s} {e['one_token_ms']:6.1f} ms/pass   profiled: {groups}", flush=True)
            if "v" in e:
                print(f"{'':14s}{spec:22s} v(K): " + " ".join(f"{k}:{v:.2f}" for k, v in e["v"].items()), flush=True)
            if "roofline" in e:
                rl = e["roofline"]
                print(f"{'':14s}roofline: {rl['stream_gbps']:.1f} GB/s streamed, {rl['kernel_gmacs']:.0f} G multiply-adds/s "
                      "in cache\n" f"{'':14s}{'rows':>5s} {'floor ms':>9s} {'roof ms':>8s} {'pass ms':>8s} {'pass/bound':>10s}")
                for k, row in rl["rows"].items():
                    print(f"{'':14s}{k:5d} {row['floor_ms']:9.2f} {row['roof_ms']:8.2f} {row['measured_ms']:8.2f} "
                          f"{row['measured_over_bound']:10.2f}", flush=True)
    if args.agreement:
        torch.set_num_threads(threads[-1])
        result["greedy_agreement"] = greedy_agreement(model, tokenizer, runners, args.agreement)
        for name, row in result["greedy_agreement"]["summary"].items():
            print(f"greedy agreement with {result['greedy_agreement']['reference']}: {name} "
                  f"{row['identical_fraction_mean']:.2f} of tokens identical, common prefix "
                  f"{row['common_prefix_mean']:.1f} of 64 (mean of {args.agreement} prompts)", flush=True)
    result.update(record.meta())  # the run record at the top: this file has no "meta"
    write_json(f"{args.out}.json", result)
    return result


if __name__ == "__main__":
    main()
