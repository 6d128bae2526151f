"""Drafts shipped in artifacts/drafts/: found when the cache has none, checked, and retrainable.

Uses the real SmolLM2 target (the shipped drafts are for it) with an empty SPECREPRO_HOME for draft
artifacts and data caches, so nothing trained on this machine can stand in for the shipped files.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from specrepro.drafts import load
from specrepro.training.longrun import load_config, run
from specrepro.drafts.shipped import find_shipped, shipped_root, verify
from specrepro.drafts.artifacts import MARKER
from specrepro.algorithm.sampling import SamplingConfig

SHIPPED_KINDS = sorted(p.name for p in shipped_root().iterdir() if (p / "config.json").exists()) \
    if shipped_root().exists() else []


@pytest.fixture(scope="module")
def real(smollm):
    """The real target and tokenizer (loaded once per process, tests/conftest.py), set up before any test's
    empty SPECREPRO_HOME (a module fixture comes first)."""
    return smollm


@pytest.fixture
def empty_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECREPRO_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECREPRO_SHIPPED_DRAFTS", raising=False)
    return tmp_path / "home"


def test_the_feature_draft_is_shipped():
    assert "feature" in SHIPPED_KINDS, f"no shipped feature draft under {shipped_root()}"
    folder = shipped_root() / "feature"
    for name in ("config.json", "net.safetensors", MARKER, "manifest.json", "train_log.csv"):
        assert (folder / name).exists(), name
    verify(folder)  # the committed weights match their recorded hash


def test_the_seqkd_draft_is_shipped_trained_on_target_written_text_only():
    """Sequence-level distillation: the small draft's shape, continued from it on target-written positions only."""
    assert "seqkd" in SHIPPED_KINDS, f"no shipped seqkd draft under {shipped_root()}"
    folder = shipped_root() / "seqkd"
    for name in ("config.json", "net.safetensors", MARKER, "manifest.json", "train_log.csv", "tau.json"):
        assert (folder / name).exists(), name
    verify(folder)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["written_only"] and not cfg["text_data"]
    small = load_file(str(shipped_root() / "small" / "net.safetensors"))
    mine = load_file(str(folder / "net.safetensors"))
    assert {k: v.shape for k, v in mine.items()} == {k: v.shape for k, v in small.items()}
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["text"]["positions"] == 0 and manifest["shards"]["target_written"] > 300_000


@pytest.mark.parametrize("kind", SHIPPED_KINDS)
def test_load_falls_back_to_the_shipped_artifact_and_drafts(kind, real, empty_home):
    model, tokenizer = real
    draft = load(kind, target=model)
    weights = load_file(str(shipped_root() / kind / "net.safetensors"))
    net = draft.net if hasattr(draft, "net") else draft.model  # the small draft is a plain HF model
    for name, value in net.state_dict().items():
        if name not in weights:  # a tied LM head ships once, as the embedding
            assert name == "lm_head.weight" and net.config.tie_word_embeddings, name
            name = "model.embed_tokens.weight"
        assert torch.equal(value.float(), weights[name].to(value.dtype).float()), name  # exactly the shipped weights
    seq = torch.tensor(tokenizer("def add(a, b):\n    return", add_special_tokens=False)["input_ids"])
    hidden = model.get_decoder()(input_ids=seq[:-1].view(1, -1)).last_hidden_state[0]
    tokens, p = draft.propose(seq, 4, SamplingConfig(temperature=0), target_hidden=hidden)
    assert tokens.shape == (4,) and p.shape == (4, model.config.vocab_size)
    assert torch.allclose(p.sum(-1), torch.ones(4))


@pytest.mark.parametrize("kind", SHIPPED_KINDS)
def test_a_shipped_draft_computes_in_the_dtype_asked_for_without_casting_the_target(kind, real, empty_home):
    """A float32 model run by a bfloat16 runner gets a bfloat16 draft (weights and borrowed tables), and the
    model keeps its float32 weights; the draft's distributions stay float32 and normalised."""
    model, tokenizer = real
    before = model.get_output_embeddings().weight.detach().clone()
    draft = load(kind, target=model, dtype=torch.bfloat16)
    net = draft.net if hasattr(draft, "net") else draft.model
    assert {p.dtype for p in net.parameters()} == {torch.bfloat16}
    for table in ("emb", "head"):
        if hasattr(net, table):
            assert getattr(net, table).dtype == torch.bfloat16, table
    assert next(model.parameters()).dtype == torch.float32
    assert torch.equal(model.get_output_embeddings().weight, before)
    seq = torch.tensor(tokenizer("def add(a, b):\n    return", add_special_tokens=False)["input_ids"])
    hidden = model.get_decoder()(input_ids=seq[:-1].view(1, -1)).last_hidden_state[0]  # float32 features
    tokens, p = draft.propose(seq, 3, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0),
                              target_hidden=hidden)
    assert tokens.shape == (3,) and p.dtype == torch.float32
    assert torch.allclose(p.sum(-1), torch.ones(3), atol=1e-4)
    with pytest.raises(TypeError, match="floating torch.dtype"):
        load(kind, target=model, dtype="bfloat16")

