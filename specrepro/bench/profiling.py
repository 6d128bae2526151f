"""Where the time of one SpS run goes: target forwards, draft proposals, verification sampling, the rest."""
from __future__ import annotations

import copy
import time

import torch

from ..drafts.base import ModelDraft
from ..algorithm.sampling import SamplingConfig, sample
from ..algorithm.speculative import rejection_step
from ..generate import speculative_generate

class _Timed:
    """A runner proxy that appends the wall time of each forward (and prefill) to times[key]."""

    def __init__(self, runner, times: dict, key: str):
        self.__dict__.update(_runner=runner, _times=times, _key=key)
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
    from ..drafts.base import Draft

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
