"""Timing harness: our ArS and SpS (HF and lean runners) against HF generate(), in one run, interleaved.

Every configuration runs on the same prompts, target, draft and seeds; the order of configurations is
rotated at every repetition so that noise from other work on the machine hits all of them alike. Reported:
median ms/token and tokens/s, the median over (prompt, repetition) pairs of the ratio to our ArS, the
acceptance rate a, tau, the measured cost ratios c and v(K), and the Leviathan et al. prediction
(1 - a^(K+1)) / ((1 - a)(K c + v(K))) beside the measured speedup.

    python -m specrepro.bench --draft truncated:4 --ks 1,2,3,4,5,6,7 --prompts news --n-prompts 2 \
        --max-new-tokens 32 --dtype float32 --device cpu --out figures/bench
"""
from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .drafts.base import ModelDraft
from .lean import LeanRunner, is_llama_like, set_threads
from .runners import HFRunner, vocab_size
from .sampling import SamplingConfig, sample
from .drafts.lookup import LookupDraft, truncated_model
from .speedup import acceptance_mle, loop_cost_bound, predicted_speedup  # noqa: F401
from .speculative import MAX_LOOKAHEAD, autoregressive_generate, rejection_step, speculative_generate

NEWS = [
    "The Reserve Bank has left interest rates unchanged for the third month in a row, saying inflation is "
    "easing but remains above its target band. The governor said the board would watch wage growth and "
    "housing prices closely before deciding whether further tightening was needed. Economists had widely "
    "expected the decision, although some had forecast a cut before the end of the year.",
    "Firefighters have contained a bushfire that burned through more than 2,000 hectares of scrub west of "
    "the city overnight. Residents of two small towns were told to evacuate on Tuesday evening as strong "
    "winds pushed the fire towards homes. Authorities say no houses were lost, but several sheds and fences "
    "were destroyed, and one firefighter was treated for smoke inhalation.",
    "A new study has found that children who spend more time outdoors are less likely to become short-"
    "sighted. Researchers followed more than 4,000 primary school students for three years and found that "
    "an extra hour outside each day reduced the risk of myopia by about a third. The authors say schools "
    "should consider moving some lessons outdoors.",
]
CODE = [
    'def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n    """Merge two sorted lists into one '
    'sorted list."""\n    result = []\n    i = j = 0\n',
    "import os\n\n\ndef count_lines(path):\n    \"\"\"Return the number of lines in every .py file under path.\"\"\"\n"
    "    counts = {}\n    for root, dirs, files in os.walk(path):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n    def pop(self):\n",
]


