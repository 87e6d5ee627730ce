"""The automatic cadence's arithmetic (EvalClock), against hand-computed budgets."""

from __future__ import annotations

import pytest

from sago_train.integrations.cadence import EvalClock


@pytest.mark.parametrize("clock, complete_next, want_more", [
    # 100 training steps in 200 s (2 s/step), a 5% budget; the baseline (10 s) is outside it.
    # Only the baseline so far; the next skips generation, not measured yet -> at the complete cost:
    # (0 + 10 + 10 final) / 0.05 = 400 s of training -> 200 s more -> 100 steps
    (dict(evals=10.0, baseline=10.0, full=10.0), False, 100),
    # + one at 2 s without generation; the next is complete: (2 + 10 + 10) / 0.05 = 440 s -> 120 steps
    (dict(evals=12.0, baseline=10.0, full=10.0, partial=2.0), True, 120),
    # + a complete one at 10 s; the next skips generation, at its measured 2 s: (12 + 2 + 10) / 0.05 = 480 s
    (dict(evals=22.0, baseline=10.0, full=10.0, partial=2.0), False, 140),
    # spacing: the budget allows one now ((0.5 + 0.5 + 1) / 0.05 = 40 s), but the last evaluation started at
    # 195 s of training and the next (0.5 s) needs 0.5 / 0.05 = 10 s of training after it: 205 s -> 3 steps
    (dict(evals=1.5, baseline=1.0, full=1.0, partial=0.5, train_at_last=195.0), False, 3),
])
def test_steps_until_due(clock, complete_next, want_more):
    c = EvalClock(start=0.0, step=0, **clock)
    now = 200.0 + c.evals  # 200 s of training
    assert c.steps_until_due(now, 100, complete_next=complete_next, budget=0.05) == want_more


def test_add_keeps_the_costliest_complete_and_the_last_partial():
    c = EvalClock(start=0.0, step=0)
    assert c.add(10.0, partial=False, at_start=True) is False
    assert c.add(2.0, partial=True, at_start=False) is True  # the first without generation
    assert c.add(3.0, partial=True, at_start=False) is False
    c.add(8.0, partial=False, at_start=False)
    assert (c.evals, c.baseline, c.full, c.partial) == (23.0, 10.0, 10.0, 3.0)
    c.add(12.0, partial=False, at_start=False)
    assert c.full == 12.0
    c.begin(100.0)
    assert c.train_at_last == 100.0 - 35.0
