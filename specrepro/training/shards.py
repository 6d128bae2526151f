"""More target-written distillation data, built in shards so a long build resumes where it stopped.

Shard i holds `shard_size` prompts continued BY THE TARGET in one batched generate call (the target
continuing many prompts at once costs far less per token than one at a time), with the target pass of
distill.py (top-k next-token probabilities and last hidden states) read off that same generate call.
Prompts: news TRAIN articles as summarisation requests (round r starts each article at its (3r)-th
sentence, so later rounds show other parts of it) and stdlib code prefixes (round r drawn with seed
r + 1). HumanEval and the held-out news
articles are never read. Shards alternate news and code, and greedy and sampled in pairs (news greedy,
code greedy, news sampled, code sampled, ...). Each shard file is written atomically, so a killed build loses at most one shard.

Config keys beyond the original ones (each enters shard_key only when set, so shards built before they existed
keep their folder):
- `generator`: "hf" (default: the left-padded `model.generate` call above) or "native" (nativegen.py: the
  native CPU pass, `gen_batch` sequences a pass in one shared cache, continuous batching; `gen_capacity`
  cache slots, default the context window up to 8192). On the 2-core AVX512-BF16 EPYC, 16 shard prompts
  (8 news, 8 code) x 128 new tokens, greedy, 2 threads: ~230 target-written tokens/s at B = 16 against 9 for
  generate_with_pass (float32, 8 a call): nativegen.py's docstring has the numbers. The native shards are the
  same for any `gen_batch` (batch-invariant pass, one sampler per sequence), so the batch is not in the key.
  Native hidden states are the runner's bfloat16 ones (stored float16 as before). `gen_threads` (default:
  torch's current setting) sets the threads for the build: on a crowded 2-core machine 2 threads fell to
  29-44 tokens/s where 1 thread kept 103-141 (the pass's OpenMP barriers wait for a descheduled thread); the
  native pass's numbers do not depend on it, so it is not in the key either.
- `prompt_variety` (default 0): 1 asks the news rounds for other requests built from the same train articles
  (`NEWS_REQUESTS`: a headline, the key facts, a plain-words explanation, questions and answers, a one-line
  summary), round r using request r % 6 on the article from its 3 * (r // 6)-th sentence, so a build of >= 1M
  tokens does not repeat greedy prompts once the articles' sentences run out. Longer continuations are
  `shard_new_tokens`.
- `samples_per_prompt` (default 1): k > 1 fills a sampled (T = 1) shard with its first ceil(shard_size / k)
  prompts, each k times in a row: k independent samples of each (the native generator seeds every sequence
  apart; HF generate draws each row anew), so a build needs k times fewer distinct prompts for those shards.
- `taps` (default none): layer indices (i, j) whose outputs (the residual stream after them) the native
  runner keeps (LeanRunner.hidden_taps); stored as "taps" bfloat16 [N, T, H] (the runner's values exactly; the
  residual stream can pass float16's range), what a fused-feature draft's
  loss reads (losses.py). Native generator only.
Beside each shard, shard-NNNN.json records how it was made: target-written tokens, seconds, tokens per hour,
B, threads and the load averages before and after (the machine is shared: they say what else ran).
"""
from __future__ import annotations

import hashlib
import os
import random
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..files import write_json
from ..tasks.prompts import as_chat, truncate_tokens
from .corpus import code_prefixes, news_prompt, news_texts
from .distill import merge

# the requests of prompt_variety 1, built from news TRAIN articles only; the first is the evaluation's own
NEWS_REQUESTS = (
    None,  # news_prompt: "Summarise the following news article in one sentence."
    "Write a short headline for the following news article.",
    "List the three most important facts in the following news article.",
    "Explain the following news article in plain words to a twelve-year-old.",
    "Write two questions a reader might ask about the following news article, and answer them.",
    "Summarise the following news article in three sentences.",
)


def _news_variant(article: str, r: int) -> str:
    sentences = article.split(". ")
    start = min(3 * r, max(len(sentences) - 4, 0))
    return ". ".join(sentences[start:])


def news_request(tokenizer, article: str, request: str | None, max_document_tokens: int = 300) -> str:
    """A chat-formatted request about a (train) article: news_prompt's summary request when request is None."""
    if request is None:
        return news_prompt(tokenizer, article, max_document_tokens)
    return as_chat(tokenizer, f"{request}\n\n{truncate_tokens(article, max_document_tokens, tokenizer)}")


