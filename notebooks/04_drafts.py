# ---
# jupyter:
#   kernelspec:
#     display_name: Python (specrepro)
#     language: python
#     name: specrepro
# ---

# %% [markdown]
# # 04 · Draft strategies
# Every kind of draft on the same target, held-out news and HumanEval prompts, greedy and T=1: acceptance
# a (per-token MLE), tokens per target call tau at each K, draft/target cost ratio c, v(K) (a K+1-token
# target pass over a one-token pass), and the measured speedup over ArS beside Leviathan et al.'s
# prediction (1 - a^(K+1)) / ((1 - a)(K c + v(K))). Trained kinds (small, seqkd, feature, heads) come
# from notebook 00's cached artifacts; lookup and truncated need no training.

# %% tags=["parameters"]
profile = "smoke"  # smoke | cpu | gpu
out_dir = "figures/smoke"  # outputs, relative to the repo root
results_dir = "runs/smoke/results"  # per-item JSON lines, for resuming
seed = 0  # base seed
threads = 1  # torch threads
target = "smollm2-135m-instruct"
dtype = "auto"  # auto (sr.tune measures float32 and bfloat16 here and keeps the faster) | float32 | bfloat16
device = "cpu"
device_map = None  # "auto" or a dict: split a target too big for one device (accelerate)
max_memory = None  # e.g. {0: "70GiB", 1: "70GiB", "cpu": "100GiB"} with device_map
drafts = ["truncated:2", "lookup"]  # "truncated:N", "model:<id>", or kinds of specrepro.drafts.load
lookaheads = [1, 2, 4]  # K values (0 is added as the baseline)
trees = ["2x2"]  # token trees each draft also runs ("WIDTHxDEPTH[/NODES]"; [] for chains only)
n_news = 1  # held-out news prompts
n_code = 1  # HumanEval prompts
max_new_tokens = 8
temperatures = [0.0, 1.0]
top_p = None

# %%
import os
from pathlib import Path

import torch
from IPython.display import Image, Markdown

import specrepro as sr
from specrepro.experiments import plots
from specrepro.experiments.drafts_table import measure_drafts
from specrepro.experiments.records import profile_note, repo_root, results_folder, run_header, write_outputs
from specrepro.experiments.results import markdown_table
from specrepro.experiments.workloads import code_items, compute_dtype, eos_ids, load_target, make_draft, news_items, tuned_target

os.chdir(repo_root())
results_dir = results_folder("04_drafts", globals())  # keyed by the effective parameters and the code
meta = run_header(profile, seed, threads, notebook="04_drafts", target=target, dtype=dtype, drafts=drafts,
                     lookaheads=lookaheads, trees=trees, n_news=n_news, n_code=n_code, max_new_tokens=max_new_tokens,
                     temperatures=temperatures, top_p=top_p)
q_model, tokenizer = load_target(target, dtype, device, device_map, max_memory)
# one runner for every draft (so all rows share one ArS baseline): the setting sr.tune measures fastest here
# for a loop with a free draft (prompt lookup)
runner, meta["tune"] = tuned_target(q_model, make_draft("lookup", q_model), dtype, threads)
prompts = {"news": news_items(tokenizer, n_news), "code": code_items(tokenizer, n_code)}
rows = measure_drafts(q_model, drafts, prompts, lookaheads, max_new_tokens, temperatures,
                         Path(results_dir) / "drafts.jsonl", seed=seed, eos=eos_ids(tokenizer), top_p=top_p,
                         dtype=compute_dtype(runner), runner=runner, trees=trees,  # drafts compute as the target runs
                         pass_costs=meta["tune"]["v"])  # a datastore draft stops where a token does not pay
write_outputs(out_dir, "drafts", rows, meta)
Image(plots.plot_drafts(out_dir)[0])

# %% [markdown]
# The best setting (chain K or tree) per draft, task and temperature (highest measured speedup):

# %%
best = {}
for r in rows:
    key = (r["draft"], r["task"], r["temperature"])
    if key not in best or r["speedup"] > best[key]["speedup"]:
        best[key] = r
table = markdown_table(list(best.values()), [
    "draft", "task", "temperature", "K", "tree", "a", "tau", "c", "v", "speedup", "predicted_speedup"])
Markdown(profile_note(profile) + table)
