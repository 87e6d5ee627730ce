"""Correctness beside stability (docs/definitions.md#correctness): never folded into the instability scalar."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import unknown_name_error
from .. import stats
from ..answer import answer_words
from ..text import words

#: ``auto`` = ``contains`` for chat-rendered and plain prompts alike: instruct and base models both answer in
#: sentences ("The capital of Germany is Berlin."), judged on the answer span (:mod:`..answer`).
MATCH_MODES = ("auto", "prefix", "contains", "exact")

# A label written as a label: the whole answer ("B", "(B)", "B.", "B)", "B:"), a leading label with its
# punctuation ("(B) red", "B) red", "B. red", "B: red"), or after an answer phrase ("The answer is B",
# "Answer: (B)", "the correct option is B"). Letters must be capitals; "A" and "I" followed by a lowercase
# word are an article or a pronoun ("A cat.", "I think"), never a label.
_WHOLE = re.compile(r"^\s*\(?([A-Za-z]|\d{1,2})[\).:]?\s*$")
_LEADING = re.compile(r"^\s*(?:\(([A-Z]|\d{1,2})\)|([A-Z]|\d{1,2})[\).:])(?=\s|$)")
_PHRASE = re.compile(
    r"(?i:\banswer\b|\bcorrect (?:option|choice)\b)\s*(?:(?i:is)\s*)?:?\s*(?:(?i:option|choice)\s+)?"
    r"\(?([A-Z]|\d{1,2})\b\)?(\s+[a-z])?"
)


def resolve_match_mode(mode: str) -> str:
    """The match mode used: ``auto`` -> ``contains``; any other mode as it is."""
    if mode not in MATCH_MODES:
        raise unknown_name_error("correctness mode", mode, MATCH_MODES, key="correctness")
    return "contains" if mode == "auto" else mode


def is_correct(output: str, reference: str | Sequence[str], mode: str = "prefix") -> bool:
    """Whether ``output`` (an answer span) answers ``reference`` (a string, or a list of aliases of which any
    one is right): ``prefix`` (the reference's words start the output's), ``exact`` (the words are equal) or
    ``contains`` (the words appear contiguously, on word boundaries). Words are
    :func:`~sago_train.functional.answer.answer_words`: normalized, numerals and number words in one form.
    ``auto`` is resolved by the caller (:func:`resolve_match_mode`).

    Example:
        >>> is_correct(" Paris, of course.", " Paris")
        True
        >>> is_correct("The capital of France is Paris.", "Paris", "contains")
        True
        >>> is_correct("A week has 7 days.", "seven", "contains"), is_correct("Kiev.", ["Kyiv", "Kiev"], "exact")
        (True, True)
    """
    if mode not in MATCH_MODES or mode == "auto":
        raise unknown_name_error("correctness mode", mode, [m for m in MATCH_MODES if m != "auto"],
                                 key="correctness")
    aliases = [reference] if isinstance(reference, str) else list(reference)
    out = answer_words(output)
    for alias in aliases:
        ref = answer_words(alias)
        if mode == "exact":
            if out == ref:
                return True
        elif not ref:
            continue
        elif (out[: len(ref)] == ref) if mode == "prefix" else _occurs(ref, out):
            return True
    return False


def _occurs(needle: list[str], hay: list[str]) -> bool:
    return any(hay[i : i + len(needle)] == needle for i in range(len(hay) - len(needle) + 1))


def _label_index(label: str, n: int, numeric_options: bool) -> int | None:
    if label.isdigit():
        if numeric_options:  # with options "3", "4", an answer "4" is the option "4", not the fourth one
            return None
        idx = int(label) - 1
    else:
        idx = ord(label.upper()) - ord("A")
    return idx if 0 <= idx < n else None


def choice_label(output: str, n_choices: int, numeric_options: bool = False) -> int | None:
    """The option index an output names by its label (docs/definitions.md#correctness: only where written as a label), else None.

    Example:
        >>> choice_label("The answer is B.", 4), choice_label("A cat.", 4), choice_label("(c)", 4)
        (1, None, 2)
    """
    m = _WHOLE.match(output)
    if m:
        return _label_index(m.group(1), n_choices, numeric_options)
    m = _LEADING.match(output)
    if m:
        return _label_index(m.group(1) or m.group(2), n_choices, numeric_options)
    for m in _PHRASE.finditer(output):
        label, next_word = m.group(1), m.group(2)
        if label in ("A", "I") and next_word:  # "the answer is a cat": an article, not option A
            continue
        idx = _label_index(label, n_choices, numeric_options)
        if idx is not None:
            return idx
    return None


def choice_index(output: str, choices: Sequence[str]) -> int | None:
    """Map a generated answer to a choice: its label where written as a label ("B", "(B)", "B.", "B)",
    "Answer: B", "The answer is B"), else the option whose text occurs in the output when exactly one does
    (an option contained in a longer occurring option, "New York" in "New York City", does not count).
    None when nothing matches or the output is ambiguous."""
    if not output.strip():
        return None
    numeric = any(c.strip().isdigit() for c in choices)
    label = choice_label(output, len(choices), numeric_options=numeric)
    if label is not None:
        return label
    out = words(output)
    found = [i for i, c in enumerate(choices) if words(c) and _occurs(words(c), out)]
    found = [i for i in found if not any(j != i and _occurs(words(choices[i]), words(choices[j])) for j in found)]
    return found[0] if len(found) == 1 else None


def variant_correct(
    output: str, *, reference: str | Sequence[str] | None, choices: Sequence[str] | None, answer: int | None,
    mode: str,
) -> bool | None:
    """Per-variant correctness, or None when the group has none: no reference and no choices, or choices
    without an answer (docs/definitions.md#correctness: never counted as wrong). ``mode`` is a resolved mode (not ``auto``)."""
    if choices is not None:
        return None if answer is None else choice_index(output, choices) == answer
    if reference is not None:
        return is_correct(output, reference, mode)
    return None


def correctness_summary(correct: Sequence[Sequence[bool]], kinds: Sequence[str] | None, *,
                        n_resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Aggregate per-variant correctness of the groups that have it.

    Returns accuracy overall (right answers / variants) with its 95% percentile-bootstrap CI over groups
    (``accuracy_ci_low`` / ``accuracy_ci_high``, whole groups resampled, seeded), accuracy per kind (when kinds align), worst-variant accuracy (the lowest per-kind
    accuracy; per variant position when there are no kinds), spread (max - min accuracy over kinds), and the
    share of groups whose variants are all right (``all_right``), all wrong, or either (``consistent``).
    """
    rows = [list(map(bool, c)) for c in correct]
    if not rows:
        return {"n": 0}
    flat = [x for r in rows for x in r]
    out: dict[str, Any] = {
        "n": len(rows),
        "accuracy": float(np.mean(flat)),
        "all_right": float(np.mean([all(r) for r in rows])),
        "all_wrong": float(np.mean([not any(r) for r in rows])),
    }
    out["consistent"] = out["all_right"] + out["all_wrong"]
    ci = stats.bootstrap_ratio_ci([sum(r) for r in rows if r], [len(r) for r in rows if r], n_resamples=n_resamples, seed=seed)
    out["accuracy_ci_low"], out["accuracy_ci_high"] = ci.ci_low, ci.ci_high
    if kinds is not None and all(len(r) == len(kinds) for r in rows):
        per_kind: dict[str, list[bool]] = {}
        for r in rows:
            for kind, x in zip(kinds, r):
                per_kind.setdefault(kind, []).append(x)
        acc = {k: float(np.mean(v)) for k, v in per_kind.items()}
        out["per_kind"] = acc
        out["spread"] = max(acc.values()) - min(acc.values())
        out["worst_variant_accuracy"] = min(acc.values())
    else:
        per_position: dict[int, list[bool]] = {}
        for r in rows:
            for k, x in enumerate(r):
                per_position.setdefault(k, []).append(x)
        out["worst_variant_accuracy"] = min(float(np.mean(v)) for v in per_position.values())
    return out
