"""The gpu profile's code paths, run on the CPU: notebooks/params/gpu-test.yaml (its comment lists every
difference from gpu.yaml) through the real runner, with hub model ids served from a Hugging Face cache of
tiny random Qwen2 models and `datasets` loading XSum- and HumanEval-shaped local files."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch
import yaml

from specrepro.experiments import reproduce
from specrepro.experiments.results import read_csv

pytestmark = [pytest.mark.notebooks, pytest.mark.slow]  # minutes: every notebook, gpu settings

TARGET_ID = "Qwen/Qwen2.5-7B-Instruct"
DRAFT_ID = "Qwen/Qwen2.5-0.5B-Instruct"
REVISION = "0" * 40  # the commit hash the cache's refs/main points at
DRAFT_PADDING = 128  # padding rows past the tokenizer (the real pair's row counts differ by 128 too)


def cache_tiny_model(hub_cache, repo_id, seed, layers, tokenizer, padding=0, tied=False):
    """A tiny random Qwen2 (q/k/v biases, as Qwen2.5 has) with the given tokenizer and `padding` vocabulary
    rows after it, laid out as transformers' hub cache holds a download."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer) + padding, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=tied)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # nonzero q/k/v biases, so that the runners' bias path is exercised
        for name, param in model.named_parameters():
            if name.endswith("proj.bias"):
                param.normal_(std=0.5)
    snapshot = repo / "snapshots" / REVISION
    model.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)


def write_datasets(root):
    """XSum- and HumanEval-shaped local files where specrepro.tasks.hub's mirror looks for them."""
    xsum = root / "EdinburghNLP" / "xsum"
    xsum.mkdir(parents=True)
    articles = [{"id": str(30000000 + i), "summary": f"Officials announced plan number {i} on Monday.",
                 "document": f"The council met on Monday to discuss plan {i}. Residents asked questions about "
                             f"costs. A vote is expected next month."} for i in range(3)]
    (xsum / "test.jsonl").write_text("".join(json.dumps(a) + "\n" for a in articles))
    he = root / "openai" / "openai_humaneval"
    he.mkdir(parents=True)
    problems = [{"task_id": f"HumanEval/{i}", "entry_point": f"add{i}",
                 "prompt": f'def add{i}(a, b):\n    """Return a + b + {i}."""\n',
                 "canonical_solution": f"    return a + b + {i}\n",
                 "test": f"def check(candidate):\n    assert candidate(1, 2) == {3 + i}\n"} for i in range(2)]
    (he / "test.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))


@pytest.fixture(scope="module")
def gpu_test_outputs(tmp_path_factory):
    from transformers import AutoTokenizer

    from specrepro.models import offline_target_dir

    root = tmp_path_factory.mktemp("gpu-test")
    tokenizer = AutoTokenizer.from_pretrained(offline_target_dir())  # SmolLM2's: no Qwen tokenizer offline
    hub = root / "hub"
    # the real 7B is untied and the 0.5B tied; here the draft carries the padding rows (see gpu-test.yaml)
    cache_tiny_model(hub, TARGET_ID, seed=0, layers=5, tokenizer=tokenizer)
    cache_tiny_model(hub, DRAFT_ID, seed=1, layers=2, tokenizer=tokenizer, padding=DRAFT_PADDING, tied=True)
    write_datasets(root / "datasets")
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(root / "datasets-cache"),
           "SPECREPRO_DATASETS_DIR": str(root / "datasets")}
    # huggingface_hub reads these when it is imported: a fresh process (like the notebooks' kernels) sees them
    check = ("import torch, specrepro as sr\nfor name in %r:\n    m, t = sr.load_model(name, dtype=torch.bfloat16)\n"
             "    print(type(m).__name__, m.config.num_hidden_layers, m.dtype, m.config.vocab_size - len(t))"
             % [TARGET_ID, DRAFT_ID])
    out = subprocess.run([sys.executable, "-c", check], env={**os.environ, **env}, capture_output=True, text=True)
    # the hub ids are the cached tiny models; the draft's vocabulary is the target's plus padding rows
    assert out.stdout.split() == ["Qwen2ForCausalLM", "5", "torch.bfloat16", "0",
                                  "Qwen2ForCausalLM", "2", "torch.bfloat16", str(DRAFT_PADDING)], out.stderr[-2000:]
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        reproduce.run("gpu-test", output_root=root / "out")
    return root / "out"


