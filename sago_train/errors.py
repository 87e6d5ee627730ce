"""Errors that the CLI turns into one clear line and exit code 2.

Every user-facing validation error is a :class:`SagoInputError`: it says *where* (file, line, key),
*what* was expected versus what was found, and *how* to fix it.
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable
from typing import Any

#: Characters of a user value quoted in an error message (:func:`short_repr`), and of a whole message.
MAX_REPR_CHARS = 80
MAX_ERROR_CHARS = 2000


class SagoInputError(ValueError):
    """Invalid user input (data, config, CLI arguments).

    Example:
        >>> raise SagoInputError("expected a list", source="sets/p.jsonl", line=3, key="variants")
        Traceback (most recent call last):
        ...
        sago_train.errors.SagoInputError: sets/p.jsonl:3: field 'variants': expected a list
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        key: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.source = source
        self.line = line
        self.key = key
        self.hint = hint
        super().__init__(self.format())

    def format(self) -> str:
        where = ""
        if self.source is not None:
            where = str(self.source)
            if self.line is not None:
                where += f":{self.line}"
            where += ": "
        elif self.line is not None:
            where = f"line {self.line}: "
        field = f"field '{self.key}': " if self.key is not None else ""
        message = self.message
        if len(message) > MAX_ERROR_CHARS:  # a safety net: values should be quoted through short_repr
            message = message[:MAX_ERROR_CHARS] + f"... ({len(self.message) - MAX_ERROR_CHARS:,} more characters)"
        text = f"{where}{field}{message}"
        if self.hint:
            text += f" ({self.hint})"
        return text


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest choice, or ``""`` when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


def unknown_name_error(kind: str, name: str, choices: Iterable[str], **where: object) -> SagoInputError:
    """The error for an unknown axis/similarity/key, listing the valid names and the closest one."""
    choices = sorted(choices)
    return SagoInputError(
        f"unknown {kind} '{name}'.{did_you_mean(name, choices)} Valid: {', '.join(choices)}",
        **where,  # type: ignore[arg-type]
    )


def short_repr(value: object, limit: int | None = None) -> str:
    """A repr of a user value for an error message, bounded in length and in the work it takes.

    A YAML alias structure (a "billion laughs") expands exponentially when printed, and a 50 MB string makes
    a 50 MB error line; every error message quotes user values through this helper instead of ``!r``.

    Example:
        >>> short_repr("x" * 1000, 12)
        "'xxx...xxxx'"
        >>> short_repr([[1, 2, 3, 4, 5, 6, 7, 8]] * 100)[:25]
        '[[1, 2, 3, 4, 5, 6, ...],'
    """
    limit = MAX_REPR_CHARS if limit is None else limit
    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset = 3, 6, 6, 6, 6
    r.maxstring, r.maxother, r.maxlong = max(8, limit), max(8, limit), 40
    text = r.repr(value)
    if len(text) <= limit:
        return text
    quote = text[0] if text[:1] in ("'", '"') else ""
    return text[: max(1, limit - 3 - len(quote))] + "..." + quote


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "object"}.get(
        type(value), type(value).__name__
    )