def test_a_cache_artifact_takes_precedence_over_the_shipped_one(real, empty_home):
    model, _ = real
    cached = empty_home / "drafts" / "feature-0000000000"
    shutil.copytree(shipped_root() / "feature", cached)
    with torch.no_grad():
        weights = load_file(str(cached / "net.safetensors"))
    weights["fc.weight"] = torch.zeros_like(weights["fc.weight"])
    from safetensors.torch import save_file
    save_file(weights, str(cached / "net.safetensors"))
    draft = load("feature", target=model)
    assert float(draft.net.fc.weight.detach().abs().sum()) == 0.0  # the cache's (zeroed) copy, not the shipped one


@pytest.mark.parametrize("damage", ["truncated", "lfs-pointer", "no-marker"])
def test_a_damaged_shipped_artifact_is_reported_clearly(damage, real, empty_home, tmp_path, monkeypatch):
    model, _ = real
    copy = tmp_path / "shipped"
    shutil.copytree(shipped_root() / "feature", copy / "feature")
    weights = copy / "feature" / "net.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "lfs-pointer":
        weights.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    else:
        (copy / "feature" / MARKER).unlink()
    monkeypatch.setenv("SPECREPRO_SHIPPED_DRAFTS", str(copy))
    with pytest.raises(RuntimeError, match="damaged|incomplete") as err:
        load("feature", target=model)
    assert "make drafts" in str(err.value)


def test_a_kind_shipped_for_another_target_is_not_used(real, empty_home, tmp_path, monkeypatch):
    model, _ = real
    copy = tmp_path / "shipped"
    shutil.copytree(shipped_root() / "feature", copy / "feature")
    cfg = json.loads((copy / "feature" / "config.json").read_text())
    (copy / "feature" / "config.json").write_text(json.dumps(cfg | {"target": "some-other-model"}))
    monkeypatch.setenv("SPECREPRO_SHIPPED_DRAFTS", str(copy))
    assert find_shipped("feature", "smollm2-135m-instruct") is None
    with pytest.raises(FileNotFoundError, match="none shipped"):
        load("feature", target=model)


@pytest.mark.parametrize("kind", SHIPPED_KINDS)
def test_a_short_retrain_with_the_shipped_config_gives_a_loadable_artifact_of_the_same_shapes(
        kind, real, empty_home, tmp_path):
    """What `make drafts` runs, cut to a few seconds: same config (shapes, schedule, data recipe, export
    dtype) except tiny data and budget."""
    model, tokenizer = real
    cfg = load_config(shipped_root() / kind / "config.json")
    cfg.pop("version", None)
    tiny = cfg | {"news_tokens": 512, "code_tokens": 512, "shards": 2, "shard_size": 2, "shard_new_tokens": 6,
                  "code_per_round": 3, "budget_minutes": 0.03, "window": 32}
    out = run(tiny, export_dir=tmp_path / "art", work=tmp_path / "work", target=model, tokenizer=tokenizer,
              progress=False)
    meta = json.loads((out / MARKER).read_text())
    assert meta["steps"] >= 1
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["shards"]["count"] == 2 and manifest["shards"]["target_written"] > 0
    assert (out / "train_log.csv").read_text().count("\n") == meta["steps"] + 1
    draft = load(kind, target=model, path=out)
    assert type(draft) is type(load(kind, target=model))  # the shipped one (the cache is empty)
    shipped = load_file(str(shipped_root() / kind / "net.safetensors"))
    retrained = load_file(str(out / "net.safetensors"))
    assert {k: (v.shape, v.dtype) for k, v in retrained.items()} == {k: (v.shape, v.dtype) for k, v in shipped.items()}
    assert json.loads((out / "config.json").read_text())["shards"] == 2


