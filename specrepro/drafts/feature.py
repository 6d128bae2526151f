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
from .common import FrozenTargetParts, HiddenStateDraft, draw_kept, expand_logits, full_rows, parameter_versions
from .layers import DecoderLayer, KVCache, RMSNorm
from ..engines.kernels import inference_linear

# ttt_steps: the training-time-test unroll (1: the draft learns one step from the target's features only);
# written_only: the loss on target-written positions only (specrepro.training.losses.feature_loss)
DEFAULTS = {"ffn": 1536, "head_vocab": 16384, "reg_weight": 1.0, "noise": 0.1, "lr": 2e-3,
            "batch": 4, "window": 128, "ttt_steps": 1, "written_only": False}


def _rope_theta(config) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def scaled_taps(h: torch.Tensor, taps: int) -> torch.Tensor:
    """[..., (taps + 1) H] fused features with each tapped layer's block divided by its root mean square (the final
    hidden state, last, is normed already). A residual stream carries a few huge values (|x| near 3e4 at some
    positions of the offline target's layer 15): scaled, every block enters `fuse` at the scale of the last."""
    blocks = h.unflatten(-1, (taps + 1, -1))
    tapped = blocks[..., :taps, :]
    tapped = tapped * torch.rsqrt(tapped.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype)
    return torch.cat([tapped, blocks[..., taps:, :]], -2).flatten(-2)


class FeatureNet(nn.Module, FrozenTargetParts):
    def __init__(self, target, cfg: dict, keep: torch.Tensor | None = None):
        super().__init__()
        c = target.config
        h = c.hidden_size
        self.cfg = cfg
        self.fc = nn.Linear(2 * h, h, bias=False)
        # EAGLE-3's fused features: with taps (l, m), a real position's feature is fuse([layer l's out, layer m's
        # out, h]) instead of h alone (the draft's own outputs roll forward as they are)
        self.taps = tuple(int(t) for t in cfg.get("taps", ()))
        if not all(0 <= t < c.num_hidden_layers - 1 for t in self.taps):
            raise ValueError(f"taps {list(self.taps)} are not layers 0..{c.num_hidden_layers - 2} of the target (its "
                             "last layer's output is the final hidden state, which the draft reads anyway)")
        self.fuse = nn.Linear((len(self.taps) + 1) * h, h, bias=False) if self.taps else None
        if self.fuse is not None:  # start as the unfused draft: fuse passes h through and ignores the taps
            with torch.no_grad():
                self.fuse.weight.zero_()
                self.fuse.weight[:, -h:] = torch.eye(h)
        head_dim = getattr(c, "head_dim", None) or h // c.num_attention_heads
        self.layer = DecoderLayer(h, c.num_attention_heads, c.num_key_value_heads, head_dim, cfg["ffn"],
                                  _rope_theta(c), c.rms_norm_eps)
        self.norm = RMSNorm(h, c.rms_norm_eps)
        final_norm = getattr(target.get_decoder(), "norm", None)
        if final_norm is not None:  # start at the target's output scale
            self.norm.weight.data.copy_(final_norm.weight.detach())
        self.register_buffer("keep", keep if keep is not None else torch.empty(0, dtype=torch.long))
        self.attach(target)

    def features(self, h: torch.Tensor) -> torch.Tensor:
        """[..., H] features from the target's: through `fuse` where h holds the tapped layers too ([..., (T + 1) H]),
        as they are otherwise (the final hidden state, or the draft's own outputs)."""
        if self.fuse is not None and h.shape[-1] == self.fuse.in_features:
            return inference_linear(self.fuse, scaled_taps(h, len(self.taps)))
        return h

    def step(self, h, next_ids, pos, cache=None, mask=None) -> torch.Tensor:
        """f_t from h_t [B, T, H] (or the target's fused features, see `features`) and token t+1 [B, T] at
        positions pos [T] (mask: a token tree's)."""
        x = inference_linear(self.fc, torch.cat([self.features(h), F.embedding(next_ids, self.emb)], -1))
        return self.norm(self.layer(x, pos, cache, mask))


