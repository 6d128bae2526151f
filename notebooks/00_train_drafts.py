# ---
# jupyter:
#   kernelspec:
#     display_name: Python (specrepro)
#     language: python
#     name: specrepro
# ---

# %% [markdown]
# # 00 · Train the drafts
# The paper's draft is a smaller model of the target's family; none exists offline for SmolLM2, so the
# reproduction trains its own (`specrepro.training.train`): distilled from the target's soft labels on the
# training splits only (news articles held out from the evaluation, CPython's standard library), with a
# time budget per draft. Artifacts are cached under `$SPECREPRO_HOME/drafts`, keyed by their settings, so a
# rerun reuses them; an interrupted training resumes from its last checkpoint. The later notebooks load
# the drafts by kind (`specrepro.drafts.load`).

# %% tags=["parameters"]
profile = "smoke"  # smoke | cpu | gpu
out_dir = "figures/smoke"  # outputs, relative to the repo root
results_dir = "runs/smoke/results"  # unused here: training checkpoints live beside the artifacts
seed = 0  # training seed
threads = 1  # torch threads
target = "smollm2-135m-instruct"
kinds = []  # draft kinds to train: small, seqkd, feature, heads; "kind:M" gives that kind M minutes (smoke: none)
budget_minutes = 1.0  # training time per draft without its own (the distillation data is built once, first)
max_steps = None  # or a fixed number of optimiser steps (exactly reproducible, unlike a time budget)

# %%
import json
import os

import torch
from IPython.display import Markdown

import specrepro as sr
from specrepro.experiments.records import repo_root, run_header, write_outputs
from specrepro.experiments.results import markdown_table
from specrepro.training import train

os.chdir(repo_root())
meta = run_header(profile, seed, threads, notebook="00_train_drafts", target=target, kinds=kinds,
                     budget_minutes=budget_minutes, max_steps=max_steps)
q_model, tokenizer = sr.load_model(target) if kinds else (None, None)
rows = []
for spec in kinds:
    kind, _, minutes = spec.partition(":")
    path = train(kind, target=q_model, tokenizer=tokenizer, budget_minutes=float(minutes or budget_minutes),
                 max_steps=max_steps, seed=seed)
    done = json.loads((path / "complete.json").read_text())
    rows.append({"kind": kind, "artifact": path.name, **{k: v for k, v in done.items() if not isinstance(v, (list, dict))}})
if rows:
    write_outputs(out_dir, "draft_training", rows, meta)
Markdown(markdown_table(rows)) if rows else Markdown("No drafts to train in this profile.")
