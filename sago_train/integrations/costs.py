"""The callback's cost lines: after the first evaluation of a run, what one costs and what the cadence will
cost in all; once a few training steps are timed, that cost's share of the estimated training time."""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import distributed
from .cadence import EvalClock
from .progress import auto_share_line, cost_line, planned_complete, planned_evaluations, share_line

logger = logging.getLogger("sago_train.integrations.callback")  # the callback's log, as setup.py


class CostNotes:
    """Says the planned cost once (:meth:`after_first`), then its share once 3 steps are timed (:meth:`on_step`)."""

    def __init__(self) -> None:
        self._cost: dict[str, float] | None = None  # the cadence's planned cost, until its share can be said

    def after_first(self, args: Any, state: Any, seconds: float, *, eval_steps: int | None, at_end: bool,
                    done: int, generation_every: int, auto: bool, budget: float) -> None:
        """After the first evaluation of the run (``done`` evaluations before it): one line with its ``seconds``
        and the cadence's planned total."""
        n = planned_evaluations(
            max_steps=state.max_steps, start_step=state.global_step, eval_steps=eval_steps,
            trainer_strategy=str(getattr(args.eval_strategy, "value", args.eval_strategy)),
            trainer_eval_steps=args.eval_steps, epochs=args.num_train_epochs, at_end=at_end)
        n_full = None if n is None else planned_complete(n, done + 1, generation_every)
        self._cost = None if n is None else {"n": n, "seconds": seconds, "n_full": n_full}
        if n is None and auto and state.max_steps > 0:  # the automatic cadence: say whether it can fit
            self._cost = {"n": 0, "seconds": seconds, "n_full": 0, "auto": 1.0}
        logger.info(cost_line(seconds, n, state.max_steps, budget, n_full=n_full, generation_every=generation_every))

    def on_step(self, state: Any, clock: EvalClock | None, budget: float) -> None:
        """At a step end: once 3 steps after the start are timed, the planned cost's share (said once)."""
        if self._cost is None or clock is None or state.global_step - clock.step < 3:
            return
        cost, self._cost = self._cost, None
        if not distributed.is_main_process():
            return
        steps = state.global_step - clock.step
        step_s = clock.train_seconds(time.perf_counter()) / steps
        if cost.get("auto"):
            logger.info(auto_share_line(step_s, steps, state.max_steps - clock.step, cost["seconds"], budget))
            return
        logger.info(share_line(step_s, steps, state.max_steps - clock.step, int(cost["n"]), cost["seconds"],
                               n_full=int(cost["n_full"]), partial_s=clock.partial))
