"""What the callback says about an evaluation (reporters): accuracy and its variants carry the same paired
verdicts as every axis in the console lines, the run summary and the W&B details; a set whose accuracy fell
significantly gets a warning, and its "more stable" verdicts say "more stable but less accurate"
(docs/accuracy.md). The warning's error rates are measured by simulation through the monitor."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from sago_train.functional import stats
from sago_train.integrations.reporters import DETAIL_COLUMNS, detail_rows, log_wandb_extras
from sago_train.results.monitor import MonitorState
from sago_train.results.wording import CONSISTENTLY_WRONG, accuracy_warnings, change_lines, run_summary_lines

from .._helpers.forgetting import SET, evaluation, forgetting_pair


def _changes(before, after):
    monitor = MonitorState(root=None)  # type: ignore[arg-type] - observe/compare do no I/O
    monitor.observe(before)
    return monitor, monitor.compare(after)


def test_forgetting_reads_more_stable_but_less_accurate_with_a_warning():
    before, after = forgetting_pair()
    monitor, changes = _changes(before, after)
    per_q = changes.to_dict()[SET]
    assert per_q["accuracy"]["vs_baseline"]["verdict"] == stats.WORSE
    assert per_q["generation"]["vs_baseline"]["verdict"] == stats.BETTER
    # The recorded accuracy change is the paired change of the per-group accuracies (a plain reference).
    acc = [np.mean(g.correct) for g in after.sets[SET].groups]
    ref = [np.mean(g.correct) for g in before.sets[SET].groups]
    assert per_q["accuracy"]["vs_baseline"]["mean_diff"] == pytest.approx(np.mean(np.subtract(acc, ref)))
    [line] = change_lines(after, changes, monitor.baseline)
    assert line.startswith(f"sago step 40, set '{SET}' vs the baseline (step 0): ")
    parts = dict(p.split(" ", 1) for p in line.split(": ", 1)[1].split("; ") if not p.startswith("no significant"))
    for axis in ("activation", "generation", "instability"):
        assert parts[axis].endswith(f"{CONSISTENTLY_WRONG} (p < 1e-4)"), parts[axis]
    assert "less accurate (p" in parts["accuracy"]
    # Every accuracy quantity is on the line, said or summarized; the worst kind names the kind compared.
    assert "accuracy_all" in line and "accuracy_worst_kind (" in line
    [warning] = accuracy_warnings(after, changes, monitor.baseline)
    assert f"accuracy on set '{SET}' fell significantly since the baseline" in warning
    assert "forgetting" in warning and "consistently wrong model is perfectly stable" in warning
    monitor.observe(after)
    [head, row] = run_summary_lines(monitor, changes)
    assert "accuracy " in row and "accuracy_all " in row and "less accurate" in row and CONSISTENTLY_WRONG in row


def test_a_stable_accurate_model_gets_no_warning_and_plain_words():
    rng = np.random.default_rng(3)
    gen = rng.uniform(0.3, 0.5, 16)
    before = evaluation(0, 0.75, gen, seed=1)
    after = evaluation(40, 0.75, gen - rng.uniform(0.1, 0.2, 16), seed=1)  # the same answers, more stable
    monitor, changes = _changes(before, after)
    assert changes.to_dict()[SET]["accuracy"]["vs_baseline"]["verdict"] == stats.NO_DIFFERENCE
    assert accuracy_warnings(after, changes, monitor.baseline) == []
    [line] = change_lines(after, changes, monitor.baseline)
    assert "generation" in line and "more stable (p" in line and CONSISTENTLY_WRONG not in line


def test_detail_rows_carry_every_quantity_with_its_verdicts():
    before, after = forgetting_pair()
    _, changes = _changes(before, after)
    rows = {r[1]: dict(zip(["set", "quantity", *DETAIL_COLUMNS], r)) for r in detail_rows(after, changes)}
    assert set(rows) == {"activation", "generation", "instability", "accuracy", "accuracy_all",
                         "accuracy_worst_kind"}
    for q, row in rows.items():
        change = changes.to_dict()[SET][q]["vs_baseline"]
        assert (row["vs_baseline"], row["vs_baseline_p"], row["vs_baseline_verdict"]) == \
            (change["mean_diff"], change["p_worse"], change["verdict"])
        assert row["vs_best"] is None and row["vs_best_verdict"] is None  # step 0 is never the best
    assert rows["accuracy"]["mean"] == after.sets[SET].accuracy.mean
    assert rows["accuracy"]["vs_baseline_verdict"] == stats.WORSE
    assert rows["generation"]["mean"] == after.sets[SET].summaries["generation"].mean


def test_wandb_details_table_and_summary_hold_the_accuracy_verdicts(monkeypatch):
    """Through log_wandb_extras with a stand-in W&B module (the real one is exercised in test_callback)."""
    logged: dict = {}

    class Table:
        def __init__(self, columns, data=None):
            self.columns, self.data = columns, list(data or [])

        def add_data(self, *row):
            self.data.append(list(row))

    run = types.SimpleNamespace(summary={})
    fake = types.SimpleNamespace(run=run, Table=Table, Histogram=lambda values: list(values),
                                 config=types.SimpleNamespace(update=lambda *a, **k: None), log=logged.update)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    before, after = forgetting_pair()
    _, changes = _changes(before, after)
    args = types.SimpleNamespace(report_to=["wandb"])
    log_wandb_extras(args, types.SimpleNamespace(global_step=40), after, max_rows=0,
                     details={"eval_sago/capitals/accuracy_vs_baseline_p": 0.0003}, changes=changes)
    table = logged["eval/sago/details"]
    rows = {r[1]: dict(zip(table.columns, r)) for r in table.data}
    assert rows["accuracy"]["vs_baseline_verdict"] == stats.WORSE
    assert rows["accuracy_worst_kind"]["vs_baseline_verdict"] == changes.to_dict()[SET]["accuracy_worst_kind"]["vs_baseline"][
        "verdict"]
    summary = run.summary["eval/sago/details"]
    assert summary[f"{SET}/accuracy_vs_baseline_verdict"] == stats.WORSE
    assert summary[f"{SET}/generation_vs_baseline_verdict"] == stats.BETTER
    assert summary[f"{SET}/accuracy_vs_baseline_p"] == 0.0003


def _warning_rate(p_before: float, p_after: float, reps: int, n: int = 24) -> float:
    """Share of simulated evaluation pairs whose accuracy warning fires, through MonitorState.compare and
    accuracy_warnings (the callback's path); every variant right with the given probability."""
    fired = 0
    for rep in range(reps):
        gen = np.full(n, 0.3)
        before = evaluation(0, p_before, gen, seed=2 * rep, n_bootstrap=20)
        after = evaluation(5, p_after, gen, seed=2 * rep + 1, n_bootstrap=20)
        monitor, changes = _changes(before, after)
        fired += bool(accuracy_warnings(after, changes, monitor.baseline))
    return fired / reps


@pytest.mark.slow
def test_accuracy_warning_error_rates_by_simulation():
    """Under no change (every variant right with p = 0.6 before and after) the warning fires at most at the
    verdict rule's level (5%, one-sided, plus Monte Carlo slack); a real fall (0.6 -> 0.35) is warned about
    nearly always. 24 groups of 4 variants, as a small monitored set."""
    false_alarm = _warning_rate(0.6, 0.6, reps=300)
    power = _warning_rate(0.6, 0.35, reps=60)
    assert false_alarm <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / 300), false_alarm
    assert power >= 0.9, power


