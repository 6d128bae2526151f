"""Run bookkeeping shared by the notebooks' experiments: parameters, seeds, per-generation records and
the aggregates read from them, and the outputs every notebook writes.
"""
from __future__ import annotations

import hashlib
import json
import re
import zlib
from pathlib import Path

import torch

from ..files import write_json
from .results import RunRecord, code_digest, end_of_run, write_csv
from ..generate import autoregressive_generate, speculative_generate

PROFILES = ("smoke", "cpu", "gpu")  # derived profiles (gpu-test) pass their _base to the notebooks

def repo_root() -> Path:
    """The checkout this package lives in (notebooks resolve their output paths against it)."""
    return Path(__file__).resolve().parents[2]

def check_params(given: dict, allowed) -> None:
    """Raise ValueError naming any parameter that the notebook does not define (a typo in a params file)."""
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown}; this notebook accepts {sorted(allowed)}")

def notebook_defaults(name: str, notebook_dir=None) -> dict:
    """{parameter: default} from the `parameters` cell of notebooks/NAME.py (the jupytext source)."""
    import jupytext

    path = Path(notebook_dir or repo_root() / "notebooks") / f"{name}.py"
    if not path.is_file():
        raise ValueError(f"no notebook {path}")
    cells = [c for c in jupytext.read(path).cells if "parameters" in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"{path}: expected one cell tagged 'parameters', found {len(cells)}")
    namespace: dict = {}
    exec(compile(cells[0].source, f"{path} (parameters cell)", "exec"), {}, namespace)
    return namespace


# parameters that say where things go, not what is computed
_PLACES = ("results_dir", "out_dir")


def results_key(params: dict) -> str:
    """The key of a notebook's results folder: its effective parameters (where things go excepted), the
    package's sources (`code_digest`) and, when it names trained draft kinds, their artifacts."""
    from ..drafts.artifacts import artifacts_digest
    from ..drafts.kinds import KINDS

    settings = {k: v for k, v in params.items() if k not in _PLACES}
    settings["code"] = code_digest()
    named = set(re.findall(r"[a-z]+", json.dumps([params.get("draft"), params.get("drafts")], default=str)))
    if named & set(KINDS):
        settings["drafts_trained"] = artifacts_digest(named)
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]


def results_folder(name: str, namespace: dict, notebook_dir=None) -> str:
    """The folder notebook `name` keeps its items in: `<results_dir>/<name>-<results_key>`.

    namespace: the notebook's globals() after its parameters cell (and papermill's injected one), so the
    key is the same whether the notebook runs under specrepro-reproduce, papermill, nbval or in JupyterLab:
    change a parameter in Lab and the next run starts fresh items. A results_dir that already ends in
    this key (specrepro-reproduce passes it so, for --force and --merge) is used as it is.
    """
    params = {k: namespace[k] for k in notebook_defaults(name, notebook_dir)}
    base = Path(params["results_dir"])
    folder = f"{name}-{results_key(params)}"
    return str(base if base.name == folder else base / folder)


def run_header(profile: str, seed: int, threads: int | None, **extra) -> dict:
    """Fix threads and seed, and return what every output records: the run record (results.RunRecord: the
    commit and code digest, the machine, the load average), profile, seed, settings (the notebooks add the
    tuned setting as "tune"); write_outputs sets the record's end when it writes."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; use one of {PROFILES}")
    if threads:
        torch.set_num_threads(int(threads))
    torch.manual_seed(seed)
    return RunRecord().meta(profile=profile, seed=seed, **extra)

def item_seed(seed: int, key: str) -> int:
    """A stable per-item seed, so a resumed run draws the same randomness for the same item."""
    return (seed * 1_000_003 + zlib.crc32(key.encode())) % (2**63)

def generator(seed: int, key: str, device="cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(item_seed(seed, key))

SMOKE_NOTE = ("**Smoke profile: these sizes check that the code runs; they measure nothing.** A handful of "
              "prompts and tokens, stand-in drafts: do not read speedups, acceptance or scores from them. "
              "Run the cpu profile (`specrepro-reproduce --profile cpu`) for numbers.")


def profile_note(profile: str) -> str:
    """What a notebook shows above its results: a warning for the smoke profile, nothing otherwise."""
    return SMOKE_NOTE + "\n\n" if profile == "smoke" else ""


def write_outputs(out_dir, name: str, rows: list[dict], meta: dict) -> dict:
    """`<name>.csv` (the table) and `<name>.json` (table + run metadata, the run record's end set to now),
    both written atomically; a smoke run's JSON says that its numbers measure nothing."""
    out_dir = Path(out_dir)
    meta = end_of_run(meta)
    if meta.get("profile") == "smoke":
        meta = {**meta, "note": SMOKE_NOTE.replace("**", "")}
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
