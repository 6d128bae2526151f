"""Timing harness: our ArS and SpS (HF and lean runners) against HF generate(), in one run, interleaved.

Every configuration runs on the same prompts, target, draft and seeds; the order of configurations is
rotated at every repetition so that noise from other work on the machine hits all of them alike. Reported:
median ms/token and tokens/s, the median over (prompt, repetition) pairs of the ratio to our ArS, the
acceptance rate a, tau, the measured cost ratios c and v(K) (specrepro.tuning.costs, the measurement the notebooks
and tune use), and the Leviathan et al. prediction (1 - a^(K+1)) / ((1 - a)(K c + v(K))) beside the
measured speedup; the CPU model and flags and a memory-floor probe with every result.

    specrepro-bench --draft truncated:4 --ks 1,2,3,4,5,6,7 --prompts news --n-prompts 2 \
        --max-new-tokens 32 --dtype float32 --device cpu --out figures/bench
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

import torch

from .report import config_name, format_table, headline, summarise, write_results
from ..tuning.costs import measure_cost_table
from ..drafts.base import ModelDraft
from ..drafts.lookup import LookupDraft
from ..engines.lean import LeanRunner, is_llama_like, set_threads
from . import llamacpp
from .profiling import profile_sps
from ..engines.runners import HFRunner, input_device, split_reason
from ..engines.machine import copy_bandwidth, cpu_info, describe_cpu, weight_bytes
from ..generate import autoregressive_generate, speculative_generate
from ..algorithm.tree import parse_tree
from ..tuning.tune import tune
from ..experiments.workloads import builtin_prompts, load_draft, parse_ks, task_prompts


@dataclass(frozen=True)
class Config:
    """One timed configuration. impl: ours_ars, ours_sps, hf_generate, hf_assisted, llamacpp (a peer's plain decoding)."""

    impl: str
    runner: str  # ours: "hf", "lean" or "compiled" (lean under torch.compile); "hf" for HF generate; llamacpp: the peer
    k: int  # lookahead; 0 for ArS
    mode: str  # "greedy" or "sample"
    schedule: str = ""  # HF assisted: "constant" or "heuristic"; ours: "adaptive", or "tree<spec>" (k = depth)

    @property
    def name(self) -> str:
        return config_name(self.impl, self.runner, self.mode, self.k, self.schedule)


def make_configs(ks, modes=("greedy", "sample"), runners=("hf", "lean"), hf=True, sps=True,
                 adaptive: bool = False, hf_schedules=("constant", "heuristic"), trees=(), peers=()) -> list[Config]:
    """Every configuration of one run. adaptive: also our SpS with the confidence stop at K = max(ks);
    trees: also our SpS verifying each of these TreeSpecs per target call; peers: llama.cpp's plain decoding
    of these GGUF kinds (specrepro.bench.llamacpp)."""
    out = []
    for mode in modes:
        out += [Config("llamacpp", p, 0, mode) for p in peers]
        out += [Config("ours_ars", r, 0, mode) for r in runners]
        if sps:
            out += [Config("ours_sps", r, k, mode) for r in runners for k in ks]
            out += [Config("ours_sps", r, t.depth, mode, f"tree{t}") for r in runners for t in trees]
            if adaptive:
                out += [Config("ours_sps", r, max(ks), mode, "adaptive") for r in runners]
        if hf:
            out.append(Config("hf_generate", "hf", 0, mode))
            if sps:
                out += [Config("hf_assisted", "hf", k, mode, s) for s in hf_schedules for k in ks]
    return out


RUNNER_KINDS = ("hf", "lean", "onednn", "native", "compiled", "frozen", "tuned")


def parse_runner(spec: str, dtype: torch.dtype) -> tuple[str, torch.dtype]:
    """"lean", "onednn@bfloat16", ... -> (kind, compute dtype); "hf" and "tuned" take no dtype."""
    kind, _, name = spec.partition("@")
    if kind not in RUNNER_KINDS:
        raise ValueError(f"unknown runner {spec!r}: use {', '.join(RUNNER_KINDS)}, optionally lean/onednn/compiled/frozen"
                         "@float32 or @bfloat16")
    if spec == "native@int8":  # the int8-weight target (LeanRunner weights="int8"): another model, named apart
        return "native@int8", torch.bfloat16
    if name and (kind in ("hf", "tuned") or name not in ("float32", "bfloat16")):
        raise ValueError(f"runner {spec!r}: only lean, onednn, compiled and frozen take @float32 or @bfloat16")
    if kind == "native":  # the native pass computes with bfloat16 weights (specrepro.engines.native)
        if name not in ("", "bfloat16"):
            raise ValueError(f"runner {spec!r}: the native pass takes @bfloat16 (default) or @int8 weights")
        return kind, torch.bfloat16
    return kind, getattr(torch, name) if name else dtype


class Setup:
    """The models and prebuilt runners every configuration draws from.

    draft: a causal LM, a ModelDraft (its model is used), a LookupDraft (HF's prompt lookup is its HF
    twin) or any other Draft (ours only). adaptive_threshold: the confidence stop of the "adaptive" runs.
    runners: "hf" (our loop over the HF model), "lean" (LeanRunner, eager linears), "onednn" (LeanRunner
    with oneDNN-prepacked linears), "native" (LeanRunner's C++ bfloat16 pass), "compiled" (LeanRunner under torch.compile), each optionally
    "@float32" / "@bfloat16" (default: `dtype`), and "tuned" (the runner sr.tune picks for this draft,
    with the acceptance measured on `tune_prompt` if given, which also gives tune's K).
    A model draft runs on the same kind of runner as the target, in the same dtype.
    """

    def __init__(self, target, draft=None, dtype=torch.float32, adaptive_threshold: float = 0.4,
                 runners=("hf", "lean"), tune_prompt: torch.Tensor | None = None, peers: dict | None = None):
        if isinstance(draft, ModelDraft) and isinstance(draft.model, torch.nn.Module):
            draft = draft.model  # a trained small draft: its plain model, so every runner can take it
        specs = {r: parse_runner(r, dtype) for r in runners}
        self.target, self.draft = target, draft
        self.peers = dict(peers or {})  # llama.cpp peers by kind: specrepro.bench.llamacpp.LlamaCppPeer
        self.draft_is_model = isinstance(draft, torch.nn.Module) and hasattr(draft, "get_output_embeddings")
        self.draft_is_lookup = isinstance(draft, LookupDraft)
        lean_draft_ok = self.draft_is_model and is_llama_like(draft)
        self.targets, self.drafts, self.adaptive, self.tuned = {}, {}, {}, None
        for name, (kind, dt) in specs.items():
            if kind == "hf":
                self.targets[name] = HFRunner(target)
            elif kind == "tuned":
                # at the bench's thread count: one count for every runner of the run
                self.tuned = tune(target, draft, prompt=tune_prompt, temperature=0.0,
                                  threads=[torch.get_num_threads()])
                self.targets[name] = self.tuned.target
            elif kind == "frozen":  # the one-token step compiled with frozen weights; longer blocks on oneDNN
                from ..engines.frozen import FrozenRunner

                self.targets[name] = FrozenRunner(target, dtype=dt)
            elif kind == "native@int8":
                self.targets[name] = LeanRunner(target, dtype=dt, backend="native", weights="int8")
            else:
                self.targets[name] = LeanRunner(target, dtype=dt, compile=kind == "compiled",
                                                backend=kind if kind in ("onednn", "native") else "eager")
            if draft is None:
                continue
            if not self.draft_is_model:
                self.drafts[name] = draft
            elif kind == "hf" or not lean_draft_ok:
                self.drafts[name] = ModelDraft(draft)
            else:
                t = self.targets[name]
                self.drafts[name] = ModelDraft(LeanRunner(draft, dtype=t.dtype, compile=t.compiled, backend=t.backend))
        if self.draft_is_model:
            self.adaptive = {r: ModelDraft(d.runner, confidence_threshold=adaptive_threshold)
                             for r, d in self.drafts.items()}
        # a LeanRunner for the profile: the first lean-kind runner, else a plain one (None for a split target,
        # which only the HF runner can run)
        self.lean_target = next((t for t in self.targets.values() if isinstance(t, LeanRunner)), None) or (
            LeanRunner(target, dtype=dtype) if split_reason(target) is None else None)

    @property
    def hf_twin(self) -> bool:
        """Whether HF assisted generation can run the same draft (a model, or prompt lookup)."""
        return self.draft_is_model or self.draft_is_lookup


def run_config(cfg: Config, setup: Setup, prompt: torch.Tensor, max_new_tokens: int, seed: int) -> dict:
    """Generate max_new_tokens (EOS ignored) with one configuration; wall time includes the prompt pass."""
    temperature = 0.0 if cfg.mode == "greedy" else 1.0
    generator = torch.Generator(device=prompt.device).manual_seed(seed)
    if cfg.impl == "llamacpp":
        rec = setup.peers[cfg.runner].generate(prompt, max_new_tokens, temperature, generator)
        return dict(rec, accepted=0, proposed=0, target_calls=rec["tokens"])
    target = setup.target if cfg.runner == "hf" else setup.targets[cfg.runner]
    start = time.perf_counter()
    if cfg.impl == "ours_ars":
        gen = autoregressive_generate(target, prompt, max_new_tokens, temperature=temperature, generator=generator)
    elif cfg.impl == "ours_sps":
        drafts = setup.adaptive if cfg.schedule == "adaptive" else setup.drafts
        if cfg.runner not in drafts:
            raise ValueError(f"{cfg.name}: the adaptive lookahead needs a model draft (a confidence to stop on)")
        tree = parse_tree(cfg.schedule.removeprefix("tree")) if cfg.schedule.startswith("tree") else None
        gen = speculative_generate(
            target, drafts[cfg.runner], prompt, max_new_tokens, cfg.k, temperature=temperature,
            generator=generator, tree=tree,
        )
    else:
        return _run_hf(cfg, setup, prompt, max_new_tokens, seed)
    seconds = time.perf_counter() - start
    return dict(
        tokens=len(gen.tokens), seconds=seconds, decode_seconds=sum(gen.loop_seconds),
        first_token_seconds=gen.first_token_seconds, accepted=sum(gen.accepted),
        proposed=sum(gen.proposed), target_calls=gen.target_calls, ids=gen.tokens.tolist(),
        loop_accepted=list(gen.accepted), loop_proposed=list(gen.proposed),
    )


def _run_hf(cfg: Config, setup: Setup, prompt: torch.Tensor, max_new_tokens: int, seed: int) -> dict:
    from transformers import GenerationConfig

    # EOS off and no top-k/top-p (HF's defaults differ from ours): all runs make exactly max_new_tokens
    gc = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=cfg.mode == "sample", temperature=1.0, top_p=1.0,
        eos_token_id=None, pad_token_id=setup.target.config.pad_token_id or 0,
    )
    if cfg.mode == "sample":
        gc.top_k = None  # HF's default top_k=50 would differ from our plain sampling
    kwargs = {}
    if cfg.impl == "hf_assisted" and setup.draft_is_lookup:  # the same n-gram draft, HF's implementation
        kwargs.update(prompt_lookup_num_tokens=cfg.k, max_matching_ngram_size=setup.draft.max_ngram)
    elif cfg.impl == "hf_assisted":
        assistant = setup.draft
        agc = assistant.generation_config
        agc.num_assistant_tokens = cfg.k
        agc.num_assistant_tokens_schedule = cfg.schedule
        # HF stops drafting early below this confidence by default; "constant" means exactly K drafts
        agc.assistant_confidence_threshold = 0.0 if cfg.schedule == "constant" else 0.4
        kwargs["assistant_model"] = assistant
    ids = prompt.view(1, -1)
    torch.manual_seed(seed)  # HF sampling draws from the global generator
    # generate() fills unset fields (eos_token_id among them) from the model's own generation_config:
    # swap ours in for the call so that EOS stays off
    saved = setup.target.generation_config
    setup.target.generation_config = gc
    first = _FirstToken()
    try:
        start = time.perf_counter()
        with torch.inference_mode():
            out = setup.target.generate(ids, attention_mask=torch.ones_like(ids), streamer=first, **kwargs)
        seconds = time.perf_counter() - start
    finally:
        setup.target.generation_config = saved
    new = out[0, ids.shape[1] :]
    return dict(tokens=int(new.shape[0]), seconds=seconds, decode_seconds=None,
                first_token_seconds=first.at - start if first.at is not None else None, accepted=0, proposed=0,
                target_calls=0, ids=new.tolist())


