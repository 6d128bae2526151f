"""K for one draft on a runner already tuned: the chain length that makes SpS fastest for that draft, at that
decoding setting, on this machine.

sr.tune ranks settings with one acceptance rate a and Leviathan et al.'s i.i.d. model, and costs a proposal of
K tokens as K one-token steps. A trained draft breaks both: its acceptance falls with the position in the
chain (the first drafted token is right far more often than the third), and its first step after a target
pass costs more than the later ones (its weights come back from memory). Here both are measured instead:
- tau(K), the expected tokens per loop for every K up to the pilot's, from one short SpS pilot at the largest
  K on prompts that are not evaluation items: a loop that proposed at least j tokens tells whether the j-th
  was accepted, so P(n >= j) is counted over those loops and tau(K) = 1 + sum_{j <= K} P(n >= j) (a chain's
  first K tokens are drawn the same way whatever comes after them);
- the pass over K + 1 tokens and the draft's proposal of K tokens, each right after a target pass
  (specrepro.tuning.costs, interleaved, medians).
K >= 1 minimises (proposal_ms[K] + pass_ms[K + 1]) / tau(K); the expected speedup over ArS (pass_ms[1] a
token) says whether even that K loses to ArS. This is for drafts that propose every token they are asked for; a draft with its own stop rule
(the datastore draft) decides its length itself.

    choice = tuned_lookahead(setting.target, draft, prompts, {"greedy": {"temperature": 0.0}})
    gen = sr.speculative_generate(setting.target, draft, ids, lookahead=choice["greedy"]["lookahead"])
"""
from __future__ import annotations

import torch

from .costs import measure_cost_table

PILOT_LOOKAHEAD = 6  # the pilot's chain: trained drafts here stop paying well before it


def tau_by_lookahead(accepted: list[int], proposed: list[int], max_lookahead: int) -> dict:
    """{"tau": {K: expected tokens per loop}, "p_reach": {j: P(n >= j)}, "loops": {j: loops that proposed >= j}}
    for K = 1..max_lookahead, from the accepted and proposed counts of a pilot's loops. A position no loop
    reached gets no entry (and no K at or past it)."""
    if len(accepted) != len(proposed):
        raise ValueError(f"accepted has {len(accepted)} loops and proposed {len(proposed)}")
    tau, p_reach, loops, total = {}, {}, {}, 1.0
    for j in range(1, max_lookahead + 1):
        seen = [n for n, k in zip(accepted, proposed) if k >= j]
        if not seen:
            break
        p_reach[j] = sum(n >= j for n in seen) / len(seen)
        loops[j] = len(seen)
        total += p_reach[j]
        tau[j] = total
    return {"tau": tau, "p_reach": p_reach, "loops": loops}


def choose_lookahead(pass_ms: dict, proposal_ms: dict, tau: dict) -> dict:
    """The K >= 1 with the least expected time per token, (proposal_ms[K] + pass_ms[K + 1]) / tau[K], over the
    Ks all three know (ties to the smaller K). Pure: tests feed it tables. Returns {"lookahead", "ms_per_token":
    {K: ms}, with 0 for ArS at pass_ms[1], "expected_speedup" of that K over ArS on the same runner (below 1
    where ArS is faster)}."""
    if 1 not in pass_ms:
        raise ValueError("pass_ms needs the one-token pass (key 1)")
    ms = {0: pass_ms[1]}
    for k in sorted(tau):
        if k >= 1 and k in proposal_ms and k + 1 in pass_ms:
            ms[k] = (proposal_ms[k] + pass_ms[k + 1]) / tau[k]
    if len(ms) == 1:
        raise ValueError(f"no K has a tau, a proposal time and a pass time: tau for {sorted(tau)}, proposals for "
                         f"{sorted(proposal_ms)}, passes over {sorted(pass_ms)} tokens")
    best = min((k for k in ms if k >= 1), key=lambda k: (ms[k], k))
    return {"lookahead": best, "ms_per_token": ms, "expected_speedup": ms[0] / ms[best]}


@torch.inference_mode()
def pilot(runner, draft, prompts, sampling: dict, lookahead: int = PILOT_LOOKAHEAD, max_new_tokens: int = 48,
          seed: int = 0) -> dict:
    """Accepted and proposed counts of every loop of SpS at `lookahead` over `prompts` (token id tensors) with
    `sampling` (speculative_generate's temperature / top_k / top_p), one seeded generator per prompt."""
    from ..generate import speculative_generate

    accepted, proposed = [], []
    for i, ids in enumerate(prompts):
        gen = speculative_generate(runner, draft, ids.view(-1), max_new_tokens=max_new_tokens, lookahead=lookahead,
                                   generator=torch.Generator().manual_seed(seed + i), **sampling)
        accepted += gen.accepted
        proposed += gen.proposed
    return {"accepted": accepted, "proposed": proposed}


def tuned_lookahead(runner, draft, prompts, samplings: dict, max_lookahead: int = PILOT_LOOKAHEAD,
                    reps: int = 15, max_new_tokens: int = 48, seed: int = 0) -> dict:
    """{name: choice} for each decoding setting in `samplings` ({name: speculative_generate's sampling
    keywords}): the K for `draft` on `runner`, with what it was chosen from (choose_lookahead's fields,
    "tau" and "p_reach" of the pilot, "pass_ms" and "proposal_ms" measured once for all settings).
    prompts: token id tensors that are not evaluation items (the pilot's, and the first is the prefix the
    costs are timed after); at least 2 tokens each."""
    if not prompts:
        raise ValueError("tuned_lookahead needs at least one prompt to measure acceptance on")
    if not isinstance(max_lookahead, int) or isinstance(max_lookahead, bool) or max_lookahead < 1:
        raise ValueError(f"max_lookahead must be a positive integer, got {max_lookahead!r}")
    if not samplings:
        raise ValueError("samplings is empty: name at least one decoding setting, e.g. {'greedy': {'temperature': 0.0}}")
    costs = measure_cost_table({"draft": (runner, draft)}, prompts[0], range(1, max_lookahead + 1), reps=reps,
                               seed=seed, proposal_sizes=range(2, max_lookahead + 1))["draft"]
    out = {}
    for name, sampling in samplings.items():
        counts = pilot(runner, draft, prompts, dict(sampling), max_lookahead, max_new_tokens, seed)
        reach = tau_by_lookahead(counts["accepted"], counts["proposed"], max_lookahead)
        choice = choose_lookahead(costs["target_ms"], costs["proposal_ms"], reach["tau"])
        out[name] = {**choice, "tau": reach["tau"], "p_reach": reach["p_reach"], "pilot_loops": len(counts["proposed"]),
                     "pass_ms": costs["target_ms"], "proposal_ms": costs["proposal_ms"], "sampling": dict(sampling)}
    return out