def builtin_prompts(kind: str, tokenizer=None, n: int | None = None, vocab: int | None = None) -> list[torch.Tensor]:
    """Token ids of the built-in prompts: "news" (a summarisation request, chat-formatted) or "code".

    Without a tokenizer (tiny test models) returns random ids over `vocab` instead.
    """
    texts = {"news": NEWS, "code": CODE}[kind][:n]
    if tokenizer is None:
        g = torch.Generator().manual_seed(0)
        return [torch.randint(2, vocab, (8 + 4 * i,), generator=g) for i in range(len(texts))]
    out = []
    for text in texts:
        if kind == "news" and getattr(tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": f"Summarise this article in one sentence.\n\n{text}"}]
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(torch.tensor(tokenizer(text).input_ids, dtype=torch.long))
    return out


def truncated_draft(target: torch.nn.Module, n_layers: int) -> torch.nn.Module:
    """The stand-in draft: the target's first n_layers with its final norm and head (modules shared)."""
    return truncated_model(target, n_layers)


def task_prompts(kind: str, tokenizer, n: int) -> list[torch.Tensor]:
    """Prompt ids from the evaluation sets: "news-eval" (held-out news, chat-formatted) or "humaneval"."""
    from .experiments import code_items, news_items

    items = news_items(tokenizer, n) if kind == "news-eval" else code_items(tokenizer, n)
    return [item["prompt_ids"] for item in items]


def load_draft(spec: str, target: torch.nn.Module, dtype: torch.dtype = torch.float32):
    """truncated:N, a model directory or model:<id>, lookup+<spec>, or a kind of specrepro.drafts.load."""
    from .experiments import make_draft

    return make_draft(spec, target, dtype=dtype, device=next(target.parameters()).device)


@dataclass(frozen=True)
class Config:
    """One timed configuration. impl: ours_ars, ours_sps, hf_generate, hf_assisted."""

    impl: str
    runner: str  # ours: "hf", "lean" or "compiled" (lean under torch.compile); "hf" for HF generate
    k: int  # lookahead; 0 for ArS
    mode: str  # "greedy" or "sample"
    schedule: str = ""  # HF assisted: "constant" or "heuristic"

    @property
    def name(self) -> str:
        parts = [self.impl, self.runner, self.mode] + ([f"K{self.k}"] if self.k else []) + [self.schedule]
        return "/".join(p for p in parts if p)


def make_configs(ks, modes=("greedy", "sample"), runners=("hf", "lean"), hf=True, sps=True,
                 adaptive: bool = False, hf_schedules=("constant", "heuristic")) -> list[Config]:
    """Every configuration of one run. adaptive: also our SpS with the confidence stop at K = max(ks)."""
    out = []
    for mode in modes:
        out += [Config("ours_ars", r, 0, mode) for r in runners]
        if sps:
            out += [Config("ours_sps", r, k, mode) for r in runners for k in ks]
            if adaptive:
                out += [Config("ours_sps", r, max(ks), mode, "adaptive") for r in runners]
        if hf:
            out.append(Config("hf_generate", "hf", 0, mode))
            if sps:
                out += [Config("hf_assisted", "hf", k, mode, s) for s in hf_schedules for k in ks]
    return out


class Setup:
    """The models and prebuilt runners every configuration draws from.

    draft: a causal LM, a ModelDraft (its model is used), a LookupDraft (HF's prompt lookup is its HF
    twin) or any other Draft (ours only). adaptive_threshold: the confidence stop of the "adaptive" runs.
    """

    def __init__(self, target, draft=None, dtype=torch.float32, adaptive_threshold: float = 0.4,
                 runners=("hf", "lean")):
        if isinstance(draft, ModelDraft) and isinstance(draft.model, torch.nn.Module):
            draft = draft.model  # a trained small draft: its plain model, so every runner can take it
        unknown = set(runners) - {"hf", "lean", "compiled"}
        if unknown:
            raise ValueError(f"unknown runners {sorted(unknown)}: use hf, lean, compiled")
        self.target, self.draft = target, draft
        self.lean_target = LeanRunner(target, dtype=dtype)
        self.targets = {"hf": HFRunner(target), "lean": self.lean_target}
        if "compiled" in runners:
            self.targets["compiled"] = LeanRunner(target, dtype=dtype, compile=True)
        self.draft_is_model = isinstance(draft, torch.nn.Module) and hasattr(draft, "get_output_embeddings")
        self.draft_is_lookup = isinstance(draft, LookupDraft)
        self.drafts, self.adaptive = {}, {}
        if draft is not None:
            self.drafts["hf"] = ModelDraft(draft) if self.draft_is_model else draft
            lean_ok = self.draft_is_model and is_llama_like(draft)
            self.drafts["lean"] = ModelDraft(LeanRunner(draft, dtype=dtype)) if lean_ok else self.drafts["hf"]
            if "compiled" in runners:
                self.drafts["compiled"] = (ModelDraft(LeanRunner(draft, dtype=dtype, compile=True)) if lean_ok
                                           else self.drafts["hf"])
            if self.draft_is_model:
                self.adaptive = {r: ModelDraft(d.runner, confidence_threshold=adaptive_threshold)
                                 for r, d in self.drafts.items()}

    @property
    def hf_twin(self) -> bool:
        """Whether HF assisted generation can run the same draft (a model, or prompt lookup)."""
        return self.draft_is_model or self.draft_is_lookup


def run_config(cfg: Config, setup: Setup, prompt: torch.Tensor, max_new_tokens: int, seed: int) -> dict:
    """Generate max_new_tokens (EOS ignored) with one configuration; wall time includes the prompt pass."""
    temperature = 0.0 if cfg.mode == "greedy" else 1.0
    generator = torch.Generator(device=prompt.device).manual_seed(seed)
    target = setup.target if cfg.runner == "hf" else setup.targets[cfg.runner]
    start = time.perf_counter()
    if cfg.impl == "ours_ars":
        gen = autoregressive_generate(target, prompt, max_new_tokens, temperature=temperature, generator=generator)
    elif cfg.impl == "ours_sps":
        drafts = setup.adaptive if cfg.schedule == "adaptive" else setup.drafts
        if cfg.runner not in drafts:
            raise ValueError(f"{cfg.name}: the adaptive lookahead needs a model draft (a confidence to stop on)")
        gen = speculative_generate(
            target, drafts[cfg.runner], prompt, max_new_tokens, cfg.k, temperature=temperature,
            generator=generator,
        )
    else:
        return _run_hf(cfg, setup, prompt, max_new_tokens, seed)
    seconds = time.perf_counter() - start
    return dict(
        tokens=len(gen.tokens), seconds=seconds, decode_seconds=sum(gen.loop_seconds), accepted=sum(gen.accepted),
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
    try:
        start = time.perf_counter()
        with torch.inference_mode():
            out = setup.target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        seconds = time.perf_counter() - start
    finally:
        setup.target.generation_config = saved
    new = out[0, ids.shape[1] :]
    return dict(tokens=int(new.shape[0]), seconds=seconds, decode_seconds=None, accepted=0, proposed=0, target_calls=0, ids=new.tolist())


def measure_costs(setup: Setup, prefix: torch.Tensor, ks, reps: int = 5) -> dict:
    """Median ms of one target forward of n tokens after `prefix`, and of one draft step, per runner type.

    Interleaved across reps. n covers 1..max(K)+1 so that loops proposing fewer than K tokens (lookup,
    adaptive) are costed too. The draft step is one propose() of one token after the same prefix (for a
    model draft: one forward of one token; for lookup: its n-gram search). Returns {runner: {"target_ms":
    {n: ms}, "v": {K: v(K)}, "draft_ms": ms, "c": c}}.
    """
    kinds = setup.targets
    sizes = list(range(1, max(ks) + 2))
    times = {r: {n: [] for n in sizes} for r in kinds}
    dtimes = {r: [] for r in setup.drafts}
    for runner in kinds.values():
        runner.reset()
        runner.forward(prefix)
    hidden = None
    if any(getattr(d, "wants_target_hidden", False) for d in setup.drafts.values()):  # feature drafts
        features = HFRunner(setup.target, keep_hidden=True)
        features.forward(prefix[:-1])
        hidden = features.hidden
    base = prefix.shape[0]
    g = torch.Generator().manual_seed(0)
    greedy = SamplingConfig(0.0)
    for d in setup.drafts.values():
        d.reset()
        d.propose(prefix, 1, greedy, g, hidden)  # prefills the draft's own cache
    for _ in range(reps):
        for r, runner in kinds.items():
            for n in sizes:
                ids = torch.randint(0, setup.lean_target.vocab_size, (n,), generator=g)
                runner.rollback(base)
                t = time.perf_counter()
                runner.forward(ids)
                times[r][n].append(time.perf_counter() - t)
        for r, d in setup.drafts.items():
            t = time.perf_counter()
            d.propose(prefix, 1, greedy, g, hidden)  # the cache holds prefix[:-1]: one step, as in a loop
            dtimes[r].append(time.perf_counter() - t)
    out = {}
    for r in kinds:
        target = {n: 1e3 * statistics.median(v) for n, v in times[r].items()}
        entry = {"target_ms": target, "v": {k: target[k + 1] / target[1] for k in range(1, max(ks) + 1)}}
        if dtimes.get(r):
            entry["draft_ms"] = 1e3 * statistics.median(dtimes[r])
            entry["c"] = entry["draft_ms"] / target[1]
        out[r] = entry
    return out


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
) -> dict:
    """Run every configuration on every prompt `reps` times, interleaved. Returns {"rows", "summary", "costs"}.

    adaptive: also our SpS at K = max(ks) with the draft's confidence stop (model drafts only).
    setup: prebuilt runners for this target and draft (else built here from dtype, adaptive_threshold, runners).
    """
    setup = setup or Setup(target, draft, dtype, adaptive_threshold, runners)
    if configs is None:
        schedules = ("lookup",) if setup.draft_is_lookup else ("constant", "heuristic")
        configs = make_configs(ks, modes, runners, hf=hf, sps=draft is not None,
                               adaptive=adaptive and bool(setup.adaptive), hf_schedules=schedules)
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
                if rec["decode_seconds"] is not None:  # ours: the loops alone, without the prompt pass
                    rec["decode_ms_per_token"] = 1e3 * rec["decode_seconds"] / max(rec["tokens"], 1)
                rows.append(rec)
                if progress:
                    print(f"rep {rep} prompt {pi} {cfg.name:38s} {rec['ms_per_token']:8.1f} ms/token", flush=True)
    costs = measure_costs(setup, prompts[0], list(ks), reps=max(3, reps))
    summary = summarise(rows, costs)
    return {"rows": rows, "summary": summary, "costs": costs, "headline": headline(rows, summary)}


def summarise(rows: list[dict], costs: dict) -> list[dict]:
    by = {}
    for r in rows:
        by.setdefault(r["name"], []).append(r)
    per = {(r["name"], r["rep"], r["prompt"]): r["ms_per_token"] for r in rows}
    # ours vs ours: decode time only (the prompt pass, equal for both, would pull ratios toward 1)
    per_decode = {(r["name"], r["rep"], r["prompt"]): r["decode_ms_per_token"] for r in rows if "decode_ms_per_token" in r}
    out = []
    for name, rs in by.items():
        first = rs[0]
        mode, runner, k = first["mode"], first["runner"], first["k"]
        ms = statistics.median(r["ms_per_token"] for r in rs)

        def ratio(ref_name, table=per, key="ms_per_token"):  # paired: same prompt and repetition
            pairs = [table[(ref_name, r["rep"], r["prompt"])] / r[key] for r in rs
                     if (ref_name, r["rep"], r["prompt"]) in table]
            return statistics.median(pairs) if pairs else None

        row = dict(
            name=name, impl=first["impl"], runner=runner, mode=mode, k=k, schedule=first["schedule"], runs=len(rs),
            ms_per_token=ms, tokens_per_s=1e3 / ms,
            decode_ms_per_token=(
                statistics.median(r["decode_ms_per_token"] for r in rs) if "decode_ms_per_token" in first else None
            ),
            ratio_to_ours_ars_hf=ratio(Config("ours_ars", "hf", 0, mode).name),
            speedup_vs_same_runner_ars=(
                ratio(Config("ours_ars", runner, 0, mode).name, per_decode, "decode_ms_per_token")
                if first["impl"].startswith("ours") else None
            ),
        )
        proposed = sum(r["proposed"] for r in rs)
        if first["impl"] == "ours_sps" and proposed:
            loop_acc = sum((r["loop_accepted"] for r in rs), [])
            loop_prop = sum((r["loop_proposed"] for r in rs), [])
            tokens = sum(r["tokens"] for r in rs)
            a = acceptance_mle(loop_acc, loop_prop)
            row.update(acceptance_rate=sum(r["accepted"] for r in rs) / proposed, a=a,
                       tau=tokens / sum(r["target_calls"] for r in rs), mean_proposed=proposed / len(loop_prop))
            cost = costs.get(runner, {})
            if "c" in cost and k in cost.get("v", {}):
                row.update(c=cost["c"], v=cost["v"][k], bound=loop_cost_bound(tokens, loop_prop, cost["c"], cost["v"]))
                if first["schedule"] != "adaptive":  # the i.i.d. prediction assumes K drafts per loop
                    row["predicted"] = predicted_speedup(a, k, cost["c"], cost["v"][k])
                if row["speedup_vs_same_runner_ars"]:
                    if "predicted" in row:
                        row["measured_over_predicted"] = row["speedup_vs_same_runner_ars"] / row["predicted"]
                    row["measured_over_bound"] = row["speedup_vs_same_runner_ars"] / row["bound"]
        out.append(row)
    return out


COLUMNS = [
    "name", "impl", "runner", "mode", "k", "schedule", "runs", "ms_per_token", "tokens_per_s", "decode_ms_per_token",
    "ratio_to_ours_ars_hf", "speedup_vs_same_runner_ars", "acceptance_rate", "a", "tau", "mean_proposed", "c", "v",
    "predicted", "measured_over_predicted", "bound", "measured_over_bound",
]


def paired_speedup(rows: list[dict], name: str, reference: str) -> float | None:
    """Median over (repetition, prompt) of reference ms/token / name ms/token: > 1 means `name` is faster."""
    ms = {(r["name"], r["rep"], r["prompt"]): r["ms_per_token"] for r in rows}
    pairs = [ms[(reference, rep, pr)] / v for (n, rep, pr), v in ms.items() if n == name and (reference, rep, pr) in ms]
    return statistics.median(pairs) if pairs else None


def headline(rows: list[dict], summary: list[dict]) -> list[dict]:
    """Per sampling mode, the issue's comparisons, each a paired ratio from this one run (> 1: ours faster).

    ars_vs_hf_generate: our fastest ArS against HF generate(). sps_vs_hf_assisted: our fastest fixed-K SpS
    against HF assisted generation with the same draft at the same K (its fastest schedule). Also the
    speedup of that SpS over our ArS on the same runner with measured/predicted, and the adaptive
    lookahead against the best fixed K.
    """
    out = []
    for mode in sorted({r["mode"] for r in summary}):
        mine = [r for r in summary if r["mode"] == mode]
        pick = lambda rs: min(rs, key=lambda r: r["ms_per_token"]) if rs else None  # noqa: E731
        ars = pick([r for r in mine if r["impl"] == "ours_ars"])
        sps = pick([r for r in mine if r["impl"] == "ours_sps" and r["schedule"] != "adaptive"])
        gen = pick([r for r in mine if r["impl"] == "hf_generate"])
        line = {"mode": mode, "ours_ars": ars and ars["name"], "ours_sps": sps and sps["name"]}
        if ars and gen:
            line["ars_vs_hf_generate"] = paired_speedup(rows, ars["name"], gen["name"])
        if sps:
            line.update(best_k=sps["k"], sps_speedup=sps["speedup_vs_same_runner_ars"],
                        measured_over_predicted=sps.get("measured_over_predicted"),
                        measured_over_bound=sps.get("measured_over_bound"))
            assisted = pick([r for r in mine if r["impl"] == "hf_assisted" and r["k"] == sps["k"]])
            if assisted:
                line.update(hf_assisted=assisted["name"],
                            sps_vs_hf_assisted=paired_speedup(rows, sps["name"], assisted["name"]))
            best_any = pick([r for r in mine if r["impl"] == "hf_assisted"])
            if best_any:
                line.update(hf_assisted_best=best_any["name"],
                            sps_vs_hf_assisted_best=paired_speedup(rows, sps["name"], best_any["name"]))
            adaptive = pick([r for r in mine if r["schedule"] == "adaptive" and r["runner"] == sps["runner"]])
            if adaptive:
                line.update(adaptive=adaptive["name"], adaptive_vs_best_fixed=paired_speedup(rows, adaptive["name"], sps["name"]))
        out.append(line)
    return out


def format_table(summary: list[dict]) -> str:
    head = ["config", "ms/tok", "tok/s", "decode ms", "x ours-ArS", "x same-ArS", "a", "tau", "c", "v(K)", "pred",
            "meas/pred", "bound", "meas/bnd"]
    keys = ["ms_per_token", "tokens_per_s", "decode_ms_per_token", "ratio_to_ours_ars_hf", "speedup_vs_same_runner_ars",
            "a", "tau", "c", "v", "predicted", "measured_over_predicted", "bound", "measured_over_bound"]
    lines = [f"{head[0]:40s}" + "".join(f"{h:>11s}" for h in head[1:])]
    for row in summary:
        cells = [("" if row.get(k) is None else f"{row[k]:.3f}" if isinstance(row[k], float) else str(row[k])) for k in keys]
        lines.append(f"{row['name']:40s}" + "".join(f"{c:>11s}" for c in cells))
    return "\n".join(lines)


def write_results(result: dict, out: str | os.PathLike, meta: dict | None = None) -> tuple[Path, Path]:
    """<out>.csv (the summary) and <out>.json (summary, costs, every run, meta), each written atomically."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out.with_suffix(".csv"), out.with_suffix(".json")
    tmp = csv_path.with_name(f".{csv_path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(result["summary"])
    os.replace(tmp, csv_path)
    tmp = json_path.with_name(f".{json_path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"meta": meta or {}, **result}, indent=1, default=str))
    os.replace(tmp, json_path)
    return csv_path, json_path


class _Timed:
    """A runner proxy that appends the wall time of each forward (and prefill) to times[key]."""

    def __init__(self, runner, times: dict, key: str):
        self.__dict__.update(_runner=runner, _times=times, _key=key)
        if not hasattr(runner, "vocab_size"):  # HFRunner: the loop asks the runner or its config
            self.__dict__["vocab_size"] = vocab_size(runner.model)
        if hasattr(runner, "prefill"):
            self.__dict__["prefill"] = self._prefill

    def forward(self, ids):
        t = time.perf_counter()
        out = self._runner.forward(ids)
        self._times[self._key].append(time.perf_counter() - t)
        return out

    def _prefill(self, ids):
        t = time.perf_counter()
        self._runner.prefill(ids)
        self._times[self._key + "_prefill"].append(time.perf_counter() - t)

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def __setattr__(self, name, value):
        setattr(self._runner, name, value)


def _time_proposals(draft, times: list) -> None:
    """Make draft.propose (this instance only) append the wall time of each call to times."""
    propose = draft.propose

    def timed(*args, **kwargs):
        t = time.perf_counter()
        out = propose(*args, **kwargs)
        times.append(time.perf_counter() - t)
        return out

    draft.propose = timed


def profile_sps(target_runner, draft, prompt, k=4, max_new_tokens=32, temperature=1.0, seed=0) -> dict:
    """Where the time of SpS goes: target forwards, draft proposals, verification sampling, the rest.

    draft: any Draft (a ModelDraft over a runner, lookup, feature...). Draft time is whole propose() calls
    (its forwards and its sampling). The verification's sampling and rejection are timed in isolation on
    the shapes one loop uses; the rest of the loop time is Python and bookkeeping.
    """
    from .drafts.base import Draft

    times = {"target_forward": [], "target_forward_prefill": []}
    propose_times: list[float] = []
    target = _Timed(target_runner, times, "target_forward")
    inner = copy.copy(draft) if isinstance(draft, Draft) else ModelDraft(draft)  # the caller's draft stays untimed
    inner.reset()
    _time_proposals(inner, propose_times)
    gen = speculative_generate(target, inner, prompt, max_new_tokens, k, temperature=temperature,
                               generator=torch.Generator().manual_seed(seed))
    prefill = gen.seconds - sum(gen.loop_seconds)
    loops = sum(gen.loop_seconds)
    # the prompt pass is outside the loops: a prefill call, or else the first target forward
    has_prefill = hasattr(target_runner, "prefill") or prompt.shape[0] < 2
    in_loops_target = sum(times["target_forward"] if has_prefill else times["target_forward"][1:])
    draft_total = sum(propose_times)  # the draft's prompt pass happens inside the first loop: draft time
    sampling = SamplingConfig(temperature)
    vocab = target.vocab_size
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(k + 1, vocab, generator=g)
    p = sampling.probs(logits[:k])
    drafted = sample(p, g)
    reps = 20
    t = time.perf_counter()
    for _ in range(reps):
        q = sampling.probs(logits)
        rejection_step(drafted, p, q, g)
    verify_sampling = (time.perf_counter() - t) / reps
    n = gen.target_calls
    sampling_total = n * verify_sampling
    rest = loops - in_loops_target - draft_total - sampling_total
    return dict(
        loops=n, tokens=len(gen.tokens), loop_seconds=loops, prompt_seconds=prefill,
        target_forward=in_loops_target, draft_propose=draft_total, draft_calls=len(propose_times),
        verify_sampling_est=sampling_total, python_overhead_est=rest,
        per_loop_ms={
            "total": 1e3 * loops / n, "target_forward": 1e3 * in_loops_target / n,
            "draft_propose": 1e3 * draft_total / n, "verify_sampling_est": 1e3 * sampling_total / n,
            "python_overhead_est": 1e3 * rest / n,
        },
    )


def parse_ks(text: str) -> list[int]:
    """'1,2,4' or '1-7' or '1,2,...,7'."""
    text = text.replace(" ", "")
    if ",...," in text:
        lo, hi = text.split(",...,")
        return list(range(int(lo.split(",")[0]), int(hi) + 1))
    out = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out += range(int(lo), int(hi) + 1)
        elif part:
            out.append(int(part))
    bad = [k for k in out if not 1 <= k <= MAX_LOOKAHEAD]
    if not out or bad:
        raise ValueError(f"--ks: lookaheads must be integers in 1..{MAX_LOOKAHEAD}, got {text!r}")
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
                    help="ours on: hf (HF model forward with its cache), lean, compiled (lean under torch.compile)")
    ap.add_argument("--no-hf", action="store_true", help="skip HF generate() and assisted generation")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the usable CPUs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="also profile one SpS run per runner")
    ap.add_argument("--adaptive", type=float, default=None, metavar="THRESHOLD",
                    help="also run our SpS at K = max(--ks) stopping the draft below this confidence (model drafts)")
    ap.add_argument("--out", default="figures/bench")
    args = ap.parse_args(argv)

    from .models import load_model

    try:
        ks = parse_ks(args.ks)
    except ValueError as err:
        ap.error(str(err))
    for name in ("n_prompts", "max_new_tokens", "reps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    threads = set_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    target, tokenizer = load_model(args.target, dtype=dtype, device=args.device)
    draft = load_draft(args.draft, target, dtype) if args.draft else None
    prompts = [p.to(args.device) for p in (task_prompts(args.prompts, tokenizer, args.n_prompts)
                                            if args.prompts in ("news-eval", "humaneval")
                                            else builtin_prompts(args.prompts, tokenizer, args.n_prompts))]
    runners = tuple(args.runners.split(","))
    # one set of runners for the timed runs and the profile (a second would rebuild, and recompile, them)
    setup = Setup(target, draft, dtype, 0.4 if args.adaptive is None else args.adaptive, runners)
    result = bench(
        target, draft, prompts, ks, args.max_new_tokens, args.reps, tuple(args.modes.split(",")), runners,
        hf=not args.no_hf, dtype=dtype, seed=args.seed, progress=True, adaptive=args.adaptive is not None,
        setup=setup,
    )
    meta = dict(vars(args), threads=threads, torch=torch.__version__, prompt_tokens=[int(p.shape[0]) for p in prompts])
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
    paths = write_results(result, args.out, meta)
    print("wrote", *paths)
    return result


if __name__ == "__main__":
    main()
