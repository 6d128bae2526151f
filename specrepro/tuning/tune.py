"""sr.tune: measure this machine once, pick the fastest exact setting for a target (and a draft).

    setting = sr.tune(target, draft=None)
    gen = sr.speculative_generate(setting.target, draft, ids, lookahead=setting.lookahead)

Candidates are (dtype, linear backend, torch threads[, torch.compile]) for the lean runner (an HF runner
for models it cannot run); on a CUDA target also the static-shape runner (engines/static.py) with its
passes captured by torch.cuda.CUDAGraph ("graphs-cuda") and, only with compile=True, compiled by
torch.compile (default mode, fullgraph, static shapes) and then captured by torch.cuda.CUDAGraph the same
way ("graphs-compile"; not mode="reduce-overhead", whose graph trees copy the weights and cache on each
replay), measured after capture; the capture time is reported ("capture_seconds") and the returned runner
is captured before tune returns, so it is paid once per process. A graph candidate whose capture fails,
or whose runner falls back to uncaptured replay while it is timed (the runner's `fallback`), is listed
in "skipped" with the reason and never ranked.
A screen times every candidate's passes over 1, 2 and 5 tokens; for the two best, the target's pass over
n = 1..17 tokens is timed after a cached prefix (specrepro.tuning.costs, the same measurement as the bench
and the notebooks), and so is one draft step. The draft is the same for every candidate (it runs on its own),
so the draft steps timed beside candidates of one thread count are pooled into one median draft_ms for all of
them (pool_draft_costs): the settings are then ranked by their target passes, not by which one a noisy draft
step happened to follow.
The expected time per token of SpS with lookahead K is (K * draft_ms + target_ms[K + 1]) / E[tokens],
E[tokens] = (1 - a^(K+1)) / (1 - a) (Leviathan et al.), and of ArS target_ms[1]. With a draft, the
setting and K with the least expected time per token win; without one, the fastest one-token pass.
The acceptance rate a is `acceptance` if given, else measured by a short SpS run on `prompt` if given;
with neither, K = DEFAULT_LOOKAHEAD (the paper's Table 1 setting) and the settings are ranked at that K.

Every candidate computes the same weights in its dtype: no quantisation. float32 candidates are exact
against the HF model; bfloat16 ones are exact for bfloat16 (pass `dtypes=(torch.float32,)` to forbid it).
Only with quantized=True do int8 settings compete too ("int8/native/<threads>t": the native pass with int8
weights, LeanRunner(weights="int8")): another target, whose logits differ from the model's (SpS is lossless
with respect to it, not to the float32 or bfloat16 model); the report's "target_weights" names the chosen
one's weights. The default tune never measures or returns them.
Results are cached per machine under $SPECREPRO_HOME/tune/: the key holds the CPU model and kernel flags,
the usable cores, the torch version, the target's (and draft's) identity and the candidate list, so
another CPU kind, another torch or another model measures afresh. tune() sets torch's thread count to
the chosen one (a global setting: the runner's speed depends on it).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
import time
import warnings
from dataclasses import dataclass, field

import torch

from .costs import from_json, measure_cost_table
from ..engines.kernels import BACKENDS, unavailable_reason
from ..engines.machine import RunRecord, cpu_info, describe_cpu
from ..engines.runners import vocab_size
from ..models import specrepro_home
from ..files import portable_path, write_json
from ..stats.speedup import acceptance_mle, expected_tokens

TUNE_VERSION = 4  # bump when the measurement or the choice changes: old cache entries are then ignored
DEFAULT_LOOKAHEAD = 4
MAX_TUNE_LOOKAHEAD = 16
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Candidate:
    dtype: str
    backend: str
    threads: int
    compile: bool = False
    graphs: str = ""  # "" the lean runner; "cuda" / "compile": engines.static.StaticRunner with those graphs
    weights: str = "bfloat16"  # "int8": the native pass with int8 weights (another target; tune(quantized=True) only)

    @property
    def name(self) -> str:
        if self.weights == "int8":
            return f"int8/{self.backend}/{self.threads}t"
        return (f"{self.dtype}/{self.backend}/{self.threads}t" + ("/compiled" if self.compile else "")
                + (f"/graphs-{self.graphs}" if self.graphs else ""))

    def ident(self) -> dict:
        """The candidate as the cache key holds it (weights only where not the default, so that the default
        candidates' keys are what they were before int8 settings existed)."""
        d = dataclasses.asdict(self)
        if d["weights"] == "bfloat16":
            del d["weights"]
        return d


@dataclass
class Setting:
    """What tune returns: a runner to pass as `target`, the chosen K (and tree), and why."""

    target: object
    lookahead: int
    candidate: Candidate
    tree: object | None = None
    report: dict = field(default_factory=dict)

    @property
    def pass_costs(self) -> dict[int, float]:
        """v(n) of the chosen setting, as measured here: a target pass over n + 1 tokens / a one-token pass."""
        return dict(self.report["costs"][self.report["name"]]["v"])

    def apply(self, draft):
        """`draft` with this setting's v(n) offered to its stop rule (a datastore draft, or a hybrid holding one,
        proposes only tokens whose expected gain pays for verifying them; other drafts are unchanged). A draft
        given its own pass_costs keeps them. Returns the draft."""
        offer = getattr(draft, "offer_pass_costs", None)
        if offer is not None:
            offer(self.pass_costs)
        return draft


def tune(
    target,
    draft=None,
    acceptance: float | None = None,
    prompt: torch.Tensor | None = None,
    dtypes=("float32", "bfloat16"),
    backends=BACKENDS,
    threads=None,
    compile: bool = False,
    max_lookahead: int = MAX_TUNE_LOOKAHEAD,
    reps: int = 2,
    cache: bool = True,
    temperature: float = 1.0,
    trees=(),
    quantized: bool = False,
) -> Setting:
    """Measure the candidate settings on this machine (or reuse the cached measurement) and pick one.

    target: an HF causal LM. draft: anything speculative_generate takes (costed per candidate); a datastore draft
    (or a hybrid holding one) also gets the chosen setting's v(n) for its stop rule (Setting.apply).
    acceptance: an estimate of the draft's per-token acceptance a in [0, 1); prompt: token ids to measure
    a on (a short SpS run at `temperature`) when no estimate is given. threads: thread counts to try
    (default: 1 and all usable cores). compile: also try torch.compile'd runners (slow to build): the lean runner's compiled
    linears, and on CUDA the compiled static-shape graphs.
    trees: TreeSpecs to weigh against the chain: with a draft that can branch and a `prompt`, each tree's
    tokens per target call and the chain's at the chosen K are measured on the prompt with the chosen
    runner, and the tree wins if its (depth * draft step + pass over its nodes) / tau is smaller.
    quantized: also measure "int8/native/<threads>t", the native pass with int8 weights (a different target:
    its output follows the int8 model, not this one); off by default, and then tune is what it was without it.
    """
    dtypes = [_check_dtype(d) for d in dtypes]
    threads = _check_threads(threads)
    if acceptance is not None and not (isinstance(acceptance, (int, float)) and 0 <= acceptance < 1):
        raise ValueError(f"acceptance must be a number in [0, 1), got {acceptance!r}")
    if not isinstance(max_lookahead, int) or not 1 <= max_lookahead <= MAX_TUNE_LOOKAHEAD:
        raise ValueError(f"max_lookahead must be an integer in 1..{MAX_TUNE_LOOKAHEAD}, got {max_lookahead!r}")
    for b in backends:
        if b not in BACKENDS:
            raise ValueError(f"unknown linear backend {b!r}; choose from {', '.join(BACKENDS)}")
    if not isinstance(quantized, bool):
        raise TypeError(f"quantized must be True or False, got {quantized!r}")
    candidates = candidate_settings(target, dtypes, backends, threads, compile, quantized)
    trees = _check_trees(trees, draft, prompt)
    extra = sorted({t.nodes + 1 for t in trees})
    machine = cpu_info()
    key = cache_key(machine, target, draft, candidates, max_lookahead, extra)
    path = specrepro_home() / "tune" / f"{key}.json"
    measured = _read_cache(path) if cache else None
    cached = measured is not None
    if measured is None:
        start = time.perf_counter()
        measured = measure_candidates(target, draft, candidates, max_lookahead, reps, extra_sizes=extra)
        measured["seconds"] = time.perf_counter() - start
        if cache:
            write_json(path, {"key": key, "version": TUNE_VERSION, "machine": machine, **measured})
    a_source = "given" if acceptance is not None else None
    if acceptance is None and draft is not None and prompt is not None:
        best_guess = choose(measured["costs"], draft is not None, None)
        acceptance = estimate_acceptance(target, draft, prompt, best_guess["candidate"], best_guess["lookahead"],
                                         temperature)
        a_source = f"measured on the prompt ({prompt.numel()} tokens) at T={temperature:g}"
    choice = choose(measured["costs"], draft is not None, acceptance, max_lookahead)
    cand = Candidate(**choice["candidate"])
    torch.set_num_threads(cand.threads)
    tree = None
    if trees:
        choice["trees"] = compare_trees(target, draft, prompt, cand, measured["costs"][choice["name"]],
                                        choice["lookahead"], trees, temperature)
        best = min(choice["trees"], key=lambda r: r["ms_per_token"])
        tree = next((t for t in trees if str(t) == best["tree"]), None)
        if tree is not None:
            choice["why"] += (f"; tree {tree} beats the chain: {best['ms_per_token']:.1f} ms/token expected from its "
                              f"measured tau {best['tau']:.2f} on the prompt")
    runner = build_runner(target, cand)
    if cand.graphs:
        choice["capture_seconds_returned_runner"] = runner.warmup(_graph_sizes(max_lookahead, extra))
    report = {
        "machine": machine, "cpu": describe_cpu(machine), "torch": torch.__version__, "cache_file": portable_path(path),
        "cached": cached, "measure_seconds": measured.get("seconds"), "acceptance": acceptance,
        "acceptance_source": a_source, **choice, "costs": measured["costs"], "screen": measured.get("screen", {}),
        "skipped": measured.get("skipped", {}), "prepare": measured.get("prepare", {}),
        "target_weights": cand.weights,
    }
    if any(c.backend == "native" for c in candidates):
        from ..engines import native

        report["native"] = native.describe()  # which kernels were compiled, and the build time
    setting = Setting(target=runner, lookahead=choice["lookahead"], candidate=cand, tree=tree, report=report)
    if draft is not None:
        setting.apply(draft)  # a datastore draft's stop rule gets this machine's v(n)
    return setting


def compare_trees(target, draft, prompt, cand: Candidate, costs: dict, lookahead: int, trees, temperature: float,
                  max_new_tokens: int = 48) -> list[dict]:
    """The chain at `lookahead` and each tree on the prompt with the candidate's runner: tau measured, time
    per token expected from the measured pass costs: (levels * draft step + pass over the nodes) / tau."""
    from ..generate import speculative_generate

    costs = from_json(costs)
    runner = build_runner(target, cand)
    draft_ms = costs.get("draft_ms", 0.0)
    out = []
    for tree in [None, *trees]:
        gen = speculative_generate(runner, draft, prompt, max_new_tokens=max_new_tokens, lookahead=lookahead,
                                   temperature=temperature, generator=torch.Generator().manual_seed(0), tree=tree)
        levels, size = (lookahead, lookahead) if tree is None else (tree.depth, tree.nodes)
        ms = (levels * draft_ms + costs["target_ms"][size + 1]) / gen.tau
        out.append({"tree": None if tree is None else str(tree), "tau": gen.tau, "ms_per_token": ms,
                    "nodes": size, "levels": levels})
    return out


def _check_trees(trees, draft, prompt) -> list:
    from ..algorithm.tree import TreeSpec

    trees = list(trees or ())
    for t in trees:
        if not isinstance(t, TreeSpec):
            raise TypeError(f"trees must hold sr.TreeSpec objects, got {type(t).__name__}")
    if trees and (draft is None or prompt is None):
        raise ValueError("tune(trees=...) needs a draft and a prompt: a tree's tau is measured on the prompt")
    return trees


def candidate_settings(target, dtypes, backends, threads, compile: bool, quantized: bool = False) -> list[Candidate]:
    """Every (dtype, backend, threads[, compile]) to measure; the lean runner's knobs only where it applies.
    quantized: also the native pass with int8 weights at each thread count (CPU, native among the backends)."""
    from ..engines.lean import is_llama_like
    from ..engines.runners import split_reason

    # an HF runner in the model's own dtype: only threads vary (the lean runner needs all weights on one device)
    if not is_llama_like(target) or split_reason(target) is not None:
        dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
        return [Candidate(dtype, "hf", t) for t in threads]
    out = []
    cuda = _device(target).type == "cuda"
    if cuda:  # the host's threads barely matter to a GPU pass: one count, the largest
        threads = threads[-1:]
    for d in dtypes:
        for b in backends:
            for t in threads:
                out.append(Candidate(d, b, t))
                if compile and b == "eager":  # the lean runner compiles eager linears only
                    out.append(Candidate(d, b, t, True))
        if cuda:  # the static-shape runner (engines/static.py): CUDA graphs; compiled ones only when asked
            out += [Candidate(d, "eager", threads[-1], graphs=g) for g in GRAPH_CHOICES if compile or g != "compile"]
    if quantized and not cuda and "native" in backends:
        out += [Candidate("bfloat16", "native", t, weights="int8") for t in threads]
    return out


GRAPH_CHOICES = ("cuda", "compile")


def _graph_sizes(max_lookahead: int, extra_sizes=()) -> list[int]:
    return sorted(set(range(1, max_lookahead + 2)) | set(extra_sizes))


def build_runner(target, cand: Candidate):
    from ..engines.lean import LeanRunner
    from ..engines.runners import HFRunner

    if cand.backend == "hf":
        return HFRunner(target)
    if cand.graphs:
        from ..engines.static import StaticRunner

        return StaticRunner(target, dtype=DTYPES[cand.dtype], graphs=cand.graphs)
    if cand.weights != "bfloat16":
        return LeanRunner(target, dtype=DTYPES[cand.dtype], backend=cand.backend, weights=cand.weights)
    return LeanRunner(target, dtype=DTYPES[cand.dtype], backend=cand.backend, compile=cand.compile)


SCREEN_SIZES = (1, 2, 5)  # the screen's passes (tokens): a one-token step and a K = 4 verify


def measure_candidates(target, draft, candidates: list[Candidate], max_lookahead: int, reps: int,
                       keep: int = 2, extra_sizes=()) -> dict:
    """{"costs": {name: costs + the candidate}, "screen": {name: {n: ms}}, "skipped": {name: why}}.

    Two stages keep tune to seconds. The screen times every candidate's passes over SCREEN_SIZES tokens
    (one runner per dtype and backend, timed at each thread count); only the `keep` best by the sum of
    their one- and five-token passes get the full measurement (1..max_lookahead + 1 tokens, the trees'
    sizes and the draft step); the others are listed in "skipped" with their screen times. Threads are
    restored afterwards.

    What is timed is what a user's generation runs: each runner is built (the native pass compiled, weights
    packed) and warmed by one untimed pass over the prefix and every measured size before any timing, at
    each thread count; "prepare" reports those seconds apart. A candidate whose screen is more than
    OUTLIER_RATIO times the best so far is screened once more and keeps the faster of its two screens
    (one slow measurement, e.g. another process on the cores, must not decide a whole reproduction).
    """
    before = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    # ids every model in play can read: a draft with a smaller (padded) vocabulary than its target's included
    readable = min([vocab_size(target)] + [n for n in (getattr(draft, "rows", None), getattr(draft, "vocab_size", None))
                                           if isinstance(n, int)])
    prefix = torch.randint(0, readable, (32,), generator=g)
    screen, skipped, runners, unavailable, kept = {}, {}, {}, {}, {}

    def score(name):
        return screen_score(screen[name])

    def build_of(c):
        return (c.dtype, c.backend, c.compile, c.graphs, c.weights)

    sizes = _graph_sizes(max_lookahead, extra_sizes)
    capture, prepare = {}, {}

    def screen_once(cand, runner):
        ms = measure_cost_table({cand.name: (runner, None)}, prefix, [1], reps, extra_sizes=[5])[cand.name]
        return {n: ms["target_ms"][n] for n in SCREEN_SIZES}

    try:
        for i, cand in enumerate(candidates):
            build = build_of(cand)
            if build not in runners and build not in unavailable:
                t0 = time.perf_counter()
                runner = _build_checked(target, cand)
                prepare[cand.name] = {"build_seconds": time.perf_counter() - t0}
                if not isinstance(runner, str) and cand.graphs:
                    try:  # capture every size measured below, so that no timing includes a capture
                        capture[cand.name] = runner.warmup(sizes)
                    except Exception as err:  # noqa: BLE001 - a capture that fails is a candidate that cannot run
                        runner = f"graph capture failed ({type(err).__name__}: {err})"
                (unavailable if isinstance(runner, str) else runners)[build] = runner
            if build in unavailable:
                skipped[cand.name] = unavailable[build]
                continue
            torch.set_num_threads(cand.threads)
            t0 = time.perf_counter()
            _warm(runners[build], prefix, sizes)
            prepare.setdefault(cand.name, {})["warmup_seconds"] = time.perf_counter() - t0
            screen[cand.name] = screen_once(cand, runners[build])
            best = min(map(score, screen))
            if score(cand.name) > OUTLIER_RATIO * best:
                again = screen_once(cand, runners[build])
                prepare[cand.name]["screens"] = [score(cand.name), screen_score(again)]
                if screen_score(again) < score(cand.name):
                    screen[cand.name] = again
            fell = _fell_back(runners[build])
            if fell:  # its times are an uncaptured runner's: not ranked as the captured one
                skipped[cand.name] = unavailable[build] = fell
                del runners[build], screen[cand.name]
                continue
            kept[cand.name] = cand
            for name in sorted(kept, key=score)[keep:]:
                del kept[name]
            # hold on only to the runners the best `keep` so far or a later candidate still need
            live = {build_of(c) for c in kept.values()} | {build_of(c) for c in candidates[i + 1:]}
            for b in [b for b in runners if b not in live]:
                del runners[b]
        ranked = sorted(screen, key=score)
        for name in ranked[keep:]:
            skipped[name] = (f"screened out: passes over 1 and 5 tokens took {score(name):.1f} ms, the {keep} "
                             f"best {', '.join(f'{score(n):.1f}' for n in ranked[:keep])} ms")
        proposer = None
        if draft is not None:
            from ..drafts.base import as_draft

            proposer = as_draft(draft)
        costs = {}
        for name in ranked[:keep]:
            cand = kept[name]
            torch.set_num_threads(cand.threads)
            entry = measure_cost_table({name: (runners[build_of(cand)], proposer)}, prefix, range(1, max_lookahead + 1), reps,
                                       extra_sizes=extra_sizes)
            fell = _fell_back(runners[build_of(cand)]) or _fell_back(getattr(proposer, "runner", None), "the draft's runner")
            if fell:
                skipped[name] = fell
                continue
            costs[name] = {"candidate": dataclasses.asdict(cand), **entry[name]}
            if name in capture:
                costs[name]["capture_seconds"] = capture[name]
        pool_draft_costs(costs)
    finally:
        torch.set_num_threads(before)
    if not costs:
        raise RuntimeError(f"no candidate setting could be measured: {skipped}")
    return {"costs": costs, "screen": screen, "skipped": skipped, "prepare": prepare}


def pool_draft_costs(costs: dict) -> dict:
    """Give every candidate of one thread count the median of all draft steps timed beside any of them.

    The draft runs on its own, so its step costs the same whichever target runner it follows; timed a few times
    per candidate, one disturbed step would otherwise add K times its excess to one candidate's loop cost and
    could rank a runner with a several times slower pass first. Each entry keeps its own median as
    "draft_ms_own" and gets "draft_ms", "c" = draft_ms / target_ms[1] and "draft_pooled_from" (the candidates
    pooled). Entries without draft samples are left alone. Returns costs (changed in place)."""
    groups: dict[int, list[str]] = {}
    for name, entry in costs.items():
        if entry.get("draft_samples_ms"):
            groups.setdefault(int(entry["candidate"]["threads"]), []).append(name)
    for names in groups.values():
        pooled = statistics.median([ms for n in names for ms in costs[n]["draft_samples_ms"]])
        for n in names:
            entry = costs[n]
            entry["draft_ms_own"] = entry["draft_ms"]
            entry["draft_ms"] = pooled
            entry["c"] = pooled / entry["target_ms"][1]
            entry["draft_pooled_from"] = sorted(names)
    return costs


def _fell_back(runner, who: str = "its runner") -> str:
    """Why a graph runner (engines.static) went on uncaptured, or "": its times are then not what the
    captured candidate would take, so tune skips the candidate with this reason instead of ranking it."""
    reason = getattr(runner, "fallback", None)
    return f"{who} fell back to uncaptured replay: {reason}" if reason else ""


OUTLIER_RATIO = 1.5  # a screen this many times the best so far is measured again before it decides


def screen_score(ms: dict) -> float:
    """What the screen ranks candidates by: its passes over 1 and 5 tokens (a step and a K = 4 verify)."""
    return ms[1] + ms[5]


@torch.inference_mode()
def _warm(runner, prefix: torch.Tensor, sizes) -> None:
    """One untimed pass over the prefix and over each size after it, at the thread count about to be timed:
    whatever a runner does on its first calls (building, packing weights, allocating) happens here."""
    runner.reset()
    runner.forward(prefix.to(runner.device))
    g = torch.Generator().manual_seed(1)
    for n in sizes:
        runner.rollback(prefix.shape[0])
        runner.forward(torch.randint(0, runner.vocab_size, (n,), generator=g).to(runner.device))
    runner.reset()


def _build_checked(target, cand: Candidate):
    """The candidate's runner, or why it cannot run here."""
    if cand.backend != "hf":
        reason = unavailable_reason(cand.backend, DTYPES[cand.dtype], _device(target))
        if reason:
            return reason
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a compile that falls back is measured as what it ran
        return build_runner(target, cand)


def choose(costs: dict, has_draft: bool, acceptance: float | None, max_lookahead: int = MAX_TUNE_LOOKAHEAD) -> dict:
    """The winning candidate and K from a cost table (pure: tests feed it fake tables).

    Returns {"candidate", "lookahead", "ms_per_token" (expected), "ars_ms_per_token" of that candidate,
    "fastest_ars" (the candidate with the fastest one-token pass), "ranking" (best first), "why"}.
    """
    rows = []
    for name, entry in costs.items():
        entry = from_json(entry)
        t1 = entry["target_ms"][1]
        best = (t1, 0)  # ArS
        if has_draft:
            ks = [k for k in range(1, max_lookahead + 1) if k + 1 in entry["target_ms"]]
            if acceptance is None:
                ks = [k for k in ks if k == DEFAULT_LOOKAHEAD] or ks[:1]
            a = DEFAULT_ACCEPTANCE_FOR_RANKING if acceptance is None else acceptance
            best = min(((k * entry.get("draft_ms", 0.0) + entry["target_ms"][k + 1]) / expected_tokens(a, k), k)
                       for k in ks)
        rows.append({"name": name, "candidate": entry["candidate"], "ms_per_token": best[0], "lookahead": best[1],
                     "ars_ms_per_token": t1, "v": {k: entry["v"][k] for k in sorted(entry["v"])}})
    rows.sort(key=lambda r: r["ms_per_token"])
    win = rows[0]
    fastest_ars = min(rows, key=lambda r: r["ars_ms_per_token"])
    if not has_draft:
        why = f"fastest one-token pass ({win['ars_ms_per_token']:.1f} ms) of {len(rows)} settings"
        lookahead = DEFAULT_LOOKAHEAD
    elif acceptance is None:
        why = (f"no acceptance estimate: K = {DEFAULT_LOOKAHEAD} (the paper's) and settings ranked by their cost "
               f"of a K = {DEFAULT_LOOKAHEAD} loop; {win['ms_per_token']:.1f} ms/token expected at a = "
               f"{DEFAULT_ACCEPTANCE_FOR_RANKING} (ranking only)")
        lookahead = DEFAULT_LOOKAHEAD
    else:
        why = (f"least expected SpS time per token, {win['ms_per_token']:.1f} ms at K = {win['lookahead']} "
               f"and a = {acceptance:.3f}, of {len(rows)} settings x K = 1..{max_lookahead}")
        lookahead = max(win["lookahead"], 1)
    expected_speedup = fastest_ars["ars_ms_per_token"] / win["ms_per_token"] if has_draft and acceptance is not None else None
    return {"candidate": win["candidate"], "name": win["name"], "lookahead": lookahead,
            "expected_speedup_over_fastest_ars": expected_speedup,
            "ms_per_token": win["ms_per_token"], "ars_ms_per_token": win["ars_ms_per_token"],
            "fastest_ars": {"name": fastest_ars["name"], "ms_per_token": fastest_ars["ars_ms_per_token"]},
            "ranking": [{k: r[k] for k in ("name", "ms_per_token", "lookahead", "ars_ms_per_token")} for r in rows],
            "why": why}


# At a fixed K the ranking of settings by loop cost does not depend on a; this only scales the number shown.
DEFAULT_ACCEPTANCE_FOR_RANKING = 0.5


def estimate_acceptance(target, draft, prompt, cand: dict, lookahead: int, temperature: float,
                        max_new_tokens: int = 32) -> float:
    """The censored MLE of a from one short SpS run (specrepro.stats.speedup.acceptance_mle)."""
    from ..generate import speculative_generate

    runner = build_runner(target, Candidate(**cand))
    gen = speculative_generate(runner, draft, prompt, max_new_tokens=max_new_tokens, lookahead=max(lookahead, 1),
                               temperature=temperature, generator=torch.Generator().manual_seed(0))
    return min(acceptance_mle(gen.accepted, gen.proposed), 0.99)


def cache_key(machine: dict, target, draft, candidates, max_lookahead: int, extra_sizes=()) -> str:
    ident = {
        "version": TUNE_VERSION, "cpu": machine["model"], "flags": machine["flags"], "cores": machine["cores"],
        "arch": machine["arch"], "isa_limits": machine.get("isa_limits", {}), "torch": torch.__version__, "target": model_identity(target),
        "draft": None if draft is None else model_identity(draft), "device": str(_device(target)),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available() else [],
        "candidates": [c.ident() for c in candidates], "max_lookahead": max_lookahead,
        "extra_sizes": list(extra_sizes),
    }
    if any(c.backend == "native" for c in candidates):  # another build of the native pass is another runner
        from ..engines import native

        ident["native_cflags"] = native.extra_flags()
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:20]


