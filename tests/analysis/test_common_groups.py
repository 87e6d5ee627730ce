"""``common_groups``: what ``compare`` scores each set on, checked against a hand computation."""

from __future__ import annotations

import pytest

from sago_train.analysis.common_groups import scores, set_scope
from sago_train.results.evaluation import Evaluation


def _eval(label: str, n: int, correct: dict[int, list[bool]]) -> Evaluation:
    recs = [{"id": f"g{i}", "axes": {"activation": 0.1 * (i + 1)}, **({"correct": correct[i]} if i in correct else {})}
            for i in range(n)]
    ev = Evaluation.from_records(1, {"s": recs})
    ev.label = label
    return ev


def test_recomputed_accuracy_counts_the_groups_that_have_correctness():
    """The recorded accuracy's ``n`` is the number of groups with correctness (groups without a reference are
    never counted); recomputed on the common groups it must be the same count, not every common group."""
    a = _eval("A", 6, {0: [True, False], 1: [True, True], 4: [False, False]})
    b = _eval("B", 8, {0: [True, True], 2: [False, True]})  # g6, g7 are B's only: recomputed
    scope = set_scope([a, b], "s")
    assert scope.recompute and scope.ids == [f"g{i}" for i in range(6)]
    acc, _ = scores([a, b], scope, "accuracy")
    assert acc["A"].mean == pytest.approx(3 / 6) and acc["A"].n == 3
    assert acc["B"].mean == pytest.approx(3 / 4) and acc["B"].n == 2


def test_no_group_with_a_value_for_every_entry_is_not_ranked_on_each_entrys_own_groups():
    """Same groups, but the axis is defined on disjoint halves of them: the recorded means are over different
    groups, so ranking them would be exactly what compare promises not to do. No score, and a note saying why."""
    nan = float("nan")
    a = Evaluation.from_records(1, {"s": [{"id": f"g{i}", "axes": {"generation": 0.2 if i < 3 else nan}}
                                          for i in range(6)]})
    b = Evaluation.from_records(1, {"s": [{"id": f"g{i}", "axes": {"generation": 0.4 if i >= 3 else nan}}
                                          for i in range(6)]})
    a.label, b.label = "A", "B"
    scope = set_scope([a, b], "s")
    assert not scope.recompute and a.score("s", "generation").n == 3  # each recorded on its own 3 groups
    got, note = scores([a, b], scope, "generation")
    assert got == {} and "undefined on 6 of the 6 common groups" in note
    # An axis undefined for every entry on every group is simply absent: nothing to say.
    c = Evaluation.from_records(1, {"s": [{"id": f"g{i}", "axes": {"generation": nan}} for i in range(6)]})
    d = Evaluation.from_records(1, {"s": [{"id": f"g{i}", "axes": {"generation": nan}} for i in range(6)]})
    c.label, d.label = "C", "D"
    assert scores([c, d], set_scope([c, d], "s"), "generation") == ({}, None)
