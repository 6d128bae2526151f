"""The feature draft's training-time-test unroll (EAGLE-3, HASS): step j of the unroll computes what drafting
computes j tokens after a root, the loss of one step is the loss the draft always had, only the positions in
the mask (the target-written ones where written_only) carry loss, and the window holds every step's targets."""
import pytest
import torch

from specrepro.drafts import feature
from specrepro.drafts.layers import KVCache
from specrepro.stats.toy import tiny_llama
from specrepro.training import losses
from specrepro.training.trainer import make_config, window_length

VOCAB = 50


def net_and_batch(steps, width=9, seed=0):
    target = tiny_llama(0, vocab=VOCAB, layers=2)
    torch.manual_seed(seed)
    net = feature.FeatureNet(target, feature.DEFAULTS | {"ffn": 32, "ttt_steps": steps})
    g = torch.Generator().manual_seed(seed)
    n = width + steps
    top = torch.stack([torch.randperm(VOCAB, generator=g)[:4] for _ in range(2 * n)]).view(2, n, 4)
    p = torch.rand(2, n, 4, generator=g)
    p = 0.9 * p / p.sum(-1, keepdim=True)
    batch = {"hidden": torch.randn(2, n, target.config.hidden_size, generator=g), "tokens": torch.randint(VOCAB, (2, n), generator=g),
             "top_ids": top, "top_p": p, "rest": torch.full((2, n), 0.1), "mask": torch.ones(2, n, dtype=torch.bool)}
    return net, batch


@torch.no_grad()
def test_each_unrolled_step_is_what_drafting_computes_after_its_root():
    steps, width = 3, 9
    net, batch = net_and_batch(steps, width)
    h, tokens = batch["hidden"], batch["tokens"]
    outs = losses.unroll(net, h[:, :width], tokens, steps)
    for r in (0, 4, width - 1):
        cache = KVCache()  # decode time: real features up to the root in the cache, then the draft's own
        f = net.step(h[:, : r + 1], tokens[:, 1 : r + 2], torch.arange(r + 1), cache)[:, -1:]
        for j in range(1, steps + 1):
            if j > 1:
                f = net.step(f, tokens[:, r + j : r + j + 1], torch.tensor([r + j - 1]), cache)
            assert torch.allclose(outs[j - 1][:, r], f[:, 0], atol=1e-5), (r, j)


def test_one_step_is_the_drafts_old_loss():
    net, batch = net_and_batch(1)
    cfg = net.cfg
    torch.manual_seed(3)
    new = losses.feature_loss(net, batch, cfg)
    torch.manual_seed(3)  # the loss before the unroll existed, written out
    h = batch["hidden"].float()
    inp = h[:, :-1] + cfg["noise"] * torch.randn_like(h[:, :-1]) * h[:, :-1].std()
    f = net.step(inp, batch["tokens"][:, 1:], torch.arange(inp.shape[1]))
    logp = net.logits(f).float().log_softmax(-1).flatten(0, 1)
    soft = losses.soft_ce(logp, batch["top_ids"][:, 1:].flatten(0, 1), batch["top_p"][:, 1:].flatten(0, 1),
                          batch["rest"][:, 1:].flatten(), batch["mask"][:, 1:].flatten().float())
    old = soft + cfg["reg_weight"] * torch.nn.functional.smooth_l1_loss(f, h[:, 1:])
    assert torch.allclose(new, old, atol=1e-5)


