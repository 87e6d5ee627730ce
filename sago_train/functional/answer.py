"""The answer span and the words correctness compares (docs/definitions.md#correctness).

A base model does not stop after its answer: fed "Question: What is the capital of France?\\nAnswer:" it says
" Paris.\\n\\nQuestion: What is the capital of Spain?\\nAnswer: Madrid". The **answer span** is the output up to
its first stop: the configured stop strings and, for plain completions, the default stops that end an answer
where the model starts a new one: a blank line, or a new line opening with one of the prompt's scaffold labels
(a word or two and a colon at the start of a prompt line: "Question:", "Q:", "Answer:"). Correctness,
generation and mirroring read the span; the raw output stays in the records.

Correctness compares **answer words**: the normalized words of :func:`sago_train.functional.text.words`, with
numbers in one form, so that "7", "seven" and "7.0" are equal, "1,000" is "1000" and "twenty-one" is "21".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from .text import words

#: The default stop that ends every plain completion's answer: a blank line.
BLANK_LINE = "\n\n"
# A scaffold label: at the start of a line, one or two words (each starting with a letter; at most 24
# characters) and a colon. "Question:", "Q:", "Answer:", "Input text:"; never a clock time or a ratio, nor a
# phrase ending in a colon ("opposite of old:", a terse prompt rather than a field name).
_LABEL = re.compile(r"^[ \t]*([A-Za-z][A-Za-z0-9]*(?: [A-Za-z][A-Za-z0-9]*)?):", re.M)
_MAX_LABEL_CHARS = 24


def scaffold_labels(prompt: str) -> list[str]:
    """The labels that open lines of ``prompt`` ("Question", "Answer"), in order, each once.

    Example:
        >>> scaffold_labels("Q: What is 2 + 2?\\nA: 4\\n\\nQ: What is 3 + 3?\\nA:")
        ['Q', 'A']
    """
    out: list[str] = []
    for m in _LABEL.finditer(prompt):
        label = m.group(1)
        if len(label) <= _MAX_LABEL_CHARS and label not in out:
            out.append(label)
    return out


def default_stops(prompt: str) -> list[str]:
    """The default stops of a plain completion of ``prompt``: a blank line, then a new line repeating each of
    its scaffold labels.

    Example:
        >>> default_stops("Question: What is the capital of France?\\nAnswer:")
        ['\\n\\n', '\\nQuestion:', '\\nAnswer:']
    """
    return [BLANK_LINE, *(f"\n{label}:" for label in scaffold_labels(prompt))]


def answer_stops(prompt: str, *, chat: bool, configured: Sequence[str] = ()) -> list[str]:
    """The stops that end the answer to one variant: the configured stop strings, and for a plain completion
    (``chat`` False) the :func:`default_stops` of its prompt; a chat-rendered answer ends at EOS (its
    template's end of turn) and the configured strings only."""
    out = [s for s in configured if s]
    if not chat:
        out += [s for s in default_stops(prompt) if s not in out]
    return out


def _pattern(stop: str) -> re.Pattern[str]:
    # Around a stop's line breaks, spaces and tabs are ignored: "\n\n" also ends at a line holding only
    # spaces, "\nQuestion:" at an indented label.
    if "\n" not in stop:
        return re.compile(re.escape(stop))
    pieces = stop.split("\n")
    return re.compile(r"[ \t]*\n[ \t]*".join(re.escape(p) for p in pieces))


def answer_end(output: str, stops: Iterable[str]) -> int | None:
    """Where the first stop starts in ``output``, searched after its leading whitespace (a blank line ends an
    answer, it does not precede one); None when no stop occurs, i.e. the answer runs to the end."""
    start = len(output) - len(output.lstrip())
    found = [m.start() for s in stops if s for m in [_pattern(s).search(output, start)] if m is not None]
    return min(found) if found else None


def answer_span(output: str, stops: Iterable[str]) -> str:
    """The output up to its first stop (all of it when none occurs).

    Example:
        >>> answer_span(" Paris.\\n\\nQuestion: What is the capital of Spain?", default_stops("Question: x\\nAnswer:"))
        ' Paris.'
        >>> answer_span("\\nParis\\nQuestion: next", ["\\n\\n", "\\nQuestion:"])
        '\\nParis'
    """
    end = answer_end(output, stops)
    return output if end is None else output[:end]


_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())}
_TENS = {w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
_SCALES = {"thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
# A numeral: digits with optional thousands commas and a decimal part ("1,000", "100.0", "3.5").
_NUMERAL = re.compile(r"(?<![\d,.])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?![\d])")
# Hyphens between letters separate words ("twenty-one", "X-ray"): normalize would glue them otherwise.
_HYPHEN = re.compile(r"(?<=[^\W\d_])-(?=[^\W\d_])")


def _numeral(m: re.Match[str]) -> str:
    whole = m.group(1).replace(",", "").lstrip("0") or "0"
    frac = (m.group(2) or "").rstrip("0")
    # normalize() drops punctuation, decimal points included: the numeral is carried through it as a word
    # marked with "¤" (a currency sign, not punctuation), its decimal point written as a second "¤".
    return f" ¤{whole}¤{frac} " if frac else f" ¤{whole} "


def _number_words(ws: list[str]) -> list[str]:
    """Runs of number words as one numeral ("twenty one" -> "21", "one hundred and six" -> "106"); a word
    that cannot continue the number starts a new one ("one two" -> "1", "2")."""
    out: list[str] = []
    i = 0
    while i < len(ws):
        total = current = 0
        last: str | None = None
        j = i
        while j < len(ws):
            w = ws[j]
            if w in _UNITS and _UNITS[w] == 0:
                if last is not None:
                    break
                last, j = "zero", j + 1
                break
            if w in _UNITS and _UNITS[w] < 10 and last in (None, "ten", "hundred", "scale"):
                current, last = current + _UNITS[w], "unit"
            elif w in _UNITS and last in (None, "hundred", "scale"):
                current, last = current + _UNITS[w], "teen"
            elif w in _TENS and last in (None, "hundred", "scale"):
                current, last = current + _TENS[w], "ten"
            elif w == "hundred" and last in ("unit", "teen") and current < 100:
                current, last = current * 100, "hundred"
            elif w in _SCALES and last in ("unit", "teen", "ten", "hundred") and current:
                total, current, last = total + current * _SCALES[w], 0, "scale"
            elif w == "and" and last in ("hundred", "scale") and j + 1 < len(ws) and (
                    ws[j + 1] in _UNITS or ws[j + 1] in _TENS):
                pass
            else:
                break
            j += 1
        if last is None:
            out.append(ws[i])
            i += 1
        else:
            out.append(str(total + current))
            i = j
    return out


def answer_words(text: str) -> list[str]:
    """Normalized words with numbers in one form: numerals without thousands commas or trailing decimal
    zeros, number words as numerals.

    Example:
        >>> answer_words("A week has seven days."), answer_words("It costs 1,000.50 dollars")
        (['a', 'week', 'has', '7', 'days'], ['it', 'costs', '1000.5', 'dollars'])
        >>> answer_words("Twenty-one, or 100.0")
        ['21', 'or', '100']
    """
    marked = _NUMERAL.sub(_numeral, _HYPHEN.sub(" ", text))
    out = []
    for w in _number_words(words(marked)):
        if w.startswith("¤"):
            whole, _, frac = w[1:].partition("¤")
            w = f"{whole}.{frac}" if frac else whole
        out.append(w)
    return out
