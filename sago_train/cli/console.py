"""The one place the commands get a rich console: on a terminal, rich's own (its width, colours); anywhere
else (a log file, a pipe, CI, a test's captured output) lines are never wrapped, so a log reads as the
terminal would show it with an unlimited width and ``grep`` finds a sentence on one line.

Every command prints user text (ids, kinds, paths, model names, outputs, notes made from them) through
:func:`user_text`, never straight into a markup string: ``[/bold]`` in a kind would fail the print after the
whole evaluation, and an ESC sequence in an id would act on the terminal. Its owner is
:mod:`sago_train.formatting` (the console tables of :mod:`sago_train.analysis.display` use it too,
and a layer cannot import from the CLI); it is re-exported here for the commands."""

from __future__ import annotations

import sys
from typing import Any

from ..formatting import printable, user_text

__all__ = ["UNWRAPPED_WIDTH", "make_console", "printable", "user_text"]

#: Off a terminal: wide enough that no table is squeezed and no line is broken (rich needs some width).
UNWRAPPED_WIDTH = 10_000


def make_console(*, stderr: bool = False) -> Any:
    """A ``rich.console.Console`` on stdout (or stderr): unwrapped and without highlighting off a terminal.

    Example:
        >>> import io, contextlib
        >>> buf = io.StringIO()
        >>> with contextlib.redirect_stdout(buf):
        ...     make_console().print("word " * 40)
        >>> len(buf.getvalue().splitlines())
        1
    """
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        tty = False
    if tty:
        return Console(stderr=stderr, highlight=False)
    return Console(file=stream, width=UNWRAPPED_WIDTH, soft_wrap=True, highlight=False, color_system=None)
