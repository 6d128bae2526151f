"""The GPU check in one command for a short GPU lease: a bare image with python3, torch and transformers, no
internet, minutes of device time. `bash tests/gpu_session.sh` runs this file; see docs/gpu.md.

    python3 tests/gpu_session.py [--out DIR] [--device cuda|cpu] [--deadline 480] [--sizes full|tiny]
                                 [--stages versions,headline,costs,compile,tests,notebooks]

Finds what tests/gpu_carry.sh packed in .gpu-carry/ (config and tokenizer, data files, optional real
weights) beside the tree, gives every stage a timeout inside one overall deadline, runs the headline first,
and leaves exactly two files in --out: summary.json (every stage's status, seconds, expected seconds on an
H200, and its numbers) and gpu-check.tar.gz (each stage's JSON and log). Stages, in order:

- versions: torch, CUDA, transformers, the GPU, the commit;
- headline: our captured ArS (StaticRunner, CUDA graphs) against HF `generate(cache_implementation="static")`
  with `max_cache_len` fixed (so HF compiles its decode step once, not once per prompt length), ms/token on
  prompts of several lengths; v(K) of the captured runner; host syncs per token (torch.cuda sync debug mode) for ArS and for SpS with a small draft;
- costs: c (a draft step over a one-token target pass, both captured) of each draft kind (feature, heads,
  small, truncated:4, a whole smaller model) at the SmolLM2-135M, SmolLM2-1.7B and a Qwen2.5-7B shape
  beside its Qwen2.5-0.5B draft, random weights: the numbers that choose the gpu profile's pair;
- compile: the torch.compile'd block captured over every bucket for two runners, then passes under Dynamo's
  fail_on_recompile stance: any recompile or capture fallback fails the stage;
- tests: the CUDA tests (SPECREPRO_REQUIRE_CUDA=1, SPECREPRO_STRICT_GRAPHS=1): greedy parity, chi-square;
- notebooks: tests/gpu_check.sh's notebook stage, skipped where papermill or jupytext is not installed.

Random weights make tau and speedups of SpS meaningless; pass costs, c, v(K) and ArS times do not depend on
them. --sizes tiny shrinks every shape (the CPU rehearsal in tests/test_gpu_session.py).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARRY = ROOT / ".gpu-carry"
STAGES = ["versions", "headline", "costs", "compile", "tests", "notebooks"]
# seconds each stage is expected to take on one H200 (estimates from the 2026-12-04 run's pass costs and
# capture times; the first run on a GPU replaces them) and the most it may take
EXPECTED_H200 = {"versions": 5, "headline": 90, "costs": 120, "compile": 90, "tests": 100, "notebooks": 120}
CAP = {"versions": 30, "headline": 180, "costs": 200, "compile": 150, "tests": 180, "notebooks": 200}

# Llama-family shapes: (hidden, layers, heads, kv heads, ffn, vocab); the Qwen2.5 shapes without their qkv bias
SHAPES = {
    "135m": (576, 30, 9, 3, 1536, 49152),        # SmolLM2-135M
    "1.7b": (2048, 24, 32, 32, 8192, 49152),     # SmolLM2-1.7B
    "7b": (3584, 28, 28, 4, 18944, 152064),      # Qwen2.5-7B
    "0.5b": (896, 24, 14, 2, 4864, 152064),      # Qwen2.5-0.5B (the 7B shape's model draft)
}
TINY = {"135m": (64, 3, 4, 2, 128, 256), "1.7b": (128, 2, 4, 4, 256, 256), "7b": (128, 2, 4, 2, 256, 512),
        "0.5b": (32, 2, 2, 1, 64, 512)}
MODEL_DRAFT = {"135m": None, "1.7b": "135m", "7b": "0.5b"}  # the whole-model draft measured beside each target


# ------------------------------------------------------------------ the driver

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "figures/gpu-check"))
    ap.add_argument("--device", default=os.environ.get("DEVICE", "cuda"))
    ap.add_argument("--deadline", type=float, default=float(os.environ.get("DEADLINE", 480)))
    ap.add_argument("--sizes", default=os.environ.get("SIZES", "full"), choices=["full", "tiny"])
    ap.add_argument("--stages", default=os.environ.get("STAGES", ",".join(STAGES)))
    ap.add_argument("--stage", help=argparse.SUPPRESS)  # internal: run one stage in this process
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.stage:
        return run_stage(args)
    stages = [s for s in args.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        sys.exit(f"unknown stage(s) {unknown}: choose from {','.join(STAGES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    work.mkdir(exist_ok=True)
    env = stage_env(args)
    t_end = time.monotonic() + args.deadline
    summary = {"device": args.device, "sizes": args.sizes, "deadline_s": args.deadline, "carried": carried(),
               "stages": [], "results": {}}
    print(f"gpu session: stages {stages}, deadline {args.deadline:.0f} s, carried {summary['carried']}", flush=True)
    for name in stages:
        left = t_end - time.monotonic()
        entry = {"stage": name, "expected_h200_s": EXPECTED_H200[name]}
        if left < 5:
            entry.update(status="not run", reason="the overall deadline was reached")
            summary["stages"].append(entry)
            continue
        limit = min(CAP[name], left)
        log, result = work / f"{name}.log", work / f"{name}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--stage", name, "--json", str(result),
               "--device", args.device, "--sizes", args.sizes, "--out", str(out)]
        print(f"== {name} (limit {limit:.0f} s, expected on an H200 ~{EXPECTED_H200[name]} s)", flush=True)
        t0 = time.monotonic()
        with open(log, "w") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
        entry["seconds"] = round(time.monotonic() - t0, 1)
        data = json.loads(result.read_text()) if result.exists() else {}
        if rc is None:
            entry.update(status="timeout", reason=f"killed after {limit:.0f} s")
        elif rc == 0:
            entry["status"] = data.pop("status", "ok")
            if "reason" in data:
                entry["reason"] = data.pop("reason")
        else:
            entry.update(status="failed", reason=f"exit {rc}: " + tail(log))
        summary["results"][name] = data
        summary["stages"].append(entry)
        print(f"   {name}: {entry['status']} in {entry['seconds']} s" + (f" ({entry['reason']})" if 'reason' in entry
                                                                          else ""), flush=True)
    summary["ok"] = all(s["status"] in ("ok", "skipped") for s in summary["stages"])
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    with tarfile.open(out / "gpu-check.tar.gz", "w:gz") as tar:
        for f in sorted(work.iterdir()):
            tar.add(f, arcname=f.name)
    shutil.rmtree(work)
    return 0 if summary["ok"] else 1


def stage_env(args) -> dict:
    env = dict(os.environ)
    paths = [str(ROOT)] + ([str(CARRY / "site")] if (CARRY / "site").is_dir() else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(PYTHONUNBUFFERED="1", MPLBACKEND="agg", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               SPECREPRO_STRICT_GRAPHS="1")
    if args.device != "cpu":
        env["SPECREPRO_REQUIRE_CUDA"] = "1"
    return env


def carried() -> dict:
    """What tests/gpu_carry.sh put beside the tree (the paths are relative to the repository root)."""
    found = {}
    for name in ("site", "weights-1", "weights-2"):
        p = CARRY / name
        if p.exists():
            found[name] = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return found


def tail(log: Path, n: int = 300) -> str:
    text = log.read_text(errors="replace").strip() if log.exists() else ""
    return text[-n:].replace("\n", " | ")


# ------------------------------------------------------------------ stages (each in its own process)

def run_stage(args) -> int:
    import torch

    result = {}
    try:
        result = globals()[f"stage_{args.stage}"](args, torch.device(args.device)) or {}
    finally:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 1 if result.get("status") == "failed" else 0


def stage_versions(args, device):
    import torch
    import transformers

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "python": platform.python_version(), "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None}
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                        text=True).stdout.strip() or None
    except OSError:
        info["commit"] = None
    from specrepro.engines.machine import describe_cpu
    from specrepro.engines.runners import cache_argument

    info.update(host_cpu=describe_cpu(), hf_cache_argument=cache_argument())
    print(info)
    return info


def build(shape: str, device, dtype, tiny: bool, seed: int = 0):
    """A random Llama-family model of a named shape (real weights where .gpu-carry/weights holds them)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv, ffn, vocab = (TINY if tiny else SHAPES)[shape]
    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=ffn, vocab_size=vocab, max_position_embeddings=2048,
                      rope_theta=100000.0, tie_word_embeddings=shape in ("135m", "0.5b"), eos_token_id=None,
                      pad_token_id=0, bos_token_id=0)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    return model


