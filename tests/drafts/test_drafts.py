"""Trained drafts: train a few steps, save, load, stay lossless in speculative_generate; resume works.

The real SmolLM2 target is used with tiny distillation data and a handful of steps, so the point is the
plumbing (and exact greedy parity), not draft quality.
"""
from __future__ import annotations

import copy
import os

import pytest
import torch

from helpers import llama
from specrepro.drafts import FeatureDraft, HeadsDraft, SmallDraft, load
from specrepro.drafts.artifacts import MARKER
from specrepro.drafts.kinds import KINDS
from specrepro.training import train
from specrepro.algorithm.sampling import SamplingConfig
from specrepro.generate import autoregressive_generate, speculative_generate

TINY_DATA = {"news_tokens": 512, "code_tokens": 512, "gen_news": 2, "gen_code": 2, "gen_new_tokens": 8,
             "batch": 2, "window": 32}
TINY_SHAPE = {"small": {"hidden": 64, "layers": 1, "ffn": 128}, "seqkd": {"hidden": 64, "layers": 1, "ffn": 128},
              "feature": {"ffn": 256, "head_vocab": 4096}, "heads": {"heads": 3, "head_vocab": 4096}}


@pytest.fixture(scope="module")
def real(smollm, tmp_path_factory):
    """The real target and tokenizer (loaded once per process, tests/conftest.py, from the real cache before
    this redirects it), and a throwaway SPECREPRO_HOME for data caches and artifacts."""
    model, tokenizer = smollm
    home = tmp_path_factory.mktemp("home")
    old = os.environ.get("SPECREPRO_HOME")
    os.environ["SPECREPRO_HOME"] = str(home)
    yield model, tokenizer, home
    if old is None:
        os.environ.pop("SPECREPRO_HOME")
    else:
        os.environ["SPECREPRO_HOME"] = old


def tiny_train(kind, real, root, **kw):
    model, tokenizer, _ = real
    return train(kind, target=model, tokenizer=tokenizer, budget_minutes=None, root=root, progress=False,
                 **TINY_DATA | TINY_SHAPE[kind] | {"max_steps": 4} | kw)


@pytest.fixture(scope="module")
def tiny_target():
    return llama(0, vocab=300, hidden=64, window=256)


def untrained(kind, target):
    if kind == "small":
        return SmallDraft.from_config(target, {"hidden": 32, "layers": 1, "ffn": 64, "head_dim": 16})
    if kind == "feature":
        return FeatureDraft.init_for(target, {"ffn": 64}, keep=torch.arange(0, 300, 2))
    return HeadsDraft.init_for(target, {"heads": 3})


@pytest.mark.parametrize("kind", ["small", "feature", "heads"])
def test_untrained_drafts_are_lossless_greedy_on_a_tiny_target(kind, tiny_target):
    prompt = torch.randint(0, 300, (6,), generator=torch.Generator().manual_seed(1))
    ref = autoregressive_generate(tiny_target, prompt, 25, temperature=0).tokens
    draft = untrained(kind, tiny_target)
    for k in (1, 3, 5):
        assert torch.equal(speculative_generate(tiny_target, draft, prompt, 25, lookahead=k, temperature=0).tokens, ref)
    one = speculative_generate(tiny_target, draft, prompt[:1], 10, lookahead=2, temperature=0).tokens
    assert torch.equal(one, autoregressive_generate(tiny_target, prompt[:1], 10, temperature=0).tokens)


@pytest.mark.parametrize("kind", ["small", "feature", "heads"])
def test_draft_rows_are_distributions_and_tokens_are_in_their_support(kind, tiny_target):
    draft = untrained(kind, tiny_target)
    seq = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(2))
    hidden = tiny_target.get_decoder()(input_ids=seq[:-1].view(1, -1)).last_hidden_state[0].detach()
    sampling = SamplingConfig(0.8, top_k=50)
    tokens, p = draft.propose(seq, 4, sampling, torch.Generator().manual_seed(0), hidden)
    assert p.shape == (4, 300)
    assert torch.allclose(p.sum(-1), torch.ones(4), atol=1e-5)
    assert (p[torch.arange(4), tokens] > 0).all()


def test_feature_cache_matches_a_fresh_draft(tiny_target):
    """After proposing, accepting some and rejecting the rest, the cached state equals a cold start."""
    draft = FeatureDraft.init_for(tiny_target, {"ffn": 64})
    seq = torch.randint(0, 300, (12,), generator=torch.Generator().manual_seed(3))
    hidden = tiny_target.get_decoder()(input_ids=seq.view(1, -1)).last_hidden_state[0].detach()
    greedy = SamplingConfig(0)
    draft.propose(seq[:8], 4, greedy, None, hidden[:7])
    warm, warm_p = draft.propose(seq[:11], 4, greedy, None, hidden[:10])
    draft.reset()
    cold, cold_p = draft.propose(seq[:11], 4, greedy, None, hidden[:10])
    assert torch.equal(warm, cold)
    assert torch.allclose(warm_p, cold_p)


def test_small_draft_works_as_hf_assistant_model(tiny_target):
    draft = untrained("small", tiny_target)
    ids = torch.randint(0, 300, (1, 5), generator=torch.Generator().manual_seed(4))
    plain = tiny_target.generate(ids, max_new_tokens=12, do_sample=False)
    assisted = tiny_target.generate(ids, assistant_model=draft.model, max_new_tokens=12, do_sample=False)
    assert torch.equal(plain, assisted)


