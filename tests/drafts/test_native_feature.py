"""The feature draft's steps through the native pass (drafts.feature.NativeFeature) and its fused target
features (EAGLE-3: the outputs of chosen target layers beside the final hidden state): the native step gives the
torch step's features and logits within bfloat16 round-off, runners hand the tapped layers over exactly as the
model computes them, and greedy SpS with either draft still equals greedy ArS (chains and trees)."""
import pytest
import torch

import specrepro as sr
from helpers import EOS, PROMPT
from specrepro.algorithm.sampling import SamplingConfig
from specrepro.algorithm.tree import TreeSpec
from specrepro.drafts import FeatureDraft
from specrepro.engines import native
from specrepro.engines.lean import LeanRunner
from specrepro.engines.runners import HFRunner, hidden_kept
from specrepro.stats.toy import tiny_llama

pytestmark = pytest.mark.skipif(native.unavailable_reason(torch.bfloat16, "cpu") is not None,
                                reason="the native module cannot be built here")


def bf16_feature(target, cfg=None, seed=3, **kw):
    draft = FeatureDraft.init_for(target, {"ffn": 32, **(cfg or {})}, seed=seed)
    draft.net.to(torch.bfloat16)
    draft.net.attach(target, torch.bfloat16)
    return FeatureDraft(draft.net, target, **kw)


@pytest.mark.parametrize("taps", [(), (0,)])
def test_native_step_matches_the_torch_step_and_is_the_default_for_bfloat16(taps):
    target = tiny_llama(0, vocab=50, layers=2)
    width = target.config.hidden_size * (len(taps) + 1)
    seq = torch.tensor([0, 7, 3, 9, 4])
    hidden = torch.randn(4, width, generator=torch.Generator().manual_seed(0))
    fast, slow = bf16_feature(target, {"taps": list(taps)}), bf16_feature(target, {"taps": list(taps)}, native=False)
    fast._begin(), slow._begin()  # what a proposal does first: choose the step
    fa, la, _ = fast._root_feature(seq, hidden)
    fb, lb, _ = slow._root_feature(seq, hidden)
    assert fast._native is not None and slow._native is None  # the default chose the native step
    assert fa.shape == (1, 1, target.config.hidden_size) and la.shape == lb.shape == (1, 50)
    assert torch.allclose(fa.float(), fb.float(), atol=0.05, rtol=0.02), (fa.float() - fb.float()).abs().max()
    assert torch.allclose(la, lb, atol=0.05, rtol=0.02), (la - lb).abs().max()
    # a second proposal rolls forward from the cache the first one left (the real positions only)
    greedy = SamplingConfig(0.0)
    longer = torch.cat([seq, torch.tensor([11, 2])])
    more = torch.cat([hidden, torch.randn(2, width, generator=torch.Generator().manual_seed(1))])
    for d in (fast, slow):
        d.propose(seq, 3, greedy, target_hidden=hidden)
    a, b = fast.propose(longer, 3, greedy, target_hidden=more), slow.propose(longer, 3, greedy, target_hidden=more)
    assert fast._native.length == slow.cache.length == len(longer) - 1
    assert torch.allclose(a[1], b[1]) or (a[0] != b[0]).any()  # same rows unless a near-tie flipped a token
    # float32 nets keep the torch step
    f32 = FeatureDraft.init_for(target, {"ffn": 32}, seed=3)
    f32.propose(seq, 2, greedy, target_hidden=hidden[:, : target.config.hidden_size])
    assert f32._native is None and f32.native is False