def model_identity(obj) -> dict:
    """What distinguishes one model (or draft) from another for the cache: class, path, shapes, dtype."""
    model = getattr(obj, "model", None) if not isinstance(obj, torch.nn.Module) else obj
    ident = {"class": type(obj).__name__}
    if isinstance(model, torch.nn.Module):
        config = getattr(model, "config", None)
        ident.update(model_class=type(model).__name__,
                     name=getattr(config, "_name_or_path", None) if config is not None else None,
                     params=sum(p.numel() for p in model.parameters()),
                     dtype=str(next(model.parameters()).dtype))
        if config is not None:
            ident["config"] = {k: getattr(config, k, None) for k in
                               ("hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size")}
    for name in ("spec", "max_ngram", "min_ngram", "kind"):
        if hasattr(obj, name):
            ident[name] = getattr(obj, name)
    return ident


def _read_cache(path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("version") != TUNE_VERSION or not isinstance(data.get("costs"), dict) or not data["costs"]:
        return None
    try:
        data["costs"] = {name: from_json(entry) for name, entry in data["costs"].items()}
    except (AttributeError, TypeError, ValueError):  # hand-edited or damaged: measure afresh
        return None
    return data


def _check_dtype(d) -> str:
    name = str(d).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {d!r} for tune: choose from {', '.join(DTYPES)}")
    return name


def _check_threads(threads) -> list[int]:
    from ..engines.machine import cpu_info as _info

    if threads is None:
        cores = _info()["cores"]
        return sorted({1, cores})
    threads = [threads] if isinstance(threads, int) else list(threads)
    if not threads or any(not isinstance(t, int) or isinstance(t, bool) or t < 1 for t in threads):
        raise ValueError(f"threads must be integers >= 1, got {threads!r}")
    return sorted(set(threads))


def _device(model):
    return next(model.parameters()).device


def main(argv=None) -> dict:
    """specrepro-tune [--target ID] [--draft SPEC] [--acceptance A] [--threads N ...] [--no-cache]

    Measures (or reads from the cache) every candidate setting on this machine and prints, per setting, the
    one-token pass against the memory floor (weight bytes / copy bandwidth) and v(K) for K = 1, 2, 4, 8, 16.
    """
    import argparse

    from ..engines.machine import copy_bandwidth, weight_bytes
    from ..models import load_model
    from ..drafts.spec import make_draft

    ap = argparse.ArgumentParser(prog="specrepro-tune", description=main.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--draft", default=None, help="a draft spec (lookup, small, feature, truncated:N, ...)")
    ap.add_argument("--acceptance", type=float, default=None, help="an estimate of a, to choose K")
    ap.add_argument("--threads", type=int, nargs="*", default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--out", default=None, help="write the report as JSON here")
    args = ap.parse_args(argv)
    try:
        _check_threads(args.threads)
    except ValueError as err:
        ap.error(str(err))
    record = RunRecord(args)  # before any output is written (the dirty flag)
    model, _ = load_model(args.target)
    draft = make_draft(args.draft, model) if args.draft else None
    setting = tune(model, draft, acceptance=args.acceptance, threads=args.threads, reps=args.reps,
                   cache=not args.no_cache)
    report = setting.report
    bandwidth = copy_bandwidth()
    report["copy_bandwidth_gbs"] = bandwidth
    print(f"{report['cpu']}; torch {report['torch']}; copy bandwidth {bandwidth:.1f} GB/s "
          f"(at {torch.get_num_threads()} threads); {'cached' if report['cached'] else 'measured'}")
    print(f"{'setting':28s} {'1-token ms':>10s} {'floor ms':>9s} {'x floor':>8s}" +
          "".join(f"{f'v({k})':>8s}" for k in (1, 2, 4, 8, 16)))
    for name, entry in report["costs"].items():
        floor = 1e3 * weight_bytes(model, DTYPES[entry["candidate"]["dtype"]]) / (bandwidth * 1e9)
        entry["floor_ms"] = floor
        v = entry["v"]
        print(f"{name:28s} {entry['target_ms'][1]:10.1f} {floor:9.1f} {entry['target_ms'][1] / floor:8.2f}" +
              "".join(f"{v[k]:8.2f}" if k in v else f"{'':8s}" for k in (1, 2, 4, 8, 16)))
    for name, why in report["skipped"].items():
        print(f"{name:28s} skipped: {why}")
    print(f"chosen: {report['name']}, K = {setting.lookahead}: {report['why']}")
    if args.out:  # the report with the run record beside it
        write_json(args.out, {**report, "meta": record.meta()})
    return report


if __name__ == "__main__":
    main()