class _FirstToken:
    """A generate() streamer that notes when the first new token arrives (its first put() is the prompt)."""

    def __init__(self):
        self.calls, self.at = 0, None

    def put(self, value):
        self.calls += 1
        if self.calls == 2 and self.at is None:
            self.at = time.perf_counter()

    def end(self):
        pass


def measure_costs(setup: Setup, prefix: torch.Tensor, ks, reps: int = 5, trees=()) -> dict:
    """specrepro.tuning.costs for every runner of the setup with its draft, interleaved: {runner: costs}; with
    trees, also the pass over each tree's nodes + 1 (its v is keyed by the node count)."""
    pairs = {r: (runner, setup.drafts.get(r)) for r, runner in setup.targets.items()}
    return measure_cost_table(pairs, prefix, ks, reps, extra_sizes=[t.nodes + 1 for t in trees])


def bench(
    target,
    draft=None,
    prompts: list[torch.Tensor] | None = None,
    ks=(1, 2, 3, 4, 5, 6, 7),
    max_new_tokens: int = 32,
    reps: int = 3,
    modes=("greedy", "sample"),
    runners=("hf", "lean"),
    hf: bool = True,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    configs: list[Config] | None = None,
    progress: bool = False,
    adaptive: bool = False,
    adaptive_threshold: float = 0.4,
    setup: Setup | None = None,
    trees=(),
    peers: dict | None = None,
) -> dict:
    """Run every configuration on every prompt `reps` times, interleaved. Returns {"rows", "summary", "costs"}.

    adaptive: also our SpS at K = max(ks) with the draft's confidence stop (model drafts only).
    setup: prebuilt runners for this target and draft (else built here from dtype, adaptive_threshold, runners).
    peers: {kind: specrepro.bench.llamacpp.LlamaCppPeer} timed beside ours (when setup is not given).
    """
    setup = setup or Setup(target, draft, dtype, adaptive_threshold, runners, peers=peers)
    if configs is None:
        schedules = ("lookup",) if setup.draft_is_lookup else ("constant", "heuristic")
        configs = make_configs(ks, modes, runners, hf=hf, sps=draft is not None,
                               adaptive=adaptive and bool(setup.adaptive), hf_schedules=schedules, trees=trees,
                               peers=tuple(setup.peers))
        if not setup.hf_twin:  # HF assisted generation needs a model (or prompt lookup) as the assistant
            configs = [c for c in configs if c.impl != "hf_assisted"]
    rows = []
    # one untimed warm-up of each configuration (allocations, lazy inits)
    for cfg in configs:
        run_config(cfg, setup, prompts[0][:8], 2, seed)
    for rep in range(reps):
        shift = (rep * 7) % len(configs)  # rotate the order every repetition
        order = configs[shift:] + configs[:shift]
        for pi, prompt in enumerate(prompts):
            for cfg in order:
                rec = run_config(cfg, setup, prompt, max_new_tokens, seed + 1000 * rep + pi)
                rec.update(asdict(cfg), name=cfg.name, rep=rep, prompt=pi, prompt_tokens=int(prompt.shape[0]))
                rec["ms_per_token"] = 1e3 * rec["seconds"] / max(rec["tokens"], 1)
                if rec.get("first_token_seconds") is not None:
                    rec["first_token_ms"] = 1e3 * rec["first_token_seconds"]
                if rec["decode_seconds"] is not None:  # ours: the loops alone, without the prompt pass
                    rec["decode_ms_per_token"] = 1e3 * rec["decode_seconds"] / max(rec["tokens"], 1)
                rows.append(rec)
                if progress:
                    print(f"rep {rep} prompt {pi} {cfg.name:38s} {rec['ms_per_token']:8.1f} ms/token", flush=True)
    costs = measure_costs(setup, prompts[0], list(ks), reps=max(3, reps), trees=trees)
    for kind, peer in setup.peers.items():  # llama.cpp's pass costs on the same prefix: its v(K)
        costs[f"llamacpp:{kind}"] = peer.costs(prompts[0], list(ks), reps=max(3, reps))
    machine = memory_floor_probe(setup, costs)
    summary = summarise(rows, costs)
    return {"rows": rows, "summary": summary, "costs": costs, "headline": headline(rows, summary), "machine": machine}