def test_bad_input_is_rejected(real, tmp_path):
    model, tokenizer, _ = real
    with pytest.raises(ValueError, match="unknown draft kind"):
        train("tiny", target=model, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="budget_minutes"):
        train("small", target=model, tokenizer=tokenizer, budget_minutes=-1)
    with pytest.raises(ValueError, match="unknown settings"):
        train("small", target=model, tokenizer=tokenizer, budget_minutes=1, hiden=3)
    with pytest.raises(FileNotFoundError, match="specrepro-drafts train heads"):
        load("heads", target=model, root=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_trained_draft_round_trip_is_lossless(kind, real):
    model, tokenizer, home = real
    out = tiny_train(kind, real, home / "art")
    assert (out / MARKER).exists() and (out / "config.json").exists()
    assert not (out / "checkpoint.pt").exists()
    draft = load(kind, target=model, root=home / "art")
    msgs = [{"role": "user", "content": "Summarise in one sentence: the cat sat on the mat all day."}]
    prompt = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt = prompt["input_ids"][0]
    ref = autoregressive_generate(model, prompt, 16, temperature=0, eos_token_id=tokenizer.eos_token_id)
    got = speculative_generate(model, draft, prompt, 16, lookahead=4, temperature=0, eos_token_id=tokenizer.eos_token_id)
    assert torch.equal(got.tokens, ref.tokens)
    # the same artifact drafts for a bfloat16 target: the draft computes in the target's dtype
    model16 = copy.deepcopy(model).to(torch.bfloat16)
    draft16 = load(kind, target=model16, root=home / "art")
    got16 = speculative_generate(model16, draft16, prompt, 8, lookahead=3, temperature=1.0,
                                 generator=torch.Generator().manual_seed(0))
    assert len(got16.tokens) == 8 and sum(got16.proposed) > 0
    draft16.reset()
    hidden = model16.get_decoder()(input_ids=prompt.view(1, -1)).last_hidden_state[0]
    tokens, p = draft16.propose(prompt, 2, SamplingConfig(1.0), torch.Generator().manual_seed(0), hidden[:-1])
    assert p.dtype == torch.float32 and torch.allclose(p.sum(-1), torch.ones(len(tokens)), atol=1e-4)
    # a second call returns the finished artifact instead of training again
    assert tiny_train(kind, real, home / "art") == out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["small", "feature"])
def test_interrupted_training_resumes_to_the_same_weights(kind, real):
    _, _, home = real
    straight = tiny_train(kind, real, home / "straight", max_steps=6)
    assert tiny_train(kind, real, home / "resumed", max_steps=6, stop_after=3) is None
    cfg_dir = next((home / "resumed").glob(f"{kind}-*"))
    assert (cfg_dir / "checkpoint.pt").exists() and not (cfg_dir / MARKER).exists()
    resumed = tiny_train(kind, real, home / "resumed", max_steps=6)
    assert resumed.name == straight.name
    from safetensors.torch import load_file

    name = "model/model.safetensors" if kind == "small" else "net.safetensors"
    a, b = load_file(str(straight / name)), load_file(str(resumed / name))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_damaged_checkpoint_is_reported_and_training_starts_over(tmp_path):
    from specrepro.training.trainer import atomic_save, resume, trainable_state

    net = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(net.parameters())
    gen = torch.Generator().manual_seed(0)
    ckpt = tmp_path / "checkpoint.pt"
    atomic_save({"model": trainable_state(net), "opt": opt.state_dict(), "gen": gen.get_state(),
                 "torch_rng": torch.get_rng_state(), "state": {"step": 7}}, ckpt)
    assert resume(ckpt, net, opt, gen) == {"step": 7}
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])  # a half-written file
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.warns(UserWarning, match="is damaged .* training starts over"):
        assert resume(ckpt, net, opt, gen) is None
    assert not ckpt.exists()
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    other = torch.nn.Linear(4, 2)  # a checkpoint of another shape is refused before anything is applied
    atomic_save({"model": trainable_state(other), "opt": {}, "gen": gen.get_state(),
                 "torch_rng": torch.get_rng_state(), "state": {}}, ckpt)
    with pytest.warns(UserWarning, match="do not match"):
        assert resume(ckpt, net, opt, gen) is None
    assert resume(ckpt, net, opt, gen) is None  # nothing left to resume from


@pytest.mark.parametrize("kind", ["small", "feature"])
def test_damaged_artifact_is_a_clear_error(tmp_path, kind):
    import json

    target = llama(0, layers=1, heads=2, kv_heads=1, hidden=16)
    target.config.name_or_path = "tiny"
    art = tmp_path / f"{kind}-0123456789"
    (art / "model").mkdir(parents=True)
    (art / "config.json").write_text(json.dumps({"kind": kind, "target": "tiny"}))
    (art / "model" / "config.json").write_text("{ not json")
    (art / "net.safetensors").write_bytes(b"\x00" * 10)  # a torn weights file
    (art / MARKER).write_text("{}")
    with pytest.raises(RuntimeError, match="draft artifact .* is damaged .* train again"):
        load(kind, target=target, root=tmp_path)