def test_profile_is_gpu_with_listed_differences():
    gpu, test = reproduce.load_profile("gpu"), reproduce.load_profile("gpu-test")
    assert reproduce.notebook_profile("gpu-test") == "gpu"
    for name in gpu:
        assert set(test[name]) == set(gpu[name]), name  # the same keys
        changed = {k for k in gpu[name] if test[name][k] != gpu[name][k]}
        allowed = {"device", "n_news", "n_code", "max_new_tokens", "news_max_new_tokens", "code_max_new_tokens",
                   "code_samples", "n_samples", "chunk"}
        assert changed <= allowed, (name, changed - allowed)
        if "device" in gpu[name]:
            assert test[name]["device"] == "cpu"
    # the K values, dtype, models and sources are the gpu profile's
    for key in ("lookaheads", "trees", "dtype", "target", "draft", "drafts", "news_source", "code_source", "settings"):
        for name in gpu:
            if key in gpu[name]:
                assert test[name][key] == gpu[name][key]
    header = (reproduce.PARAMS_DIR / "gpu-test.yaml").read_text()
    assert yaml.safe_load(header)["_base"] == "gpu" and "Every difference" in header


def test_losslessness(gpu_test_outputs):
    rows = read_csv(gpu_test_outputs / "figures" / "losslessness.csv")
    assert len(rows) == len(reproduce.load_profile("gpu")["01_losslessness"]["settings"])
    assert all(r["n_samples"] == 400 and r["n_tokens"] == 3 for r in rows)


def test_lookahead_sweep_uses_hub_models_and_datasets(gpu_test_outputs):
    data = json.loads((gpu_test_outputs / "figures" / "lookahead_sweep.json").read_text())
    meta, rows = data["meta"], data["rows"]
    gpu = reproduce.load_profile("gpu")["02_lookahead_sweep"]
    assert meta["target"] == TARGET_ID and meta["dtype"] == gpu["dtype"] and meta["profile"] == "gpu"
    assert {(r["task"], r["K"]) for r in rows} == {(t, k) for t in ("news", "code") for k in range(8)}
    assert all(r["tau"] >= 1 and r["tokens"] > 0 for r in rows)
    items = [json.loads(line) for p in (gpu_test_outputs / "results").rglob("lookahead_sweep*.jsonl")
             for line in p.read_text().splitlines()]
    assert {r["item"] for r in items if "item" in r} == {"30000000", "HumanEval/0"}  # from the local files


def test_table1(gpu_test_outputs):
    rows = read_csv(gpu_test_outputs / "figures" / "table1.csv")
    groups = {(r["benchmark"], r["decoding"]) for r in rows}
    assert {("news", "nucleus"), ("news", "greedy"), ("humaneval", "nucleus")} <= groups
    assert {(r["benchmark"], r["decoding"], r["method"]) for r in rows} == {
        (b, d, m) for b, d in groups for m in ("ArS", "SpS")}
    for r in rows:
        assert r["tau"] >= 1 and not math.isnan(r["result"])
        if (r["benchmark"], r["decoding"]) == ("humaneval", "nucleus"):
            assert r["samples_per_problem"] == 2 and r["pass@1"] is not None


def test_drafts(gpu_test_outputs):
    rows = read_csv(gpu_test_outputs / "figures" / "drafts.csv")
    assert {(r["draft"], r["task"], r["temperature"], r["K"]) for r in rows} == {
        (d, t, temp, k) for d in (f"model:{DRAFT_ID}", "truncated:4") for t in ("news", "code")
        for temp in (0.0, 1.0) for k in range(1, 8)}
