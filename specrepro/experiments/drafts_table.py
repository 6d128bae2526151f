"""The drafts table: every draft strategy's acceptance, tau, step cost c and predicted speedup on the same
prompts, at each K and temperature (notebook 04 and `specrepro-drafts measure`)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..drafts.spec import make_draft
from .sweep import run_lookahead_sweep
from .workloads import compute_dtype, slug, with_pass_costs


def measure_drafts(target, draft_specs: list[str], prompts: dict[str, list[dict]], lookaheads, max_new_tokens: int,
                   temperatures, results_path, seed: int = 0, eos=None, top_p=None, dtype=None,
                   runner=None, trees=(), pass_costs=None) -> list[dict]:
    """Per draft, task and temperature: acceptance a (MLE), tau at each K, c, v(K), measured and predicted speedup;
    with `trees` (TreeSpecs or 'WIDTHxDEPTH[/NODES]'), also each token tree's tau and speedup per draft.

    prompts: {task: [{id, prompt_ids}]} (held-out news and HumanEval). Each (draft, temperature) is one
    resumable lookahead sweep (K = 0, ArS, is its baseline), so c and v(K) are measured in the same run.
    runner: what generates as the target (e.g. a tuned LeanRunner); default the HF model itself. Drafts are
    built from the HF model `target`, computing in `dtype` (default: the runner's, see compute_dtype).
    pass_costs: the runner's measured v(n) (tuned_target's summary["v"]), given to every datastore draft for
    its stop rule (workloads.with_pass_costs), as notebooks 02 and 03 run it; None: datastore drafts propose
    every token a match allows.
    """
    if dtype is None:
        dtype = compute_dtype(runner if runner is not None else target)
    rows = []
    path = Path(results_path)
    # resumed items must come from the same settings: the file name carries a digest of them
    made_with = settings_digest(max_new_tokens=max_new_tokens, top_p=top_p, seed=seed, eos=eos, dtype=str(dtype),
                                pass_costs=pass_costs, trees=[str(t) for t in trees],
                                prompts={task: [it["id"] for it in items] for task, items in prompts.items()})
    for spec in draft_specs:
        draft = make_draft(spec, target, dtype=dtype)
        if pass_costs is not None:
            draft = with_pass_costs(draft, {"v": pass_costs})
        for temp in temperatures:
            sweep_path = path.with_name(f"{path.stem}-{slug(spec)}-T{temp:g}-{made_with}{path.suffix}")
            out = run_lookahead_sweep(runner if runner is not None else target, draft, prompts, lookaheads, max_new_tokens,
                                      {"temperature": temp, "top_p": top_p}, sweep_path, seed=seed, eos=eos,
                                      trees=trees)
            for r in out["rows"]:
                if r["K"] > 0:
                    rows.append({"draft": spec, "task": r["task"], "temperature": temp, "K": r["K"],
                                 "tree": r["tree"], "nodes": r["nodes"], "a": r["a"],
                                 "acceptance_rate": r["acceptance_rate"],
                                 "acceptance_by_position": [round(x, 4) for x in r["acceptance_by_position"]],
                                 "tau": r["tau"],
                                 "tau_ci_low": r["tau_ci_low"], "tau_ci_high": r["tau_ci_high"], "c": r["c"],
                                 "v": r["v"], "speedup": r["speedup"], "speedup_ci_low": r["speedup_ci_low"],
                                 "speedup_ci_high": r["speedup_ci_high"], "predicted_speedup": r["predicted_speedup"],
                                 "ms_per_token": r["ms_per_token"], "n_generations": r["n_generations"],
                                 "n_items": r["n_items"]})
    return rows


def settings_digest(**settings) -> str:
    """12 hex digits naming the settings a sweep's items were generated with (so a rerun with other settings,
    e.g. --no-stop-rule or more new tokens, starts its own file instead of resuming another's)."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
