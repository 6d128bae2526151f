"""What the drafts learn from: the target's outputs over training sequences, computed once and cached.

For every position j of every training sequence we keep the target's top-k next-token probabilities
(plus the residual mass outside them) and its last hidden state (after the final norm, as
speculative_generate passes it). Token-level distillation, feature and head drafts all train against
this one pass, so the 135M-parameter target never runs inside a training step.

Two sources of sequences:
  "text": news train articles and stdlib code, as written;
  "gen":  news summarisation chat prompts and stdlib code prefixes continued BY THE TARGET (half greedy,
          half sampled at T=1): the text drafts must actually predict at decode time.
"""
from __future__ import annotations

import torch
from tqdm.auto import tqdm

from .corpus import cached, code_prefixes, news_prompt, news_texts, text_chunks


@torch.inference_mode()
def target_pass(model, sequences: list[torch.Tensor], top_k: int = 32, keep_hidden: bool = True) -> dict:
    """Target outputs for each position of each sequence, flattened, with `starts` giving boundaries."""
    from ..engines.runners import input_device

    device = input_device(model)  # the target runs where it lives (a GPU); the data is kept on the host
    tokens, top_ids, top_p, rest, hidden = [], [], [], [], []
    for seq in tqdm(sequences, desc="target pass", leave=False):
        h = model.get_decoder()(input_ids=seq.view(1, -1).to(device)).last_hidden_state[0]
        probs = model.get_output_embeddings()(h).float().softmax(-1)
        p, ids = probs.topk(top_k, dim=-1)
        tokens.append(seq)
        top_ids.append(ids.int().cpu())
        top_p.append(p.cpu())
        rest.append((1 - p.sum(-1)).clamp_min(0).cpu())
        if keep_hidden:
            hidden.append(h.half().cpu())
    lengths = torch.tensor([0] + [len(s) for s in sequences])
    out = {
        "tokens": torch.cat(tokens),
        "starts": lengths.cumsum(0),
        "top_ids": torch.cat(top_ids),
        "top_p": torch.cat(top_p),
        "rest": torch.cat(rest),
    }
    if keep_hidden:
        out["hidden"] = torch.cat(hidden)
    return out


@torch.inference_mode()
def target_continuations(model, tokenizer, prompts: list[str], new_tokens: int, batch: int = 32,
                         seed: int = 0) -> list[tuple[torch.Tensor, int]]:
    """(prompt + continuation ids, prompt length) per prompt; even batches greedy, odd ones T=1 samples."""
    from ..engines.runners import input_device

    device = input_device(model)
    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = []
    for b, i in enumerate(tqdm(range(0, len(prompts), batch), desc="target samples", leave=False)):
        enc = tokenizer(prompts[i : i + batch], return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(device) for k, v in enc.items()}
        sampled = b % 2 == 1
        gen = model.generate(
            **enc, max_new_tokens=new_tokens, do_sample=sampled, temperature=1.0 if sampled else None,
            top_k=0 if sampled else None, top_p=1.0 if sampled else None, pad_token_id=pad,
        )
        width = enc["input_ids"].shape[1]
        for row, mask in zip(gen.cpu(), enc["attention_mask"].cpu()):
            prompt = row[:width][mask.bool()]
            cont = row[width:]
            # cut after the first EOS; padding after it is not target text
            eos = (cont == tokenizer.eos_token_id).nonzero()
            if eos.numel():
                cont = cont[: int(eos[0]) + 1]
            out.append((torch.cat([prompt, cont]), len(prompt)))
    return out


def distill_data(model, tokenizer, source: str, cfg: dict) -> dict:
    """Cached target pass over the "text" or "gen" sequences described by cfg (see DATA_DEFAULTS)."""
    key = {k: cfg[k] for k in DATA_DEFAULTS} | {"source": source, "target": model.config.name_or_path}

    def build():
        if source == "text":
            rows = text_chunks(tokenizer, cfg["news_tokens"], cfg["code_tokens"])
            data = target_pass(model, list(rows), cfg["top_k"])
            data["gen_mask"] = torch.ones(len(data["tokens"]), dtype=torch.bool)
            return data
        if source == "gen":
            return gen_data(model, tokenizer, cfg)
        raise ValueError(f"unknown distillation source {source!r}")

    return cached(f"distill-{source}", key, build)


def gen_data(model, tokenizer, cfg: dict) -> dict:
    articles = news_texts("train")[: cfg["gen_news"]]
    prompts = [news_prompt(tokenizer, a) for a in articles]
    prompts += code_prefixes(tokenizer, cfg["gen_code"])
    pairs = target_continuations(model, tokenizer, prompts, cfg["gen_new_tokens"])
    data = target_pass(model, [seq for seq, _ in pairs], cfg["top_k"])
    # positions whose NEXT token the target generated: where decode-time predictions happen
    mask = torch.zeros(len(data["tokens"]), dtype=torch.bool)
    for start, (seq, plen) in zip(data["starts"].tolist(), pairs):
        mask[start + plen - 1 : start + len(seq) - 1] = True
    data["gen_mask"] = mask
    return data


# gen: every news train article (199) and 200 stdlib prefixes, 128 target tokens each (about 50k
# target-written positions; 21 min to build at 1 torch thread on the 2-core CPU). The first version used 32 + 32 x 64 tokens
# (3.8k positions): the feature draft then agreed with the target on only 16-28% of target-written tokens.
DATA_DEFAULTS = {
    "news_tokens": 16384,
    "code_tokens": 16384,
    "gen_news": 199,
    "gen_code": 200,
    "gen_new_tokens": 128,
    "top_k": 32,
}


def merge(parts: list[dict]) -> dict:
    """Concatenate several target-pass dicts (sequence boundaries shifted accordingly)."""
    out = {}
    offset = 0
    starts = [torch.zeros(1, dtype=torch.long)]
    for part in parts:
        starts.append(part["starts"][1:] + offset)
        offset += len(part["tokens"])
    out["starts"] = torch.cat(starts)
    for name in parts[0]:
        if name != "starts":
            out[name] = torch.cat([p[name] for p in parts])
    return out