def test_positions_outside_the_mask_carry_no_loss_and_later_steps_add_their_own():
    net, batch = net_and_batch(3)
    cfg = net.cfg | {"noise": 0.0}
    batch["mask"][:, ::2] = False  # e.g. prompt positions where only target-written ones count
    base = losses.feature_loss(net, batch, cfg)
    changed = {**batch, "top_ids": batch["top_ids"].clone()}
    changed["top_ids"][:, ::2] = (changed["top_ids"][:, ::2] + 1) % VOCAB  # labels at masked positions only
    assert torch.allclose(losses.feature_loss(net, changed, cfg), base, atol=1e-6)
    one = losses.feature_loss(net, batch, cfg | {"ttt_steps": 1})
    assert not torch.allclose(one, base)  # steps 2 and 3 add loss terms of their own
    base.backward()  # and the unroll is differentiable through the draft's own features
    assert net.fc.weight.grad is not None and net.fc.weight.grad.abs().sum() > 0


def test_the_config_and_window_hold_the_unroll():
    cfg = make_config("feature", "tiny", ttt_steps=3, written_only=True)
    assert cfg["ttt_steps"] == 3 and cfg["written_only"] is True
    assert window_length(cfg) == cfg["window"] + 3
    assert window_length(make_config("feature", "tiny")) == cfg["window"] + 1
    mask = losses.unroll_mask(3, 4)
    assert mask.shape == (12, 12) and mask[8 + 2].tolist() == [True, True, True, False] + [False, False, True, False] \
        + [False, False, True, False]
    with pytest.raises(ValueError, match="unknown settings"):
        make_config("feature", "tiny", ttt=3)


def fused_net_and_batch(steps, width=9, seed=0):
    """A draft fusing layer 0's output with h (EAGLE-3) and a batch holding that layer's output as taps."""
    target = tiny_llama(0, vocab=VOCAB, layers=2)
    torch.manual_seed(seed)
    net = feature.FeatureNet(target, feature.DEFAULTS | {"ffn": 32, "ttt_steps": steps, "taps": [0], "noise": 0.0})
    torch.nn.init.normal_(net.fuse.weight, std=0.2)
    _, batch = net_and_batch(steps, width, seed)
    g = torch.Generator().manual_seed(seed + 1)
    batch["taps"] = torch.randn(2, width + steps, 1, target.config.hidden_size, generator=g)
    return net, batch


@torch.no_grad()
def test_fused_roots_read_what_drafting_feeds_them():
    """Training's step 1 from fused roots is drafting's first step from the runner's [taps ; h] rows, and later
    steps roll forward on the draft's own features as drafting does."""
    steps, width = 3, 9
    net, batch = fused_net_and_batch(steps, width)
    h, tokens = batch["hidden"], batch["tokens"]
    rows = torch.cat([batch["taps"].flatten(2), h], -1)  # what hidden_taps = (0,) gives: [n, 2H]
    fused = net.features(rows[:, :width])
    outs = losses.unroll(net, fused, tokens, steps)
    for r in (0, 5, width - 1):
        cache = KVCache()
        f = net.step(rows[:, : r + 1], tokens[:, 1 : r + 2], torch.arange(r + 1), cache)[:, -1:]
        for j in range(1, steps + 1):
            if j > 1:
                f = net.step(f, tokens[:, r + j : r + j + 1], torch.tensor([r + j - 1]), cache)
            assert torch.allclose(outs[j - 1][:, r], f[:, 0], atol=1e-5), (r, j)
    # the loss reads the same fused roots (noise 0 here)
    loss = losses.feature_loss(net, batch, net.cfg)
    expected = sum(losses._step_loss(net, f, h[:, j : j + width].float(), batch, j, width, net.cfg)
                   for j, f in enumerate(outs, 1)) / steps
    assert torch.allclose(loss, expected, atol=1e-5)


def test_a_fused_draft_refuses_data_without_its_taps():
    net, batch = fused_net_and_batch(2)
    with pytest.raises(ValueError, match="holds no taps"):
        losses.feature_loss(net, {k: v for k, v in batch.items() if k != "taps"}, net.cfg)
    batch["taps"] = torch.cat([batch["taps"], batch["taps"]], 2)
    with pytest.raises(ValueError, match="2 tapped layers"):
        losses.feature_loss(net, batch, net.cfg)
