"""The runner contract between the algorithm and the engines, and the Hugging Face runner.

A runner is a stateful model pass: feed tokens, get one logits row per token, roll the KV cache back by
position. Algorithms 1 and 2 (specrepro.algorithm) see a target, and model drafts see their model, only
through `Runner`; `as_runner` turns a plain HF causal LM into one. A new engine implements the protocol
and nothing above it changes.
"""
from __future__ import annotations

import contextlib
from typing import Protocol, runtime_checkable

import torch
import transformers
from transformers import DynamicCache


@runtime_checkable
class Runner(Protocol):
    """What a runner offers (HFRunner, LeanRunner and its native/static/frozen kinds).

    forward(ids [n]) -> logits [n, V] float32, caching the n tokens after the first `length`;
    forward_tree(ids, positions, mask): a token tree (specrepro.algorithm.tree), each token at its given
    position seeing what the bool mask [n, length + n] allows; rollback(length) forgets everything after
    the first `length` tokens; compact(keep) keeps only the cache slots `keep` (ascending), in order;
    reset() empties the cache. With keep_hidden set, `hidden` holds the last pass's last-layer hidden
    states [n, H] (feature drafts read them). A runner may also have prefill(ids): cache without logits.
    """

    length: int
    vocab_size: int  # rows of the LM head: the logits' last dimension
    context_window: int | None
    device: torch.device  # where its input ids go
    dtype: torch.dtype
    keep_hidden: bool
    hidden: torch.Tensor | None

    def forward(self, ids: torch.Tensor) -> torch.Tensor: ...

    def forward_tree(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor: ...

    def rollback(self, length: int) -> None: ...

    def compact(self, keep: torch.Tensor) -> None: ...

    def reset(self) -> None: ...


def as_runner(target) -> Runner:
    """A runner as it is; a Hugging Face causal LM wrapped in an HFRunner."""
    if isinstance(target, Runner):
        return target
    if isinstance(target, torch.nn.Module) and hasattr(target, "get_output_embeddings"):
        return HFRunner(target)
    raise TypeError(
        f"target must be a Hugging Face causal LM or a runner (specrepro.engines.runners.Runner), "
        f"got {type(target).__name__}"
    )


@contextlib.contextmanager
def hidden_kept(runner: Runner, wanted: bool, taps: tuple[int, ...] = ()):
    """The runner keeps its last-layer hidden states while the block runs, if `wanted`, preceded by the
    outputs of layers `taps` (a fused-feature draft's input; runners without `hidden_taps` refuse taps); its own
    settings are restored afterwards, so a caller's (tuned) runner is left as it was given."""
    taps = tuple(taps) if wanted else ()
    if taps and not hasattr(runner, "hidden_taps"):
        raise TypeError(f"the draft reads the outputs of target layers {list(taps)}, which a "
                        f"{type(runner).__name__} does not give (LeanRunner with the native pass and HFRunner do)")
    before, before_taps = runner.keep_hidden, getattr(runner, "hidden_taps", ())
    runner.keep_hidden = before or wanted
    if taps or before_taps:
        runner.hidden_taps = taps
    try:
        yield runner
    finally:
        runner.keep_hidden = before
        if taps or before_taps:
            runner.hidden_taps = before_taps


def cache_argument(version: str | None = None) -> str:
    """The forward keyword that takes the KV cache: `cache` from transformers 5.24, `past_key_values` before
    (a GPU image's own transformers may be older than the one specrepro is developed against)."""
    from packaging.version import Version

    return "cache" if Version(version or transformers.__version__) >= Version("5.24") else "past_key_values"


class HFRunner:
    """Any Hugging Face causal LM with a DynamicCache; a rollback crops the cache (no recomputation).
    cache_arg: the forward keyword for the cache (default: what the installed transformers takes)."""

    def __init__(self, model: torch.nn.Module, keep_hidden: bool = False, cache_arg: str | None = None):
        if cache_arg not in (None, "cache", "past_key_values"):
            raise ValueError(f"cache_arg must be 'cache' or 'past_key_values', got {cache_arg!r}")
        self.cache_arg = cache_arg or cache_argument()
        self.model = model
        self.keep_hidden = keep_hidden
        self.device = input_device(model)
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = vocab_size(model)
        self.context_window = context_window(model)
        self._taps: tuple[int, ...] = ()
        self.reset()

    @property
    def hidden_taps(self) -> tuple[int, ...]:
        """As LeanRunner.hidden_taps: layers whose outputs `hidden` holds before the final hidden state."""
        return self._taps

    @hidden_taps.setter
    def hidden_taps(self, taps) -> None:
        taps = tuple(int(t) for t in taps)
        layers = self.model.config.num_hidden_layers
        bad = [t for t in taps if not 0 <= t < layers - 1]
        if bad:
            raise ValueError(f"hidden_taps {bad} are not layers 0..{layers - 2} of this {layers}-layer model (the last "
                             "layer's output is the final hidden state, which hidden always holds)")
        self._taps = taps

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0
        self.hidden: torch.Tensor | None = None

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # a model split over GPUs computes its head on the last one: logits come back beside the inputs
        return self._run(ids, head=True)[0].float().to(self.device)

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> None:
        """Cache ids without the LM head: a long prompt's logits are never read, and the head over a
        49k vocabulary costs as much as the layers of a small model."""
        self._run(ids, head=False)

    @torch.inference_mode()
    def forward_tree(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """forward() over tokens at the given positions, each seeing only what the bool mask
        [n, length + n] allows (a 4-D mask is used by transformers as given)."""
        n = ids.shape[-1]
        if mask.shape != (n, self.length + n):
            raise ValueError(f"tree mask must have shape {(n, self.length + n)}, got {tuple(mask.shape)}")
        dtype = next(self.model.parameters()).dtype
        # additive float mask: read the same way by the sdpa and eager attention paths
        bias = torch.zeros(mask.shape, dtype=dtype, device=self.device)
        bias.masked_fill_(~mask.to(self.device), torch.finfo(dtype).min)
        return self._run(ids, True, positions.view(1, n), bias.view(1, 1, n, -1))[0].float()

    @torch.inference_mode()
    def compact(self, keep: torch.Tensor) -> None:
        """Keep only cache slots `keep` (ascending), moved down in place; the slots before the first
        moved one stay where they are."""
        keep = keep.to(self.device)
        same = keep == torch.arange(len(keep), device=self.device)
        first = int(same.logical_not().nonzero()[0]) if not bool(same.all()) else len(keep)
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)
                t[..., first : len(keep), :] = t[..., keep[first:], :]
        self.rollback(len(keep))

    def _run(self, ids: torch.Tensor, head: bool, positions=None, mask=None) -> torch.Tensor | None:
        n = ids.shape[-1]
        ids = ids.to(self.device).view(1, n)
        if positions is None:
            positions = torch.arange(self.length, self.length + n, device=self.device).view(1, n)
        self.length += n
        extra = {self.cache_arg: self.cache}
        if mask is not None:
            extra["attention_mask"] = mask
        if not (self.keep_hidden or not head):
            return self.model(input_ids=ids, position_ids=positions, use_cache=True, **extra).logits
        # the base model alone: the normed last hidden state feeds feature drafts, the head is optional
        taps = self.hidden_taps if self.keep_hidden else ()
        out = self.model.get_decoder()(input_ids=ids, position_ids=positions, use_cache=True,
                                       output_hidden_states=bool(taps), **extra)
        self.hidden = out.last_hidden_state[0] if self.keep_hidden else None
        if taps:  # hidden_states[i + 1] is layer i's output; the last one is the normed final state
            self.hidden = torch.cat([out.hidden_states[t + 1][0] for t in taps] + [self.hidden], -1)
        return self.model.get_output_embeddings()(out.last_hidden_state) if head else None

    def rollback(self, length: int) -> None:
        if length < self.length:
            self.cache.crop(length - self.length)  # transformers 5.x: a negative count removes tokens
            self.length = length


def is_dispatched(model) -> bool:
    """True for a model placed by accelerate (device_map): split over devices or offloaded to CPU/disk."""
    return bool(getattr(model, "hf_device_map", None)) or hasattr(model, "_hf_hook")


def split_reason(model: torch.nn.Module) -> str | None:
    """Why a model's weights are not all resident on one device (offloaded or split), or None if they are."""
    devices = {p.device for p in model.parameters()}
    if any(d.type == "meta" for d in devices):
        where = sorted({str(v) for v in (getattr(model, "hf_device_map", None) or {}).values()})
        return f"some weights are offloaded (on the 'meta' device; device_map places modules on {where})"
    if len(devices) > 1:
        return f"its weights are split over {sorted(map(str, devices))}"
    return None


def input_device(model: torch.nn.Module) -> torch.device:
    """The device a model's input ids must be on: its embedding layer's (execution) device.

    A model dispatched with a device_map keeps offloaded weights on the "meta" device and moves them in
    with accelerate hooks; the hook's execution device is where the embedding runs. Parameters on "meta"
    with no such hook were never loaded: a ValueError names them.
    """
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    hook = getattr(embed, "_hf_hook", None) if embed is not None else None
    if getattr(hook, "execution_device", None) is not None:
        return torch.device(hook.execution_device)
    unloaded = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    if unloaded and not is_dispatched(model):
        raise ValueError(
            f"{len(unloaded)} parameter(s) of {type(model).__name__} are on the 'meta' device with no accelerate "
            f"offload hook (first: {unloaded[0]}): the weights were never loaded (a model built under "
            "init_empty_weights?); load it with specrepro.load_model or from_pretrained"
        )
    weight = getattr(embed, "weight", None)
    if weight is not None and weight.device.type != "meta":
        return weight.device
    return next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))


def context_window(model: torch.nn.Module) -> int | None:
    """The model's maximum number of positions, when its config (or a runner's context_window) says."""
    window = getattr(model, "context_window", None)
    if isinstance(window, int) and window > 0:  # a runner such as specrepro.engines.lean.LeanRunner
        return window
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def vocab_size(model: torch.nn.Module) -> int:
    """Rows of the LM head (what the logits' last dim will be)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return head.weight.shape[0]
    return model.config.vocab_size