class NativeFeature:
    """A FeatureNet's steps through the native pass (specrepro.engines.native): its decoder layer as a one-layer
    native model whose input projection is the net's fc over [feature ; embedding], whose final norm is the
    net's and whose LM head is the kept head, with its own float32 KV cache. One C++ call per draft step
    (`forward_draft`: the embedding lookup, and for rows of fused target features their scaling and `fuse`,
    happen inside it) instead of ~40 torch ops.

    Numbers: bfloat16 weights and product inputs, float32 accumulation, norms, RoPE and attention (the native
    pass's), so features and logits agree with the torch step within bfloat16 round-off; the draft draws from,
    and reports, the rows it computed, so verification stays exact either way."""

    def __init__(self, net: FeatureNet, context: int):
        from ..engines import native

        layer = net.layer
        module = native.load()
        self.model = module.Model(net.emb, net.norm.weight.detach().float(), net.norm.eps, layer.heads,
                                  layer.kv_heads, layer.hd)
        self.model.add_layer(layer.norm1.weight.detach().float(), native.pack([layer.q.weight, layer.k.weight, layer.v.weight]),
                             native.pack([layer.o.weight]), layer.norm2.weight.detach().float(),
                             native.pack([layer.gate.weight, layer.up.weight]), native.pack([layer.down.weight]))
        self.model.set_input(native.pack([net.fc.weight]))
        self.model.set_head(native.pack([net.head]))
        if net.fuse is not None:  # the target's fused features: scaled and fused inside the call (scaled_taps)
            self.model.set_fuse(native.pack([net.fuse.weight]), len(net.taps))
        self.hidden = net.emb.shape[1]
        self.capacity = context + 1
        self.k_cache = torch.zeros(1, 1, layer.kv_heads, self.capacity, layer.hd)
        self.v_cache = torch.zeros_like(self.k_cache)
        freqs = layer.theta ** (-torch.arange(0, layer.hd, 2, dtype=torch.float32) / layer.hd)
        angles = torch.arange(self.capacity, dtype=torch.float32)[:, None] * freqs[None]
        angles = torch.cat([angles, angles], -1)
        self.cos, self.sin = angles.cos().contiguous(), angles.sin().contiguous()  # as layers.rope computes them
        self.length = 0
        self.key = self.key_of(net)

    @staticmethod
    def key_of(net) -> tuple:
        """What the packed copies were made from: rebuilt when the head is cut again or weights change."""
        return (id(net.head), net.head._version, parameter_versions(net))

    def truncate(self, n: int) -> None:
        self.length = min(self.length, n)

    def step(self, h: torch.Tensor, ids: torch.Tensor, pos, mask=None, logits: bool = True):
        """As FeatureNet.step with its cache (h [1, T, F], ids [1, T]; pos: positions [T], or an int, the first of
        T consecutive ones (a chain: the RoPE rows are then a view, not a gather); mask [T, cached + T] bool), plus
        the kept-head logits [T, kept] (float32) when `logits`. Returns (f [1, T, H] float32, logits or None)."""
        t = ids.shape[-1]
        if self.length + t > self.capacity:
            raise ValueError(f"the draft's cache holds {self.capacity} positions, {self.length + t} were asked for")
        if isinstance(pos, int):
            cos, sin = self.cos[pos : pos + t], self.sin[pos : pos + t]
        else:
            cos, sin = self.cos[pos], self.sin[pos]
        f, out, _ = self.model.forward_draft(h[0], ids[0], self.length, cos, sin, mask, self.k_cache, self.v_cache,
                                             logits)
        self.length += t
        return f.view(1, t, self.hidden), out


