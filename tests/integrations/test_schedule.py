"""The cadence: the automatic cadence's arithmetic (EvalClock) against hand-computed budgets, the planned
number of evaluations and the cost lines (issue 13, "Costs shown")."""

from __future__ import annotations

import pytest

from sago_train.integrations import schedule
from sago_train.integrations.schedule import EvalClock, planned_evaluations


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


@pytest.mark.parametrize("kw, expected", [
    (dict(eval_steps=5), 2),                                   # steps 5, 10
    (dict(eval_steps=3), 4),                                   # 3, 6, 9 and the final 10
    (dict(eval_steps=3, at_end=False), 3),
    (dict(trainer_strategy="steps", trainer_eval_steps=0.5), 2),
    (dict(trainer_strategy="steps", trainer_eval_steps=4.0), 3),
    (dict(trainer_strategy="epoch", epochs=3.0), 3),
    (dict(), None),                                            # the automatic cadence
])
def test_planned_evaluations(kw, expected):
    args = dict(max_steps=10, start_step=0, eval_steps=None, trainer_strategy="no", trainer_eval_steps=None,
                epochs=1.0, at_end=True) | kw
    assert planned_evaluations(**args) == expected
    # brute force for a fixed cadence: the multiples of `every` after the start, plus a final one
    if kw.get("eval_steps"):
        every = kw["eval_steps"]
        due = {s for s in range(1, 11) if s % every == 0} | ({10} if args["at_end"] else set())
        assert expected == len(due)


def test_cost_lines():
    assert schedule.cost_line(12.34, 4, 100, 0.05) == (
        "sago: one evaluation took 12.3 s; the cadence plans 4 more up to step 100: about 49 s (the share of "
        "training time follows once a few steps are timed)")
    assert schedule.cost_line(2.0, None, 100, 0.05) == (
        "sago: one evaluation took 2.0 s (the baseline, a one-off set-up cost); the automatic cadence keeps later "
        "evaluations, the final one included, within 5% of training time")
    assert schedule.share_line(0.5, 3, 100, 4, 12.5) == (
        "sago: at 0.50 s per training step (3 steps timed), training takes about 50 s; the 4 planned evaluations "
        "take 50 s, 100% of it")


@pytest.mark.parametrize("n, done, every", [(4, 1, 4), (9, 1, 4), (3, 1, 1), (5, 2, 3), (1, 1, 4), (0, 1, 4)])
def test_planned_complete_matches_brute_force(n, done, every):
    # evaluation i (0 = the baseline) is complete when i % every == 0 or it is the last (final) one
    want = sum(1 for i in range(done, done + n) if i % every == 0 or i == done + n - 1)
    assert schedule.planned_complete(n, done, every) == want


def test_cost_lines_with_generation_every():
    assert schedule.cost_line(10.0, 9, 100, 0.05, n_full=3, generation_every=4) == (
        "sago: one evaluation took 10.0 s; the cadence plans 9 more up to step 100 (3 complete, 6 without "
        "generation): at most 90 s (the share of training time follows once a few steps are timed)")
    assert schedule.cost_line(2.0, None, 100, 0.05, generation_every=4) == (
        "sago: one evaluation took 2.0 s (the baseline, a one-off set-up cost); the automatic cadence keeps later "
        "evaluations, the final one included, within 5% of training time; generation-based axes at every 4th "
        "evaluation only, the others cost less")
    # 3 complete at 10 s + 6 without generation at 4 s = 54 s over 100 steps x 1 s
    assert schedule.share_line(1.0, 3, 100, 9, 10.0, n_full=3, partial_s=4.0) == (
        "sago: at 1.00 s per training step (3 steps timed), training takes about 100 s; the 9 planned evaluations "
        "(3 complete, 6 without generation) take 54 s, 54% of it")
    assert schedule.share_line(1.0, 3, 100, 9, 10.0, n_full=3).endswith(
        "(3 complete, 6 without generation) take at most 90 s, at most 90% of it")
    assert schedule.partial_cost_line(4.0, 10.0, 4) == (
        "sago: an evaluation without generation-based axes took 4.0 s (40% of a complete one, 10.0 s); they are "
        "computed at every 4th evaluation (and at the final one)")
    # Ordinals: not "2th" / "3th" / "1th".
    assert "every 2nd evaluation (and at the final one)" in schedule.partial_cost_line(4.0, 10.0, 2)
    assert "every 3rd evaluation only" in schedule.cost_line(2.0, None, 100, 0.05, generation_every=3)
    assert [schedule._ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]


def test_auto_share_line_says_whether_the_final_evaluation_fits():
    # 40 steps x 8 s = 320 s; a 236 s final evaluation is 74% of it, over 5%
    assert schedule.auto_share_line(8.0, 3, 40, 236.0, 0.05) == (
        "sago: at 8.00 s per training step (3 steps timed), training takes about 320 s; the final evaluation "
        "alone (about 236 s) is 74% of it, over the 5% budget, so no periodic evaluation will run (eval_steps sets "
        "a cadence; a lower max_groups or max_new_tokens makes evaluations cheaper)")
    # 1000 steps x 2 s = 2000 s; 5% = 100 s >= a 60 s final evaluation
    assert schedule.auto_share_line(2.0, 3, 1000, 60.0, 0.05).endswith(
        "evaluations after the baseline will take at most 5% of it (about 100 s): the final one (about 60 s); a "
        "periodic one would need about 2400 s of training, so none is expected")
    # The real-model run in BENCHMARKS.md: 300 x 4.07 s = 1221 s, 5% = 61 s; the final (24 s) and one more complete
    # evaluation are covered after 976 s of training (that run trained faster, 965 s in all, and got none).
    assert schedule.auto_share_line(4.07, 3, 300, 24.4, 0.05).endswith(
        "the final one (about 24 s) and periodic ones while they fit (the first after about 976 s of training at "
        "most)")
