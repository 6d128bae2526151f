"""Logits -> probabilities (temperature, top-k, top-p, greedy) and sampling with a torch.Generator.

One function, `logits_to_probs`, serves the draft and the target: the p used in the acceptance ratio
must be exactly the distribution the draft token was drawn from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..engines import native


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings shared by draft and target. temperature=0 means greedy."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        validate_sampling(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits_to_probs(logits, self.temperature, self.top_k, self.top_p)

    def draw(self, logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One token (a 0-d index) from logits [V], distributed as `sample(self.probs(logits), generator)` draws
        it and with the one uniform it takes: greedy is the argmax (no uniform); without top-k, CPU logits go
        through the native module's one-call draw where this process has loaded it (native_draw), else a
        nucleus is drawn within its top-64 head (nucleus_draw) where that head holds it; anything else through
        probs and sample."""
        if self.greedy:
            return logits.float().argmax(-1)
        if self.top_k is None and logits.dim() == 1:
            token = native_draw(logits, self.temperature, 1.0 if self.top_p is None else self.top_p, generator)
            if token is None and self.top_p is not None and self.top_p < 1:
                token = nucleus_draw(logits, self.temperature, self.top_p, generator)
            if token is not None:
                return token
        return sample(self.probs(logits), generator)


def validate_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ValueError naming the bad setting."""
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or math.isnan(temperature):
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if math.isinf(temperature):
        raise ValueError("temperature must be finite")
    if top_k is not None:
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    if top_p is not None:
        if not isinstance(top_p, (int, float)) or isinstance(top_p, bool) or not (0 < top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")


def logits_to_probs(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """Float32 probabilities over the last dim, in the order HF applies them: temperature, top-k, top-p.

    temperature=0 is greedy: a one-hot at the argmax (first index on ties).
    """
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = _tempered(logits, temperature)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p is not None and top_p < 1:
        logits = logits.masked_fill(top_p_drop(logits.softmax(-1), top_p), -math.inf)
    return logits.softmax(-1)


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 logits / temperature (> 0), finite where the logits are."""
    if temperature == 1:
        return logits
    scaled = logits / temperature
    if temperature < 1 and torch.isposinf(scaled).any():
        # huge logits over a small temperature overflow float32 (inf - inf = nan in softmax): shift each row
        # by its max first, which softmax, top-k and top-p are all invariant to (T >= 1 cannot overflow)
        scaled = (logits - logits.amax(-1, keepdim=True)) / temperature
    return scaled


NUCLEUS_HEAD = 64  # the likeliest tokens nucleus_draw orders, as top_p_drop's first head


def nucleus_draw(logits: torch.Tensor, temperature: float, top_p: float,
                 generator: torch.Generator | None = None) -> torch.Tensor | None:
    """One token from the nucleus of softmax(logits [V] / temperature), or None where its top-NUCLEUS_HEAD head
    holds less than top_p (the caller then goes through probs and sample).

    The kept tokens are top_p_drop's (a token stays while the mass before it in descending order is below top_p;
    the top one always), each drawn in proportion to its probability: what sample() draws from logits_to_probs'
    renormalised row, by inverting the CDF of the kept tokens alone, in vocabulary order, at the one float64
    uniform sample() would take, so the same generator state gives the same token (but where u falls within
    float32 rounding of a boundary). In an autoregressive step this spares the drop mask, the masked copy and second
    softmax over the vocabulary, and the float64 cumulative sum over it.
    """
    probs = _tempered(logits.float(), temperature).softmax(-1)
    head, order, keep, reached = _nucleus_head(probs, top_p, NUCLEUS_HEAD)
    if not (bool(reached) or head.shape[-1] == probs.shape[-1]):
        return None
    tokens, by_index = order[keep].sort()  # the CDF in vocabulary order, as sample() walks the row
    cdf = head[keep][by_index].to(torch.float64).cumsum(-1)
    where = generator.device if generator is not None else cdf.device
    u = torch.rand(1, 1, generator=generator, device=where, dtype=torch.float64).to(cdf.device) * cdf[-1]
    j = torch.searchsorted(cdf, u.view(1), right=True)
    if int(j) >= cdf.shape[-1]:  # u * total rounded up to the total: the last kept token with mass
        j = cdf.argmax(-1, keepdim=True)
    return tokens[j].view(())


