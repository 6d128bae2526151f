"""Long, resumable training of a shipped draft: more target-written data, a warm-up + cosine schedule.

specrepro-drafts longrun --config artifacts/drafts/feature/config.json [--export DIR]
    [--work DIR] [--stop-at HH:MM] [--data-minutes M] [--threads 1]

1. the "text" target pass (distill.py, cached) plus `shards` shards of target-written continuations
   (shards.py; built first, resumably; --data-minutes caps the build and the run then trains on the
   finished shards, recording how many in the exported config, so a retrain reads the same data);
2. training with linear warm-up over `warmup_steps` and cosine decay to `lr_min_ratio` * lr over
   `budget_minutes` of training time. Training time is the sum of step times, each capped at ten times
   the running median, so a process paused with SIGSTOP does not lose its schedule;
3. the work folder (default $SPECREPRO_HOME/drafts/long/<kind>-<hash>) holds checkpoint.pt (weights,
   AdamW moments, RNGs, schedule state; replaced atomically every `checkpoint_seconds`) and log.csv:
   rerunning the same command continues exactly where it stopped;
4. every `export_minutes` and at the end the artifact is exported (--export, default the cache
   artifact root that sr.drafts.load searches first): config.json, net.safetensors (float32, or the
   config's export_dtype; a tied LM head is stored once, as the embedding),
   manifest.json (data sources, counts, hashes), train_log.csv, resume.json, complete.json.
--stop-at stops (checkpoint + export) at a wall-clock time before the budget is spent.
--continue-from DIR starts from an exported artifact's weights instead of a random init (AdamW's moments
are not shipped; they re-estimate during the new warm-up).
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from .distill import DATA_DEFAULTS, distill_data, merge
from .losses import LOSSES, frequent_tokens
from .shards import build_shards, load_shards
from .trainer import (atomic_save, build_net, get_batch, lr_at, optimise, trainable_state, window_length,
                      window_starts)
from ..drafts.artifacts import MARKER, VERSION, config_hash, load_weights, tied_head
from ..drafts.kinds import check_kind
from ..files import file_sha256
from ..models import load_model, specrepro_home

# the kinds whose nets this driver exports (safetensors); seqkd is the small draft's shape trained on the shards'
# target-written positions only (its config sets written_only)
LONG_KINDS = ("small", "seqkd", "feature", "heads")
LONG_DEFAULTS = {"shards": 40, "shard_size": 32, "shard_new_tokens": 128, "code_per_round": 200,
                 "warmup_steps": 100, "lr_min_ratio": 0.05, "checkpoint_seconds": 120, "export_minutes": 10}


def load_config(path) -> dict:
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read draft config {path}: {err}") from None
    check_kind(cfg.get("kind"), LONG_KINDS)
    missing = {"kind", "target", "seed", "budget_minutes", "lr", "batch", "window"} | set(DATA_DEFAULTS) \
        | set(LONG_DEFAULTS)
    missing -= set(cfg)
    if missing:
        raise ValueError(f"draft config {path} lacks {sorted(missing)}")
    if not isinstance(cfg["budget_minutes"], (int, float)) or cfg["budget_minutes"] <= 0:
        raise ValueError(f"budget_minutes must be a positive number, got {cfg['budget_minutes']!r}")
    return cfg


def run_hash(cfg: dict) -> str:
    """Names the work folder: everything but the settings that do not change what is learnt."""
    skip = {"checkpoint_seconds", "export_minutes", "measured"}
    return config_hash({k: v for k, v in cfg.items() if k not in skip})


def tensor_sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16]


def build_data(target, tokenizer, cfg: dict, work_root: Path, data_deadline: float | None, progress: bool):
    # text_data false: the target-written shards alone (a written_only draft learns nothing from the text pass,
    # which holds no tapped layers for a fused one)
    text = distill_data(target, tokenizer, "text", cfg) if cfg.get("text_data", True) else None
    paths = build_shards(target, tokenizer, cfg, work_root / "data", data_deadline, progress)
    if cfg.get("written_only") and paths:  # prompt positions no labelled window reaches are never read
        shard_data = merge([trim_prompts(torch.load(p, weights_only=True), window_length(cfg)) for p in paths])
    else:
        shard_data = load_shards(paths) if paths else None
    parts = ([text] if text is not None else []) + ([shard_data] if shard_data is not None else [])
    if not parts:
        raise ValueError("no training data: text_data is false and no shard was built (raise --data-minutes)")
    data = merge(parts) if len(parts) > 1 else parts[0]
    gen_positions = int(sum(torch.load(p, weights_only=True)["gen_mask"].sum() for p in paths)) if paths else 0
    manifest = {
        "text": {"source": "news train articles and CPython stdlib modules, as written (distill.py)",
                 "news_tokens": cfg["news_tokens"], "code_tokens": cfg["code_tokens"],
                 "positions": len(text["tokens"]), "tokens_sha256": tensor_sha(text["tokens"])} if text is not None
                else {"source": "none (text_data false)", "positions": 0},
        "shards": {"source": "news train summarisation requests and stdlib code prefixes continued by the "
                             + ("target in batched native passes (nativegen.py)" if cfg.get("generator") == "native"
                                else f"target, {cfg['shard_size']} per batched generate call")
                             + "; shards alternate news and code, and greedy and T=1 in pairs (shards.py)",
                   "count": len(paths), "prompts": len(paths) * cfg["shard_size"],
                   "positions": len(data["tokens"]) - (len(text["tokens"]) if text is not None else 0),
                   "target_written": gen_positions,
                   "files_sha256": [file_sha256(p)[:16] for p in paths]},
        "total_positions": len(data["tokens"]),
        "never_read": "HumanEval, news eval split",
    }
    if cfg["kind"] in ("small", "seqkd"):  # token models read neither hidden states nor taps
        data.pop("hidden", None)
        data.pop("taps", None)
    if not cfg.get("written_only"):
        data["gen_mask"] = torch.ones_like(data["gen_mask"])  # feature/heads learn every position
    return data, len(paths), manifest


def trim_prompts(data: dict, length: int) -> dict:
    """Each sequence from `length` - 1 positions before its first target-written label on: a training window of
    `length` positions with a label (trainer.window_starts) never starts earlier, so nothing dropped is ever read,
    and a long prompt's hidden states and taps (the bulk of a shard) need not sit in memory."""
    bounds = data["starts"].tolist()
    keep, starts = [], [0]
    for s, e in zip(bounds[:-1], bounds[1:]):
        labelled = data["gen_mask"][s:e].nonzero()
        first = s + int(labelled[0]) if len(labelled) else e
        lo = max(s, first - (length - 1))
        keep.append(torch.arange(lo, e))
        starts.append(starts[-1] + e - lo)
    index = torch.cat(keep) if keep else torch.empty(0, dtype=torch.long)
    out = {k: v[index] for k, v in data.items() if k != "starts"}
    if "taps" in out:  # one dtype for every shard (shards built before taps were stored in bfloat16 hold float16)
        out["taps"] = out["taps"].to(torch.bfloat16)
    out["starts"] = torch.tensor(starts)
    return out


