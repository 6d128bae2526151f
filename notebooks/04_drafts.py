# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Draft strategies
# Acceptance a, tokens per target call tau at each K, draft/target cost ratio c, and measured vs predicted
# speedup, per draft. When `python -m specrepro.drafts.measure` has written `figures/drafts/*.csv`, this
# notebook tabulates those; otherwise (or with `measure = True`) it measures the drafts listed below.

# %% tags=["parameters"]
profile = "smoke"  # smoke | cpu | gpu
out_dir = "figures/smoke"  # outputs, relative to the repo root
results_dir = "runs/smoke/results"  # per-item JSON lines, for resuming
seed = 0  # base seed
threads = 1  # torch threads
target = "smollm2-135m-instruct"
dtype = "float32"
device = "cpu"
drafts_dir = "figures/drafts"  # where specrepro.drafts.measure writes its CSV/JSON
measure = False  # True: measure here even if drafts_dir has CSVs
drafts = ["truncated:2", "truncated:6"]  # drafts to measure: "truncated:N", "model:<id>", or kinds
lookaheads = [1, 2, 4]  # K values (0 is added as the baseline)
n_prompts = 1  # news prompts per draft
max_new_tokens = 8
temperature = 1.0
top_p = None

# %%
import os
from pathlib import Path

import torch
from IPython.display import Image, Markdown

import specrepro as sr
from specrepro import experiments as ex, plots

os.chdir(ex.repo_root())
meta = ex.run_header(profile, seed, threads, notebook="04_drafts", target=target, drafts=drafts,
                     lookaheads=lookaheads, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_p=top_p)
rows = [] if measure else ex.read_draft_measurements(drafts_dir)
meta["source"] = f"read from {drafts_dir}" if rows else "measured in this notebook"
if not rows:
    q_model, tokenizer = sr.load_model(target, dtype=getattr(torch, dtype), device=device)
    rows = ex.measure_drafts(q_model, drafts, ex.news_items(tokenizer, n_prompts), lookaheads, max_new_tokens,
                             {"temperature": temperature, "top_p": top_p}, Path(results_dir) / "drafts.jsonl",
                             seed=seed, eos=ex.eos_ids(tokenizer))
ex.write_outputs(out_dir, "drafts", rows, meta)
Image(plots.plot_drafts(out_dir)[0]) if {"draft", "K", "tau"} <= set(rows[0]) else None

# %%
Markdown(ex.markdown_table(rows))
