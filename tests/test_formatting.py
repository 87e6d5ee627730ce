"""The one formatting helper: fixed significant digits, p-values floored at 1e-4, constant axes in one line."""

from __future__ import annotations

import math

import pytest
from rich.console import Console

from sago_train.analysis.display import constant_axes, print_result, set_table
from sago_train.formatting import constant_line, constant_value, fmt_ci, fmt_num, fmt_p, p_text
from sago_train.functional.stats import Summary
from sago_train.results.evaluation import Evaluation, GroupRecord, SetEvaluation


@pytest.mark.parametrize("value, text", [
    (0, "0.000"), (0.011, "0.0110"), (2.54e-3, "0.00254"), (1.0, "1.00"), (-0.5, "-0.500"), (123.456, "123"),
    (0.09996, "0.100"), (1.23e-5, "1.23e-05"), (2.5e6, "2.50e+06"), (None, "-"), (math.nan, "-"), (math.inf, "inf"),
])
def test_fmt_num_three_significant_digits(value, text):
    assert fmt_num(value) == text


@pytest.mark.parametrize("p, text, sentence", [
    (0.0, "< 1e-4", "p < 1e-4"), (5e-5, "< 1e-4", "p < 1e-4"), (1e-4, "0.000100", "p = 0.000100"),
    (0.017, "0.0170", "p = 0.0170"), (1.0, "1.00", "p = 1.00"), (None, "-", "p = -"),
])
def test_p_values_never_print_as_zero(p, text, sentence):
    assert fmt_p(p) == text
    assert p_text(p) == sentence


def test_ci_and_constant():
    assert fmt_ci(0.1234, 0.5) == "[0.123, 0.500]"
    assert fmt_ci(None, 0.5) == "-"
    assert constant_value(Summary(0.0, 0.0, 0.0, 8)) == 0.0
    assert constant_value({"mean": 0.25, "ci_low": 0.25, "ci_high": 0.25, "n": 3}) == 0.25
    assert constant_value(Summary(0.2, 0.1, 0.3, 8)) is None
    assert constant_value(Summary(math.nan, math.nan, math.nan, 0)) is None
    assert constant_line("mirroring", 0.0) == "mirroring: constant at 0.000 (left out of the tables and plots)"


def _result() -> Evaluation:
    groups = [GroupRecord(id=f"g{i}", variants=["a", "b"], kinds=None, outputs=None, reference=None,
                          scored_reference=None, axes={"activation": 0.1 * (i + 1), "mirroring": 0.0},
                          per_variant={"activation": [0.1, 0.2], "mirroring": [0.0, 0.0]}) for i in range(4)]
    s = SetEvaluation.from_groups(name="s", axes=["activation", "mirroring"], groups=groups, kinds=None, skipped={},
                  n_bootstrap=200)
    return Evaluation(sets={"s": s}, model="m", config={})


def test_a_constant_axis_is_one_line_not_a_row():
    result = _result()
    s = result.sets["s"]
    assert constant_axes(s) == {"mirroring": 0.0}
    console = Console(record=True, width=200)
    console.print(set_table(s))
    table = console.export_text()
    assert "activation" in table and "mirroring" not in table
    sm = s.summaries["activation"]
    row = next(line for line in table.splitlines() if "activation" in line)
    assert row.split("│")[2:5] == [f" {fmt_num(sm.mean)} ".rjust(13), f" {fmt_ci(sm.ci_low, sm.ci_high)} ".rjust(17), " 4 "]
    assert fmt_num(sm.mean) == "0.250"
    console = Console(record=True, width=200)
    print_result(result, console)
    text = console.export_text()
    assert "  mirroring: constant at 0.000 (left out of the tables and plots)\n" in text
    assert text.split("Findings")[0].count("mirroring") == 1  # no row in the set, kind or reliability tables


def test_user_text_is_never_markup_and_never_acts_on_the_terminal():
    """A kind '[/bold]' failed the table after the whole evaluation; ESC/OSC sequences in ids cleared the screen
    or retitled the terminal."""
    import io

    from sago_train.formatting import printable, user_text

    hostile = "kind [/bold] m[/x] \x1b[2J\x1b]0;title\x07 \u202eevil \\"
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(f"[bold]{user_text(hostile)}[/bold]")
    shown = buf.getvalue().rstrip("\n")
    assert shown == printable(hostile)
    assert "\x1b" not in shown and "\u202e" not in shown and "\x07" not in shown
    assert shown == "kind [/bold] m[/x] \\x1b[2J\\x1b]0;title\\x07 \\u202eevil \\"
    assert printable("plain ünïcode text") == "plain ünïcode text"