def export_state(net, cfg: dict) -> dict:
    """The weights to ship: floating point ones in cfg's export_dtype (default float32; the small draft's
    49152 x 128 embedding ships in bfloat16 to halve it), a tied LM head once (as the embedding)."""
    dtype = getattr(torch, cfg.get("export_dtype", "float32"))
    tied = tied_head(net)
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in trainable_state(net).items() if k not in tied}


def export(net, cfg: dict, state: dict, manifest: dict, log_path: Path, out: Path) -> None:
    """Write the artifact folder atomically enough: complete.json last, after everything it vouches for."""
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).unlink(missing_ok=True)
    weights = out / "net.safetensors"
    save_file(export_state(net, cfg), str(weights) + ".tmp")
    os.replace(str(weights) + ".tmp", weights)
    (out / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    if log_path.exists():
        shutil.copyfile(log_path, out / "train_log.csv")
    resume = {k: state[k] for k in ("step", "train_seconds", "wall_seconds")}
    (out / "resume.json").write_text(json.dumps(resume, indent=1))
    recent = state["recent_losses"]
    meta = {"steps": state["step"], "train_seconds": round(state["train_seconds"], 1),
            "final_loss": round(sum(recent) / max(len(recent), 1), 4), "threads": torch.get_num_threads(),
            "weights_sha256": file_sha256(weights), "finished": state.get("finished", False),
            "exported": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    (out / f"{MARKER}.tmp").write_text(json.dumps(meta, indent=1))
    os.replace(out / f"{MARKER}.tmp", out / MARKER)


def run(cfg: dict, export_dir=None, work=None, stop_at: float | None = None, data_minutes: float | None = None,
        continue_from=None, progress: bool = True, target=None, tokenizer=None,
        stop_after_steps: int | None = None) -> Path:
    """Train (or continue) the draft described by cfg; returns the export folder.

    target/tokenizer: the loaded cfg["target"] (loaded here if not given). stop_after_steps (not part of
    the config) checkpoints, exports and returns after that many steps in all, like --stop-at."""
    kind = cfg["kind"]
    check_kind(kind, LONG_KINDS)
    cfg = {"version": VERSION, **cfg}
    if target is None or tokenizer is None:
        target, tokenizer = load_model(cfg["target"])
    home = specrepro_home() / "drafts"
    work_root = Path(work) if work is not None else home / "long"
    data_deadline = time.time() + data_minutes * 60 if data_minutes is not None else None
    data, n_shards, manifest = build_data(target, tokenizer, cfg, work_root, data_deadline, progress)
    cfg["shards"] = n_shards  # what was actually read (a capped build may have finished fewer)
    if continue_from is not None:
        cfg["continued_from"] = json.loads((Path(continue_from) / MARKER).read_text())["weights_sha256"]
    folder = work_root / f"{kind}-{run_hash(cfg)}"
    folder.mkdir(parents=True, exist_ok=True)
    export_dir = Path(export_dir) if export_dir is not None else home / f"{kind}-{config_hash(cfg)}"
    ckpt, log_path = folder / "checkpoint.pt", folder / "log.csv"

    saved = torch.load(ckpt, weights_only=False) if ckpt.exists() else None
    keep = None  # the feature and heads drafts' output vocabulary (the small draft has the full one)
    if kind not in ("small", "seqkd"):
        if saved is not None:
            keep = saved["model"]["keep"]
        elif continue_from is not None and cfg.get("keep_from") != "data":
            keep = load_file(str(Path(continue_from) / "net.safetensors"))["keep"]
        else:  # the head is the target's, frozen: any kept set fits the weights, so it may come from the data
            keep = frequent_tokens(data, cfg["head_vocab"], special=sorted(set(tokenizer.all_special_ids)))
    net = build_net(kind, target, cfg, keep if keep is not None and keep.numel() else None)
    if continue_from is not None and saved is None:
        # a fused draft may continue from an unfused one: its `fuse` starts as the pass-through of h
        weights = load_file(str(Path(continue_from) / "net.safetensors"))
        if keep is not None and "keep" in weights and not torch.equal(weights["keep"], keep):
            weights.pop("keep")  # keep_from data: the frozen head's rows come from this run's data instead
        load_weights(net, weights, new=("fuse.weight", "keep"))
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=cfg["lr"], weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg["seed"])
    torch.manual_seed(cfg["seed"])
    state = {"step": 0, "train_seconds": 0.0, "wall_seconds": 0.0, "recent_losses": [], "step_times": []}
    if saved is not None:
        net.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        gen.set_state(saved["gen"])
        torch.set_rng_state(saved["torch_rng"])
        state = saved["state"]

    def checkpoint():
        atomic_save({"model": trainable_state(net), "opt": opt.state_dict(), "gen": gen.get_state(),
                     "torch_rng": torch.get_rng_state(), "state": state}, ckpt)

    length = window_length(cfg)
    starts = window_starts(data, length)
    budget_s = cfg["budget_minutes"] * 60
    max_steps = cfg.get("max_steps")  # if set, the schedule runs over steps instead of training time

    def progress_now():
        return state["step"] / max_steps if max_steps else state["train_seconds"] / budget_s

    def more():
        if progress_now() >= 1 or (stop_at is not None and time.time() >= stop_at):
            return False
        return stop_after_steps is None or state["step"] < stop_after_steps
    new_log = not log_path.exists()
    log = open(log_path, "a", newline="")
    writer = csv.writer(log)
    if new_log:
        writer.writerow(["step", "train_seconds", "lr", "loss"])
    bar = tqdm(total=None, initial=state["step"], desc=f"train {kind}", disable=not progress)
    last_ckpt = last_export = time.monotonic()
    steps = optimise(net, opt, lambda net, batch: LOSSES[kind](net, batch, cfg),
                     lambda: get_batch(data, starts, cfg, length, gen), lambda: lr_at(cfg, state["step"], progress_now()),
                     more)
    for dt, lr, loss in steps:
        times = state["step_times"]
        if len(times) >= 20:  # a step paused by SIGSTOP (or starved) counts as a typical step
            dt = min(dt, 10 * statistics.median(times))
        times.append(dt)
        del times[:-200]
        state["step"] += 1
        state["train_seconds"] += dt
        state["recent_losses"] = (state["recent_losses"] + [loss])[-50:]
        writer.writerow([state["step"], round(state["train_seconds"], 2), f"{lr:.3e}", f"{loss:.4f}"])
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.1e}")
        now = time.monotonic()
        if now - last_ckpt > cfg["checkpoint_seconds"]:
            log.flush()
            state["wall_seconds"] += now - last_ckpt
            checkpoint()
            last_ckpt = now
        if now - last_export > cfg["export_minutes"] * 60:
            export(net, cfg, state, manifest, log_path, export_dir)
            last_export = now
    bar.close()
    log.close()
    state["finished"] = progress_now() >= 1
    checkpoint()
    export(net, cfg, state, manifest, log_path, export_dir)
    return export_dir


