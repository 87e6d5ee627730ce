"""The wall-time bookkeeping of one training run that :class:`~sago_train.SAGOCallback`'s automatic cadence and
cost lines read: training time against evaluation time (the baseline apart), the costliest complete evaluation
and the last one without generation. Plain arithmetic on the times the callback passes in, so it is tested
without a Trainer or a real clock."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class EvalClock:
    """Times of one run since train start, in seconds of ``time.perf_counter``."""

    start: float  # the clock at train start
    step: int  # the global step at train start
    evals: float = 0.0  # time spent evaluating since train start
    baseline: float = 0.0  # the evaluation at the start step, before any training: a set-up cost
    full: float | None = None  # the costliest complete evaluation so far
    partial: float | None = None  # the last evaluation without generation
    train_at_last: float = 0.0  # training time when the last evaluation started

    def train_seconds(self, now: float) -> float:
        """Wall time since train start outside evaluations."""
        return max(1e-9, now - self.start - self.evals)

    def begin(self, now: float) -> None:
        """An evaluation starts at ``now``."""
        self.train_at_last = self.train_seconds(now)

    def add(self, seconds: float, *, partial: bool, at_start: bool) -> bool:
        """Record one evaluation's time; returns True for the first one without generation (worth a line)."""
        first = partial and self.partial is None
        self.evals += seconds
        if partial:
            self.partial = seconds
        else:
            self.full = max(seconds, self.full or 0.0)
        if at_start:
            self.baseline = seconds
        return first

    def steps_until_due(self, now: float, step: int, *, complete_next: bool, budget: float) -> int:
        """Training steps until the next evaluation fits ``budget`` (<= 0: it is due now).

        It fits once ``evals + next_eval + final_eval <= budget * train_time``: the evaluations since the first
        training step (the baseline before it is a one-off set-up cost, reported by the cost line), the next one
        at the last measured cost of its kind (a complete one's until one without generation has run), and a
        reserve for the final one, always complete, at the costliest complete evaluation so far (they grow as a
        model learns to answer); and once the training since the last evaluation has earned the next one
        (``next_eval / budget``), so that evaluations are spread over the run instead of bunched where the
        budget frees up. Steps are predicted from the measured time per step."""
        train_s = self.train_seconds(now)
        step_s = train_s / max(1, step - self.step)
        full = self.full or 0.0
        upcoming = full if complete_next or self.partial is None else self.partial
        needed_s = max((self.evals - self.baseline + upcoming + full) / budget, self.train_at_last + upcoming / budget)
        return math.ceil((needed_s - train_s) / step_s)
