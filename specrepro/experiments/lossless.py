"""Losslessness on tiny random models: the exact target joint of the first tokens against the empirical
frequencies of SpS samples (scipy chi-square, Bonferroni-corrected), with a deliberately wrong sampler
that the test must reject. Notebook 01 calls run_losslessness and joint_table.
"""
from __future__ import annotations

import itertools
import math
from collections import Counter

import torch
from tqdm.auto import tqdm

from . import wrong
from .records import generator
from .results import ResultsFile
from ..algorithm.sampling import SamplingConfig
from ..generate import autoregressive_generate, speculative_generate
from ..stats.exact import chisquare_fit, exact_joint, truncate_outcome
from ..stats.toy import tiny_llama

def toy_models(target_seed: int = 0, draft_seed: int = 1, vocab: int = 6, logit_scale: float = 12.0):
    """(q, p): two tiny random Llamas (specrepro.stats.toy) without EOS, so every outcome has n_tokens tokens.

    `logit_scale` keeps their distributions far from uniform and from each other: the wrong sampler's
    output differs from q only where p and q differ.
    """
    return (tiny_llama(target_seed, vocab, logit_scale=logit_scale, eos_token_id=None),
            tiny_llama(draft_seed, vocab, logit_scale=logit_scale, eos_token_id=None))

# the wrong sampler resamples from q instead of (q - p)+ at a rejection: min(p, q) + (1 - sum min(p, q)) q != q
SAMPLERS = {"sps": None, "ars": None, "sps_wrong_resample_q": wrong.resample_from_q}

def sample_outcomes(target, draft, prompt, n_tokens: int, n_samples: int, sampler: str, lookahead: int,
                    sampling: SamplingConfig, gen: torch.Generator) -> Counter:
    """Counts of each outcome (the first n_tokens, named as by stats.truncate_outcome) over n_samples runs."""
    counts = Counter()
    kw = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, generator=gen)
    # generate at least K+1 tokens so the first loop drafts a full lookahead; the first n are what we test
    length = max(n_tokens, lookahead + 1)
    step = SAMPLERS[sampler]
    rules = wrong.chain_rules(step) if step else None
    for _ in range(n_samples):
        if sampler == "ars":
            tokens = autoregressive_generate(target, prompt, max_new_tokens=n_tokens, **kw).tokens
        else:
            tokens = speculative_generate(target, draft, prompt, max_new_tokens=length, lookahead=lookahead,
                                          _rules=rules, **kw).tokens
        counts[truncate_outcome(tokens.tolist(), n_tokens)] += 1
    return counts

def _model_tag(target_seed, draft_seed, vocab, logit_scale, prompt, n_tokens) -> str:
    """What the outcome counts of a losslessness record were drawn from (checked on resume)."""
    return (f"toy.tiny_llama seeds q={target_seed} p={draft_seed} vocab={vocab} logit_scale={logit_scale} "
            f"prompt={list(prompt)} n_tokens={n_tokens}")

def _outcome_counts(records, model: str) -> Counter:
    """The summed outcome counts of some losslessness records, all of which must be for `model`."""
    total = Counter()
    for r in records:
        if r.get("model") != model:
            raise ValueError(f"result {r['key']!r} was drawn from other models ({r.get('model')}), not {model}; "
                             "delete that results file or use another results_dir")
        total.update({tuple(seq): n for seq, n in r["outcomes"]})
    return total

def run_losslessness(settings: list[dict], results_path, n_samples: int, n_tokens: int = 2, vocab: int = 6,
                     alpha: float = 0.01, chunk: int = 500, seed: int = 0, target_seed: int = 0,
                     draft_seed: int = 1, prompt=(0, 3), logit_scale: float = 12.0) -> list[dict]:
    """Chi-square test (stats.chisquare_fit) of each setting's first-n_tokens outcomes against the exact
    target joint (stats.exact_joint).

    settings: dicts with name, sampler ("sps", "ars" or "sps_wrong_resample_q"), lookahead, temperature,
    top_k, top_p. alpha is the family-wise level: each test is judged at alpha / (number of settings)
    (Bonferroni). Samples are drawn in chunks, each a resumable item.
    """
    target, draft = toy_models(target_seed, draft_seed, vocab, logit_scale)
    model = _model_tag(target_seed, draft_seed, vocab, logit_scale, prompt, n_tokens)
    prompt = torch.tensor(prompt, dtype=torch.long)
    results = ResultsFile(results_path)
    corrected = alpha / len(settings)
    rows = []
    n_chunks = math.ceil(n_samples / chunk)
    todo = [(s, c) for s in settings for c in range(n_chunks)]
    for s, c in tqdm(todo, desc="losslessness chunks"):
        key = f"{s['name']}/chunk{c}"
        if key in results:
            continue
        sampling = SamplingConfig(s.get("temperature", 1.0), s.get("top_k"), s.get("top_p"))
        size = min(chunk, n_samples - c * chunk)
        counts = sample_outcomes(target, draft, prompt, n_tokens, size, s["sampler"], s.get("lookahead", 1),
                                 sampling, generator(seed, key))
        results.append({"key": key, "setting": s["name"], "model": model,
                        "outcomes": [[list(seq), n] for seq, n in sorted(counts.items())]})
    for s in settings:
        sampling = SamplingConfig(s.get("temperature", 1.0), s.get("top_k"), s.get("top_p"))
        expected = exact_joint(target, prompt, n_tokens, sampling)
        counts = _outcome_counts([results.records[f"{s['name']}/chunk{c}"] for c in range(n_chunks)], model)
        test = chisquare_fit(counts.elements(), expected)
        tv = 0.5 * sum(abs(counts[o] / test.samples - expected.get(o, 0.0)) for o in set(counts) | set(expected))
        rows.append({
            "setting": s["name"], "sampler": s["sampler"], "lookahead": s.get("lookahead", 0),
            "temperature": s.get("temperature", 1.0), "top_k": s.get("top_k"), "top_p": s.get("top_p"),
            "n_samples": test.samples, "n_tokens": n_tokens, "vocab": vocab, "cells": test.cells,
            "chi2": test.statistic, "dof": max(test.cells - 1, 0), "pvalue": test.pvalue, "alpha": alpha,
            "alpha_corrected": corrected, "tv_distance": tv,
            "expected_to_pass": s["sampler"] != "sps_wrong_resample_q", "passes": test.pvalue > corrected,
        })
    return rows

def joint_table(results_path, setting: str, target_seed: int = 0, vocab: int = 6, n_tokens: int = 2,
                sampling: SamplingConfig = SamplingConfig(), logit_scale: float = 12.0, prompt=(0, 3),
                draft_seed: int = 1) -> list[dict]:
    """Empirical vs exact frequency of every sequence in V^n_tokens for one setting (for the bar figure)."""
    target, _ = toy_models(target_seed, draft_seed, vocab, logit_scale)
    expected = exact_joint(target, torch.tensor(prompt), n_tokens, sampling)
    model = _model_tag(target_seed, draft_seed, vocab, logit_scale, prompt, n_tokens)
    counts = _outcome_counts([r for r in ResultsFile(results_path).values() if r["setting"] == setting], model)
    total = sum(counts.values())
    seqs = itertools.product(range(vocab), repeat=n_tokens)
    return [{"sequence": " ".join(map(str, s)), "exact": expected.get(s, 0.0), "empirical": counts[s] / total}
            for s in seqs]
