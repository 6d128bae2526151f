"""XSum-style one-sentence news summarisation: data, prompts and ROUGE-2.

The offline source is gensim's Lee corpus: 300 real ABC news articles. As in XSum, an
article's first sentence is the reference summary and the rest is the document. Articles
with fewer than ``MIN_DOCUMENT_SENTENCES`` sentences left are skipped (see
``offline_examples``). Splits are held out: a seeded shuffle, the last
``EVAL_SIZE`` examples are ``eval`` (what notebooks score) and the rest ``train``
(what draft models are fitted on).
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from specrepro.packaged import packaged_file
from specrepro.tasks.hub import load_hub_split
from specrepro.tasks.prompts import as_chat, has_chat_template, truncate_tokens
from specrepro.tasks.sentences import split_sentences

LEE_FILE = "gensim/test/test_data/lee_background.cor"
XSUM_NAME = "EdinburghNLP/xsum"
XSUM_SPLITS = {"eval": "test", "train": "train", "all": "train+validation+test"}
EVAL_SIZE = 100
MIN_DOCUMENT_SENTENCES = 2
INSTRUCTION = "Summarise the following news article in one sentence."


@dataclass(frozen=True)
class NewsExample:
    """One article: ``document`` to summarise and its one-sentence ``reference``."""

    id: str
    document: str
    reference: str


def lee_corpus_path() -> Path:
    """Path of the Lee corpus inside the gensim wheel (gensim itself is never imported)."""
    return packaged_file("gensim", LEE_FILE)


def example_from_article(article: str, id: str) -> NewsExample | None:
    """First sentence as reference, rest as document; None if too little is left."""
    sentences = split_sentences(article)
    if len(sentences) - 1 < MIN_DOCUMENT_SENTENCES:
        return None
    return NewsExample(id=id, document=" ".join(sentences[1:]), reference=sentences[0])


@functools.lru_cache(maxsize=1)
def offline_examples() -> tuple[tuple[NewsExample, ...], int]:
    """All usable Lee-corpus examples in file order, and how many articles were skipped."""
    lines = lee_corpus_path().read_text(encoding="utf-8").splitlines()
    articles = [(i, line.strip()) for i, line in enumerate(lines) if line.strip()]
    examples = [example_from_article(text, f"lee-{i:03d}") for i, text in articles]
    kept = tuple(e for e in examples if e is not None)
    return kept, len(examples) - len(kept)


def example_from_record(record: dict[str, Any], fallback_id: str) -> NewsExample:
    """Map an XSum-like record (document, summary or reference, optional id)."""
    reference = record.get("summary", record.get("reference"))
    if not record.get("document") or not reference:
        raise ValueError(f"record {fallback_id} lacks a document or a summary/reference")
    return NewsExample(id=str(record.get("id") or fallback_id),
                       document=str(record["document"]).strip(), reference=str(reference).strip())


def _read_jsonl(path: Path) -> list[NewsExample]:
    lines = path.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [example_from_record(r, f"{path.stem}-{i}") for i, r in enumerate(records)]


def _held_out(examples: Iterable[NewsExample], split: str, seed: int) -> list[NewsExample]:
    shuffled = list(examples)
    random.Random(seed).shuffle(shuffled)
    eval_size = min(EVAL_SIZE, len(shuffled) // 2)
    cut = len(shuffled) - eval_size
    return {"eval": shuffled[cut:], "train": shuffled[:cut], "all": shuffled}[split]


def _xsum(split: str, seed: int) -> list[NewsExample]:
    rows = load_hub_split(XSUM_NAME, XSUM_SPLITS[split])
    examples = [example_from_record(dict(row), f"xsum-{i}") for i, row in enumerate(rows)]
    random.Random(seed).shuffle(examples)
    return examples


def load_news(split: str = "eval", source: str = "offline", n: int | None = None,
              seed: int = 0) -> list[NewsExample]:
    """Examples of ``split`` ("eval", "train" or "all"), the first ``n`` of a seeded shuffle.

    ``source`` is "offline" (Lee corpus, held-out split as in the module docstring),
    "xsum" (the official XSum splits via ``datasets``; eval is its test split) or a path
    to a ``.jsonl`` file of document/summary records (held out like the offline data).
    """
    if split not in XSUM_SPLITS:
        raise ValueError(f"split must be one of {sorted(XSUM_SPLITS)}, not {split!r}")
    check_count(n)
    source = str(source) if isinstance(source, Path) else source
    if not isinstance(source, str):
        raise TypeError(f"news source must be 'offline', 'xsum' or a .jsonl path, got {type(source).__name__}")
    if source == "offline":
        examples = _held_out(offline_examples()[0], split, seed)
    elif source == "xsum":
        examples = _xsum(split, seed)
    elif Path(source).suffix == ".jsonl":
        examples = _held_out(_read_jsonl(Path(source)), split, seed)
    else:
        raise ValueError(f"unknown news source {source!r}: use 'offline', 'xsum' or a .jsonl path")
    return examples if n is None else examples[:n]


def check_count(n) -> None:
    """n: how many examples to take, None for all; a negative n would silently drop the last ones."""
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
        raise ValueError(f"n must be an integer >= 0 or None (all), got {n!r}")


def summarisation_prompt(example: NewsExample, tokenizer: Any = None,
                         max_document_tokens: int | None = None) -> str:
    """A one-sentence-summary request; chat-formatted if the tokenizer has a chat template."""
    document = truncate_tokens(example.document, max_document_tokens, tokenizer)
    if has_chat_template(tokenizer):
        return as_chat(tokenizer, f"{INSTRUCTION}\n\n{document}")
    return f"{INSTRUCTION}\n\nArticle: {document}\n\nOne-sentence summary:"


@functools.lru_cache(maxsize=1)
def _rouge2_scorer() -> Any:
    from rouge_score import rouge_scorer  # optional dependency, only needed for scoring
    return rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)


def rouge2(prediction: str, reference: str) -> float:
    """ROUGE-2 F-measure with Porter stemming, as reported for XSum."""
    return _rouge2_scorer().score(reference, prediction)["rouge2"].fmeasure


def mean_rouge2(predictions: list[str], references: list[str]) -> float:
    """Mean ROUGE-2 F over aligned prediction/reference pairs."""
    if len(predictions) != len(references) or not predictions:
        raise ValueError("need equally many predictions and references, at least one")
    return sum(map(rouge2, predictions, references)) / len(predictions)