class FeatureDraft(HiddenStateDraft):
    """Proposes with a FeatureNet; its KV cache holds the positions fed with real target features.

    native: run the steps through the native pass (NativeFeature). None (default): where it serves them, a
    bfloat16 net on the CPU with the native module built here; False: always torch."""

    def __init__(self, net: FeatureNet, target, native: bool | None = None):
        super().__init__(net, target)
        self.native = native
        self._native: NativeFeature | None = None
        self.reset()

    @property
    def target_taps(self) -> tuple[int, ...]:
        """The target layers whose outputs the draft reads before the final hidden state (fused features)."""
        return self.net.taps

    @classmethod
    def init_for(cls, target, cfg: dict | None = None, keep: torch.Tensor | None = None, seed: int = 0,
                 native: bool | None = None):
        """An untrained draft for any Llama-like target (tests, losslessness checks)."""
        torch.manual_seed(seed)
        net = FeatureNet(target, DEFAULTS | (cfg or {}), keep)
        if net.fuse is not None:  # a random fuse, small enough that the fused feature stays in scale
            nn.init.normal_(net.fuse.weight, std=0.3 / net.fuse.in_features ** 0.5)
        return cls(net, target, native)

    def reset(self) -> None:
        super().reset()
        self.cache = KVCache()
        if self._native is not None:
            self._native.truncate(0)
        self.tokens = torch.empty(0, dtype=torch.long, device=self.device)

    def _build_native(self) -> NativeFeature:
        self.tokens = self.tokens[:0]  # a new cache: nothing is cached in it yet
        return NativeFeature(self.net, self.context_window or 8192)

    def _active(self) -> NativeFeature | None:
        """The native step this draft's cache lives in, or None (the torch step's KVCache)."""
        return self._native if self.native is not False else None

    def _cached(self) -> int:
        step = self._active()
        return step.length if step is not None else self.cache.length

    def _truncate(self, n: int) -> None:
        if self._native is not None:
            self._native.truncate(n)
        self.cache.truncate(n)

    def _step(self, h, ids, pos, mask=None):
        """(f [1, T, H], kept-vocabulary logits [T, kept] float32) of one step, native or torch, cached. pos:
        positions [T], or the first of T consecutive ones as an int. The native step is chosen (and rebuilt if
        the net changed) once per proposal, by _begin."""
        step = self._active()
        if step is not None:
            return step.step(h, ids, pos, mask)
        if isinstance(pos, int):
            pos = torch.arange(pos, pos + ids.shape[-1], device=self.device)
        f = self.net.step(h, ids, pos, self.cache, mask)
        return f, self.net.logits(f[0]).float()

    def _begin(self) -> None:
        """Before a proposal reads the cache: choose the step it runs (a rebuilt native step starts with an empty
        cache)."""
        self._native_step()

    @torch.inference_mode()
    def propose(self, seq, k, sampling, generator=None, target_hidden=None):
        seq = seq.to(self.device)
        self._begin()
        f, logits, real = self._root_feature(seq, target_hidden)
        tokens, probs = [], []
        keep = self.net.keep_ids
        for i in range(k):
            token, p = draw_kept(logits[-1], keep, sampling, generator)
            tokens.append(token)
            probs.append(p)
            if i + 1 < k:
                f, logits = self._step(f, token.view(1, 1), max(real, 1) + i)
        self.calls += k
        self._truncate(real)  # forget draft positions: they used the draft's own features
        self.tokens = seq
        return torch.stack(tokens), full_rows(torch.stack(probs), keep, self.vocab_size)

    @torch.inference_mode()
    def propose_tree(self, seq, spec, sampling, generator=None, target_hidden=None, seed=None):
        """A token tree (specrepro.drafts.growing.grow): each level's nodes roll forward from their parent's feature
        in one batched step, attending to the real positions and their ancestors."""
        from ..algorithm.tree import attention_mask
        from .growing import grow

        seq = seq.to(self.device)
        self._begin()
        f, logits, real = self._root_feature(seq, target_hidden)
        context = self._cached()
        features = {-1: f[0, -1]}
        fed: list[int] = []

        def expand(rows):
            return expand_logits(rows, self.net.keep_ids, self.vocab_size)

        def next_logits(tree, nodes):
            h = torch.stack([features[tree.parents[i]] for i in nodes]).unsqueeze(0)
            ids = torch.tensor([[tree.tokens[i] for i in nodes]], device=self.device)  # host ints: one copy
            pos = torch.tensor([max(real, 1) + tree.depths[i] - 1 for i in nodes], device=self.device)
            mask = attention_mask(tree, context, nodes, fed).to(self.device)
            out, rows = self._step(h, ids, pos, mask)
            features.update(zip(nodes, out[0]))
            fed.extend(nodes)
            self.calls += 1
            return expand(rows)

        self.calls += 1
        tree = grow(spec, sampling, generator, expand(logits[-1]), next_logits, seed, self.children)
        self._truncate(real)
        self.tokens = seq
        return tree

    def _root_feature(self, seq, target_hidden):
        """Feed the target features not yet cached; returns (f [1, T, H] whose last row predicts the token
        after seq, its logits [T, kept], real = positions with target features)."""
        n = seq.shape[0]
        real = n - 1  # positions 0..n-2 have target features
        # cached position t used h_t and token t+1: valid while seq[:t+2] is unchanged
        valid = max(min(common_prefix_length(self.tokens, seq) - 1, real - 1), 0)
        self._truncate(valid)
        dtype = self.compute_dtype()
        if real > 0:
            h = target_hidden[valid:real].to(self.device, dtype).unsqueeze(0)
            f, logits = self._step(h, seq[valid + 1 : n].view(1, -1), valid)
            return f[:, -1:], logits[-1:], real
        # a one-token prompt: no target feature yet, start from zeros
        zeros = torch.zeros(1, 1, self.hidden_size, dtype=dtype, device=self.device)
        f, logits = self._step(zeros, seq.view(1, 1), 0)
        return f, logits, real
