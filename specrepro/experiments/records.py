"""Run bookkeeping shared by the notebooks' experiments: parameters, seeds, per-generation records and
the aggregates read from them, and the outputs every notebook writes.
"""
from __future__ import annotations

import time
import zlib
from pathlib import Path

import torch

from .results import machine_info, write_csv, write_json
from ..speculative import autoregressive_generate, speculative_generate

PROFILES = ("smoke", "cpu", "gpu")  # derived profiles (gpu-test) pass their _base to the notebooks

def repo_root() -> Path:
    """The checkout this package lives in (notebooks resolve their output paths against it)."""
    return Path(__file__).resolve().parents[2]

def check_params(given: dict, allowed) -> None:
    """Raise ValueError naming any parameter that the notebook does not define (a typo in a params file)."""
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown}; this notebook accepts {sorted(allowed)}")

def run_header(profile: str, seed: int, threads: int | None, **extra) -> dict:
    """Fix threads and seed, and return what every output records: machine, profile, seed, settings."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; use one of {PROFILES}")
    if threads:
        torch.set_num_threads(int(threads))
    torch.manual_seed(seed)
    return {"profile": profile, "seed": seed, "machine": machine_info(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            **extra}

def item_seed(seed: int, key: str) -> int:
    """A stable per-item seed, so a resumed run draws the same randomness for the same item."""
    return (seed * 1_000_003 + zlib.crc32(key.encode())) % (2**63)

def generator(seed: int, key: str, device="cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(item_seed(seed, key))

def write_outputs(out_dir, name: str, rows: list[dict], meta: dict) -> dict:
    """`<name>.csv` (the table) and `<name>.json` (table + run metadata), both written atomically."""
    out_dir = Path(out_dir)
    csv_path = write_csv(out_dir / f"{name}.csv", rows)
    json_path = write_json(out_dir / f"{name}.json", {"meta": meta, "rows": rows})
    return {"csv": str(csv_path), "json": str(json_path)}

def generation_record(gen, key: str, **extra) -> dict:
    emitted = [n + 1 for n in gen.accepted]
    if emitted:  # the last loop may stop early at EOS or the token budget
        emitted[-1] = len(gen.tokens) - sum(emitted[:-1])
    return {
        "key": key, "tokens": gen.tokens.tolist(), "n_tokens": len(gen.tokens), "seconds": gen.seconds,
        "target_calls": gen.target_calls, "draft_calls": gen.draft_calls, "accepted": gen.accepted,
        "proposed": gen.proposed, "loop_seconds": gen.loop_seconds, "emitted": emitted, **extra,
    }

def generate_item(target, draft, prompt_ids, lookahead: int, max_new_tokens: int, sampling: dict, eos, gen,
                  tree=None, stop_when=None):
    """ArS for lookahead 0, else SpS with a chain of `lookahead` tokens or, given a TreeSpec, a token tree."""
    kw = dict(max_new_tokens=max_new_tokens, eos_token_id=eos, generator=gen, stop_when=stop_when, **sampling)
    if lookahead == 0 and tree is None:
        return autoregressive_generate(target, prompt_ids, **kw)
    return speculative_generate(target, draft, prompt_ids, lookahead=tree.depth if tree else lookahead, tree=tree, **kw)

def decode_ms_per_token(records: list[dict]) -> float:
    """Mean token time of the decode loops (the prompt prefill is excluded, as it is the same for ArS and SpS)."""
    return 1000 * sum(sum(r["loop_seconds"]) for r in records) / sum(r["n_tokens"] for r in records)

def per_token_latencies(records: list[dict]) -> list[float]:
    """Each emitted token's latency = its loop's wall time / tokens that loop emitted."""
    out = []
    for r in records:
        for sec, n in zip(r["loop_seconds"], r["emitted"]):
            if n > 0:
                out += [sec / n] * n
    return out
