"""Training text for the drafts, tokenised with the target's tokenizer and cached under specrepro_home().

Two corpora: ABC news articles (gensim's Lee corpus, train split only) and CPython's standard library.
Evaluation data (news eval split, HumanEval) is never read here except to build measurement prompts.
"""
from __future__ import annotations

import hashlib
import os
import random
import sysconfig
from pathlib import Path

import torch

from ..models import specrepro_home
from ..tasks.news import NewsExample, load_news, summarisation_prompt

STDLIB_EXCLUDE = ("test", "idlelib", "site-packages", "lib2to3", "tkinter", "turtledemo")


def news_texts(split: str) -> list[str]:
    """Whole news articles of a split ("train" or "eval"), one string each, from specrepro.tasks.news
    so that drafts never see the held-out articles the notebooks evaluate on."""
    if split not in ("train", "eval"):
        raise ValueError(f"news split must be 'train' or 'eval', got {split!r}")
    return [f"{ex.reference} {ex.document}" for ex in load_news(split=split)]


def news_prompt(tokenizer, article: str, max_document_tokens: int = 300) -> str:
    """The chat-formatted summarisation request the target is evaluated with (truncated document)."""
    return summarisation_prompt(NewsExample("", article, ""), tokenizer, max_document_tokens)


def stdlib_files() -> list[Path]:
    """CPython's own library modules (no tests, no IDLE, no third-party packages), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if any(p in STDLIB_EXCLUDE or p.startswith("test") for p in parts[:-1]):
            continue
        files.append(path)
    return files


def code_texts(max_files: int | None = None, seed: int = 0) -> list[str]:
    """Stdlib module sources in a seeded random order (so a prefix of the list mixes packages)."""
    files = stdlib_files()
    random.Random(seed).shuffle(files)
    texts = []
    for path in files[:max_files]:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue  # a few modules are latin-1 or unreadable; plenty remain
    return texts


def code_prefixes(tokenizer, n: int, prefix_tokens: int = 128, seed: int = 0) -> list[str]:
    """Raw code prefixes cut at a line boundary from random stdlib modules (like HumanEval prompts)."""
    rng = random.Random(seed)
    prefixes = []
    for text in code_texts(seed=seed):
        lines = text.splitlines(keepends=True)
        if len(lines) < 40:
            continue
        start = rng.randrange(0, len(lines) - 30)
        chunk = "".join(lines[start : start + 60])
        ids = tokenizer(chunk, add_special_tokens=False)["input_ids"][:prefix_tokens]
        cut = tokenizer.decode(ids)
        cut = cut[: cut.rfind("\n") + 1] or cut
        prefixes.append(cut)
        if len(prefixes) == n:
            break
    return prefixes


def token_chunks(tokenizer, texts: list[str], chunk: int, max_tokens: int) -> torch.Tensor:
    """Texts joined by EOS into one stream, cut into [n, chunk] rows, at most max_tokens tokens."""
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for text in texts:
        stream.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        stream.append(eos)
        if len(stream) >= max_tokens:
            break
    n = min(len(stream), max_tokens) // chunk
    return torch.tensor(stream[: n * chunk], dtype=torch.long).view(n, chunk)


def cached(name: str, key: dict, build):
    """torch.load of specrepro_home()/drafts/cache/<name>-<hash of key>.pt, building it on a miss."""
    digest = hashlib.sha256(repr(sorted(key.items())).encode()).hexdigest()[:12]
    path = specrepro_home() / "drafts" / "cache" / f"{name}-{digest}.pt"
    if path.exists():
        return torch.load(path, weights_only=True)
    value = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    torch.save(value, tmp)
    os.replace(tmp, path)  # readers never see a torn file
    return value


def text_chunks(tokenizer, news_tokens: int, code_tokens: int, chunk: int = 256) -> torch.Tensor:
    """[n, chunk] training rows: news train articles, then stdlib code (cached)."""
    key = {"news": news_tokens, "code": code_tokens, "chunk": chunk, "tok": tokenizer.name_or_path}

    def build():
        news = token_chunks(tokenizer, news_texts("train"), chunk, news_tokens)
        code = token_chunks(tokenizer, code_texts(), chunk, code_tokens)
        return torch.cat([news, code])

    return cached("text", key, build)
