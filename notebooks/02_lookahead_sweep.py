# ---
# jupyter:
#   kernelspec:
#     display_name: Python (specrepro)
#     language: python
#     name: specrepro
# ---

# %% [markdown]
# # 02 · Lookahead sweep (Chen et al. Figure 1)
# K = 0..7 (K = 0 is autoregressive sampling) on news and code prompts with the real target and a draft:
# mean token time and its speedup over K = 0, mean accepted tokens / (K+1), time per loop, per-token latency
# percentiles, and the speedup Leviathan et al. predict from acceptance a, the draft/target cost ratio c and
# the verify cost v(K) = (target pass over K+1 tokens) / (one-token pass), all measured in this run.
# Token times exclude the prompt prefill (identical for ArS and SpS). Token trees (`trees`) run beside the
# chains on the same prompts: one target pass verifies the whole tree (specrepro.algorithm.tree); in the figure they are
# stars at K = their depth, and their v is the pass over nodes + 1 tokens.

# %% tags=["parameters"]
profile = "smoke"  # smoke | cpu | gpu
out_dir = "figures/smoke"  # outputs, relative to the repo root
results_dir = "runs/smoke/results"  # per-item JSON lines, for resuming
seed = 0  # base seed (each generation's seed derives from it and the prompt)
threads = 1  # torch threads
target = "smollm2-135m-instruct"  # offline default, an HF id or a local dir
draft = "truncated:4"  # "truncated:N" (stand-in), "model:<id or dir>", or a specrepro.drafts kind
dtype = "auto"  # auto (sr.tune measures float32 and bfloat16 here and keeps the faster) | float32 | bfloat16
device = "cpu"
device_map = None  # "auto" or a dict: split a target too big for one device (accelerate)
max_memory = None  # e.g. {0: "70GiB", 1: "70GiB", "cpu": "100GiB"} with device_map
lookaheads = [0, 1, 2, 4]  # the paper sweeps 0..7
trees = ["2x2"]  # token trees run beside the chains ("WIDTHxDEPTH[/NODES]", e.g. "3x4/12"; [] for none)
n_news = 1  # news prompts
n_code = 1  # HumanEval prompts
max_new_tokens = 8  # tokens per generation (the paper: 128)
temperature = 1.0  # sampling for the sweep
top_p = None
repeats = 1  # generations per prompt and K
cost_repeats = 5  # timed passes per cost measurement
news_source = "offline"  # offline | xsum | path.jsonl
code_source = "offline"  # offline | hub | path

# %%
import os
from pathlib import Path

import torch
from IPython.display import Image, Markdown

import specrepro as sr
from specrepro.experiments import plots
from specrepro.experiments.records import profile_note, repo_root, results_folder, run_header, write_outputs
from specrepro.experiments.results import markdown_table
from specrepro.experiments.sweep import run_lookahead_sweep
from specrepro.experiments.workloads import code_items, compute_dtype, eos_ids, load_target, make_draft, news_items, slug, tuned_target, with_pass_costs

os.chdir(repo_root())
results_dir = results_folder("02_lookahead_sweep", globals())  # keyed by the effective parameters and the code
meta = run_header(profile, seed, threads, notebook="02_lookahead_sweep", target=target, draft=draft, dtype=dtype,
                     device=device, lookaheads=lookaheads, trees=trees, max_new_tokens=max_new_tokens, temperature=temperature,
                     top_p=top_p, n_news=n_news, n_code=n_code, repeats=repeats)
q_model, tokenizer = load_target(target, dtype, device, device_map, max_memory)
p_model = make_draft(draft, q_model, dtype=q_model.dtype, device=device)
# the target runs through the setting sr.tune measured fastest on this machine (cached per CPU kind)
runner, meta["tune"] = tuned_target(q_model, p_model, dtype, threads)
if compute_dtype(runner) != q_model.dtype:  # a model draft computes in the dtype the tuned target runs in
    p_model = make_draft(draft, q_model, dtype=compute_dtype(runner), device=device)
p_model = with_pass_costs(p_model, meta["tune"])  # a datastore draft stops where a token does not pay
prompts = {"news": news_items(tokenizer, n_news, news_source), "code": code_items(tokenizer, n_code, code_source)}
meta["prompt_sources"] = {t: items[0]["source"] for t, items in prompts.items()}

# %%
out = run_lookahead_sweep(runner, p_model, prompts, lookaheads, max_new_tokens,
                             {"temperature": temperature, "top_p": top_p},
                             Path(results_dir) / f"lookahead_sweep-{slug(draft)}.jsonl", seed=seed,
                             eos=eos_ids(tokenizer), repeats=repeats, cost_repeats=cost_repeats, trees=trees)
meta["costs"] = out["costs"]
write_outputs(out_dir, "lookahead_sweep", out["rows"], meta)
Image(plots.plot_lookahead(out_dir)[0])

# %%
table = markdown_table(out["rows"], [
    "task", "K", "tree", "ms_per_token", "speedup", "predicted_speedup", "tau_over_K1", "ms_per_loop",
    "p50_ms", "p90_ms", "p99_ms", "a", "c", "v"])
Markdown(profile_note(profile) + table)
