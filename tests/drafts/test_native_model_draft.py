"""A bfloat16 Llama-family model draft on the CPU (the small draft) runs in the native pass: its runner is the
native LeanRunner, its logits agree with the HF model's within bfloat16 round-off, and greedy SpS with it, chain
and tree, still equals greedy ArS. float32 drafts and other families keep the HF runner."""
import pytest
import torch

import specrepro as sr
from helpers import EOS, PROMPT
from specrepro.algorithm.tree import TreeSpec
from specrepro.drafts import ModelDraft, SmallDraft
from specrepro.drafts.base import default_runner
from specrepro.engines import native
from specrepro.engines.lean import LeanRunner
from specrepro.engines.runners import HFRunner
from specrepro.stats.toy import tiny_llama

pytestmark = pytest.mark.skipif(native.unavailable_reason(torch.bfloat16, "cpu") is not None,
                                reason="the native module cannot be built here")


def small_bf16(target):
    draft = SmallDraft.from_config(target, {"hidden": 32, "layers": 2, "ffn": 64, "head_dim": 16})
    return SmallDraft(draft.model.to(torch.bfloat16))


def test_bfloat16_llama_drafts_run_native_and_others_keep_the_hf_runner():
    target = tiny_llama(0, layers=2)
    draft = small_bf16(target)
    assert isinstance(draft.runner, LeanRunner) and draft.runner.backend == "native"
    f32 = SmallDraft.from_config(target, {"hidden": 32, "layers": 2, "ffn": 64, "head_dim": 16})
    assert isinstance(f32.runner, HFRunner)


def test_native_draft_logits_agree_with_the_hf_model():
    target = tiny_llama(0, vocab=50, layers=2)
    model = small_bf16(target).model
    ids = torch.tensor([0, 7, 3, 9, 4, 4, 2])
    fast, slow = default_runner(model), HFRunner(model)
    a, b = fast.forward(ids), slow.forward(ids)
    assert a.shape == b.shape == (7, 50)
    assert torch.allclose(a.float(), b.float(), atol=0.1, rtol=0.05), (a.float() - b.float()).abs().max()


@pytest.mark.parametrize("tree", [None, TreeSpec(2, 3)])
def test_greedy_sps_with_a_native_model_draft_equals_ars(tree):
    target = tiny_llama(0, layers=2)
    kw = dict(max_new_tokens=12, temperature=0.0, eos_token_id=EOS)
    ars = sr.autoregressive_generate(target, PROMPT, **kw).tokens
    draft = small_bf16(target)
    sps = sr.speculative_generate(target, draft, PROMPT, lookahead=3, tree=tree, **kw)
    assert torch.equal(sps.tokens, ars) and draft.calls > 0
