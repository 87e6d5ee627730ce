"""Progress lines for log files and the cadence's planned number of evaluations (issue 13, "Costs shown")."""

from __future__ import annotations

import logging

import pytest

from sago_train.integrations import progress
from sago_train.integrations.progress import SetProgress, planned_evaluations


def test_one_line_per_finished_set(monkeypatch):
    times = iter([100.0, 102.5, 110.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(times))
    lines: list[str] = []
    tick = SetProgress({"a": 6, "b": 4}, lines.append, label="sago step 0")
    for n in (3, 2):
        tick(n)
    assert lines == []
    tick(1)  # set a ends exactly at 6 sequences
    tick(4)
    assert lines == ["sago step 0: set 'a' done (1/2 sets, 6/10 sequences, 2.5 s)",
                     "sago step 0: set 'b' done (2/2 sets, 10/10 sequences, 10.0 s)"]


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


def test_console_only_when_logging_is_unconfigured(monkeypatch):
    lib = logging.getLogger("sago_train")
    monkeypatch.setattr(lib, "handlers", [])
    progress.ensure_console(logging.INFO)  # pytest has a root handler: nothing is added
    assert lib.handlers == []
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(lib, "propagate", True)
    monkeypatch.setattr(lib, "level", logging.NOTSET)
    progress.ensure_console(logging.INFO)
    assert len(lib.handlers) == 1 and lib.level == logging.INFO and lib.propagate is False


def test_cost_lines():
    assert progress.cost_line(12.34, 4, 100, 0.05) == (
        "sago: one evaluation took 12.3 s; the cadence plans 4 more up to step 100: about 49 s (the share of "
        "training time follows once a few steps are timed)")
    assert progress.cost_line(2.0, None, 100, 0.05) == (
        "sago: one evaluation took 2.0 s (the baseline, a one-off set-up cost); the automatic cadence keeps later "
        "evaluations, the final one included, within 5% of training time")
    assert progress.share_line(0.5, 3, 100, 4, 12.5) == (
        "sago: at 0.50 s per training step (3 steps timed), training takes about 50 s; the 4 planned evaluations "
        "take 50 s, 100% of it")


@pytest.mark.parametrize("n, done, every", [(4, 1, 4), (9, 1, 4), (3, 1, 1), (5, 2, 3), (1, 1, 4), (0, 1, 4)])
def test_planned_complete_matches_brute_force(n, done, every):
    # evaluation i (0 = the baseline) is complete when i % every == 0 or it is the last (final) one
    want = sum(1 for i in range(done, done + n) if i % every == 0 or i == done + n - 1)
    assert progress.planned_complete(n, done, every) == want


def test_cost_lines_with_generation_every():
    assert progress.cost_line(10.0, 9, 100, 0.05, n_full=3, generation_every=4) == (
        "sago: one evaluation took 10.0 s; the cadence plans 9 more up to step 100 (3 complete, 6 without "
        "generation): at most 90 s (the share of training time follows once a few steps are timed)")
    assert progress.cost_line(2.0, None, 100, 0.05, generation_every=4) == (
        "sago: one evaluation took 2.0 s (the baseline, a one-off set-up cost); the automatic cadence keeps later "
        "evaluations, the final one included, within 5% of training time; generation-based axes at every 4th "
        "evaluation only, the others cost less")
    # 3 complete at 10 s + 6 without generation at 4 s = 54 s over 100 steps x 1 s
    assert progress.share_line(1.0, 3, 100, 9, 10.0, n_full=3, partial_s=4.0) == (
        "sago: at 1.00 s per training step (3 steps timed), training takes about 100 s; the 9 planned evaluations "
        "(3 complete, 6 without generation) take 54 s, 54% of it")
    assert progress.share_line(1.0, 3, 100, 9, 10.0, n_full=3).endswith(
        "(3 complete, 6 without generation) take at most 90 s, at most 90% of it")
    assert progress.partial_cost_line(4.0, 10.0, 4) == (
        "sago: an evaluation without generation-based axes took 4.0 s (40% of a complete one, 10.0 s); they are "
        "computed at every 4th evaluation (and at the final one)")
    # Ordinals: not "2th" / "3th" / "1th".
    assert "every 2nd evaluation (and at the final one)" in progress.partial_cost_line(4.0, 10.0, 2)
    assert "every 3rd evaluation only" in progress.cost_line(2.0, None, 100, 0.05, generation_every=3)
    assert [progress._ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]


def test_auto_share_line_says_whether_the_final_evaluation_fits():
    # 40 steps x 8 s = 320 s; a 236 s final evaluation is 74% of it, over 5%
    assert progress.auto_share_line(8.0, 3, 40, 236.0, 0.05) == (
        "sago: at 8.00 s per training step (3 steps timed), training takes about 320 s; the final evaluation "
        "alone (about 236 s) is 74% of it, over the 5% budget, so no periodic evaluation will run (eval_steps sets "
        "a cadence; a lower max_groups or max_new_tokens makes evaluations cheaper)")
    # 1000 steps x 2 s = 2000 s; 5% = 100 s >= a 60 s final evaluation
    assert progress.auto_share_line(2.0, 3, 1000, 60.0, 0.05).endswith(
        "evaluations after the baseline will take at most 5% of it (about 100 s): the final one (about 60 s); a "
        "periodic one would need about 2400 s of training, so none is expected")
    # The real-model run in BENCHMARKS.md: 300 x 4.07 s = 1221 s, 5% = 61 s; the final (24 s) and one more complete
    # evaluation are covered after 976 s of training (that run trained faster, 965 s in all, and got none).
    assert progress.auto_share_line(4.07, 3, 300, 24.4, 0.05).endswith(
        "the final one (about 24 s) and periodic ones while they fit (the first after about 976 s of training at "
        "most)")
