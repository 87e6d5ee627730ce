"""Correctness beside stability (SPEC "correctness"): never folded into the instability scalar."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import unknown_name_error
from ..text import normalize, words

MATCH_MODES = ("prefix", "exact", "contains")
_LABEL = re.compile(r"^\(?([a-z]|\d{1,2})[\).:]?$")


def is_correct(output: str, reference: str, mode: str = "prefix") -> bool:
    """Whether ``output`` answers ``reference``: ``prefix`` (the reference's normalized words start the
    output's), ``exact`` (normalized strings equal) or ``contains`` (the words appear contiguously).

    Example:
        >>> is_correct(" Paris, of course.", " Paris")
        True
    """
    if mode not in MATCH_MODES:
        raise unknown_name_error("correctness mode", mode, MATCH_MODES, key="correctness")
    ref, out = words(reference), words(output)
    if mode == "exact":
        return normalize(output) == normalize(reference)
    if not ref:
        return False
    if mode == "prefix":
        return out[: len(ref)] == ref
    return any(out[i : i + len(ref)] == ref for i in range(len(out) - len(ref) + 1))


def choice_index(output: str, choices: Sequence[str]) -> int | None:
    """Map a generated answer to a choice: a leading label (``A``, ``b)``, ``2.``) or a choice's text at
    the start of the output. None when nothing matches."""
    out = words(output)
    if not out:
        return None
    # A choice's own text first (longest first, so "New York City" wins over "New York"): with numeric
    # options such as ["4", "5"], an answer "4" means the option "4", not the fourth option.
    for i in sorted(range(len(choices)), key=lambda i: -len(words(choices[i]))):
        cw = words(choices[i])
        if cw and out[: len(cw)] == cw:
            return i
    first = output.strip().split()[0].lower()
    m = _LABEL.match(first)
    if m:
        label = m.group(1)
        idx = ord(label) - ord("a") if label.isalpha() else int(label) - 1
        if 0 <= idx < len(choices):
            return idx
    return None


def variant_correct(
    output: str, *, reference: str | None, choices: Sequence[str] | None, answer: int | None, mode: str
) -> bool | None:
    """Per-variant correctness, or None when the group has neither a reference nor choices."""
    if choices is not None and answer is not None:
        return choice_index(output, choices) == answer
    if reference is not None:
        return is_correct(output, reference, mode)
    return None


def correctness_summary(correct: Sequence[Sequence[bool]], kinds: Sequence[str] | None) -> dict[str, Any]:
    """Aggregate per-variant correctness of the groups that have it.

    Returns accuracy overall, per kind (when kinds align), worst-variant accuracy (a group counts only if
    every variant is right), spread (max - min accuracy over kinds), and the share of groups whose variants
    all agree (all right or all wrong).
    """
    rows = [list(map(bool, c)) for c in correct]
    if not rows:
        return {"n": 0}
    flat = [x for r in rows for x in r]
    out: dict[str, Any] = {
        "n": len(rows),
        "accuracy": float(np.mean(flat)),
        "worst_variant_accuracy": float(np.mean([all(r) for r in rows])),
        "all_right": float(np.mean([all(r) for r in rows])),
        "all_wrong": float(np.mean([not any(r) for r in rows])),
    }
    out["consistent"] = out["all_right"] + out["all_wrong"]
    if kinds is not None and all(len(r) == len(kinds) for r in rows):
        per_kind: dict[str, list[bool]] = {}
        for r in rows:
            for kind, x in zip(kinds, r):
                per_kind.setdefault(kind, []).append(x)
        acc = {k: float(np.mean(v)) for k, v in per_kind.items()}
        out["per_kind"] = acc
        out["spread"] = max(acc.values()) - min(acc.values())
    return out
