"""How every SAGO number is written for people (console tables, ``report.md``, ``compare``): one helper per
kind of number, so the same value reads the same everywhere.

- a value: three significant digits, positional between 1e-4 and 1e5 (``0.0110``, ``0.00254``, ``1.00``), else
  scientific (``1.23e-05``); zero as ``0.000``; missing (None, NaN) as ``-``.
- a p-value: ``< 1e-4`` below 1e-4 (never ``0.0000``), else three significant digits; :func:`p_text` puts
  ``p`` in front (``p < 1e-4``, ``p = 0.0170``).
- a constant axis (every group the same value: the bootstrap CI has zero width) is said once,
  ``constant at 0.000``, and left out of tables and plots.
- user text (ids, kinds, paths, model names, outputs) on a console: :func:`user_text`, never read as rich markup
  and with control characters shown as escapes; :func:`printable` for plain lines (errors, logs).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

SIG_DIGITS = 3
P_FLOOR = 1e-4


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def fmt_num(x: Any, sig: int = SIG_DIGITS) -> str:
    """A value with ``sig`` significant digits (see the module doc)."""
    v = _num(x)
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return f"{0:.{sig}f}"
    if 1e-4 <= abs(v) < 1e5:
        digits = max(0, sig - 1 - math.floor(math.log10(abs(v))))
        text = f"{v:.{digits}f}"
        # Rounding can carry into a new digit (0.09996 -> 0.1000): redo with the rounded magnitude.
        rounded = abs(float(text))
        if rounded and math.floor(math.log10(rounded)) != math.floor(math.log10(abs(v))):
            text = f"{v:.{max(0, sig - 1 - math.floor(math.log10(rounded)))}f}"
        return text
    return f"{v:.{sig - 1}e}"


def fmt_p(p: Any) -> str:
    """A p-value: ``< 1e-4`` below the floor, else three significant digits; ``-`` when missing."""
    v = _num(p)
    if math.isnan(v):
        return "-"
    return f"< {P_FLOOR:.0e}".replace("e-0", "e-") if v < P_FLOOR else fmt_num(v)


def p_text(p: Any) -> str:
    """``p < 1e-4`` or ``p = 0.0170`` (for sentences)."""
    text = fmt_p(p)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


def fmt_ci(low: Any, high: Any) -> str:
    """``[low, high]``, or ``-`` when a bound is missing."""
    if math.isnan(_num(low)) or math.isnan(_num(high)):
        return "-"
    return f"[{fmt_num(low)}, {fmt_num(high)}]"


def constant_value(summary: Any) -> float | None:
    """The value of an axis that is the same on every group (mean == CI bounds, at least one group), else None.
    ``summary``: a :class:`~sago_train.functional.stats.Summary` or its dict form."""
    get = summary.get if isinstance(summary, Mapping) else lambda k: getattr(summary, k, None)
    mean, lo, hi, n = _num(get("mean")), _num(get("ci_low")), _num(get("ci_high")), get("n")
    if not (math.isfinite(mean) and n) or lo != mean or hi != mean:
        return None
    return mean


def constant_line(axis: str, value: float) -> str:
    """The one line that replaces a constant axis' rows, panels and tables."""
    return f"{axis}: constant at {fmt_num(value)} (left out of the tables and plots)"


# C0 and C1 controls (ESC starts the sequences that clear a screen or retitle a terminal; OSC 8 makes links),
# DEL, and the bidirectional overrides that make text read differently from what it is.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: Any) -> str:
    r"""``text`` with every control character written as its escape (``\x1b``, ``\n``), so user text printed
    to a terminal or a log is seen as it is and never acts on the terminal.

    Example:
        >>> printable("id\x1b]0;pwned\x07")
        'id\\x1b]0;pwned\\x07'
    """
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def user_text(value: Any) -> str:
    r"""User text for a rich console (tables, banners, lines): :func:`printable`, with rich markup escaped so that
    ``[/bold]`` in a kind or ``m[/x]`` in a path prints as written instead of failing the print.

    Example:
        >>> from rich.text import Text
        >>> Text.from_markup(user_text("kind [/bold] \x1b[2J")).plain
        'kind [/bold] \\x1b[2J'
    """
    from rich.markup import escape

    return escape(printable(value))
