"""Drafts keep their work on the target's device: what a CPU can check of "every draft on CUDA".

On a GPU a draft step that builds a tensor without `device=` makes it on the CPU, and a `.cpu()` copies
to the host: the feature draft crashed on an H200 for exactly that (ids on the CPU, the borrowed
embedding on cuda:0). Here every draft kind proposes (chain and tree) with traps set:
- chain: the default device is "meta" while a proposal runs, so a tensor created without `device=` is a
  meta tensor, which the first op that mixes it with a real one refuses (and which cannot be returned);
- chain and tree: `.cpu()`, `.numpy()` and `.to("cpu")` calls are recorded (helpers.HostSyncs, whose copies()
  these are; the value reads it also records, .item() and the like, a draft may make): on CUDA each is a copy to the
  host. (A tree's shape is decided on the host by design, specrepro.algorithm.tree: its masks and slot lists are
  built there and copied over once per level, so the meta trap does not apply to trees.)
The trained drafts load onto the target's device (checked with the `meta` target device in
test_trained_draft_goes_where_the_target_is); the real CUDA runs are in tests/engines/test_devices.py.
"""
import contextlib

import pytest
import torch

import specrepro as sr
from helpers import HostSyncs, tiny_llama
from specrepro.drafts import (FeatureDraft, HeadsDraft, HybridDraft, LookupDraft, ModelDraft, SmallDraft,
                              TruncatedDraft)
from specrepro.drafts.artifacts import draft_device
from specrepro.engines.lean import LeanRunner
from specrepro.engines.runners import HFRunner
from specrepro.engines.static import StaticRunner
from specrepro.algorithm.tree import TreeSpec

# every draft kind of specrepro.drafts, with the tiny target
DRAFTS = {
    "lookup": lambda t: LookupDraft(t.config.vocab_size, max_ngram=2),
    "truncated": lambda t: TruncatedDraft(t, n_layers=1),
    "small": lambda t: SmallDraft.from_config(t, {"hidden": 16, "layers": 1, "ffn": 32, "head_dim": 8}),
    "feature": lambda t: FeatureDraft.init_for(t, {"ffn": 32}, seed=3),
    "feature-reduced-vocab": lambda t: FeatureDraft.init_for(t, {"ffn": 32}, keep=torch.tensor([0, 1, 3]), seed=4),
    "heads": lambda t: HeadsDraft.init_for(t, {"heads": 3}, seed=5),
    "model": lambda t: tiny_llama(1, layers=2),
    "model-lean": lambda t: ModelDraft(LeanRunner(tiny_llama(1, layers=2))),
    "model-static": lambda t: ModelDraft(StaticRunner(tiny_llama(1, layers=2))),
    "lookup+feature": lambda t: HybridDraft(FeatureDraft.init_for(t, {"ffn": 32}, seed=6),
                                            LookupDraft(t.config.vocab_size, max_ngram=2)),
    "lookup+small": lambda t: HybridDraft(SmallDraft.from_config(t, {"hidden": 16, "layers": 1, "ffn": 32,
                                                                      "head_dim": 8}),
                                          LookupDraft(t.config.vocab_size, max_ngram=2)),
}


def trap(draft, method, meta=True):
    """Wrap draft.<method> so each call runs with host copies recorded (and the meta default device)."""
    traffic = HostSyncs()
    inner = getattr(draft, method)

    def wrapped(*args, **kwargs):
        with contextlib.ExitStack() as stack:
            if meta:
                stack.enter_context(torch.device("meta"))
            stack.enter_context(traffic)
            return inner(*args, **kwargs)

    setattr(draft, method, wrapped)
    return traffic


@pytest.mark.parametrize("tree", [None, TreeSpec(2, 3)], ids=["chain", "tree"])
@pytest.mark.parametrize("name", list(DRAFTS))
def test_draft_creates_no_host_tensors_per_step(name, tree):
    target = tiny_llama(0, layers=2, eos_token_id=None)
    draft = sr.drafts.as_draft(DRAFTS[name](target))
    prompt = torch.tensor([0, 3, 2, 0, 3, 4, 0, 3])  # repeats: the lookup finds matches, and misses too
    want = sr.autoregressive_generate(target, prompt, max_new_tokens=12, temperature=0).tokens
    traffic = trap(draft, "propose" if tree is None else "propose_tree", meta=tree is None)
    for temperature in (0.0, 1.0):
        gen = sr.speculative_generate(LeanRunner(target), draft, prompt, max_new_tokens=12, lookahead=3,
                                      temperature=temperature, tree=tree, generator=torch.Generator().manual_seed(0))
        assert gen.tokens.device.type == "cpu" and len(gen.tokens) == 12
        if temperature == 0:
            assert torch.equal(gen.tokens, want)
    assert traffic.copies() == [], f"{name} copied to the host while proposing: {traffic.copies()}"


def test_the_trap_catches_a_host_tensor():
    """The harness has power: a draft that builds a position tensor without device= fails, one that
    calls .cpu() is recorded."""
    target = tiny_llama(0, layers=2, eos_token_id=None)
    draft = FeatureDraft.init_for(target, {"ffn": 32}, seed=3)
    trap(draft, "propose")
    original = draft._root_feature

    def careless(seq, hidden):  # the H200 bug: positions made on the default device
        torch.arange(3) + seq[:3]
        return original(seq, hidden)

    draft._root_feature = careless
    with pytest.raises((RuntimeError, NotImplementedError)):
        sr.speculative_generate(LeanRunner(target), draft, torch.tensor([0, 3, 2]), max_new_tokens=4, temperature=0)
    draft = FeatureDraft.init_for(target, {"ffn": 32}, seed=3)
    traffic = trap(draft, "propose")
    draft._root_feature = lambda seq, hidden, f=draft._root_feature: f(seq.cpu(), hidden)
    sr.speculative_generate(LeanRunner(target), draft, torch.tensor([0, 3, 2]), max_new_tokens=4, temperature=0)
    assert "cpu" in traffic.copies()


@pytest.mark.parametrize("kind", ["feature", "heads"])
def test_trained_net_moves_to_the_target_embedding_device(kind):
    """A net built on the CPU for a target whose embedding lives elsewhere is moved beside it (here the
    `meta` device stands for cuda:0: no values, but every parameter and buffer must follow)."""
    target = tiny_llama(0, layers=2)
    cls = FeatureDraft if kind == "feature" else HeadsDraft
    draft = cls.init_for(target, {"ffn": 32} if kind == "feature" else {"heads": 3})
    draft.net.emb = draft.net.emb.to("meta")  # as if attach() had borrowed a table from another device
    moved = cls(draft.net, target)
    assert moved.device.type == "meta"
    assert {p.device.type for p in moved.net.parameters()} == {"meta"}
    assert {b.device.type for b in moved.net.buffers()} == {"meta"}


def test_draft_device_is_the_target_input_device():
    target = tiny_llama(0, layers=2)
    assert draft_device(target) == torch.device("cpu")
    assert HFRunner(target).device == draft_device(target)
