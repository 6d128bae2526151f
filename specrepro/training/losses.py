"""The training losses of the trained drafts: distillation against the target's cached top-k distributions
(soft cross-entropy plus residual mass), hard labels, and the kept-vocabulary targets of cut heads."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..drafts.feature import FeatureNet
from ..drafts.heads import HeadsNet


def soft_ce(logp: torch.Tensor, top_ids: torch.Tensor, top_p: torch.Tensor, rest: torch.Tensor,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy H(q, p) against the target's cached top-k q plus its residual mass.

    Equals KL(q || p) up to q's entropy (a constant), with the mass q puts outside its top-k matched
    to the mass p puts outside those same tokens. logp: [N, V] draft log-probs; top_*: [N, k]; rest: [N].
    """
    lp_top = logp.gather(-1, top_ids.long())
    p_rest = (1 - lp_top.exp().sum(-1)).clamp_min(1e-6)
    loss = -(top_p.float() * lp_top).sum(-1) - rest.float() * p_rest.log()
    if mask is not None:
        return (loss * mask).sum() / mask.sum().clamp_min(1)
    return loss.mean()


def hard_ce(logp: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    loss = F.nll_loss(logp, labels, reduction="none")
    if mask is not None:
        return (loss * mask).sum() / mask.sum().clamp_min(1)
    return loss.mean()


def frequent_tokens(data: dict, n: int, special: list[int]) -> torch.Tensor:
    """The n token ids the target emits or predicts most often in the training data (sorted ids).

    A draft whose head covers only these is still lossless: its p is zero elsewhere, and it proposes
    only tokens it gives mass to. Special tokens (EOS, chat markers) are always kept.
    """
    counts = torch.bincount(data["tokens"], minlength=1).float()
    vocab = max(int(data["top_ids"].max()) + 1, len(counts))
    full = torch.zeros(vocab)
    full[: len(counts)] += counts
    full.index_add_(0, data["top_ids"][:, 0].long(), torch.ones(len(data["top_ids"])))
    full[torch.tensor(special, dtype=torch.long)] = float("inf")
    return full.topk(min(n, vocab)).indices.sort().values


def remap(ids: torch.Tensor, keep: torch.Tensor, vocab: int) -> torch.Tensor:
    """Positions of `ids` inside the kept vocabulary (-1 where a token is not kept)."""
    index = torch.full((vocab,), -1, dtype=torch.long, device=keep.device)
    index[keep] = torch.arange(len(keep), device=keep.device)
    return index[ids.long()]


def reduced_soft_targets(top_ids, top_p, rest, keep: torch.Tensor, vocab: int):
    """Cached top-k labels moved into the kept vocabulary; mass on dropped tokens joins the residual."""
    local = remap(top_ids, keep, vocab)
    dropped = local < 0
    rest = rest + (top_p.float() * dropped).sum(-1)
    return local.clamp_min(0), top_p.float().masked_fill(dropped, 0), rest



def feature_loss(net: FeatureNet, batch: dict, cfg: dict) -> torch.Tensor:
    """Match h_{t+1} (smooth L1) and the target's distribution of token t+2 (soft CE), from noisy h_t; with
    cfg's ttt_steps J > 1, also steps 2..J of a training-time-test unroll (EAGLE-3, HASS): step j feeds step
    j - 1's own outputs, as drafting does, and learns the target's features and distribution j positions on.
    The loss is the mean over steps; positions outside batch["mask"] (the target-written ones where
    written_only) carry none."""
    steps = int(cfg.get("ttt_steps", 1))
    h = batch["hidden"].float()
    width = h.shape[1] - steps  # roots r = 0..width-1; step j's output at root r stands for position r + j
    inp = h[:, :width]
    if net.fuse is not None:  # EAGLE-3: the roots read the tapped layers' outputs beside h, fused
        if "taps" not in batch:
            raise ValueError(f"the draft fuses target layers {list(net.taps)}, but its data holds no taps "
                             "(build it with the config's taps)")
        taps = batch["taps"][:, :width].float()
        if taps.shape[2] != len(net.taps):
            raise ValueError(f"the data holds {taps.shape[2]} tapped layers, the draft fuses {len(net.taps)}")
        inp = net.features(torch.cat([taps.flatten(2), inp], -1))
    # noise stands in for the draft's own, imperfect features it rolls forward on at decode time
    inp = inp + cfg["noise"] * torch.randn_like(inp) * inp.detach().std()
    outs = unroll(net, inp, batch["tokens"], steps)
    return sum(_step_loss(net, f, h[:, j : j + width], batch, j, width, cfg) for j, f in enumerate(outs, 1)) / steps


def unroll(net: FeatureNet, inp: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The outputs [B, width, H] of steps 1..`steps` from features inp [B, width, H] at roots 0..width-1 and
    tokens [B, width + steps]: step 1 reads inp and token r + 1, step j the output of step j - 1 and token r + j,
    each query attending as drafting from root r does (unroll_mask)."""
    width = inp.shape[1]
    feats, ids, outs = [inp], [tokens[:, 1 : 1 + width]], []
    for j in range(1, steps + 1):
        f = net.step(torch.cat(feats, 1), torch.cat(ids, 1), unroll_positions(j, width, inp.device),
                     mask=unroll_mask(j, width, inp.device))[:, -width:]
        outs.append(f)
        feats.append(f)
        ids.append(tokens[:, j + 1 : j + 1 + width])
    return outs


def _step_loss(net, f, h_next, batch, j: int, width: int, cfg: dict) -> torch.Tensor:
    """Step j's outputs against the target: its features at r + j and its distribution of token r + j + 1
    (cached at index r + j)."""
    reg = F.smooth_l1_loss(f, h_next)
    logp = net.logits(f).float().log_softmax(-1).flatten(0, 1)
    ids, p, rest = (batch[name][:, j : j + width] for name in ("top_ids", "top_p", "rest"))
    if net.keep_ids is not None:
        ids, p, rest = reduced_soft_targets(ids, p, rest, net.keep, net.vocab)
    mask = batch["mask"][:, j : j + width].flatten().float()
    return soft_ce(logp, ids.flatten(0, 1), p.flatten(0, 1), rest.flatten(), mask) + cfg["reg_weight"] * reg


def unroll_positions(steps: int, width: int, device=None) -> torch.Tensor:
    """RoPE positions of steps 1..`steps` laid side by side: step i's output at root r sits at r + i - 1."""
    return torch.cat([torch.arange(width, device=device) + i for i in range(steps)])


def unroll_mask(steps: int, width: int, device=None) -> torch.Tensor:
    """[steps * width]^2 bool: which keys each query of the unroll sees, as at decode time: step i at root r
    sees the real positions up to r (step 1's keys) and its own chain (steps 2..i at root r), nothing else."""
    n = steps * width
    step = torch.arange(n, device=device) // width
    root = torch.arange(n, device=device) % width
    real = (step[None, :] == 0) & (root[None, :] <= root[:, None])
    chain = (step[None, :] > 0) & (root[None, :] == root[:, None]) & (step[None, :] <= step[:, None])
    return real | chain


def heads_loss(net: HeadsNet, batch: dict, cfg: dict) -> torch.Tensor:
    """Head i at position t learns the target's distribution at t+i (that of token t+1+i)."""
    k = cfg["heads"]
    h = batch["hidden"].float()
    w = h.shape[1] - k
    f = net.features(h[:, :w], batch["tokens"][:, 1 : w + 1])
    losses = []
    for i in range(1, k + 1):
        logp = net.logits(f[i - 1]).float().log_softmax(-1).flatten(0, 1)
        ids, p, rest = (batch[name][:, i : i + w] for name in ("top_ids", "top_p", "rest"))
        if net.keep_ids is not None:
            ids, p, rest = reduced_soft_targets(ids, p, rest, net.keep, net.vocab)
        mask = batch["mask"][:, i : i + w].flatten().float()
        losses.append(soft_ce(logp, ids.flatten(0, 1), p.flatten(0, 1), rest.flatten(), mask))
    return torch.stack(losses).mean()


def small_loss(model, batch: dict, cfg: dict) -> torch.Tensor:
    """Soft (cached top-k) plus hard-label cross-entropy at every position, masked by batch["mask"]."""
    tokens = batch["tokens"]
    logits = model(input_ids=tokens[:, :-1]).logits
    logp = logits.float().log_softmax(-1).flatten(0, 1)
    # position t's cached labels describe token t+1, which is also its hard label
    top_ids, top_p, rest = (batch[name][:, :-1].flatten(0, 1) for name in ("top_ids", "top_p", "rest"))
    mask = batch["mask"][:, :-1].flatten().float()
    soft = soft_ce(logp, top_ids, top_p, rest.flatten(), mask)
    hard = hard_ce(logp, tokens[:, 1:].flatten(), mask)
    w = cfg["hard_weight"]
    return (1 - w) * soft + w * hard


LOSSES = {"small": small_loss, "seqkd": small_loss, "feature": feature_loss, "heads": heads_loss}
