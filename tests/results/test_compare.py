"""The one room for comparison (issue #31): a typed Change and Comparison that read a history written before
they existed (``tests/fixtures/history_a37d3cf``, written by commit a37d3cf with
``tests/fixtures/make_history_a37d3cf.py``) unchanged, and the one list of what may be watched."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from sago_train.analysis.report import _since_baseline
from sago_train.functional import stats
from sago_train.results.compare import (
    Change,
    Comparison,
    watchable,
    watchable_in,
)
from sago_train.results.monitor import MonitorState
from sago_train.results.store import Run

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "history_a37d3cf"


def _old_form(block: dict) -> dict:
    """A ``compare`` block in a37d3cf's form: ``p_worse`` was called ``p_value``."""
    return {s: {q: {label: {("p_value" if k == "p_worse" else k): v for k, v in c.items()} for label, c in e.items()}
                for q, e in per_q.items()} for s, per_q in block.items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    root = tmp_path_factory.mktemp("old") / "history_a37d3cf"
    shutil.copytree(FIXTURE, root)  # a reader must not need to write, but a copy keeps the fixture untouched
    return Run.read(root.parent, root, root.name)


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads((FIXTURE / "expected.json").read_text())


def test_the_old_history_reads_back_with_the_same_values_and_verdicts(run):
    assert [int(h["step"]) for h in run.history] == [0, 2, 4, 6]
    seen = 0
    for line in run.history:
        block = line.get("compare") or {}
        comparison = Comparison.from_dict(block, line["step"])
        for s, per_q in block.items():
            for q, entry in per_q.items():
                for label, old in entry.items():
                    change = comparison.get(s, q, label)
                    assert "p_value" in old and "p_worse" not in old  # written by a37d3cf
                    assert change.p_worse == old["p_value"]  # p_value read as p of "worse"
                    assert change.verdict == old["verdict"] and change.n == old["n"]
                    assert change.reference_step == old["step"]
                    assert (change.mean_diff, change.ci_low, change.ci_high, change.p_better) == \
                        tuple(math.nan if old.get(k) is None else old[k] for k in
                              ("mean_diff", "ci_low", "ci_high", "p_better"))
                    assert change.kind == old.get("kind")
                    seen += 1
        assert _old_form(comparison.to_dict()) == block  # nothing lost but the key's name
    assert seen > 20 and any(c.verdict == stats.WORSE for _, c in Comparison.from_dict(run.history[-1]["compare"]))


def test_the_report_reads_the_old_history_as_before(run, expected):
    rows, warnings = _since_baseline(run)
    assert [list(r) for r in rows] == expected["since_baseline"] and warnings == expected["warnings"]


def test_a_monitor_recomputes_the_old_changes_and_best(run, expected):
    """The same changes against the baseline as a37d3cf's monitor, with one fix. a37d3cf emptied its record of the
    baseline's degenerate sets by aliasing (an ``-=`` on the same set object), so a set whose outputs ignored the
    question from the baseline on never had a best (and a "better" verdict there would read ``degenerate
    outputs``). The fixture's one set is such a set. It now keeps the rule's verdicts and its best, as early
    stopping and report already did: the changes against the baseline are a37d3cf's, and the changes against the
    best are new."""
    from sago_train.results.best import Best

    replay = MonitorState(FIXTURE)  # compare and observe do no I/O
    best = Best()
    for line in run.history:
        ev = run.evaluation(int(line["step"]))
        got = _old_form(replay.compare(ev, seed=0).to_dict())
        want = expected["recomputed"][str(line["step"])]
        assert {s: {q: e.get("vs_baseline") for q, e in per_q.items()} for s, per_q in got.items()} == \
            {s: {q: e.get("vs_baseline") for q, e in per_q.items()} for s, per_q in want.items()}
        assert not any(c.get("verdict") == stats.DEGENERATE for per_q in got.values() for e in per_q.values()
                       for c in e.values())
        replay.observe(ev)
        best.observe(ev.slim(), skip=set())
    assert replay.baseline_degenerate == {"num"} and expected["best"] == {}
    assert {k: e.step for k, e in replay.best.entries.items()} == {k: e.step for k, e in best.entries.items()} != {}


def test_a_change_says_its_side_and_reads_its_old_name():
    c = Change.from_dict({"mean_diff": -0.2, "ci_low": -0.3, "ci_high": -0.1, "p_value": 0.001, "p_better": 0.9,
                          "n": 12, "step": 0}, "accuracy", "s")
    assert c.verdict == stats.WORSE and c.p == c.p_worse == 0.001 and c.worse_by == pytest.approx(0.2)
    assert c.to_dict()["p_worse"] == 0.001 and "p_value" not in c.to_dict()
    better = Change.from_dict({"mean_diff": -0.2, "ci_low": -0.3, "ci_high": -0.1, "p_worse": 0.999,
                               "p_better": 0.001, "n": 12}, "activation", "s")
    assert better.verdict == stats.BETTER and better.p == 0.001 and better.worse_by == pytest.approx(-0.2)


def test_one_answer_to_what_early_stopping_may_watch(run):
    assert watchable(["confidence"]) == ["confidence", "instability", "accuracy"]
    assert watchable(["confidence"], correctness=False) == ["confidence", "instability"]
    s = run.evaluation(6).sets["num"]
    assert watchable_in(s) == [*s.axes, "instability", "accuracy"]
