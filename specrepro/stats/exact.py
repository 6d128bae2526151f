"""Exact target distributions and chi-square goodness-of-fit: the losslessness check.

For a small vocabulary the target's joint distribution of the first n generated tokens can be enumerated
exactly; speculative samples are then compared with it by scipy's chi-square test.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import chisquare

from ..algorithm.sampling import SamplingConfig


@torch.inference_mode()
def exact_joint(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    n_tokens: int,
    sampling: SamplingConfig,
    eos_token_id: int | None = None,
) -> dict[tuple[int, ...], float]:
    """P(first n_tokens generated) under the target with `sampling`, by full enumeration.

    A sequence ending in EOS before n_tokens is a complete outcome of its own (shorter tuple).
    Uses uncached full forwards, so it is independent of the KV-cache code it checks.
    """
    if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens < 1:
        raise ValueError(f"n_tokens must be an integer >= 1, got {n_tokens!r}")
    out: dict[tuple[int, ...], float] = {}
    frontier = [((), 1.0)]
    for _ in range(n_tokens):
        if not frontier:
            break
        batch = torch.stack([torch.cat([prompt, torch.tensor(prefix, dtype=torch.long)]) for prefix, _ in frontier])
        probs = sampling.probs(model(input_ids=batch).logits[:, -1]).double().tolist()
        next_frontier = []
        for (prefix, mass), row in zip(frontier, probs):
            for token, p in enumerate(row):
                if p == 0:
                    continue
                seq = prefix + (token,)
                if token == eos_token_id:
                    out[seq] = out.get(seq, 0.0) + mass * p
                else:
                    next_frontier.append((seq, mass * p))
        frontier = next_frontier
    for seq, mass in frontier:
        out[seq] = out.get(seq, 0.0) + mass
    return out


def truncate_outcome(tokens, n_tokens: int, eos_token_id: int | None = None) -> tuple[int, ...]:
    """The outcome exact_joint would name for a generated sequence: its first n tokens, cut after EOS."""
    seq = []
    for t in list(tokens)[:n_tokens]:
        seq.append(int(t))
        if t == eos_token_id:
            break
    return tuple(seq)


@dataclass
class ChiSquare:
    statistic: float
    pvalue: float
    cells: int
    samples: int


def chisquare_fit(samples, expected_probs: dict, min_expected: float = 5.0) -> ChiSquare:
    """Chi-square of sampled outcomes against exact probabilities.

    Cells whose expected count is below `min_expected` are pooled (into a cell of their own, or with the
    smallest cell when their total is too small), as the test's approximation requires. An outcome with
    probability 0 (absent or listed as 0) that occurs is a certain failure: p-value 0.
    """
    counts = Counter(samples)
    n = sum(counts.values())
    impossible = sum(c for k, c in counts.items() if expected_probs.get(k, 0.0) <= 0)
    keys = sorted((k for k in expected_probs if expected_probs[k] > 0), key=lambda k: -expected_probs[k])
    big = [k for k in keys if expected_probs[k] * n >= min_expected]
    if impossible or len(big) < 2:
        # an outcome the target can never produce is a certain failure; one cell leaves nothing to test
        return ChiSquare(float("inf") if impossible else 0.0, 0.0 if impossible else 1.0, len(big), n)
    observed = np.array([counts.get(k, 0) for k in big], dtype=float)
    expected = np.array([expected_probs[k] * n for k in big])
    rest_obs, rest_exp = n - observed.sum(), n - expected.sum()
    if rest_exp >= min_expected:
        observed, expected = np.append(observed, rest_obs), np.append(expected, rest_exp)
    else:  # too little mass for a cell of its own: pool it with the smallest cell
        observed[-1] += rest_obs
        expected[-1] += max(rest_exp, 0.0)
    expected *= n / expected.sum()  # exact totals despite float round-off
    stat, p = chisquare(observed, expected)
    return ChiSquare(float(stat), float(p), len(observed), n)
