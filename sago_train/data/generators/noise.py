"""Text noise on the content: ``typo``, ``casing`` and ``whitespace``."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from ...errors import SagoInputError, unknown_name_error
from ..render import _title
from .base import (
    _check_name,
    _ContentGenerator,
    _str_options,
)


def _keyboard_neighbours() -> dict[str, str]:
    rows = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
    offsets = (0.0, 0.25, 0.75)  # the stagger of a physical QWERTY keyboard
    pos = {c: (r, col + offsets[r]) for r, row in enumerate(rows) for col, c in enumerate(row)}
    return {
        c: "".join(d for d, (r2, x2) in pos.items() if d != c and abs(r2 - r) <= 1 and abs(x2 - x) <= 1.0)
        for c, (r, x) in pos.items()
    }


KEYBOARD_NEIGHBOURS = _keyboard_neighbours()
TYPO_OPS = ("swap", "drop", "duplicate", "substitute")


class TypoGenerator(_ContentGenerator):
    """Character noise: each letter is edited with probability ``rate``.

    Edits are adjacent swaps, drops, duplications and QWERTY-neighbour substitutions (case kept). Only letters
    are edited - digits and punctuation carry meaning ("2+2") - at least one letter is edited when there is
    one, and a text never loses its last letter, so a variant is never empty.

    Example:
        >>> TypoGenerator(rate=0.2).perturb("The quick brown fox", random.Random(1)) != "The quick brown fox"
        True
    """

    name = "typo"

    def __init__(self, rate: float = 0.05, *, ops: Sequence[str] = TYPO_OPS, name: str = "typo") -> None:
        self.name = _check_name(name)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise SagoInputError(f"typo rate must be in (0, 1], got {rate!r}", key="rate")
        self.rate = float(rate)
        self.ops = _str_options(ops, "ops", TYPO_OPS)

    def perturb(self, text: str, rng: random.Random) -> str:
        letters = [i for i, c in enumerate(text) if c.isalpha()]
        if not letters:
            return text
        chosen = [i for i in letters if rng.random() < self.rate]
        if not chosen:
            chosen = [rng.choice(letters)]
        chars = list(text)
        out: list[str] = []
        n_letters = len(letters)
        todo = set(chosen)
        i = 0
        while i < len(chars):
            c = chars[i]
            if i not in todo:
                out.append(c)
                i += 1
                continue
            op = rng.choice(self.ops)
            nxt = chars[i + 1] if i + 1 < len(chars) else ""
            if op == "swap" and nxt.isalpha() and nxt != c:
                out += [nxt, c]
                i += 2  # the swapped partner is consumed
                continue
            if op == "drop" and n_letters > 1:
                n_letters -= 1
                i += 1
                continue
            low = c.lower()
            if op == "substitute" and low in KEYBOARD_NEIGHBOURS:
                s = rng.choice(KEYBOARD_NEIGHBOURS[low])
                out.append(s.upper() if c.isupper() else s)
                i += 1
                continue
            # duplicate, and the fallback when the drawn edit is impossible here (it always changes the text)
            out += [c, c]
            n_letters += 1
            i += 1
        result = "".join(out)
        if result == text:
            # Edits can cancel out (drop one "a" of "aa", duplicate the other); one more duplication cannot.
            j = rng.choice(letters)
            result = text[: j + 1] + text[j:]
        return result


CASING_MODES = ("lower", "upper", "title", "swap", "random")


class CasingGenerator(_ContentGenerator):
    """Change the casing of the content: ``lower``, ``upper``, ``title``, ``swap`` (swapcase) or ``random``
    (each letter upper or lower at random).

    Example:
        >>> CasingGenerator("title").perturb("what's the capital of france?", random.Random(0))
        "What's The Capital Of France?"
    """

    name = "casing"

    def __init__(self, mode: str = "lower", *, name: str = "casing") -> None:
        self.name = _check_name(name)
        if mode not in CASING_MODES:
            raise unknown_name_error("casing mode", str(mode), CASING_MODES, key="mode")
        self.mode = mode

    def perturb(self, text: str, rng: random.Random) -> str:
        if self.mode == "lower":
            return text.lower()
        if self.mode == "upper":
            return text.upper()
        if self.mode == "title":
            return _title(text)
        if self.mode == "swap":
            return text.swapcase()
        return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in text)


WHITESPACE_STYLES = {"space": "  ", "newline": "\n", "tab": "\t"}
# A single space between two non-space characters: leading/trailing whitespace is left alone because the
# end of the prompt is where the reference attaches.
_GAP = re.compile(r"(?<=\S) (?=\S)")


class WhitespaceGenerator(_ContentGenerator):
    """Replace a share ``rate`` of the single spaces between words with ``"  "`` (``space``), ``"\\n"``
    (``newline``) or ``"\\t"`` (``tab``); at least one when there is a gap.

    Example:
        >>> WhitespaceGenerator(rate=1.0, styles=["space"]).perturb("a b c", random.Random(0))
        'a  b  c'
    """

    name = "whitespace"

    def __init__(
        self, rate: float = 0.25, *, styles: Sequence[str] = ("space", "newline"), name: str = "whitespace"
    ) -> None:
        self.name = _check_name(name)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise SagoInputError(f"whitespace rate must be in (0, 1], got {rate!r}", key="rate")
        self.rate = float(rate)
        self.styles = _str_options(styles, "styles", tuple(WHITESPACE_STYLES))

    def perturb(self, text: str, rng: random.Random) -> str:
        gaps = [m.start() for m in _GAP.finditer(text)]
        if not gaps:
            return text
        chosen = {g for g in gaps if rng.random() < self.rate} or {rng.choice(gaps)}
        return "".join(
            WHITESPACE_STYLES[rng.choice(self.styles)] if i in chosen else c for i, c in enumerate(text)
        )