def test_load_config_names_what_is_missing(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"kind": "feature"}))
    with pytest.raises(ValueError, match="lacks"):
        load_config(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        load_config(path)
    path.write_text(json.dumps({"kind": "lookup"}))
    with pytest.raises(ValueError, match="unknown draft kind"):
        load_config(path)


def test_an_interrupted_long_run_resumes_exactly(real, empty_home, tmp_path):
    """Checkpoint after 2 of 4 steps, rerun the same call: the same weights as 4 uninterrupted steps
    (step-based schedule; the RNGs and AdamW's moments come back from the checkpoint)."""
    model, tokenizer = real
    cfg = load_config(shipped_root() / "feature" / "config.json")
    cfg.pop("version", None)
    tiny = cfg | {"news_tokens": 512, "code_tokens": 512, "shards": 1, "shard_size": 2, "shard_new_tokens": 6,
                  "code_per_round": 3, "budget_minutes": 60, "max_steps": 4, "window": 32, "ffn": 64}
    kw = dict(target=model, tokenizer=tokenizer, progress=False)
    cut = run(tiny, export_dir=tmp_path / "cut", work=tmp_path / "w1", stop_after_steps=2, **kw)
    assert json.loads((cut / MARKER).read_text())["steps"] == 2
    assert not json.loads((cut / MARKER).read_text())["finished"]
    run(tiny, export_dir=tmp_path / "cut", work=tmp_path / "w1", **kw)
    shutil.copytree(tmp_path / "w1" / "data", tmp_path / "w2" / "data")  # same shards, not rebuilt
    run(tiny, export_dir=tmp_path / "whole", work=tmp_path / "w2", **kw)
    a = load_file(str(tmp_path / "cut" / "net.safetensors"))
    b = load_file(str(tmp_path / "whole" / "net.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "cut" / MARKER).read_text())["finished"]
    log = (tmp_path / "cut" / "train_log.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in log] == ["step", "1", "2", "3", "4"]
    assert log[1:] != [] and (tmp_path / "whole" / "train_log.csv").read_text().splitlines()[1].split(",")[3] \
        == log[1].split(",")[3]  # the same first loss


def test_continue_from_starts_at_the_given_artifact(real, empty_home, tmp_path):
    model, tokenizer = real
    cfg = load_config(shipped_root() / "feature" / "config.json")
    cfg.pop("version", None)
    # no shards: the text pass is the data, and the kept tokens are the artifact's (a zero-step run is the artifact)
    tiny = cfg | {"news_tokens": 512, "code_tokens": 512, "shards": 0, "budget_minutes": 60, "max_steps": 3,
                  "text_data": True, "written_only": False}
    tiny.pop("keep_from", None)
    out = run(tiny, export_dir=tmp_path / "cont", work=tmp_path / "w", continue_from=shipped_root() / "feature",
              target=model, tokenizer=tokenizer, progress=False, stop_after_steps=0)
    a = load_file(str(out / "net.safetensors"))
    b = load_file(str(shipped_root() / "feature" / "net.safetensors"))
    assert all(torch.equal(a[k], b[k].float()) for k in b)  # zero steps: exactly the artifact it continues
    saved = json.loads((out / "config.json").read_text())
    assert saved["continued_from"] == json.loads((shipped_root() / "feature" / MARKER).read_text())["weights_sha256"]


def test_tau_card_pools_prompts_and_brackets_tau():
    from specrepro.training.taucard import tau_with_ci

    recs = [{"task": "news", "lookahead": 4, "n_tokens": 64, "target_calls": c} for c in (20, 30, 40, 32)]
    recs += [{"task": "news", "lookahead": 0, "n_tokens": 64, "target_calls": 64}]  # ArS rows are ignored
    (row,) = tau_with_ci(recs)
    assert row["tau"] == pytest.approx(256 / 122) and row["n_prompts"] == 4
    lo, hi = row["ci95"]
    assert 64 / 40 <= lo < row["tau"] < hi <= 64 / 20
    same = [{"task": "code", "lookahead": 4, "n_tokens": 10, "target_calls": 5}] * 3
    assert tau_with_ci(same)[0]["ci95"] == [2.0, 2.0]
    with pytest.raises(ValueError, match="no speculative"):
        tau_with_ci(recs[-1:])
    # a token tree of depth 4 is its own row, not pooled with the chain of K = 4
    tree = [{"task": "news", "lookahead": 4, "tree": "2x4", "n_tokens": 64, "target_calls": 16}]
    chain, tree_row = tau_with_ci(recs + tree)
    assert chain["tau"] == pytest.approx(256 / 122) and "tree" not in chain
    assert tree_row["tree"] == "2x4" and tree_row["tau"] == 4.0
