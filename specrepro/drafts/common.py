"""Pieces the trained drafts share: the target's frozen embedding and head, one base for the drafts that read
the target's hidden states, and reduced (kept) output vocabularies."""
from __future__ import annotations

import torch

from .base import Draft
from ..engines.kernels import inference_linear
from ..engines.runners import context_window, vocab_size


def frequency_subset(keep: torch.Tensor | None, counts: torch.Tensor, n: int, vocab: int,
                     special=()) -> torch.Tensor:
    """Sorted ids of the n tokens of `keep` (None: the whole vocabulary) that `counts` [>= vocab or fewer
    entries; missing ones count 0] ranks highest, ties to the lower id, `special` ids (EOS) always in: the
    frequency-ranked subset FR-Spec cuts a draft's LM head to. Errors name a bad n."""
    kept = torch.arange(vocab) if keep is None else keep.detach().cpu().long()
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(kept):
        raise ValueError(f"head_vocab must be an integer in 1..{len(kept)} (the tokens this draft's head covers), "
                         f"got {n!r}")
    full = torch.zeros(vocab, dtype=torch.float64)
    counts = torch.as_tensor(counts, dtype=torch.float64).flatten()[:vocab]
    full[: len(counts)] = counts
    score = full[kept]
    special = [int(t) for t in special if 0 <= int(t) < vocab]
    if special:
        score[torch.isin(kept, torch.tensor(special))] = float("inf")
    order = torch.argsort(-score, stable=True)  # kept is sorted by id, so ties go to the lower id
    return kept[order[:n]].sort().values


def expand_logits(sub: torch.Tensor, keep: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """Logits over a kept vocabulary -> logits over the full one (-inf elsewhere, so p is 0 there)."""
    if keep is None:
        return sub
    full = sub.new_full(sub.shape[:-1] + (vocab,), float("-inf"))
    full[..., keep] = sub
    return full


def draw_kept(logits: torch.Tensor, keep: torch.Tensor | None, sampling, generator=None):
    """(token id, p over the kept columns) for one row of logits over a kept vocabulary (`keep`, sorted ids;
    None: logits over the full one). p is sampling's distribution over the kept tokens only: every other token
    has p = 0 in the full row (expand_logits gives it -inf), so the draw is the one a full row would give (the
    same uniform inverts the same cumulative sums; zeros add nothing), over the kept columns instead of the
    whole vocabulary (timed on the 2-core CPU, a heads:1024 step was not measurably cheaper for it)."""
    from ..algorithm.sampling import sample

    if sampling.temperature == 0:  # greedy: the one-hot at the first argmax, what probs and sample give, drawn
        j = logits.argmax(-1)      # with no uniform (a greedy loop never reads its generator)
        p = torch.nn.functional.one_hot(j, logits.shape[-1]).float()
    else:
        p = sampling.probs(logits)
        j = sample(p, generator)
    return (j if keep is None else keep[j]), p


def full_rows(p: torch.Tensor, keep: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """[R, n kept] probabilities -> [R, vocab] rows, zero outside the kept columns."""
    if keep is None:
        return p
    from .growing import zero_rows

    rows = zero_rows(p.shape[0], vocab, p.device)
    rows[:, keep] = p
    return rows


def parameter_versions(module) -> tuple:
    """(id, version) of every parameter of `module` and its submodules: changes when a weight is written in place
    or replaced (versions alone miss a replaced parameter: a fresh one starts at version 0 as an unwritten one
    is). A native step compares it before every proposal, so it walks the modules' own tables instead of
    module.parameters() (8 against 16 us for the feature draft on the 2-core CPU)."""
    out, stack = [], [module]
    while stack:
        m = stack.pop()
        out += [(id(p), p._version) for p in m._parameters.values() if p is not None]
        stack += [c for c in m._modules.values() if c is not None]
    return tuple(out)


class FrozenTargetParts:
    """The target's embedding table and (optionally vocabulary-cut) LM head, not trained, not saved.

    A net that mixes this in registers a `keep` buffer (sorted kept token ids; empty: the whole vocabulary)."""

    def attach(self, target, dtype: torch.dtype | None = None) -> None:
        """Borrow the target's tables (views; a cast copy where `dtype` differs from the target's)."""
        self.vocab = vocab_size(target)
        self.emb = target.get_input_embeddings().weight.detach()
        head = target.get_output_embeddings().weight.detach()
        self.head = head if self.keep.numel() == 0 else head[self.keep].contiguous()
        if dtype is not None:
            self.emb, self.head = self.emb.to(dtype), self.head.to(dtype)

    def restrict(self, n: int, counts: torch.Tensor, special=()) -> None:
        """Cut the head to the n currently kept tokens `counts` ranks highest (frequency_subset; FR-Spec's
        frequency-ranked head, applied to a trained draft without retraining it). The head is the target's
        frozen one, so the kept rows are unchanged; p renormalises over fewer tokens and stays a proper
        distribution over the full vocabulary (zero elsewhere), so verification stays exact."""
        old = self.keep_ids
        new = frequency_subset(old, counts, n, self.vocab, special)
        rows = new if old is None else torch.searchsorted(old.cpu(), new)
        self.head = self.head[rows.to(self.head.device)].contiguous()
        self.keep = new.to(self.keep.device)

    @property
    def keep_ids(self):
        return None if self.keep.numel() == 0 else self.keep

    def logits(self, f: torch.Tensor) -> torch.Tensor:
        """Logits over the kept vocabulary (apply expand_logits for the full one). The head is most of a
        draft step: when drafting it runs prepacked (specrepro.engines.kernels.inference_linear)."""
        return inference_linear(self, f, self.head)


class HiddenStateDraft(Draft):
    """A draft whose net (with FrozenTargetParts) reads the target's hidden states, which the verification
    pass computes anyway. It runs where the borrowed tables live, the target's embedding device, so a step
    copies nothing between devices."""

    wants_target_hidden = True

    def __init__(self, net, target):
        super().__init__()
        self.net = net.eval()
        self.vocab_size = vocab_size(target)
        self.context_window = context_window(target)
        self.hidden_size = target.config.hidden_size
        self.device = self.net.emb.device
        self.net.to(self.device)

    def compute_dtype(self) -> torch.dtype:
        """What the net computes in (the target's, or load()'s dtype)."""
        return next(self.net.parameters()).dtype

    # The step through the native kernels (specrepro.engines.native), where a subclass has one: `native` is None
    # (the default: native where it serves, a bfloat16 net on the CPU with the module built here), True or
    # False (always torch); `_native` the packed step, rebuilt when the net's weights or cut head change.
    native: bool | None = False
    _native = None
    _served_dtype = None  # the net's dtype when the native step was last found to serve it (native None)

    def _build_native(self):
        """A new native step for self.net (its class has key_of(net), a digest of what it was packed from)."""
        raise NotImplementedError

    def _native_step(self):
        """The native step to run, or None for the torch step."""
        if self.native is False:
            return None
        if self.native is None and self._served_dtype != self.compute_dtype():  # checked again if the net is cast
            if not self._native_serves():
                self.native = False  # decided once per draft
                return None
            self._served_dtype = self.compute_dtype()
        if self._native is None or self._native.key != type(self._native).key_of(self.net):
            self._native = self._build_native()
        return self._native

    def _native_serves(self) -> bool:
        from ..engines import native

        return (self.compute_dtype() == torch.bfloat16 and self.device.type == "cpu"
                and native.unavailable_reason(torch.bfloat16, self.device) is None)
