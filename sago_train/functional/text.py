"""Text normalization and word-level similarity shared by the generation, mirroring and correctness axes."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

_WS = re.compile(r"\s+")


def normalize(text: str) -> str:
    """Normalize (docs/definitions.md#correctness): lowercase, drop Unicode punctuation, collapse whitespace, strip.

    Example:
        >>> normalize("  Hello,   World!! ")
        'hello world'
    """
    text = text.lower()
    text = "".join(ch for ch in text if not unicodedata.category(ch).startswith("P"))
    return _WS.sub(" ", text).strip()


def words(text: str) -> list[str]:
    """Normalized words of ``text`` (with multiplicity)."""
    norm = normalize(text)
    return norm.split(" ") if norm else []


def exact_match(a: str, b: str) -> float:
    """1.0 when the normalized strings are equal, else 0.0."""
    return float(normalize(a) == normalize(b))


def token_f1(a: str, b: str) -> float:
    """SQuAD-style bag-of-words F1 on normalized words; both empty = 1, one empty = 0.

    Example:
        >>> round(token_f1("the cat sat", "a cat sat down"), 4)
        0.5714
    """
    wa, wb = words(a), words(b)
    if not wa and not wb:
        return 1.0
    if not wa or not wb:
        return 0.0
    common = sum((Counter(wa) & Counter(wb)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(wa), common / len(wb)
    return 2 * precision * recall / (precision + recall)
