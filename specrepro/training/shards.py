"""More target-written distillation data, built in shards so a long build resumes where it stopped.

Shard i holds `shard_size` prompts continued BY THE TARGET in one batched generate call (the target
continuing many prompts at once costs far less per token than one at a time), with the target pass of
distill.py (top-k next-token probabilities and last hidden states) read off that same generate call.
Prompts: news TRAIN articles as summarisation requests (round r starts each article at its (3r)-th
sentence, so later rounds show other parts of it) and stdlib code prefixes (round r drawn with seed
r + 1). HumanEval and the held-out news
articles are never read. Shards alternate news and code, and greedy and sampled in pairs (news greedy,
code greedy, news sampled, code sampled, ...). Each shard file is written atomically, so a killed build loses at most one shard.
"""
from __future__ import annotations

import hashlib
import os
import random
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .corpus import code_prefixes, news_prompt, news_texts
from .distill import merge


def _news_variant(article: str, r: int) -> str:
    sentences = article.split(". ")
    start = min(3 * r, max(len(sentences) - 4, 0))
    return ". ".join(sentences[start:])


def news_round(tokenizer, r: int) -> list[str]:
    news = [news_prompt(tokenizer, _news_variant(a, r)) for a in news_texts("train")]
    random.Random(r).shuffle(news)
    return news


def shard_prompts(tokenizer, index: int, shard_size: int, code_per_round: int = 200) -> list[str]:
    """Even shards are news requests, odd shards code prefixes (one kind per shard, so left-padding
    wastes little and a build cut short still has both). Each kind is an endless stream of rounds:
    round r of news has every train article (from its (3r)-th sentence on), round r of code has
    `code_per_round` stdlib prefixes drawn with seed r + 1."""
    j = index // 2
    pool: list[str] = []
    r = 0
    while len(pool) < (j + 1) * shard_size:
        pool += news_round(tokenizer, r) if index % 2 == 0 else code_prefixes(tokenizer, code_per_round, seed=r + 1)
        r += 1
    return pool[j * shard_size : (j + 1) * shard_size]


@torch.inference_mode()
def generate_with_pass(model, tokenizer, prompts: list[str], new_tokens: int, sampled: bool, seed: int,
                       top_k: int = 32) -> dict:
    """All prompts continued in one left-padded generate call, with the target pass of distill.py taken
    from that same call: a hook on the final norm keeps every position's last hidden state (prompt
    positions from the prefill, then one per decoding step), so nothing is recomputed. Per sequence:
    prompt + continuation up to and including its first EOS, less the last generated token (which the
    target never read, so it has no hidden state; its probability is still in the row before it).
    """
    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    captured: list[torch.Tensor] = []
    norm = model.get_decoder().norm
    hook = norm.register_forward_hook(lambda _m, _i, out: captured.append(out.detach()))
    try:
        gen = model.generate(**enc, max_new_tokens=new_tokens, do_sample=sampled,
                             temperature=1.0 if sampled else None, top_k=0 if sampled else None,
                             top_p=1.0 if sampled else None, pad_token_id=pad)
    finally:
        hook.remove()
    width = enc["input_ids"].shape[1]
    hidden = torch.cat(captured, dim=1)  # [B, width + steps - 1, H]: every fed position
    head = model.get_output_embeddings()
    tokens, top_ids, top_p, rest, hid, lengths, plens = [], [], [], [], [], [0], []
    for row, mask, h in zip(gen, enc["attention_mask"], hidden):
        keep = mask.bool()
        prompt, cont = row[:width][keep], row[width:]
        eos = (cont == tokenizer.eos_token_id).nonzero()
        if eos.numel():  # padding after the first EOS is not target text
            cont = cont[: int(eos[0]) + 1]
        if len(cont) < 2:
            continue  # nothing the target wrote and read back
        seq = torch.cat([prompt, cont[:-1]])
        hs = torch.cat([h[:width][keep], h[width : width + len(cont) - 1]])
        probs = head(hs).float().softmax(-1)
        p, ids = probs.topk(top_k, dim=-1)
        tokens.append(seq)
        top_ids.append(ids.int())
        top_p.append(p)
        rest.append((1 - p.sum(-1)).clamp_min(0))
        hid.append(hs.half())
        lengths.append(len(seq))
        plens.append(len(prompt))
    starts = torch.tensor(lengths).cumsum(0)
    mask = torch.zeros(int(starts[-1]), dtype=torch.bool)
    for s, e, plen in zip(starts[:-1].tolist(), starts[1:].tolist(), plens):
        mask[s + plen - 1 : e] = True  # positions whose next token the target wrote
    return {"tokens": torch.cat(tokens), "starts": starts, "top_ids": torch.cat(top_ids),
            "top_p": torch.cat(top_p), "rest": torch.cat(rest), "hidden": torch.cat(hid), "gen_mask": mask}


def shard_key(cfg: dict) -> str:
    key = {k: cfg[k] for k in ("target", "shard_size", "shard_new_tokens", "top_k", "code_per_round")}
    return hashlib.sha256(repr(sorted(key.items()) + [("format", 3)]).encode()).hexdigest()[:10]


def build_shard(model, tokenizer, index: int, cfg: dict) -> dict:
    prompts = shard_prompts(tokenizer, index, cfg["shard_size"], cfg["code_per_round"])
    return generate_with_pass(model, tokenizer, prompts, cfg["shard_new_tokens"], sampled=(index // 2) % 2 == 1,
                              seed=1000 + index, top_k=cfg["top_k"])


def build_shards(model, tokenizer, cfg: dict, root: Path, deadline: float | None = None,
                 progress: bool = True) -> list[Path]:
    """Build shards 0..cfg["shards"]-1 under root/<shard_key>/ (skipping finished ones); stop early
    once time.time() passes `deadline`. Returns the finished shard files, in order, from shard 0 on."""
    folder = Path(root) / f"shards-{shard_key(cfg)}"
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"shard-{i:04d}.pt" for i in range(cfg["shards"])]
    bar = tqdm(total=len(paths), initial=sum(p.exists() for p in paths), desc="target-written shards",
               disable=not progress)
    for i, path in enumerate(paths):
        if path.exists():
            continue
        if deadline is not None and time.time() > deadline:
            break
        data = build_shard(model, tokenizer, i, cfg)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        torch.save(data, tmp)
        os.replace(tmp, path)
        bar.update(1)
    bar.close()
    done = []
    for path in paths:  # only a gap-free prefix, so the shard count alone names the data
        if not path.exists():
            break
        done.append(path)
    return done


def load_shards(paths: list[Path]) -> dict:
    return merge([torch.load(p, weights_only=True) for p in paths])