def real_target(device, dtype):
    """The real SmolLM2-135M from the two-call transfer (docs/gpu.md): the GGUF's two halves in
    .gpu-carry/weights-1 and .gpu-carry/weights-2, joined here; None when they are not both present."""
    parts = sorted(CARRY.glob("weights-*/*.gguf.part*"), key=lambda p: p.name)
    if len(parts) < 2:
        return None
    from transformers import AutoModelForCausalLM

    folder = CARRY / "weights"
    folder.mkdir(exist_ok=True)
    gguf = folder / parts[0].name.split(".part")[0]
    if not gguf.exists():
        with open(gguf, "wb") as out:
            for p in parts:
                out.write(p.read_bytes())
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf.name, dtype=dtype)
    return model.to(device).eval()


def timed(fn, device, reps):
    import torch

    times, out = [], None
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def stage_headline(args, device):
    import torch

    import specrepro as sr
    from specrepro.engines.static import StaticRunner
    from specrepro.tuning.costs import measure_cost_table

    tiny = args.sizes == "tiny"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    n_new, reps = (8, 1) if tiny else (128, 3)
    lengths = (5, 11) if tiny else (40, 90, 150)
    model = real_target(device, dtype)
    weights = "real" if model is not None else "random"
    model = model or build("135m", device, dtype, tiny)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (n,), generator=g).to(device) for n in lengths]
    capacity = max(lengths) + n_new + 72
    runner = StaticRunner(model, dtype=dtype, capacity=capacity)  # graphs "cuda" on a GPU, "none" on a CPU
    capture_s = runner.warmup(tuple(range(1, 9)) + (16, 32, 64))
    out = {"weights": weights, "dtype": str(dtype), "graphs": runner.graphs, "new_tokens": n_new, "prompt_lengths":
           list(lengths), "capture_seconds": round(capture_s, 2)}

    from transformers import GenerationConfig

    # max_cache_len where this transformers has it; else the longest-prompt warm-up sizes HF's cache
    sized = {"max_cache_len": capacity} if hasattr(GenerationConfig(), "max_cache_len") else {}
    out["hf_max_cache_len"] = bool(sized)

    def hf(ids):
        kw = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, pad_token_id=0,
                  cache_implementation="static", **sized)
        return model.generate(ids.view(1, -1), **kw)[0, ids.shape[0]:]

    from torch._dynamo.utils import counters

    t0 = time.perf_counter()
    hf(prompts[-1])  # warm-up on the longest prompt: HF's cache is sized once (max_cache_len) and compiled
    out["hf_warmup_seconds"] = round(time.perf_counter() - t0, 2)
    graphs_before = counters["stats"]["unique_graphs"]
    rows = []
    for ids in prompts:
        s_hf, hf_tokens = timed(lambda: hf(ids), device, reps)
        s_ours, gen = timed(lambda: sr.autoregressive_generate(runner, ids, max_new_tokens=n_new, temperature=0),
                            device, reps)
        rows.append({"prompt_tokens": int(ids.shape[0]), "hf_static_ms_per_token": 1e3 * s_hf / n_new,
                     "ours_ms_per_token": 1e3 * s_ours / n_new, "x_hf_static": s_hf / s_ours,
                     "greedy_equal_to_hf": bool(torch.equal(gen.tokens.cpu(), hf_tokens.cpu()))})
        print(rows[-1], flush=True)
    out["rows"] = rows
    out["hf_graphs_compiled_while_timed"] = counters["stats"]["unique_graphs"] - graphs_before  # 0: no recompile
    out["x_hf_static_median"] = statistics.median(r["x_hf_static"] for r in rows)
    costs = measure_cost_table({"static": (runner, None)}, prompts[0][:4], range(1, 9), reps=5,
                               extra_sizes=[16, 33, 65])["static"]
    out["target_ms"], out["v"] = costs["target_ms"], costs["v"]
    # host synchronisations, as torch's CUDA sync debug mode sees them (None off CUDA): ArS per token, SpS with a
    # small model draft per target call (each round must read its accepted count once)
    from specrepro.drafts import SmallDraft

    draft = SmallDraft.from_config(model, {"hidden": 32, "head_dim": 8, "ffn": 64} if tiny else {})
    n_ars, gen = count_syncs(lambda: sr.autoregressive_generate(runner, prompts[0], max_new_tokens=n_new,
                                                                temperature=0), device)
    out["syncs_per_token_ars"] = None if n_ars is None else len(n_ars) / len(gen.tokens)
    n_sps, gen = count_syncs(lambda: sr.speculative_generate(runner, draft, prompts[0], max_new_tokens=n_new,
                                                             lookahead=4, temperature=0), device)
    out["syncs_per_target_call_sps"] = None if n_sps is None else len(n_sps) / gen.target_calls
    out["sync_examples"] = sorted(set((n_ars or []) + (n_sps or [])))[:8]
    out["captures_after_timing"] = runner.captures
    if runner.graphs != ("cuda" if device.type == "cuda" else "none"):
        out.update(status="failed", reason=f"the runner fell back to graphs={runner.graphs!r}")
    return out


