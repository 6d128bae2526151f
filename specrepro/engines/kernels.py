"""Linear layers for the lean runner: the model's own weights through F.linear, or oneDNN prepacked copies.

A decode or verify pass of a small model over 1-16 tokens is a chain of matrix-vector-like products; how
fast a CPU library does those for a handful of rows decides v(K). Measured on a 2-core AMD EPYC with
AVX512-BF16 (30 SmolLM2 layers + LM head, 2 threads, ms for 1 / 5 / 9 / 17 rows): float32 F.linear
51 / 69 / 69 / 109, oneDNN prepacked 25 / 28 / 28 / 44; bfloat16 F.linear 37 / 41 / 43 / 49, oneDNN
prepacked 16 / 17 / 17 / 26. Other CPUs differ (on AVX2 without native bfloat16 the picture changes), so
`specrepro.tune` measures the backends on the machine at hand instead of trusting these numbers.

Backends:
- "eager": F.linear over views of the model's own tensors (no copy).
- "onednn": the weights of the projections that read the same input (q/k/v; gate/up) concatenated and
  reordered once into oneDNN's blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, the op inductor
  uses when it freezes a CPU graph), then `mkldnn._linear_pointwise`. Same weights and dtype, a different
  summation order: logits agree with eager within the dtype's round-off.
- "native": not a linear layer but a whole pass: LeanRunner(backend="native") runs every layer of a
  bfloat16 pass over up to 64 tokens in one C++ call (specrepro.engines.native), its linears eager for
  longer blocks. Listed here so that the runner, tune and the bench choose it like the others.
A backend that is not available or fails its probe falls back to eager with a one-line warning.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

BACKENDS = ("eager", "onednn", "native")
PACK_ROWS_HINT = 8  # oneDNN picks its blocking for about this many rows; 4-16 measured alike (1-17 rows)

_probe_cache: dict[tuple[torch.dtype, str], str | None] = {}


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown linear backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def unavailable_reason(backend: str, dtype: torch.dtype, device: torch.device | str = "cpu") -> str | None:
    """None if `backend` works for `dtype` on `device` here, else why not (probed once per dtype)."""
    check_backend(backend)
    if backend == "eager":
        return None
    if backend == "native":
        from . import native

        return native.unavailable_reason(dtype, device)
    if torch.device(device).type != "cpu":
        return f"oneDNN prepacked linear runs on CPU only, not on {device}"
    key = (dtype, backend)
    if key not in _probe_cache:
        _probe_cache[key] = _probe_onednn(dtype)
    return _probe_cache[key]


def _probe_onednn(dtype: torch.dtype) -> str | None:
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "oneDNN has no bfloat16 kernels for this CPU"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"oneDNN prepacked linear is wired for float32 and bfloat16, not {dtype}"
    try:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(24, 40, generator=g).to(dtype)
        x = torch.randn(3, 40, generator=g).to(dtype)
        got = _onednn(x, torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS_HINT), None)
        want = F.linear(x, w)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        if got.shape != want.shape or not torch.allclose(got.float(), want.float(), atol=tol, rtol=tol):
            return "oneDNN prepacked linear disagreed with F.linear in the probe"
    except Exception as e:  # a missing op or kernel: any failure means "not here"
        return f"oneDNN prepacked linear failed its probe ({type(e).__name__}: {e})"
    return None


def resolve_backend(backend: str, dtype: torch.dtype, device) -> str:
    """The backend to use: `backend` if it works here, else "eager" with a one-line warning."""
    reason = unavailable_reason(backend, dtype, device)
    if reason is None:
        return backend
    warnings.warn(f"linear backend {backend!r} unavailable ({reason}); using eager F.linear", stacklevel=3)
    return "eager"


def _onednn(x, packed, bias):
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class Linear:
    """One or more projections of the same input: `linear(x)` -> a tuple with one output per weight.

    weights: [(weight [out_i, in], bias [out_i] or None), ...] as the model holds them (any dtype: cast to
    `dtype` once where they differ).
    """

    def __init__(self, weights, dtype: torch.dtype, backend: str = "eager"):
        check_backend(backend)
        if backend == "native":
            raise ValueError("'native' is a whole-pass backend (LeanRunner), not one for single linear layers")
        self.backend = backend
        self.sizes = [w.shape[0] for w, _ in weights]
        if backend == "eager":  # views of the model's own tensors when dtypes match
            self.parts = [(w.detach().to(dtype), None if b is None else b.detach().to(dtype)) for w, b in weights]
            return
        w = torch.cat([w.detach() for w, _ in weights]).to(dtype).contiguous()
        biases = [b for _, b in weights]
        if all(b is None for b in biases):
            self.bias = None
        else:
            self.bias = torch.cat(
                [b.detach() if b is not None else w.new_zeros(n) for (_, b), n in zip(weights, self.sizes)]
            ).to(dtype)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS_HINT)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.backend == "eager":
            return tuple(F.linear(x, w, b) for w, b in self.parts)
        y = self.joint(x)
        return (y,) if len(self.sizes) == 1 else y.split(self.sizes, dim=-1)

    def joint(self, x: torch.Tensor) -> torch.Tensor:
        """All projections of x in one tensor, concatenated along the last dimension."""
        if self.backend == "eager":
            outs = [F.linear(x, w, b) for w, b in self.parts]
            return outs[0] if len(outs) == 1 else torch.cat(outs, -1)
        shape = x.shape
        y = _onednn(x.reshape(-1, shape[-1]), self.packed, self.bias)
        return y.view(*shape[:-1], y.shape[-1])


def inference_linear(owner: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight) for `owner`, an nn.Linear (its weight and bias) or any module holding `weight`.

    Without autograd, and where oneDNN serves the weight's dtype, the product runs on a prepacked copy of
    the weight, made on first use and kept on `owner` until the weight changes (a training step bumps its
    version). The trained drafts use it: their steps are matrix-vector products, which the packed kernel
    streams ~2x faster on CPU than F.linear. With autograd on (training) it is plain F.linear.
    """
    w, b = (owner.weight, owner.bias) if weight is None else (weight, None)
    if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
        return F.linear(x, w, b)
    cached = getattr(owner, "_specrepro_packed", None)
    if cached is None or cached[0] is not w or cached[1] != w._version:
        # whether oneDNN serves this weight is decided here, at (re)pack, not on every call
        packed = None if unavailable_reason("onednn", w.dtype, w.device) else Linear([(w, b)], w.dtype, "onednn")
        cached = (w, w._version, packed)
        owner._specrepro_packed = cached
    if cached[2] is None:
        return F.linear(x, w, b)
    return cached[2].joint(x.to(w.dtype))
