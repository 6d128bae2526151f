"""Uncertainty for the reproduction's numbers: bootstrap 95% confidence intervals over items, and paired
tests of "SpS leaves quality unchanged".

Items (prompts, problems) are the unit of resampling: the tokens of one generation are not independent.
A ratio such as a speedup (ArS time per token / SpS time per token, both summed over the same items) is
resampled with its items paired, so the interval reflects how the speedup varies across prompts.
Percentile intervals with a fixed seed: rerunning gives the same interval.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.stats import wilcoxon

N_BOOT = 2000
LEVEL = 0.95


def _percentiles(stats: np.ndarray, level: float) -> tuple[float, float]:
    tail = 100 * (1 - level) / 2
    return float(np.percentile(stats, tail)), float(np.percentile(stats, 100 - tail))


def _indices(n: int, n_boot: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def mean_ci(values, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high) of the mean over items; (mean, nan, nan) with fewer than 2 items."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    if x.size < 2:
        return float(x.mean()), math.nan, math.nan
    boots = x[_indices(x.size, n_boot, seed)].mean(axis=1)
    return (float(x.mean()), *_percentiles(boots, level))


def ratio_ci(numerators, denominators, n_boot: int = N_BOOT, level: float = LEVEL,
             seed: int = 0) -> tuple[float, float, float]:
    """(sum(num) / sum(den), low, high), resampling items i with their (num_i, den_i) pairs together."""
    a, b = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"ratio_ci needs paired items: {a.shape} numerators vs {b.shape} denominators")
    if a.size == 0 or b.sum() == 0:
        return math.nan, math.nan, math.nan
    point = float(a.sum() / b.sum())
    if a.size < 2:
        return point, math.nan, math.nan
    idx = _indices(a.size, n_boot, seed)
    return (point, *_percentiles(a[idx].sum(axis=1) / b[idx].sum(axis=1), level))


def ratio_of_ratios_ci(a_num, a_den, b_num, b_den, n_boot: int = N_BOOT, level: float = LEVEL,
                       seed: int = 0) -> tuple[float, float, float]:
    """((sum a_num / sum a_den) / (sum b_num / sum b_den), low, high), resampling items i with all four of
    their values together: two methods compared on the same items (a speedup, a tree's tau over a chain's)."""
    a_n, a_d, b_n, b_d = (np.asarray(x, float) for x in (a_num, a_den, b_num, b_den))
    if not (a_n.shape == a_d.shape == b_n.shape == b_d.shape):
        raise ValueError("a ratio of ratios needs the same items on both sides: "
                         f"{a_n.shape}, {a_d.shape} vs {b_n.shape}, {b_d.shape}")
    if a_n.size == 0:
        return math.nan, math.nan, math.nan

    def stat(idx):
        return (a_n[idx].sum(-1) / a_d[idx].sum(-1)) / (b_n[idx].sum(-1) / b_d[idx].sum(-1))

    point = float(stat(np.arange(a_n.size)))
    if a_n.size < 2:
        return point, math.nan, math.nan
    return (point, *_percentiles(stat(_indices(a_n.size, n_boot, seed)), level))


def speedup_ci(ars_seconds, ars_tokens, sps_seconds, sps_tokens, n_boot: int = N_BOOT, level: float = LEVEL,
               seed: int = 0) -> tuple[float, float, float]:
    """(ArS time per token / SpS time per token, low, high) over paired items (same prompts, both methods)."""
    return ratio_of_ratios_ci(ars_seconds, ars_tokens, sps_seconds, sps_tokens, n_boot, level, seed)


def paired_test(ars, sps) -> dict:
    """Wilcoxon signed-rank test of per-item SpS - ArS differences (two-sided), with the mean difference
    and its bootstrap CI. All differences zero (e.g. identical greedy texts) gives p = 1."""
    a, s = np.asarray(ars, float), np.asarray(sps, float)
    if a.shape != s.shape:
        raise ValueError(f"paired_test needs the same items: {a.shape} vs {s.shape}")
    diff = s - a
    mean, lo, hi = mean_ci(diff)
    if diff.size == 0:
        p = math.nan
    elif np.all(diff == 0):
        p = 1.0
    else:
        p = float(wilcoxon(s, a, zero_method="wilcox", alternative="two-sided").pvalue)
    return {"n_pairs": int(diff.size), "mean_difference": mean, "difference_ci_low": lo, "difference_ci_high": hi,
            "wilcoxon_p": p}