def memory_floor_probe(setup: Setup, costs: dict) -> dict:
    """The CPU, the copy bandwidth of the memory the target's weights sit in (the GPU's where it runs on
    one), and per runner the weight bytes a pass streams, the floor that sets (bytes / bandwidth) and the
    measured one-token pass over it (costs gain "floor_ms" and "over_floor")."""
    device = input_device(setup.target)  # where a dispatched model's embedding runs
    bandwidth = copy_bandwidth(device=device)
    out = {"cpu": describe_cpu(), "cpu_info": cpu_info(), "device": str(device), "copy_bandwidth_gbs": bandwidth,
           "threads": torch.get_num_threads(), "runners": {}}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    for name, runner in setup.targets.items():
        dtype = getattr(runner, "dtype", None)
        nbytes = weight_bytes(setup.target, dtype)
        floor = 1e3 * nbytes / (bandwidth * 1e9)
        entry = {"dtype": str(dtype or next(setup.target.parameters()).dtype), "weight_bytes": nbytes, "floor_ms": floor,
                 "backend": getattr(runner, "backend", "hf")}
        if name in costs:
            costs[name].update(floor_ms=floor, over_floor=costs[name]["target_ms"][1] / floor)
            entry["one_token_over_floor"] = costs[name]["over_floor"]
        out["runners"][name] = entry
    if setup.tuned is not None:
        out["tuned"] = {k: setup.tuned.report[k] for k in ("name", "why", "lookahead", "cached")}
    return out




