def parse_stop_at(text: str | None) -> float | None:
    """HH:MM (UTC, today; tomorrow if already past) -> epoch seconds."""
    if text is None:
        return None
    try:
        hh, mm = (int(x) for x in text.split(":"))
        now = datetime.now(timezone.utc)
        when = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    except ValueError:
        raise ValueError(f"--stop-at wants HH:MM in UTC, got {text!r}") from None
    stamp = when.timestamp()
    return stamp if stamp > now.timestamp() else stamp + 86400


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="specrepro-drafts longrun", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a config.json (e.g. artifacts/drafts/feature/config.json)")
    parser.add_argument("--export", default=None, help="artifact folder to write (default: the cache)")
    parser.add_argument("--work", default=None, help="data shards and checkpoints (default: $SPECREPRO_HOME/drafts/long)")
    parser.add_argument("--stop-at", default=None, help="HH:MM UTC: checkpoint, export and stop then")
    parser.add_argument("--data-minutes", type=float, default=None, help="cap on the shard build")
    parser.add_argument("--budget-minutes", type=float, default=None, help="override the config's budget")
    parser.add_argument("--continue-from", default=None, help="an exported artifact folder to start from")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
        stop_at = parse_stop_at(args.stop_at)
    except ValueError as err:
        parser.error(str(err))
    if args.budget_minutes is not None:
        if args.budget_minutes <= 0:
            parser.error(f"--budget-minutes must be positive, got {args.budget_minutes}")
        cfg["budget_minutes"] = args.budget_minutes
    cfg.pop("version", None)
    torch.set_num_threads(args.threads)
    print(run(cfg, args.export, args.work, stop_at, args.data_minutes, args.continue_from))
    return 0


if __name__ == "__main__":
    sys.exit(main())