def test_log_lines_escape_kinds_ids_and_stop_strings(tmp_path, caplog):
    """Issue 22: the console lines of the callback (change since the baseline, notes, the run's summary) carried
    kinds as written: an ESC or OSC sequence in a kind cleared the screen or retitled the terminal of a training
    run. Every sago_train log line is inert text; the kinds read as their escapes."""
    import logging

    from sago_train import SAGOCallback
    from sago_train.data import VariantSet

    from .._helpers.trainer import make_trainer

    kinds = ["t\x1b]0;x\x07", "[/bold]", "p\x1b[2J"]  # the first is the worst kind (every accuracy is 0 here)
    groups = [{"id": f"g\x1b[2J{i}", "variants": [f"The number {i} is", f"number {i}:", f"Tell me {i}"],
               "kinds": kinds, "reference": f" {i}"} for i in range(8)]
    cb = SAGOCallback(VariantSet.from_records(groups, name="num"), eval_steps=2, max_new_tokens=3, n_bootstrap=100,
                      stop_strings=["\x1b]0;s\x07"])
    with caplog.at_level(logging.INFO, logger="sago_train"):
        make_trainer(tmp_path, callbacks=[cb], max_steps=4).train()
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("sago_train")]
    assert lines and not [x for x in lines if "\x1b" in x or "\x07" in x]
    assert any("accuracy_worst_kind (t\\x1b]0;x\\x07)" in x for x in lines), lines
    assert any("sago: summary of the run" in x for x in lines)