def count_syncs(fn, device):
    """(the sync warnings torch.cuda.set_sync_debug_mode("warn") raised while fn ran, or None off CUDA;
    fn's result)."""
    import warnings

    import torch

    if device.type != "cuda":
        return None, fn()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return [str(w.message)[:200] for w in seen if "synchroniz" in str(w.message).lower()], result


def stage_costs(args, device):
    import torch

    from specrepro.drafts import FeatureDraft, HeadsDraft, ModelDraft, SmallDraft, TruncatedDraft
    from specrepro.drafts.small import init_small
    from specrepro.engines.static import StaticRunner
    from specrepro.tuning.costs import measure_cost_table

    tiny = args.sizes == "tiny"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    reps = 3 if tiny else 7
    out = {}
    for shape in ("135m", "1.7b", "7b"):
        t0 = time.perf_counter()
        target = build(shape, device, dtype, tiny)
        vocab = target.config.vocab_size
        head_vocab = min(16384, vocab)
        runner = StaticRunner(target, dtype=dtype, capacity=256)
        def in_dtype(draft):  # as specrepro.drafts.artifacts.load casts a trained net: the target's dtype
            draft.net.to(dtype)
            draft.net.attach(target, dtype)
            return draft

        drafts = {
            "feature": lambda: in_dtype(FeatureDraft.init_for(target, {"head_vocab": head_vocab,
                                                                       "ffn": 256 if tiny else 1536})),
            "heads": lambda: in_dtype(HeadsDraft.init_for(target, {"head_vocab": head_vocab})),
            "small": lambda: SmallDraft(init_small(target, {"hidden": 32, "head_dim": 8, "ffn": 64} if tiny else {})
                                        .to(device=device, dtype=dtype).eval()),
            "truncated:4": lambda: TruncatedDraft(target, n_layers=min(4, target.config.num_hidden_layers - 1)),
        }
        if MODEL_DRAFT[shape]:
            other = MODEL_DRAFT[shape]

            def model_draft(other=other):
                m = build(other, device, dtype, tiny, seed=1)  # the same vocabulary as its target
                return ModelDraft(StaticRunner(m, dtype=dtype, capacity=256))
            drafts[f"model:{other}"] = model_draft
        entry = {"layers": target.config.num_hidden_layers, "hidden": target.config.hidden_size, "c": {},
                 "draft_ms": {}, "errors": {}}
        prefix = torch.randint(3, vocab, (24,), generator=torch.Generator().manual_seed(1))
        for kind, make in drafts.items():
            try:
                table = measure_cost_table({kind: (runner, make())}, prefix, [1], reps=reps)[kind]
                entry["c"][kind], entry["draft_ms"][kind] = table.get("c"), table.get("draft_ms")
                entry["target_ms_1"] = table["target_ms"][1]
            except Exception as err:  # noqa: BLE001 - one draft kind failing is recorded, the rest measured
                entry["errors"][kind] = f"{type(err).__name__}: {err}"[:300]
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        out[shape] = entry
        print(shape, entry, flush=True)
        del target, runner, drafts
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if any(e["errors"] for e in out.values()):
        out.update(status="failed", reason="some draft kinds failed: see errors")
    return out


