"""Target-written continuations from batched native passes: many independent sequences share one KV cache.

`generate_batched` does what shards.generate_with_pass does with HF `generate` (prompts continued by the target,
with every position's top-k next-token probabilities, residual mass and last hidden state), through the lean
runner's native CPU pass (`LeanRunner(..., backend="native")`), B sequences a pass.

Layout: the sequences live interleaved in one cache; `owner[slot]` says which sequence wrote a slot (-1: none, or a
finished one). A pass's rows are the next token of every decoding sequence plus chunks of newly admitted prompts
(chunked prefill, up to `max_rows` rows a pass); row i sees exactly the slots its own sequence owns, up to and
including its own (`visible`), at RoPE position = its index in its own sequence. The native pass gathers only the
visible keys, in slot order, and is batch-invariant (a token's logits are the same bits whatever else shares the
pass and whichever pass wrote the cache entries it reads: engines/native.py), so a sequence's tokens, probabilities
and hidden states are bit for bit those it gets alone; tests/training/test_nativegen.py checks it.

Sampling: greedy (argmax, first index on ties) or T = 1 from the full softmax (algorithm.sampling.sample) with one
torch.Generator per sequence, seeded from (seed, the sequence's index): a sequence's sample does not depend on B or
on which other sequences share its passes, so shards are the same for any B (B is not part of the shard key).

A sequence ends at EOS or after `new_tokens` tokens; its last token is never fed (it has no hidden state; its
probability is in the row before it). Finished sequences leave the passes and the next prompt is admitted
(continuous batching). A prompt is admitted only when the slots every live sequence may still need fit the
runner's capacity (at most the model's context window); when the next pass would not fit, the cache is compacted
to the live sequences' slots (LeanRunner.compact moves them down; the mask follows `owner`).

Measured 2026-12-06/07 (2-core AMD EPYC with AVX512-BF16, SmolLM2-135M-Instruct, 2 threads, the first 8 news and 8
code prompts of shards 0 and 1, 2946 prompt tokens, 128 new tokens greedy, 1507 of them written before EOS or the
budget; the machine is shared with other work (load averages 2.1-3.0 during these runs), so medians of interleaved
runs, slow outliers being bursts of other work): target-written tokens/s B = 1 97 (5 runs, 91-104), B = 8 212
(5 runs: 33, 151, 212-219), B = 16 234 (5 runs: 101, 232-245), B = 32 242 (3 runs, 238-251; the same passes as B = 16 with these 16 prompts); shards.generate_with_pass
(HF generate, float32, 8 prompts a call) 9.0 in one run (168 s). Every B gave the same bits. About 1.35 ms a fed
row at B >= 16, prompt rows included: the pass is compute-bound there, and the 2946 prompt rows cost about as
much as the 1507 written ones; longer continuations raise the written share. With other processes on the cores
2 threads fell to 29-44 tokens/s (own CPU time 3-5x the work's: the pass's barriers wait for a descheduled thread)
while 1 thread kept 103-141 (2026-12-07, 4 + 4 interleaved runs): shards.py's `gen_threads`. OMP_WAIT_POLICY=PASSIVE
in the environment before torch starts (OpenMP threads sleep at a barrier instead of spinning) kept 2 threads at
128 tokens/s beside another process and 210-222 alone (one or two runs each): an environment setting, not this
module's. Whole 32-prompt shards (prompt_variety 1, B = 16, 2 threads, quiet runs): a news T = 1 shard 139
tokens/s (summaries stop early at EOS: 2056 written of 10672 positions), code 349-364 (4094 of 7928); news and
code together ~270 tokens/s, about 1M target-written tokens an hour.
"""
from __future__ import annotations

import hashlib
import os
import time
from collections import deque

import torch
from tqdm.auto import tqdm

from ..algorithm.sampling import sample
from ..engines.lean import LeanRunner
from ..engines.native import MAX_ROWS

