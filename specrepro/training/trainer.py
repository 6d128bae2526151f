"""Training drafts against the cached target pass, with resumable checkpoints and cached artifacts.

An artifact lives in <root>/<kind>-<hash of its config>/ (specrepro.drafts.artifacts: where artifacts live
and how they load). While training, the same directory holds checkpoint.pt (model, optimiser, step, elapsed time, RNG states), replaced
atomically, so rerunning an interrupted command with the same settings continues where it stopped.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from .distill import DATA_DEFAULTS, distill_data, merge
from .losses import LOSSES, frequent_tokens
from ..drafts.artifacts import MARKER, VERSION, artifact_dir, draft_device, target_name
from ..drafts.kinds import KINDS, TABLE, check_kind
from ..models import load_model

# which cached target passes each kind learns from (see distill.py)
KIND_SOURCES = {"small": ("text",), "seqkd": ("gen",), "feature": ("text", "gen"), "heads": ("text", "gen")}


def build_net(kind: str, target, cfg: dict, keep: torch.Tensor | None):
    """A fresh, untrained net of `kind` (the table's builder)."""
    return TABLE[kind].build_net(target, cfg, keep)


def make_config(kind: str, target_name: str, budget_minutes: float | None = 5.0, max_steps: int | None = None,
                seed: int = 0, **overrides) -> dict:
    """Everything that determines an artifact (its hash names the directory)."""
    check_kind(kind)
    if budget_minutes is None and max_steps is None:
        raise ValueError("give budget_minutes, max_steps or both")
    if budget_minutes is not None and (not isinstance(budget_minutes, (int, float)) or budget_minutes <= 0):
        raise ValueError(f"budget_minutes must be a positive number, got {budget_minutes!r}")
    if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    base = {"version": VERSION, "kind": kind, "target": target_name, "seed": seed, "budget_minutes": budget_minutes,
            "max_steps": max_steps} | DATA_DEFAULTS | TABLE[kind].defaults
    unknown = set(overrides) - set(base)
    if unknown:
        raise ValueError(f"unknown settings for {kind}: {sorted(unknown)}; known: {sorted(base)}")
    return base | overrides


# ----------------------------------------------------------------------------------------- data


def training_data(target, tokenizer, cfg: dict) -> dict:
    parts = [distill_data(target, tokenizer, source, cfg) for source in KIND_SOURCES[cfg["kind"]]]
    data = parts[0] if len(parts) == 1 else merge(parts)
    if cfg["kind"] in ("small", "seqkd"):
        data.pop("hidden", None)  # token models never read it; saves memory
    if cfg["kind"] != "seqkd" and not cfg.get("written_only"):  # seqkd learns only target-written text
        data["gen_mask"] = torch.ones_like(data["gen_mask"])
    return data


def window_starts(data: dict, length: int) -> torch.Tensor:
    """Start positions of windows of `length` inside one sequence with at least one unmasked label."""
    starts = []
    bounds = data["starts"].tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        if e - s >= length:
            starts.append(torch.arange(s, e - length + 1))
    starts = torch.cat(starts) if starts else torch.empty(0, dtype=torch.long)
    csum = torch.cat([torch.zeros(1, dtype=torch.long), data["gen_mask"].long().cumsum(0)])
    has_label = csum[starts + length - 1] - csum[starts] > 0
    starts = starts[has_label]
    if not len(starts):
        raise ValueError(f"no training window of {length} tokens: the distillation data is too small")
    return starts


def get_batch(data: dict, starts: torch.Tensor, cfg: dict, length: int, gen: torch.Generator) -> dict:
    pick = starts[torch.randint(len(starts), (cfg["batch"],), generator=gen)]
    index = pick[:, None] + torch.arange(length)[None]
    names = ("tokens", "top_ids", "top_p", "rest", "hidden", "taps")
    batch = {name: data[name][index] for name in names if name in data}
    batch["mask"] = data["gen_mask"][index]
    return batch


def window_length(cfg: dict) -> int:
    """Positions a training window holds: the roots plus what the last one's targets reach (every head's, or
    every step of the training-time-test unroll)."""
    return cfg["window"] + (cfg["heads"] if cfg["kind"] == "heads" else cfg.get("ttt_steps", 1))


def trainable_state(net) -> dict:
    return {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}


# ---------------------------------------------------------------------------------- training


def lr_at(cfg: dict, step: int, progress: float) -> float:
    """Linear warm-up over cfg's warmup_steps (default 20), then cosine decay over the budget down to
    lr_min_ratio (default a tenth) of cfg's lr."""
    warm = min(1.0, (step + 1) / cfg.get("warmup_steps", 20))
    floor = cfg.get("lr_min_ratio", 0.1)
    return cfg["lr"] * warm * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def optimise(net, opt, loss_of, next_batch, lr_now, more):
    """The one training loop of every draft (train here, longrun.run for the long resumable runs): while
    more(), one step at learning rate lr_now() on next_batch(), gradients clipped to norm 1. Yields
    (seconds, lr, loss) after each step; the caller keeps its own step count, log and checkpoints."""
    params = [p for p in net.parameters() if p.requires_grad]
    net.train()
    while more():
        t0 = time.monotonic()
        lr = lr_now()
        for group in opt.param_groups:
            group["lr"] = lr
        loss = loss_of(net, next_batch())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        yield time.monotonic() - t0, lr, loss.item()


def resume(ckpt: Path, net, opt, gen: torch.Generator) -> dict | None:
    """Restore a checkpoint into net, opt and the RNGs; its training state, or None to start afresh.

    A damaged checkpoint (a torn write from before saves were atomic, a disk error, a file from other
    code) is reported and removed rather than half-loaded."""
    if not ckpt.exists():
        return None
    try:
        saved = torch.load(ckpt, weights_only=False, map_location=next(net.parameters()).device)
        shapes = lambda state: {k: tuple(v.shape) for k, v in state.items()}  # noqa: E731
        if shapes(saved["model"]) != shapes(trainable_state(net)) or not {"opt", "gen", "torch_rng", "state"} <= set(saved):
            raise ValueError("its contents do not match this draft")  # checked before anything is applied
        net.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        gen.set_state(saved["gen"])
        torch.set_rng_state(saved["torch_rng"])
        return saved["state"]
    except Exception as err:  # noqa: BLE001 - any failure means the file cannot be trusted
        warnings.warn(f"checkpoint {ckpt} is damaged ({type(err).__name__}: {err}); training starts over")
        ckpt.unlink(missing_ok=True)
        return None


def atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train(kind: str, target="smollm2-135m-instruct", tokenizer=None, budget_minutes: float | None = 5.0,
          max_steps: int | None = None, seed: int = 0, root=None, checkpoint_seconds: float = 30.0,
          stop_after: int | None = None, progress: bool = True, **overrides) -> Path | None:
    """Train a draft of `kind` for `target` and return its artifact directory.

    Stops at max_steps or after budget_minutes of training (whichever first). An existing complete
    artifact with the same config is returned as is; an interrupted one resumes from its checkpoint.
    stop_after (steps, not part of the config) simulates an interruption: it checkpoints and returns None.
    """
    check_kind(kind)
    if isinstance(target, str):
        target, tokenizer = load_model(target)
    if tokenizer is None:
        raise ValueError("pass the target's tokenizer (or give target as a model name)")
    cfg = make_config(kind, target_name(target), budget_minutes, max_steps, seed, **overrides)
    out = artifact_dir(cfg, root)
    if (out / MARKER).exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))

    data = training_data(target, tokenizer, cfg)
    keep = None
    if TABLE[kind].cuttable_head and cfg["head_vocab"]:
        keep = frequent_tokens(data, cfg["head_vocab"], special=sorted(set(tokenizer.all_special_ids)))
    device = draft_device(target)  # train where the target lives (a GPU); the data stays on the host
    net = build_net(kind, target, cfg, keep).to(device)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=cfg["lr"], weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    state = {"step": 0, "elapsed": 0.0, "losses": []}
    ckpt = out / "checkpoint.pt"
    state = resume(ckpt, net, opt, gen) or state

    def checkpoint():
        atomic_save({"model": trainable_state(net), "opt": opt.state_dict(), "gen": gen.get_state(),
                     "torch_rng": torch.get_rng_state(), "state": state}, ckpt)

    length = window_length(cfg)
    starts = window_starts(data, length)
    budget_s = cfg["budget_minutes"] * 60 if cfg["budget_minutes"] else math.inf
    total = cfg["max_steps"] or None

    def done():
        return bool(total and state["step"] >= total) or state["elapsed"] >= budget_s

    def more():
        return not done() and (stop_after is None or state["step"] < stop_after)

    def lr_now():
        return lr_at(cfg, state["step"], state["step"] / total if total else state["elapsed"] / budget_s)

    def next_batch():
        return {k: v.to(device, non_blocking=True) for k, v in get_batch(data, starts, cfg, length, gen).items()}

    bar = tqdm(total=total, initial=state["step"], desc=f"train {kind}", disable=not progress)
    last_ckpt = time.monotonic()
    for seconds, _, loss in optimise(net, opt, lambda net, batch: LOSSES[kind](net, batch, cfg), next_batch, lr_now,
                                     more):
        state["step"] += 1
        state["elapsed"] += seconds
        state["losses"].append(round(loss, 4))
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}")
        if time.monotonic() - last_ckpt > checkpoint_seconds:
            checkpoint()
            last_ckpt = time.monotonic()
    if not done():  # stopped by stop_after: an interruption, resumed from the checkpoint
        checkpoint()
        bar.close()
        return None
    bar.close()
    save_artifact(kind, net, cfg, state, out)
    ckpt.unlink(missing_ok=True)
    return out


def save_artifact(kind: str, net, cfg: dict, state: dict, out: Path) -> None:
    if TABLE[kind].hf_model:
        tmp = out / ".model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        net.save_pretrained(tmp)  # a plain HF model directory, usable without specrepro
        shutil.rmtree(out / "model", ignore_errors=True)
        os.replace(tmp, out / "model")
    else:
        save_file(trainable_state(net), str(out / "net.safetensors.tmp"))
        os.replace(out / "net.safetensors.tmp", out / "net.safetensors")
    losses = state["losses"]
    meta = {"steps": state["step"], "train_seconds": round(state["elapsed"], 1),
            "final_loss": sum(losses[-20:]) / max(len(losses[-20:]), 1), "first_loss": losses[0] if losses else None,
            "threads": torch.get_num_threads(), "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (out / f"{MARKER}.tmp").write_text(json.dumps(meta, indent=1))
    os.replace(out / f"{MARKER}.tmp", out / MARKER)  # last, and atomic: the artifact is complete