def native_draw(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None = None) -> torch.Tensor | None:
    """One token from the nucleus of softmax(logits [V] / temperature) (top_p 1: the whole row) by the native
    module's nucleus_sample, at the one float64 uniform sample() would take; None (nothing drawn) where the
    module is not loaded in this process or the logits or generator are not on the CPU. One C++ call instead
    of ~20 torch calls over the vocabulary: the work a target step spends outside its pass at T > 0."""
    module = native.loaded()
    if module is None or logits.device.type != "cpu" or (generator is not None and generator.device.type != "cpu"):
        return None
    u = torch.rand(1, 1, generator=generator, dtype=torch.float64)
    return torch.tensor(module.nucleus_sample(logits.float().contiguous(), float(temperature), float(top_p),
                                              float(u)))


def _nucleus_head(probs: torch.Tensor, top_p: float, first: int):
    """The likeliest `first` tokens of each row of probs [..., V] in descending order and which of them the
    nucleus keeps: (head, order, keep, reached). A token stays while the mass before it is below top_p, the top
    one always; `reached`: whether the head's mass reaches top_p (else tokens beyond it may belong too)."""
    head, order = probs.topk(min(first, probs.shape[-1]), dim=-1)  # descending
    mass = head.cumsum(-1)
    keep = (mass - head) < top_p
    keep[..., 0] = True
    return head, order, keep, mass[..., -1] >= top_p


def top_p_drop(probs: torch.Tensor, top_p: float, first: int = 64) -> torch.Tensor:
    """A bool mask over the last dim: True where a token lies outside the nucleus, i.e. where the probability
    mass of the likelier tokens before it (in descending order) already reaches top_p; the top token stays.

    Only the head of each row is ordered: the `first` largest probabilities (topk), quadrupled for the rows whose
    head has not reached top_p. Every token outside a head that reaches top_p has at least that mass
    before it, so it is dropped without being ordered. A full sort of a 49k vocabulary costs milliseconds a row on
    a CPU, a large part of a 135M target's pass; the head of a nucleus is usually a few dozen tokens. Ties at the
    boundary are kept or dropped in topk's order, as a sort would keep them in its own.
    """
    shape, vocab = probs.shape, probs.shape[-1]
    probs = probs.reshape(-1, vocab)
    k = min(first, vocab)
    _, order, keep, reached = _nucleus_head(probs, top_p, k)
    drop = torch.ones_like(probs, dtype=torch.bool).scatter(-1, order, ~keep)
    short = ~reached  # rows whose head has not reached top_p: a longer head, for them alone
    if k < vocab and bool(short.any()):
        drop[short] = top_p_drop(probs[short], top_p, 4 * k)
    return drop.reshape(shape)


def uniforms(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """U(0, 1) draws of `shape` on `device`, drawn on the generator's own device (a CPU generator may drive
    a CUDA target: it draws on the CPU, the values move), so one seed gives one stream on any device."""
    where = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=where).to(device)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token index per row of `probs` ([..., V] -> [...]), by inverting the CDF at one uniform per row.

    Exact for any distribution (the first index whose cumulative mass exceeds u * total; a token without
    mass is never picked), and one uniform per row: on a 49k vocabulary ~20x cheaper than torch.multinomial,
    which draws an exponential for every token (~1 ms a call on the 2-core EPYC, as much as 4% of a
    decoding step). The uniform comes from the generator's own device (a CPU generator may drive a CUDA
    model), like `uniforms`.
    """
    flat = probs.reshape(-1, probs.shape[-1])
    where = generator.device if generator is not None else flat.device
    cdf = flat.to(where, torch.float64).cumsum(-1)  # float64: no drift over a long vocabulary
    u = torch.rand(flat.shape[0], 1, generator=generator, device=where, dtype=torch.float64) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, u, right=True)
    if bool((idx >= flat.shape[-1]).any()):  # u * total rounded up to the total: the last token with mass
        idx = torch.where(idx >= flat.shape[-1], cdf.argmax(-1, keepdim=True), idx)
    return idx.to(probs.device).reshape(probs.shape[:-1])