DEFAULT_CAPACITY = 8192


def make_runner(model, capacity: int | None = None, taps=None) -> LeanRunner:
    """A bfloat16 native LeanRunner keeping hidden states, its cache for `capacity` slots (default the model's
    context window, at most DEFAULT_CAPACITY). taps=(i, j) sets the runner's `hidden_taps`: its hidden state then
    holds the residual stream after those layers before the final hidden state (generate_batched stores them as
    "taps"); a runner without hidden_taps is refused with a ValueError."""
    window = getattr(model.config, "max_position_embeddings", None) or DEFAULT_CAPACITY
    capacity = min(capacity or DEFAULT_CAPACITY, window)
    runner = LeanRunner(model, dtype=torch.bfloat16, backend="native", keep_hidden=True, capacity=capacity)
    if taps:
        if not hasattr(runner, "hidden_taps"):
            raise ValueError(f"taps {tuple(taps)} asked for, but this LeanRunner has no hidden_taps")
        runner.hidden_taps = tuple(taps)
    return runner


def visible(owner: torch.Tensor, row_seq: torch.Tensor, length: int) -> torch.Tensor:
    """[n, length + n] bool: row i sees the slots its own sequence wrote, the pass's new ones up to its own.

    owner: [length + n] sequence per slot (-1 for none), the pass's rows already written at length..; row_seq: [n]
    the rows' sequences (>= 0), each sequence's rows in order."""
    n = len(row_seq)
    mask = owner.view(1, -1) == row_seq.view(-1, 1)
    mask[:, length:] &= torch.ones(n, n, dtype=torch.bool).tril()
    return mask


def sequence_seed(seed: int, index: int) -> int:
    """The seed of sequence `index`'s generator under run seed `seed` (63 bits of a hash: no two pairs collide
    the way seed + index would)."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{index}".encode()).digest()[:8], "little") >> 1


def cpu_seconds() -> dict | None:
    """This machine's CPU time so far by kind, from /proc/stat (None elsewhere): "steal" is time the hypervisor gave
    this machine's virtual CPUs to someone else, "busy" all non-idle time; differences over a run say how shared
    the machine was."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return {"steal": (ticks[7] if len(ticks) > 7 else 0) / hz, "busy": (sum(ticks[:8]) - idle) / hz}


