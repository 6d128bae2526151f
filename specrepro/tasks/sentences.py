"""A rule-based sentence splitter for English news text."""

from __future__ import annotations

import re

# Tokens that end in "." without ending a sentence (compared lower-case, without the dot).
ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "rev", "hon", "gen", "lt", "col",
    "sgt", "capt", "cmdr", "adm", "maj", "gov", "sen", "rep", "pres", "insp", "supt",
    "inc", "ltd", "co", "corp", "bros", "no", "nos", "vs", "approx", "fig", "mt", "ft",
    "jan", "feb", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
})

# Words that, after a dotted acronym ("U.S."), suggest a new sentence has started.
SENTENCE_STARTERS = frozenset({
    "the", "a", "an", "he", "she", "it", "they", "we", "i", "you", "but", "and", "this",
    "that", "these", "those", "there", "his", "her", "their", "its", "in", "on", "at",
    "meanwhile", "however", "mr", "mrs", "ms", "dr",
})

_CANDIDATE = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")
_DOTTED_ACRONYM = re.compile(r"^(?:[A-Za-z]{1,2}\.)+[A-Za-z]{1,2}$")


def _last_token(text: str) -> str:
    token = text.rsplit(None, 1)[-1] if text.strip() else ""
    return token.lstrip("\"'(\u201c\u2018[")


def _next_word(text: str) -> str:
    match = re.match(r"[\"'\u201c\u2018(\[]?([A-Za-z0-9]+)", text)
    return match.group(1).lower() if match else ""


def _is_boundary(text: str, match: re.Match) -> bool:
    punctuation = match.group(0).rstrip()
    if not punctuation.startswith(".") or punctuation.startswith(".."):
        return True
    token = _last_token(text[: match.start()])
    if token.lower() in ABBREVIATIONS:
        return False
    if len(token) == 1 and token.isalpha():
        return False  # an initial, as in "George W. Bush"
    if _DOTTED_ACRONYM.match(token):
        return _next_word(text[match.end():]) in SENTENCE_STARTERS
    return True


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences, keeping abbreviations, initials and decimals intact."""
    sentences, start = [], 0
    for match in _CANDIDATE.finditer(text):
        if _is_boundary(text, match):
            sentences.append(text[start: match.end()].strip())
            start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return [s for s in sentences if s]