def news_round(tokenizer, r: int, variety: int = 0) -> list[str]:
    """Round r of news prompts, every train article once. variety 0: the summary request on the article from its
    (3r)-th sentence; variety 1: request NEWS_REQUESTS[r % 6] on it from its 3 * (r // 6)-th sentence."""
    if variety not in (0, 1):
        raise ValueError(f"prompt_variety must be 0 or 1, got {variety!r}")
    k = len(NEWS_REQUESTS)
    request, start = (None, r) if variety == 0 else (NEWS_REQUESTS[r % k], r // k)
    news = [news_request(tokenizer, _news_variant(a, start), request) for a in news_texts("train")]
    random.Random(r).shuffle(news)
    return news


def shard_prompts(tokenizer, index: int, shard_size: int, code_per_round: int = 200, variety: int = 0) -> list[str]:
    """Even shards are news requests, odd shards code prefixes (one kind per shard, so left-padding
    wastes little and a build cut short still has both). Each kind is an endless stream of rounds:
    round r of news has every train article (news_round), round r of code has
    `code_per_round` stdlib prefixes drawn with seed r + 1."""
    j = index // 2
    pool: list[str] = []
    r = 0
    while len(pool) < (j + 1) * shard_size:
        pool += (news_round(tokenizer, r, variety) if index % 2 == 0
                 else code_prefixes(tokenizer, code_per_round, seed=r + 1))
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


GENERATORS = ("hf", "native")
# keys added after the first shards were built: in the key only when not at their default, so old folders stay valid
OPTIONAL_KEYS = {"generator": "hf", "prompt_variety": 0, "taps": None, "samples_per_prompt": 1}


def check_generator_config(cfg: dict) -> None:
    generator = cfg.get("generator", "hf")
    if generator not in GENERATORS:
        raise ValueError(f"generator must be one of {GENERATORS}, got {generator!r}")
    if cfg.get("taps") and generator != "native":
        raise ValueError("taps come from the native runner: set generator 'native' to store them")
    threads = cfg.get("gen_threads")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ValueError(f"gen_threads must be an integer >= 1 or absent, got {threads!r}")
    k = cfg.get("samples_per_prompt", 1)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"samples_per_prompt must be an integer >= 1, got {k!r}")
    batch = cfg.get("gen_batch", 16)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"gen_batch must be an integer >= 1, got {batch!r}")


def shard_key(cfg: dict) -> str:
    key = {k: cfg[k] for k in ("target", "shard_size", "shard_new_tokens", "top_k", "code_per_round")}
    extra = [(k, list(cfg[k]) if k == "taps" else cfg[k]) for k, default in sorted(OPTIONAL_KEYS.items())
             if cfg.get(k, default) not in (default, [], ())]
    return hashlib.sha256(repr(sorted(key.items()) + [("format", 3)] + extra).encode()).hexdigest()[:10]


def build_shard(model, tokenizer, index: int, cfg: dict, runner=None, stats: dict | None = None) -> dict:
    """Shard `index`; with generator "native", `runner` is nativegen.make_runner(model) (built once per build)."""
    prompts = shard_prompts(tokenizer, index, cfg["shard_size"], cfg["code_per_round"], cfg.get("prompt_variety", 0))
    sampled, seed = (index // 2) % 2 == 1, 1000 + index
    k = cfg.get("samples_per_prompt", 1)
    if sampled and k > 1:
        prompts = [p for p in prompts[: -(-len(prompts) // k)] for _ in range(k)][: len(prompts)]
    if cfg.get("generator", "hf") == "native":
        from .nativegen import generate_batched

        ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        return generate_batched(runner, ids, cfg["shard_new_tokens"], sampled, seed=seed, top_k=cfg["top_k"],
                                eos_token_id=tokenizer.eos_token_id, batch=cfg.get("gen_batch", 16), stats=stats)
    start, load = time.perf_counter(), os.getloadavg()
    data = generate_with_pass(model, tokenizer, prompts, cfg["shard_new_tokens"], sampled=sampled, seed=seed,
                              top_k=cfg["top_k"])
    if stats is not None:
        seconds, written = time.perf_counter() - start, int(data["gen_mask"].sum())
        stats.update({"generator": "hf", "batch": len(prompts), "threads": torch.get_num_threads(),
                      "seconds": seconds, "gen_mask_positions": written, "tokens_per_second": written / seconds,
                      "loadavg_before": load, "loadavg_after": os.getloadavg(),
                      "note": "shared machine: the load averages say what else ran"})
    return data


def build_shards(model, tokenizer, cfg: dict, root: Path, deadline: float | None = None,
                 progress: bool = True) -> list[Path]:
    """Build shards 0..cfg["shards"]-1 under root/<shard_key>/ (skipping finished ones); stop early
    once time.time() passes `deadline`. Returns the finished shard files, in order, from shard 0 on.
    Each shard's sidecar shard-NNNN.json records its tokens, seconds and load (module docstring)."""
    check_generator_config(cfg)
    folder = Path(root) / f"shards-{shard_key(cfg)}"
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"shard-{i:04d}.pt" for i in range(cfg["shards"])]
    bar = tqdm(total=len(paths), initial=sum(p.exists() for p in paths), desc="target-written shards",
               disable=not progress)
    runner = None
    for i, path in enumerate(paths):
        if path.exists():
            continue
        if deadline is not None and time.time() > deadline:
            break
        if runner is None and cfg.get("generator", "hf") == "native":
            from .nativegen import make_runner

            runner = make_runner(model, cfg.get("gen_capacity"), cfg.get("taps"))
        stats: dict = {}
        threads = torch.get_num_threads()
        if cfg.get("gen_threads"):  # e.g. 1 on a crowded machine (module docstring); the shards do not change
            torch.set_num_threads(cfg["gen_threads"])
        try:
            data = build_shard(model, tokenizer, i, cfg, runner, stats)
        finally:
            torch.set_num_threads(threads)
        stats["tokens_per_hour"] = stats["tokens_per_second"] * 3600
        write_json(path.with_suffix(".json"), stats)  # first: a shard file always has its record
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