def stage_compile(args, device):
    import torch

    from specrepro.engines.static import StaticRunner

    tiny = args.sizes == "tiny"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    buckets = (1, 2, 4, 8)
    runners = [StaticRunner(build(s, device, dtype, tiny, seed=i), dtype=dtype, capacity=128, buckets=buckets,
                            graphs="compile", compile_backend=backend) for i, s in enumerate(("135m", "1.7b"))]
    t0 = time.perf_counter()
    for r in runners:
        r.warmup()
    out = {"backend": backend, "capture_seconds": round(time.perf_counter() - t0, 1)}
    ids = torch.randint(3, 200, (40,), generator=torch.Generator().manual_seed(2))
    with torch.compiler.set_stance("fail_on_recompile"):
        times = []
        for r in runners:
            r.forward(ids[:9])
            for n in (1, 2, 3, 5, 8, 1):
                t = time.perf_counter()
                r.forward(ids[9 : 9 + n])
                times.append((n, time.perf_counter() - t))
                r.rollback(9)
    out["pass_ms"] = [(n, round(1e3 * s, 3)) for n, s in times]
    out["graphs"] = [r.graphs for r in runners]
    out["captures"] = [r.captures for r in runners]
    if out["graphs"] != ["compile", "compile"]:
        out.update(status="failed", reason="a runner fell back from its compiled graphs")
    return out