def test_the_packed_step_follows_the_net_it_was_packed_from():
    """Weights written in place or replaced, or the net cast to float32: the next proposal never runs stale packed
    weights (the key is checked before every proposal)."""
    target = tiny_llama(0, vocab=50, layers=2)
    seq, hidden = torch.tensor([0, 7, 3, 9]), torch.randn(3, target.config.hidden_size)
    greedy = SamplingConfig(0.0)
    draft = bf16_feature(target)
    draft.propose(seq, 2, greedy, target_hidden=hidden)
    first = draft._native
    draft.propose(seq, 2, greedy, target_hidden=hidden)
    assert draft._native is first  # nothing changed: the same packed copy
    with torch.no_grad():
        draft.net.layer.down.weight.mul_(2)  # in place
    draft.propose(seq, 2, greedy, target_hidden=hidden)
    second = draft._native
    assert second is not first
    old = draft.net.fc.weight
    new = torch.nn.Parameter(old.detach() * 2)
    with torch.no_grad():
        while new._version < old._version:  # the same version as the one it replaces: only its identity differs
            new.add_(0)
    draft.net.fc.weight = new
    draft.propose(seq, 2, greedy, target_hidden=hidden)
    assert draft._native is not second
    # what the rebuilt step computes is the current net's: the same rows as a draft packed from it afresh
    fresh = FeatureDraft(draft.net, target)
    a = draft.propose(seq, 3, greedy, target_hidden=hidden)
    b = fresh.propose(seq, 3, greedy, target_hidden=hidden)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    draft.net.float()  # cast: the native step no longer serves it, the torch step runs
    draft.propose(seq, 2, greedy, target_hidden=hidden.float())
    assert draft.native is False


def test_the_runners_give_the_tapped_layers_as_the_model_computes_them():
    target = tiny_llama(0, vocab=50, layers=3)
    ids = torch.tensor([0, 7, 3, 9, 4, 2])
    with torch.no_grad():
        ref = target.model(input_ids=ids.view(1, -1), output_hidden_states=True).hidden_states
    expected = torch.cat([ref[1][0], ref[2][0], ref[-1][0]], -1)  # layers 0 and 1, then the final normed state
    hf = HFRunner(target, keep_hidden=True)
    hf.hidden_taps = (0, 1)
    hf.forward(ids)
    assert hf.hidden.shape == (6, 3 * target.config.hidden_size)
    assert torch.allclose(hf.hidden, expected, atol=1e-5)
    eager = LeanRunner(target, dtype=torch.float32, keep_hidden=True)
    eager.hidden_taps = (0, 1)
    eager.forward(ids)
    assert torch.allclose(eager.hidden, expected, atol=1e-5)
    lean = LeanRunner(target.to(torch.bfloat16), dtype=torch.bfloat16, backend="native", keep_hidden=True)
    lean.hidden_taps = (0, 1)
    lean.forward(ids)
    assert lean.hidden.shape == (6, 3 * target.config.hidden_size)
    assert torch.allclose(lean.hidden.float(), expected, atol=0.1, rtol=0.05), (lean.hidden.float() - expected).abs().max()
    # the taps change what hidden holds, never the logits
    plain = LeanRunner(target, dtype=torch.bfloat16, backend="native")
    lean.reset()
    assert torch.equal(lean.forward(ids), plain.forward(ids))
    lean.hidden_taps = ()
    lean.reset()
    lean.forward(ids)
    assert lean.hidden.shape == (6, target.config.hidden_size)


def test_taps_are_refused_clearly_where_they_cannot_be_given():
    target = tiny_llama(0, vocab=50, layers=2)
    from specrepro.engines.static import StaticRunner

    with pytest.raises(ValueError, match="gives no hidden_taps"):
        StaticRunner(target).hidden_taps = (0,)
    lean = LeanRunner(target.to(torch.bfloat16), dtype=torch.bfloat16, backend="native")
    with pytest.raises(ValueError, match="not layers"):
        lean.hidden_taps = (1,)  # the last layer: its output is the final hidden state
    with pytest.raises(ValueError, match="not layers"):
        HFRunner(target).hidden_taps = (-1,)
    with pytest.raises(ValueError, match="not layers 0..0 of the target"):
        FeatureDraft.init_for(target, {"ffn": 32, "taps": [5]})

    class Bare:  # a runner without hidden_taps
        keep_hidden = False

    with pytest.raises(TypeError, match="does not give"):
        with hidden_kept(Bare(), True, (0,)):
            pass
    # a caller's runner is left as it was given
    hf = HFRunner(target)
    with hidden_kept(hf, True, (0,)):
        assert hf.hidden_taps == (0,) and hf.keep_hidden
    assert hf.hidden_taps == () and not hf.keep_hidden