def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="specrepro-bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--draft", default="truncated:4", help="truncated:N, a model directory, or a drafts kind")
    ap.add_argument("--ks", default="1-7")
    ap.add_argument("--prompts", default="news", choices=["news", "code", "news-eval", "humaneval"],
                    help="built-in news/code prompts, or the held-out news split / HumanEval of specrepro.tasks")
    ap.add_argument("--n-prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", default="greedy,sample")
    ap.add_argument("--runners", default="hf,lean",
                    help="ours on: hf (HF model forward with its cache), lean, onednn (lean, oneDNN-prepacked linears), "
                         "native (lean, the C++ bfloat16 pass of specrepro.engines.native; native@int8 its int8-weight target), "
                         "compiled (lean under torch.compile), frozen (one-token step compiled by inductor with "
                         "frozen weights, specrepro.engines.frozen), each optionally @float32 or @bfloat16; tuned (sr.tune's pick)")
    ap.add_argument("--no-hf", action="store_true", help="skip HF generate() and assisted generation")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the usable CPUs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="also profile one SpS run per runner")
    ap.add_argument("--trees", default="", help="also our SpS with token trees, e.g. 3x4,4x8/32 (WIDTHxDEPTH[/NODES])")
    ap.add_argument("--adaptive", type=float, default=None, metavar="THRESHOLD",
                    help="also run our SpS at K = max(--ks) stopping the draft below this confidence (model drafts)")
    ap.add_argument("--llamacpp", default="", metavar="KINDS",
                    help="also time llama.cpp's plain decoding (pip install 'specrepro[llamacpp]') of the shipped GGUF "
                         "and/or conversions of it, e.g. q4_1,f16 (kinds: q4_1, f16, bf16, f32)")
    ap.add_argument("--out", default="figures/bench")
    args = ap.parse_args(argv)

    from ..models import load_model

    try:
        ks = parse_ks(args.ks)
    except ValueError as err:
        ap.error(str(err))
    for name in ("n_prompts", "max_new_tokens", "reps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    dtype = getattr(torch, args.dtype)
    runners = tuple(args.runners.split(","))
    try:
        for r in runners:
            parse_runner(r, dtype)
        trees = [parse_tree(t) for t in args.trees.split(",") if t.strip()]
    except ValueError as err:
        ap.error(str(err))
    try:
        peer_kinds = llamacpp.check_peers(args.llamacpp.split(","))
    except ValueError as err:
        ap.error(str(err))
    if peer_kinds and llamacpp.unavailable_reason():
        ap.error(f"--llamacpp: {llamacpp.unavailable_reason()}")
    if peer_kinds and args.target != "smollm2-135m-instruct":
        ap.error("--llamacpp times the shipped SmolLM2 GGUF: use it with the default --target")
    threads = set_threads(args.threads)
    target, tokenizer = load_model(args.target, dtype=dtype, device=args.device)
    draft = load_draft(args.draft, target, dtype) if args.draft else None
    prompts = [p.to(args.device) for p in (task_prompts(args.prompts, tokenizer, args.n_prompts)
                                            if args.prompts in ("news-eval", "humaneval")
                                            else builtin_prompts(args.prompts, tokenizer, args.n_prompts))]
    # one set of runners for the timed runs and the profile (a second would rebuild, and recompile, them)
    n_ctx = max(int(p.shape[0]) for p in prompts) + args.max_new_tokens + 64
    peers = {k: llamacpp.LlamaCppPeer(llamacpp.peer_path(k), threads, n_ctx, name=k) for k in peer_kinds}
    setup = Setup(target, draft, dtype, 0.4 if args.adaptive is None else args.adaptive, runners, prompts[0], peers)
    if setup.tuned is not None:
        print(f"tuned: {setup.tuned.report['name']}, K = {setup.tuned.lookahead} ({setup.tuned.report['why']})")
        ks = sorted(set(ks) | {setup.tuned.lookahead})
    from ..experiments.results import RunRecord, end_of_run

    record = RunRecord(args)  # before any output is written (the dirty flag)
    result = bench(
        target, draft, prompts, ks, args.max_new_tokens, args.reps, tuple(args.modes.split(",")), runners,
        hf=not args.no_hf, dtype=dtype, seed=args.seed, progress=True, adaptive=args.adaptive is not None,
        setup=setup, trees=trees,
    )
    meta = record.meta(threads=threads, prompt_tokens=[int(p.shape[0]) for p in prompts])
    from ..engines import native

    if native.describe() is not None:  # a native runner ran: its kernels and build time
        meta["native"] = native.describe()
    if peers:
        import llama_cpp

        meta["llamacpp"] = {"version": llama_cpp.__version__, "system_info": llama_cpp.llama_print_system_info().decode(),
                            "files": {k: {"name": p.path.name, "tensor_types": llamacpp.tensor_types(p.path)}
                                      for k, p in peers.items()}}
    write_results(result, args.out, meta)  # written now and again with the profile: a crash keeps the numbers
    if args.profile and draft is not None:
        result["profile"] = {}
        for runner in runners:
            t = setup.targets[runner]
            t.reset()
            best = min((r for r in result["summary"] if r["impl"] == "ours_sps" and r["runner"] == runner
                        and r["schedule"] != "adaptive"), key=lambda r: r["ms_per_token"], default=None)
            k = best["k"] if best else max(ks)
            result["profile"][runner] = dict(k=k, **profile_sps(t, setup.drafts[runner], prompts[0], k, args.max_new_tokens))
    print(format_table(result["summary"]))
    print("costs:", json.dumps(result["costs"], indent=1))
    print("headline:", json.dumps(result["headline"], indent=1))
    if "profile" in result:
        print("profile:", json.dumps(result["profile"], indent=1))
    paths = write_results(result, args.out, end_of_run(meta))
    print("wrote", *paths)
    return result


if __name__ == "__main__":
    main()
