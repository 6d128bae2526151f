# ---
# jupyter:
#   kernelspec:
#     display_name: Python (specrepro)
#     language: python
#     name: specrepro
# ---

# %% [markdown]
# # 01 · Losslessness of speculative sampling
# Chen et al. 2023, Theorem 1: speculative sampling (p = draft, q = target) samples exactly from q.
# Two tiny random `LlamaForCausalLM`s (`specrepro.stats.toy.tiny_llama`: 6-token vocabulary, different seeds, LM
# head scaled so that p and q are far apart) stand in for q and p, so the target's joint distribution of the
# first tokens can be enumerated exactly (`specrepro.stats.exact.exact_joint`). We draw many SpS samples per setting
# and run a chi-square test against that exact distribution (`stats.chisquare_fit`: cells with expected
# count < 5 pooled),
# at a family-wise level alpha split over the settings (Bonferroni). A deliberately wrong sampler, which
# resamples from q instead of the normalised (q - p)+ after a rejection, must fail.

# %% tags=["parameters"]
profile = "smoke"  # smoke | cpu | gpu: recorded with the outputs
out_dir = "figures/smoke"  # where the CSV/JSON/PNG/PDF go (relative to the repo root)
results_dir = "runs/smoke/results"  # per-item JSON lines, for resuming
seed = 0  # base seed; each chunk of samples gets a stable seed derived from it
threads = 1  # torch threads
n_samples = 800  # samples per setting
n_tokens = 2  # length of the tested prefix: the joint over vocab**n_tokens cells
vocab = 6  # vocabulary of the tiny models
alpha = 0.01  # family-wise significance level (divided by the number of settings)
chunk = 400  # samples per resumable item
settings = [  # sampler: "sps", "ars" (control) or "sps_wrong_resample_q" (must fail)
    {"name": "ArS T=1 (control)", "sampler": "ars"},
    {"name": "SpS K=1 T=1", "sampler": "sps", "lookahead": 1},
    {"name": "SpS K=3 T=0.7 top-p 0.9", "sampler": "sps", "lookahead": 3, "temperature": 0.7, "top_p": 0.9},
    {"name": "WRONG: resample q, K=2", "sampler": "sps_wrong_resample_q", "lookahead": 2},
]

# %%
import os
from pathlib import Path

from IPython.display import Image, Markdown
from specrepro.experiments import plots
from specrepro.experiments.lossless import joint_table, run_losslessness
from specrepro.experiments.records import repo_root, results_folder, run_header, write_outputs
from specrepro.experiments.results import markdown_table
from specrepro.algorithm.sampling import SamplingConfig

os.chdir(repo_root())
results_dir = results_folder("01_losslessness", globals())  # keyed by the effective parameters and the code
meta = run_header(profile, seed, threads, notebook="01_losslessness", n_samples=n_samples, n_tokens=n_tokens,
                     vocab=vocab, alpha=alpha, settings=settings,
                     models="specrepro.stats.toy.tiny_llama x2 (hidden 16, 1 layer, logit_scale 12, no EOS), seeds target 0, draft 1")

# %%
rows = run_losslessness(settings, Path(results_dir) / "losslessness.jsonl", n_samples=n_samples,
                           n_tokens=n_tokens, vocab=vocab, alpha=alpha, chunk=chunk, seed=seed)
joint = []
for s in settings[:2] + settings[-1:]:
    sampling = SamplingConfig(s.get("temperature", 1.0), s.get("top_k"), s.get("top_p"))
    joint += [{"setting": s["name"], **r} for r in joint_table(Path(results_dir) / "losslessness.jsonl",
                                                                   s["name"], vocab=vocab, n_tokens=n_tokens,
                                                                   sampling=sampling)]
write_outputs(out_dir, "losslessness_joint", joint, meta)
write_outputs(out_dir, "losslessness", rows, meta)
Image(plots.plot_losslessness(out_dir)[0])

# %%
Markdown(markdown_table(rows, ["setting", "n_samples", "cells", "chi2", "dof", "pvalue", "alpha_corrected",
                                  "tv_distance", "expected_to_pass", "passes"]))