def stage_tests(args, device):
    if device.type == "cuda":
        targets = ["tests/engines/test_devices.py", "-k", "cuda", "tests/engines/test_static.py",
                   "tests/engines/test_gpu_session_runners.py"]
    else:  # the rehearsal: the same command on a few quick CPU tests
        targets = ["tests/engines/test_gpu_session_runners.py", "-k", "trap or cache_argument"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
           "-W", "error::specrepro.engines.static.GraphFallbackWarning", *targets]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    print(proc.stdout[-4000:], proc.stderr[-2000:])
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    out = {"command": " ".join(cmd[1:]), "result": last}
    if proc.returncode != 0:
        out.update(status="failed", reason=last)
    return out


def stage_notebooks(args, device):
    import importlib.util

    missing = [m for m in ("papermill", "jupytext", "datasets") if importlib.util.find_spec(m) is None]
    if missing:
        return {"status": "skipped", "reason": f"not installed here: {', '.join(missing)}"}
    env = dict(os.environ, STAGES="2", DEVICE=args.device, OUT=str(Path(args.json).parent / "notebooks"), PY=sys.executable)
    proc = subprocess.run(["bash", "tests/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    print(proc.stdout[-4000:], proc.stderr[-2000:])
    return {} if proc.returncode == 0 else {"status": "failed", "reason": proc.stdout.strip()[-300:]}


if __name__ == "__main__":
    sys.exit(main())
