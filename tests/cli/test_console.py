"""The commands' console: off a terminal nothing is wrapped, whatever width the environment claims."""

from __future__ import annotations

import io

from rich.table import Table

from sago_train.cli.console import make_console


def test_lines_and_tables_are_not_wrapped_off_a_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")  # rich would otherwise take this as the width
    buf = io.StringIO()
    monkeypatch.setattr("sys.stdout", buf)
    console = make_console()
    sentence = "resuming from " + "x" * 300
    console.print(sentence)
    table = Table()
    for name in ("a column with a long heading", "another long heading", "and a third one"):
        table.add_column(name)
    table.add_row("a cell with a long value in it", "another long value", "x" * 60)
    console.print(table)
    lines = buf.getvalue().splitlines()
    assert lines[0] == sentence
    assert any("a cell with a long value in it" in line and "x" * 60 in line for line in lines)  # one row, one line
    assert "\x1b[" not in buf.getvalue()  # no colour codes in a log


def test_markup_in_the_program_text_still_renders(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr("sys.stdout", buf)
    make_console().print("[bold]sago-train run[/bold] 'x'")
    assert buf.getvalue() == "sago-train run 'x'\n"
