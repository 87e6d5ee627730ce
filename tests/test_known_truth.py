"""Signals with a known truth (docs/validity.md): a step whose outputs no longer depend on the question is never
"more stable" nor "best", on any axis, in the monitor, the report / compare and early stopping; a real fine-tune
that became right and consistent reads as one on the default axes (the committed SmolLM2 evaluations)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from sago_train import SAGOEarlyStoppingCallback
from sago_train.analysis.report import paired_against_first
from sago_train.functional import stats
from sago_train.functional.axes import DEFAULT_AXES
from sago_train.results.degenerate import degenerate_sets
from sago_train.results.evaluation import Evaluation
from sago_train.results.monitor import MonitorState

AXES = ("confidence", "generation", "mirroring", "activation")
N = 12


def _step(step: int, scale: float, outputs) -> Evaluation:
    """A set of N groups: axis values ``scale`` x a fixed per-group pattern, every variant right."""
    rng = np.random.default_rng(7)
    base = rng.uniform(0.2, 0.6, (N, len(AXES)))
    recs = [{"id": f"g{i}", "variants": [f"What is fact {i}?", f"Tell me fact {i}."], "reference": f"answer{i}",
             "outputs": outputs(i), "correct": [True, True],
             "axes": {a: float(scale * base[i, j] + 0.001 * step) for j, a in enumerate(AXES)}} for i in range(N)]
    return Evaluation.from_records(step, {"s": recs})


def healthy(step: int, scale: float) -> Evaluation:
    return _step(step, scale, lambda i: [f"answer{i}.", f"It is answer{i}."])


def collapsed(step: int, scale: float) -> Evaluation:
    return _step(step, scale, lambda i: ["Coyote.", "Coyote."])  # one answer to every question


def test_a_collapse_is_detected_only_where_it_is_new():
    assert degenerate_sets(collapsed(5, 0.3)) == {"s"} and degenerate_sets(healthy(5, 0.3)) == set()
    assert degenerate_sets(collapsed(5, 0.3), collapsed(0, 1.0)) == set()  # it ignored the question from the start


def test_a_collapsed_step_is_never_more_stable_in_report_or_compare():
    rows = paired_against_first([healthy(0, 1.0), collapsed(5, 0.3)])
    stability = [r for r in rows if r["axis"] in AXES]
    assert stability and all(r["outcome"] == stats.DEGENERATE for r in stability), stability
    assert all("more stable" not in r["verdict"] and "degenerate" in r["verdict"] for r in stability)
    # The same drop without the collapse is more stable.
    rows = paired_against_first([healthy(0, 1.0), healthy(5, 0.3)])
    assert all(r["outcome"] == stats.BETTER for r in rows if r["axis"] in AXES)


def test_a_collapsed_step_is_never_the_monitors_best_nor_better_than_the_baseline(tmp_path):
    monitor = MonitorState(tmp_path)
    monitor.observe(healthy(0, 1.0))
    monitor.observe(healthy(5, 0.8))
    changes = monitor.compare(collapsed(10, 0.3))
    monitor.observe(collapsed(10, 0.3))
    for axis in AXES:
        assert monitor.best[("s", axis)].step == 5, axis
        assert changes.get("s", axis).verdict == stats.DEGENERATE
    assert monitor.compare(healthy(15, 0.3)).get("s", "generation").verdict == stats.BETTER


@pytest.mark.parametrize("axis", AXES)
def test_early_stopping_never_takes_a_collapsed_step_as_best(axis):
    cb = SAGOEarlyStoppingCallback(f"sago/s/{axis}", patience=2)
    args = TrainingArguments(output_dir="/tmp/unused", report_to=[])
    for ev in (healthy(0, 1.0), healthy(5, 0.8), collapsed(10, 0.3), healthy(15, 0.7)):
        cb.on_sago_evaluate(args, TrainerState(global_step=ev.step), TrainerControl(), result=None, evaluation=ev)
    assert cb.best_step == 15
    assert [d.get("degenerate") is not None for d in cb.decisions] == [False, False, True, False]


# ------------------------------------------------------------------ a real fine-tune that became right and consistent
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "confidence-auc"


@pytest.fixture(scope="module")
def base_and_finetune():
    """SmolLM2-135M-Instruct and its 30-step LoRA fine-tune of recipes/demo-real.yaml on the held-out phrasings
    (benchmarks/confidence_auc.py; docs/validity.md)."""
    return Evaluation.read(RESULTS / "base"), Evaluation.read(RESULTS / "finetune")


def test_the_finetune_became_right_and_consistent(base_and_finetune):
    """The known truth: accuracy rose on every set, and on two of three sets every variant of more groups is right."""
    rows = {(r["set"], r["axis"]): r for r in paired_against_first(list(base_and_finetune))}
    assert all(rows[(s, "accuracy")]["outcome"] == stats.BETTER for s in ("paraphrase", "format", "typo"))
    assert sum(rows[(s, "accuracy_all")]["outcome"] == stats.BETTER for s in ("paraphrase", "format", "typo")) >= 2


def test_no_default_axis_reads_the_successful_finetune_as_less_stable(base_and_finetune, tmp_path):
    base, finetune = base_and_finetune
    rows = paired_against_first([base, finetune])
    for r in rows:
        if r["axis"] in DEFAULT_AXES:
            assert r["outcome"] == stats.BETTER, r  # report and compare
    monitor = MonitorState(tmp_path)  # the training log and the history
    monitor.observe(base)
    changes = monitor.compare(finetune)
    for name in changes.changes:
        for axis in DEFAULT_AXES:
            assert changes.get(name, axis).verdict == stats.BETTER, (name, axis)


@pytest.mark.parametrize("metric", ["sago/paraphrase/accuracy", "sago/paraphrase/generation",
                                    "sago/typo/confidence", "sago/format/generation"])
def test_early_stopping_on_a_recommended_metric_lets_the_finetune_go_on(base_and_finetune, metric):
    base, finetune = base_and_finetune
    cb = SAGOEarlyStoppingCallback(metric, patience=1, exclude_baseline=False)
    args, control = TrainingArguments(output_dir="/tmp/unused", report_to=[]), TrainerControl()
    for step, ev in ((0, base), (30, finetune)):
        ev.step = step
        cb.on_sago_evaluate(args, TrainerState(global_step=step), control, result=None, evaluation=ev)
    assert not control.should_training_stop and cb.best_step == 30
