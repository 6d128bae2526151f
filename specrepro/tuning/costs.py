"""The one cost measurement behind every speed number: c (a draft step / a one-token target pass) and
v(K) (a target pass over K + 1 tokens / a one-token pass), as in Leviathan et al.'s speedup model.

Used by the bench, the notebooks' sweeps, `specrepro-drafts measure` and `specrepro.tune`, so
the c and v(K) in the README, the figures and tune's choice are one quantity measured one way:
- the target (an HF model, or any runner: HFRunner, LeanRunner, a tuned setting's runner) first caches
  `prefix`; each timed pass then feeds n random token ids after it and is rolled back, for every
  n in 1..max(K) + 1 (loops that propose fewer than K tokens are costed too);
- a draft step is one propose() of one token after the same prefix (for a model draft one forward of one
  token, for prompt lookup its n-gram search), after an untimed call that caches the prefix;
- repetitions are interleaved over sizes and over the pairs measured together, and medians are kept.
Keys are ints; `from_json` restores them after a JSON round trip.
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch

from ..algorithm.sampling import SamplingConfig
from ..drafts.base import as_draft
from ..engines.runners import as_runner, hidden_kept


def _sync(device) -> None:
    """Wait for queued GPU work, so a wall-clock interval covers the pass itself (a no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def measure_cost_table(pairs: dict, prefix: torch.Tensor, ks, reps: int = 5, seed: int = 0, extra_sizes=(),
                       proposal_sizes=()) -> dict:
    """{name: costs} for several (target, draft or None) pairs measured interleaved, e.g. one per runner.

    costs: {"target_ms": {n: median ms of a pass over n tokens}, "v": {K: target_ms[K+1] / target_ms[1]},
    and with a draft "draft_ms" and "c" = draft_ms / target_ms[1]}: a proposal of one token, right after a
    target pass as in a loop ("draft_samples_ms": each timed step, in order). extra_sizes: more pass sizes to
    time (e.g. a token tree's node count + 1), beyond 1..max(ks) + 1. proposal_sizes: also time proposals of
    these many tokens, each right after a target pass ("proposal_ms": {K: median ms}, "c_per_token":
    {K: proposal_ms[K] / K / target_ms[1]}): a draft's later steps in one proposal find its weights in cache,
    its first one after the target's pass does not.
    """
    ks = [int(k) for k in ks if int(k) > 0] or [1]
    sizes = sorted(set(range(1, max(ks) + 2)) | {int(n) for n in extra_sizes if int(n) >= 1})
    prefix = prefix.view(-1)
    if prefix.shape[0] < 2:
        raise ValueError("measure_costs needs a prefix of at least 2 tokens")
    with contextlib.ExitStack() as kept:
        return _measure(pairs, prefix, sizes, reps, seed, kept, sorted({int(k) for k in proposal_sizes if int(k) > 1}))


def _measure(pairs, prefix, sizes, reps, seed, kept, proposal_sizes=()) -> dict:
    g = torch.Generator().manual_seed(seed)
    greedy = SamplingConfig(0.0)
    state = {}
    for name, (target, draft) in pairs.items():
        proposer = as_draft(draft) if draft is not None else None
        wants = bool(proposer is not None and proposer.wants_target_hidden)
        runner = kept.enter_context(hidden_kept(as_runner(target), wants, getattr(draft, "target_taps", ())))
        runner.reset()
        runner.forward(prefix[:-1].to(runner.device))
        hidden = runner.hidden if wants else None  # the prompt's target features, for feature drafts
        runner.forward(prefix[-1:].to(runner.device))
        if proposer is not None:
            proposer.reset()
            proposer.propose(prefix, 1, greedy, g, hidden)  # caches the prefix in the draft
        state[name] = dict(runner=runner, proposer=proposer, hidden=hidden, base=runner.length,
                           times={n: [] for n in sizes}, draft=[], proposals={k: [] for k in proposal_sizes})
    for _ in range(reps):
        for name, s in state.items():
            runner = s["runner"]
            for n in sizes:
                ids = torch.randint(0, runner.vocab_size, (n,), generator=g).to(runner.device)
                runner.rollback(s["base"])
                _sync(runner.device)
                t = time.perf_counter()
                runner.forward(ids)
                _sync(runner.device)
                s["times"][n].append(time.perf_counter() - t)
            runner.rollback(s["base"])
            if s["proposer"] is not None:
                t = time.perf_counter()
                s["proposer"].propose(prefix, 1, greedy, g, s["hidden"])  # one step, as inside a loop
                _sync(runner.device)
                s["draft"].append(time.perf_counter() - t)
                for k in proposal_sizes:  # each after a target pass, as the first of a loop's proposals is
                    runner.forward(ids[:1])
                    _sync(runner.device)
                    runner.rollback(s["base"])
                    t = time.perf_counter()
                    s["proposer"].propose(prefix, k, greedy, g, s["hidden"])
                    _sync(runner.device)
                    s["proposals"][k].append(time.perf_counter() - t)
    out = {}
    for name, s in state.items():
        target_ms = {n: 1e3 * statistics.median(v) for n, v in s["times"].items()}
        entry = {"target_ms": target_ms, "v": {n - 1: ms / target_ms[1] for n, ms in target_ms.items() if n > 1}}
        if s["draft"]:
            entry["draft_samples_ms"] = [1e3 * t for t in s["draft"]]
            entry["draft_ms"] = statistics.median(entry["draft_samples_ms"])
            entry["c"] = entry["draft_ms"] / target_ms[1]
        if any(s["proposals"].values()):
            entry["proposal_ms"] = {1: entry["draft_ms"]} | {k: 1e3 * statistics.median(v) for k, v in s["proposals"].items()}
            entry["c_per_token"] = {k: ms / k / target_ms[1] for k, ms in entry["proposal_ms"].items()}
        out[name] = entry
    return out


def measure_costs(target, draft, prefix: torch.Tensor, ks, reps: int = 5, seed: int = 0, extra_sizes=()) -> dict:
    """Costs of one (target, draft) pair: see measure_cost_table."""
    return measure_cost_table({"": (target, draft)}, prefix, ks, reps, seed, extra_sizes)[""]


def from_json(costs: dict) -> dict:
    """The same costs with the int keys a JSON round trip turned into strings."""
    out = dict(costs)
    for name in ("target_ms", "v"):
        if name in out:
            out[name] = {int(k): v for k, v in out[name].items()}
    return out
