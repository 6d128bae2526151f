"""Prompt helpers shared by the tasks: chat formatting and token-budget truncation."""

from __future__ import annotations

from typing import Any


def has_chat_template(tokenizer: Any) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def as_chat(tokenizer: Any, user_message: str) -> str:
    """The user message in the tokenizer's chat format, ending where the assistant starts."""
    messages = [{"role": "user", "content": user_message}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def truncate_tokens(text: str, max_tokens: int | None, tokenizer: Any = None) -> str:
    """The first ``max_tokens`` tokens of ``text`` (whitespace words without a tokenizer)."""
    if max_tokens is None:
        return text
    if tokenizer is None:
        words = text.split()
        return text if len(words) <= max_tokens else " ".join(words[:max_tokens])
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])
