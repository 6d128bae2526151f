"""EAGLE-like feature draft: one decoder layer that extrapolates the target's last hidden state.

Input at position t: [h_t ; embedding of token t+1] -> linear -> one Llama decoder layer -> norm = f_t,
trained to match h_{t+1} (so the target's own, frozen LM head turns f_t into a guess of token t+2).
Later draft positions roll forward on the draft's own f instead of the target's h. The embeddings and LM
head are the target's (not stored in the artifact); the head may be cut to the most frequent tokens,
which cuts the draft's cost, while p stays a proper distribution over the full vocabulary.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import common_prefix_length
from .common import FrozenTargetParts, HiddenStateDraft, draw_kept, expand_logits, full_rows
from .layers import DecoderLayer, KVCache, RMSNorm
from ..engines.kernels import inference_linear

# ttt_steps: the training-time-test unroll (1: the draft learns one step from the target's features only);
# written_only: the loss on target-written positions only (specrepro.training.losses.feature_loss)
DEFAULTS = {"ffn": 1536, "head_vocab": 16384, "reg_weight": 1.0, "noise": 0.1, "lr": 2e-3,
            "batch": 4, "window": 128, "ttt_steps": 1, "written_only": False}


def _rope_theta(config) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


class FeatureNet(nn.Module, FrozenTargetParts):
    def __init__(self, target, cfg: dict, keep: torch.Tensor | None = None):
        super().__init__()
        c = target.config
        h = c.hidden_size
        self.cfg = cfg
        self.fc = nn.Linear(2 * h, h, bias=False)
        head_dim = getattr(c, "head_dim", None) or h // c.num_attention_heads
        self.layer = DecoderLayer(h, c.num_attention_heads, c.num_key_value_heads, head_dim, cfg["ffn"],
                                  _rope_theta(c), c.rms_norm_eps)
        self.norm = RMSNorm(h, c.rms_norm_eps)
        final_norm = getattr(target.get_decoder(), "norm", None)
        if final_norm is not None:  # start at the target's output scale
            self.norm.weight.data.copy_(final_norm.weight.detach())
        self.register_buffer("keep", keep if keep is not None else torch.empty(0, dtype=torch.long))
        self.attach(target)

    def step(self, h, next_ids, pos, cache=None, mask=None) -> torch.Tensor:
        """f_t from h_t [B, T, H] and token t+1 [B, T] at positions pos [T] (mask: a token tree's)."""
        x = inference_linear(self.fc, torch.cat([h, F.embedding(next_ids, self.emb)], -1))
        return self.norm(self.layer(x, pos, cache, mask))


class FeatureDraft(HiddenStateDraft):
    """Proposes with a FeatureNet; its KV cache holds the positions fed with real target features."""

    def __init__(self, net: FeatureNet, target):
        super().__init__(net, target)
        self.reset()

    @classmethod
    def init_for(cls, target, cfg: dict | None = None, keep: torch.Tensor | None = None, seed: int = 0):
        """An untrained draft for any Llama-like target (tests, losslessness checks)."""
        torch.manual_seed(seed)
        return cls(FeatureNet(target, DEFAULTS | (cfg or {}), keep), target)

    def reset(self) -> None:
        super().reset()
        self.cache = KVCache()
        self.tokens = torch.empty(0, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def propose(self, seq, k, sampling, generator=None, target_hidden=None):
        seq = seq.to(self.device)
        f, real = self._root_feature(seq, target_hidden)
        tokens, probs = [], []
        keep = self.net.keep_ids
        for i in range(k):
            token, p = draw_kept(self.net.logits(f[0, -1]).float(), keep, sampling, generator)
            tokens.append(token)
            probs.append(p)
            if i + 1 < k:
                pos = torch.full((1,), max(real, 1) + i, device=self.device)
                f = self.net.step(f, token.view(1, 1), pos, self.cache)
        self.calls += k
        self.cache.truncate(real)  # forget draft positions: they used the draft's own features
        self.tokens = seq
        return torch.stack(tokens), full_rows(torch.stack(probs), keep, self.vocab_size)

    @torch.inference_mode()
    def propose_tree(self, seq, spec, sampling, generator=None, target_hidden=None, seed=None):
        """A token tree (specrepro.drafts.growing.grow): each level's nodes roll forward from their parent's feature
        in one batched step, attending to the real positions and their ancestors."""
        from ..algorithm.tree import attention_mask
        from .growing import grow

        seq = seq.to(self.device)
        f, real = self._root_feature(seq, target_hidden)
        context = self.cache.length
        features = {-1: f[0, -1]}
        fed: list[int] = []

        def logits_of(fs):
            return expand_logits(self.net.logits(fs).float(), self.net.keep_ids, self.vocab_size)

        def next_logits(tree, nodes):
            h = torch.stack([features[tree.parents[i]] for i in nodes]).unsqueeze(0)
            ids = torch.tensor([[tree.tokens[i] for i in nodes]], device=self.device)  # host ints: one copy
            pos = torch.tensor([max(real, 1) + tree.depths[i] - 1 for i in nodes], device=self.device)
            mask = attention_mask(tree, context, nodes, fed).to(self.device)
            out = self.net.step(h, ids, pos, self.cache, mask)[0]
            features.update(zip(nodes, out))
            fed.extend(nodes)
            self.calls += 1
            return logits_of(out)

        self.calls += 1
        tree = grow(spec, sampling, generator, logits_of(f[0, -1]), next_logits, seed, self.children)
        self.cache.truncate(real)
        self.tokens = seq
        return tree

    def _root_feature(self, seq, target_hidden):
        """Feed the target features not yet cached; returns (f [1, T, H] whose last row predicts the token
        after seq, real = positions with target features)."""
        n = seq.shape[0]
        real = n - 1  # positions 0..n-2 have target features
        # cached position t used h_t and token t+1: valid while seq[:t+2] is unchanged
        valid = max(min(common_prefix_length(self.tokens, seq) - 1, real - 1), 0)
        self.cache.truncate(valid)
        dtype = self.compute_dtype()
        if real > 0:
            h = target_hidden[valid:real].to(self.device, dtype).view(1, -1, self.hidden_size)
            pos = torch.arange(valid, real, device=self.device)
            f = self.net.step(h, seq[valid + 1 : n].view(1, -1), pos, self.cache)[:, -1:]
        else:  # a one-token prompt: no target feature yet, start from zeros
            zeros = torch.zeros(1, 1, self.hidden_size, dtype=dtype, device=self.device)
            f = self.net.step(zeros, seq.view(1, 1), torch.arange(1, device=self.device), self.cache)
        return f, real