def _check(prompts, new_tokens, batch, top_k, max_rows):
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id sequences")
    if any(len(p) < 1 for p in prompts):
        raise ValueError(f"every prompt needs at least one token; prompt {[len(p) for p in prompts].index(0)} is empty")
    for name, value in (("new_tokens", new_tokens), ("batch", batch), ("top_k", top_k), ("max_rows", max_rows)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@torch.inference_mode()
def generate_batched(runner, prompts, new_tokens: int, sampled: bool, seed: int = 0, top_k: int = 32,
                     eos_token_id: int | None = None, batch: int = 16, max_rows: int = MAX_ROWS,
                     stats: dict | None = None, progress: bool = False) -> dict:
    """The prompts (token-id lists or 1-D tensors) continued by `runner`'s target, `batch` sequences a pass.

    Returns generate_with_pass's dict: per kept sequence (prompt + continuation up to and including its first EOS,
    less the last generated token; sequences whose continuation has fewer than 2 tokens are dropped, as there)
    `tokens`, `starts` (cumulative boundaries from 0), `top_ids` int32 / `top_p` float32 [N, top_k], `rest`, `hidden`
    float16 [N, H] (the runner's bfloat16 final-norm hidden state), `gen_mask` (positions whose next token the
    target wrote), and `taps` bfloat16 [N, T, H] where the runner has hidden_taps (make_runner's taps). `stats`,
    if a dict, receives counts and seconds (target-written tokens, passes, rows, ...).
    """
    _check(prompts, new_tokens, batch, top_k, max_rows)
    prompts = [torch.as_tensor(p, dtype=torch.long).view(-1) for p in prompts]
    capacity = min(runner.capacity, runner.context_window or runner.capacity)
    need = [len(p) + new_tokens - 1 for p in prompts]  # slots a sequence may fill (its last token is never fed)
    too_long = [i for i, k in enumerate(need) if k > capacity]
    if too_long:
        raise ValueError(f"prompt {too_long[0]} needs {need[too_long[0]]} cache slots ({len(prompts[too_long[0]])} "
                         f"prompt + {new_tokens} new tokens - 1), more than the runner's {capacity}")
    rows_per_pass = max(max_rows, batch)
    tapped, width = len(getattr(runner, "hidden_taps", ()) or ()), runner.hidden_size
    started = time.perf_counter()
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    cpu_before, own_before = cpu_seconds(), time.process_time()

    runner.reset()
    owner = torch.full((capacity,), -1, dtype=torch.long)
    queue = deque(range(len(prompts)))
    live: list[int] = []  # admission order
    pending: dict[int, list[int]] = {}  # tokens each live sequence has still to feed
    fed = [0] * len(prompts)  # next position of each sequence
    written: list[list[int]] = [[] for _ in prompts]  # the target's tokens
    gens: dict[int, torch.Generator] = {}
    reserved = 0
    parts: dict[str, list] = {"seq": [], "pos": [], "top_ids": [], "top_p": [], "rest": [], "hidden": [], "taps": []}
    passes = rows_fed = compactions = 0
    forward_seconds = 0.0
    bar = tqdm(total=len(prompts), desc="sequences", leave=False, disable=not progress)
    while queue or live:
        while queue and len(live) < batch and reserved + need[queue[0]] <= capacity:
            s = queue.popleft()
            live.append(s)
            pending[s] = prompts[s].tolist()
            reserved += need[s]
            if sampled:
                gens[s] = torch.Generator().manual_seed(sequence_seed(seed, s))
        # rows: every decoding sequence's one token first, then prompt chunks in admission order
        decoding = [s for s in live if fed[s] >= len(prompts[s])]
        budget = rows_per_pass - len(decoding)
        take: list[tuple[int, int]] = [(s, 1) for s in decoding]
        for s in live:
            if fed[s] < len(prompts[s]) and budget > 0:
                k = min(budget, len(pending[s]))
                take.append((s, k))
                budget -= k
        row_seq = torch.tensor([s for s, k in take for _ in range(k)])
        row_pos = torch.tensor([fed[s] + j for s, k in take for j in range(k)])
        ids = torch.tensor([t for s, k in take for t in pending[s][:k]])
        n = len(ids)
        if runner.length + n > capacity:  # drop finished sequences' slots
            keep = (owner[: runner.length] >= 0).nonzero().flatten()
            runner.compact(keep)
            owner[: len(keep)] = owner[keep].clone()
            owner[len(keep):] = -1
            compactions += 1
        length = runner.length
        owner[length:length + n] = row_seq
        mask = visible(owner[: length + n], row_seq, length)
        t0 = time.perf_counter()
        logits = runner.forward_tree(ids, row_pos, mask)
        forward_seconds += time.perf_counter() - t0
        passes += 1
        rows_fed += n
        probs = logits.softmax(-1)
        top_p, top_ids = probs.topk(top_k, dim=-1)
        parts["seq"].append(row_seq)
        parts["pos"].append(row_pos)
        parts["top_ids"].append(top_ids.int())
        parts["top_p"].append(top_p)
        parts["rest"].append((1 - top_p.sum(-1)).clamp_min(0))
        hidden = runner.hidden  # [n, (T + 1) H] with T hidden_taps: the tapped layers' outputs, then the final one
        if tapped:
            # bfloat16, the runner's own dtype (lossless): the residual stream reaches float16's limit (|x| up to
            # ~29,000 after layer 15 of SmolLM2-135M, float16 overflows at 65,504)
            parts["taps"].append(hidden[:, : tapped * width].reshape(n, tapped, width).clone())
        parts["hidden"].append(hidden[:, tapped * width:].half())
        row = 0
        for s, k in take:
            del pending[s][:k]
            fed[s] += k
            row += k
            if pending[s]:
                continue  # a prompt not yet fed whole
            last = row - 1  # the row of s's last fed token: its next token comes from here
            tok = int(sample(probs[last:last + 1], gens[s])[0]) if sampled else int(logits[last].argmax())
            written[s].append(tok)
            if tok == eos_token_id or len(written[s]) == new_tokens:
                live.remove(s)
                del pending[s]
                gens.pop(s, None)
                owner[owner == s] = -1  # its slots are never visible again and go at the next compaction
                reserved -= need[s]
                bar.update(1)
            else:
                pending[s] = [tok]
    bar.close()

    data = _assemble(prompts, written, parts, top_k, runner.hidden_size)
    if stats is not None:
        seconds = time.perf_counter() - started
        generated = sum(len(w) for w in written)
        cpu_after = cpu_seconds()
        shared = None if cpu_before is None or cpu_after is None else {
            k: round(cpu_after[k] - cpu_before[k], 2) for k in ("steal", "busy")}
        stats.update({"generator": "native", "batch": batch, "threads": torch.get_num_threads(), "seconds": seconds,
                      "forward_seconds": forward_seconds, "target_written_tokens": generated, "tokens_per_second": generated / seconds,
                      "gen_mask_positions": int(data["gen_mask"].sum()), "positions": len(data["tokens"]),
                      "sequences": len(prompts), "passes": passes, "rows": rows_fed, "compactions": compactions,
                      "capacity": capacity, "loadavg_before": load_before,
                      "loadavg_after": os.getloadavg() if hasattr(os, "getloadavg") else None,
                      "machine_cpu_seconds": shared, "own_cpu_seconds": round(time.process_time() - own_before, 2),
                      "note": "shared machine: the load averages and machine_cpu_seconds (all processes' busy and "
                              "stolen time) beside own_cpu_seconds say what else ran"})
    return data


def _assemble(prompts, written, parts, top_k: int, hidden_size: int) -> dict:
    """Per-pass rows -> generate_with_pass's per-sequence layout (sequence order, then position)."""
    seq, pos = torch.cat(parts["seq"]), torch.cat(parts["pos"])
    order = torch.argsort(seq * (int(pos.max()) + 1) + pos)
    seq, pos = seq[order], pos[order]
    cols = {k: torch.cat(parts[k])[order] for k in ("top_ids", "top_p", "rest", "hidden")}
    if parts["taps"]:
        cols["taps"] = torch.cat(parts["taps"])[order]
    kept = [s for s in range(len(prompts)) if len(written[s]) >= 2]  # as generate_with_pass: a token written and read
    rows = torch.isin(seq, torch.tensor(kept, dtype=torch.long))
    tokens, lengths, plens = [], [0], []
    for s in kept:
        tokens.append(torch.cat([prompts[s], torch.tensor(written[s][:-1], dtype=torch.long)]))
        lengths.append(len(tokens[-1]))
        plens.append(len(prompts[s]))
    starts = torch.tensor(lengths).cumsum(0)
    mask = torch.zeros(int(starts[-1]), dtype=torch.bool)
    for s0, e, plen in zip(starts[:-1].tolist(), starts[1:].tolist(), plens):
        mask[s0 + plen - 1 : e] = True  # positions whose next token the target wrote
    out = {"tokens": torch.cat(tokens) if tokens else torch.zeros(0, dtype=torch.long), "starts": starts}
    out.update({k: v[rows] for k, v in cols.items()})
    out["gen_mask"] = mask
    assert len(out["top_p"]) == len(out["tokens"]), "a fed row is missing or doubled"
    return out
