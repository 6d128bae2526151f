"""Medusa-like heads on the target's last hidden state.

Head i (i = 1..K) reads h_t and the embedding of token t+1 (the token the target has just emitted, which
Medusa's plain heads ignore and we can have for free) and predicts token t+1+i through a residual block
and the target's frozen LM head (optionally cut to frequent tokens). All heads run in one matmul per
proposal. For sampling, head i's distribution after `sampling.probs` is the p row and its token is
drawn from it: a proper draft distribution, so standard rejection keeps the output lossless.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import FrozenTargetParts, HiddenStateDraft, draw_kept, expand_logits, full_rows, parameter_versions

DEFAULTS = {"heads": 4, "head_vocab": 16384, "lr": 2e-3, "batch": 4, "window": 128}


class HeadsNet(nn.Module, FrozenTargetParts):
    def __init__(self, target, cfg: dict, keep: torch.Tensor | None = None):
        super().__init__()
        h = target.config.hidden_size
        self.cfg = cfg
        self.inp = nn.ModuleList(nn.Linear(2 * h, h, bias=False) for _ in range(cfg["heads"]))
        self.out = nn.ModuleList(nn.Linear(h, h, bias=False) for _ in range(cfg["heads"]))
        for lin in self.out:  # each head starts as the target's own head: a sane, non-random guess
            nn.init.zeros_(lin.weight)
        self.register_buffer("keep", keep if keep is not None else torch.empty(0, dtype=torch.long))
        self.attach(target)

    def features(self, h: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """[..., H] features and tokens t+1 -> [K, ..., H], one per head."""
        x = torch.cat([h, F.embedding(next_ids, self.emb)], -1)
        return torch.stack([h + out(F.silu(inp(x))) for inp, out in zip(self.inp, self.out)])


class NativeHeads:
    """A HeadsNet's step through the native pass's kernels (specrepro.engines.native): its bfloat16 weights
    packed once, three products per proposal (every head's input projection, every head's output projection,
    the frozen head over the kept tokens) instead of ~4K + 10 torch ops. The step's numbers: bfloat16
    weights and product inputs, float32 accumulation (the native pass's), so the logits agree with the torch
    step within bfloat16 round-off; the draft draws from, and reports, the rows it computed, so verification
    stays exact either way."""

    def __init__(self, net: "HeadsNet"):
        from ..engines import native

        self.k, self.h = len(net.inp), net.inp[0].weight.shape[0]
        self.inp = native.pack([lin.weight for lin in net.inp])  # [K * H, 2H]: one product for every head
        # every head's output projection in one product over all K rows; head i keeps its own block
        self.out = native.pack([lin.weight for lin in net.out])  # [K * H, H]
        self.head = native.pack([net.head])
        self.linear = native.load().linear
        self.key = self.key_of(net)

    @staticmethod
    def key_of(net) -> tuple:
        """What the packed copies were made from: rebuilt when the head is cut again or weights change."""
        return (id(net.head), net.head._version, parameter_versions(net))

    def logits(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Every head's logits [K, kept] from h [H] and x = [h ; embedding of the next token] [2H]."""
        a = F.silu(self.linear(x.view(1, -1), self.inp)).view(self.k, self.h)
        rows = self.linear(a, self.out).view(self.k, self.k, self.h)
        f = h.float() + rows[torch.arange(self.k), torch.arange(self.k)]  # head i's own output block
        return self.linear(f, self.head)


class HeadsDraft(HiddenStateDraft):
    """Proposes every lookahead position from one HeadsNet call on the target's last hidden state.

    native: run the step through the native kernels (NativeHeads). None (default): where they serve it, a
    bfloat16 net on the CPU with the native module built here; False: always torch."""

    def __init__(self, net: HeadsNet, target, native: bool | None = None):
        super().__init__(net, target)
        self.native = native
        self._native = None

    @classmethod
    def init_for(cls, target, cfg: dict | None = None, keep: torch.Tensor | None = None, seed: int = 0):
        """Untrained heads for any Llama-like target; out-projections are zero, so randomise them a bit
        to give tests heads that differ from each other."""
        torch.manual_seed(seed)
        net = HeadsNet(target, DEFAULTS | (cfg or {}), keep)
        for lin in net.out:
            nn.init.normal_(lin.weight, std=0.02)
        return cls(net, target)

    @torch.inference_mode()
    def propose(self, seq, k, sampling, generator=None, target_hidden=None):
        logits = self._logits(seq, target_hidden, expand=False)  # [K, kept tokens]
        keep = self.net.keep_ids
        tokens, probs = [], []
        for i in range(k):
            # lookahead beyond K reuses the last head: a worse guess, still a proper distribution
            token, p = draw_kept(logits[min(i, len(logits) - 1)], keep, sampling, generator)
            tokens.append(token)
            probs.append(p)
        self.calls += 1
        return torch.stack(tokens), full_rows(torch.stack(probs), keep, self.vocab_size)

    @torch.inference_mode()
    def propose_tree(self, seq, spec, sampling, generator=None, target_hidden=None, seed=None):
        """Medusa-style tree: a node at depth d gets its children from head d + 1 (the last head beyond K),
        whatever its own token; all heads come from one pass."""
        from .growing import grow

        logits = self._logits(seq, target_hidden)
        self.calls += 1
        last = len(logits) - 1
        return grow(spec, sampling, generator, logits[0],
                    lambda tree, nodes: logits[[min(tree.depths[i], last) for i in nodes]], seed, self.children)

    def _logits(self, seq, target_hidden, expand: bool = True) -> torch.Tensor:
        """Every head's logits [K, V] after seq, from the target's last hidden state, on the draft's device
        (expand=False: over the kept vocabulary only)."""
        dtype = self.compute_dtype()
        if target_hidden is not None and target_hidden.shape[0] > 0:
            h = target_hidden[-1].to(self.device, dtype)
        else:  # one-token prompt: no target feature yet
            h = torch.zeros(self.hidden_size, dtype=dtype, device=self.device)
        step = self._native_step()
        if step is not None:
            x = torch.cat([h, F.embedding(seq[-1].to(self.device), self.net.emb)])
            logits = step.logits(h, x)
        else:
            logits = self.net.logits(self.net.features(h, seq[-1].to(self.device))).float()
        return expand_logits(logits, self.net.keep_ids, self.vocab_size) if expand else logits

    def _build_native(self) -> NativeHeads:
        return NativeHeads(self.net)