def test_the_native_model_checks_what_it_is_fed():
    target = tiny_llama(0, vocab=50, layers=2)
    draft = bf16_feature(target)
    step = draft._native_step()
    h = target.config.hidden_size
    cos, sin = step.cos[:2], step.sin[:2]
    with pytest.raises(RuntimeError, match="input projection reads"):
        step.model.forward_features(torch.zeros(2, h), 0, cos, sin, None, step.k_cache, step.v_cache, True)
    with pytest.raises(RuntimeError, match="tap layer"):
        step.model.set_taps([1])
    bare = native.load().Model(target.model.embed_tokens.weight, torch.ones(h), 1e-5, 2, 1, h // 2)
    bare.add_layer(*[t for t in step_layer(target)])
    with pytest.raises(RuntimeError, match="no input projection"):
        bare.forward_features(torch.zeros(2, 2 * h), 0, cos, sin, None, step.k_cache, step.v_cache, False)
    # without one, features of the hidden size are the residual stream: the pass from the embeddings
    ids = torch.tensor([3, 8])
    k2, v2 = torch.zeros_like(step.k_cache), torch.zeros_like(step.v_cache)
    a = bare.forward(ids, 0, cos, sin, None, step.k_cache, step.v_cache, False)[0]
    b = bare.forward_features(target.model.embed_tokens.weight[ids].float(), 0, cos, sin, None, k2, v2, False)[0]
    assert torch.equal(a, b)


def test_forward_draft_is_the_step_built_from_torch_parts_in_one_call():
    """forward_draft (the embedding lookup, and for fused target rows their RMS scaling and fuse, inside the call)
    gives what forward_features gives on the [feature ; embedding] rows built in torch, within the float32
    rounding of the scales; it refuses what it cannot read, naming it."""
    from specrepro.drafts.feature import scaled_taps

    target = tiny_llama(0, vocab=50, layers=2)
    h = target.config.hidden_size
    draft = bf16_feature(target, {"taps": [0]})
    step = draft._native_step()
    net = draft.net
    g = torch.Generator().manual_seed(0)
    fused = (torch.randn(3, 2 * h, generator=g) * torch.tensor([40.0] * h + [1.0] * h)).to(torch.bfloat16)
    own = torch.randn(3, h, generator=g)
    ids = torch.tensor([4, 49, 0])
    cos, sin = step.cos[:3], step.sin[:3]
    fuse = native.pack([net.fuse.weight])
    for feats in (fused, own):
        rows = feats.float()
        if rows.shape[1] == 2 * h:
            rows = native.linear(scaled_taps(rows, 1), fuse)
        x = torch.cat([rows, net.emb[ids].float()], -1)
        kv = [torch.zeros_like(step.k_cache) for _ in range(4)]
        want = step.model.forward_features(x, 0, cos, sin, None, kv[0], kv[1], True)
        before = feats.clone()
        got = step.model.forward_draft(feats, ids, 0, cos, sin, None, kv[2], kv[3], True)
        assert torch.equal(feats, before)  # the caller's features are never scaled in place
        assert torch.allclose(got[0], want[0], atol=1e-4, rtol=1e-4), (got[0] - want[0]).abs().max()
        assert torch.allclose(got[1], want[1], atol=1e-4, rtol=1e-4)
        assert torch.allclose(kv[2], kv[0], atol=1e-4, rtol=1e-4)
    kc, vc = step.k_cache, step.v_cache
    with pytest.raises(RuntimeError, match="wide"):
        step.model.forward_draft(torch.zeros(3, 3 * h), ids, 0, cos, sin, None, kc, vc, True)
    with pytest.raises(RuntimeError, match="ids must be"):
        step.model.forward_draft(own, ids[:2], 0, cos, sin, None, kc, vc, True)
    with pytest.raises(RuntimeError, match="outside the embedding"):
        step.model.forward_draft(own, torch.tensor([4, 50, 0]), 0, cos, sin, None, kc, vc, True)
    with pytest.raises(RuntimeError, match="fuse projection is"):
        step.model.set_fuse(fuse, 2)
    bare = native.load().Model(target.model.embed_tokens.weight, torch.ones(h), 1e-5, 2, 1, h // 2)
    bare.add_layer(*[t for t in step_layer(target)])
    with pytest.raises(RuntimeError, match="needs an input projection"):
        bare.forward_draft(own, ids, 0, cos, sin, None, kc, vc, False)


def step_layer(target):
    layer = target.model.layers[0]
    a, m = layer.self_attn, layer.mlp
    return (layer.input_layernorm.weight.float(), native.pack([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
            native.pack([a.o_proj.weight]), layer.post_attention_layernorm.weight.float(),
            native.pack([m.gate_proj.weight, m.up_proj.weight]), native.pack([m.down_proj.weight]))


@pytest.mark.parametrize("taps", [(), (0,)])
@pytest.mark.parametrize("backend", ["hf", "native"])
def test_greedy_sps_with_the_native_feature_draft_equals_ars(taps, backend):
    target = tiny_llama(0, layers=2)
    if backend == "native":
        target = LeanRunner(target.to(torch.bfloat16), dtype=torch.bfloat16, backend="native")
    kw = dict(max_new_tokens=12, temperature=0.0, eos_token_id=EOS)
    ars = sr.autoregressive_generate(target, PROMPT, **kw).tokens
    model = target.model if backend == "native" else target
    for k, tree in ((1, None), (3, None), (3, TreeSpec(2, 3))):
        draft = bf16_feature(model, {"taps": list(taps)})
        out = sr.speculative_generate(target, draft, PROMPT, lookahead=k, tree=tree, **kw)
        assert torch.equal(out.tokens, ars), (k, tree)
        assert draft._native is not None and draft.calls > 0


def test_sampled_proposals_come_with_the_rows_they_were_drawn_from():
    target = tiny_llama(0, layers=3)
    draft = bf16_feature(target, {"taps": [1]})
    hidden = torch.randn(len(PROMPT) - 1, 2 * target.config.hidden_size)
    tokens, rows = draft.propose(PROMPT, 3, SamplingConfig(1.0), torch.Generator().manual_seed(0), target_hidden=hidden)
    assert rows.shape == (3, draft.vocab_size) and torch.allclose(rows.sum(-1), torch.ones(3), atol=1e-5)
    assert (rows[torch.arange(3), tokens] > 0).all()


def test_tapped_layers_enter_the_fuse_at_the_scale_of_the_final_state():
    """A residual stream's huge values (the offline target's layer 15 reaches |x| ~ 3e4) do not reach `fuse` as
    such: each tapped block is divided by its RMS, so scaling a tapped layer changes nothing, scaling h does."""
    from specrepro.drafts.feature import scaled_taps

    g = torch.Generator().manual_seed(0)
    tap, h = torch.randn(3, 8, generator=g), torch.randn(3, 8, generator=g)
    a = scaled_taps(torch.cat([tap, h], -1), 1)
    assert torch.allclose(a, scaled_taps(torch.cat([3e4 * tap, h], -1), 1), atol=1e-5)
    assert torch.equal(a[:, 8:], h) and torch.allclose(a[:, :8].pow(2).mean(-1), torch.ones(3), atol=1e-4)
    assert not torch.allclose(a, scaled_taps(torch.cat([tap, 2 * h], -1), 1))
