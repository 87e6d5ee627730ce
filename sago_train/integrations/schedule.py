"""When :class:`~sago_train.SAGOCallback` evaluates and what that costs: the cadence (every ``eval_steps``, at
the Trainer's evaluations, or an automatic cadence within ``overhead_budget`` of training time), which
evaluations compute the generation-based axes (``generation_every``), the rules that ``metric_for_best_model =
"sago/..."`` adds (SAGO must measure at every Trainer evaluation, with the watched axis), and the cost lines the
run prints. The clock is plain arithmetic on the times passed in, so it is tested without a Trainer."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from .. import distributed
from ..data.groups import VariantSet
from ..errors import SagoInputError
from ..eval.config import SAGOConfig
from ..eval.plan import axes_computed, select_groups
from ..formatting import printable
from ..functional.axes import ACCURACY, INSTABILITY, get_axis
from .keys import PREFIX, trainer_key
from .options import MonitorOptions

logger = logging.getLogger("sago_train.integrations.callback")  # the callback's log

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


def planned_evaluations(*, max_steps: int, start_step: int, eval_steps: int | None, trainer_strategy: str,
                        trainer_eval_steps: float | None, epochs: float, at_end: bool) -> int | None:
    """How many evaluations after the baseline the chosen cadence will run up to ``max_steps``; None for the
    automatic cadence (bounded by its overhead budget instead) or an unknown length."""
    if max_steps <= 0:
        return None
    if eval_steps is not None:
        every = eval_steps
    elif trainer_strategy == "steps" and trainer_eval_steps:
        every = max(1, round(trainer_eval_steps * max_steps)) if trainer_eval_steps < 1 else int(trainer_eval_steps)
    elif trainer_strategy == "epoch":
        return max(1, round(epochs))
    else:
        return None
    n = max_steps // every - start_step // every
    return n + int(at_end and max_steps % every != 0)


def planned_complete(n: int, done: int, every: int) -> int:
    """How many of the ``n`` evaluations after the ``done`` ones are complete (with generation): every
    ``every``-th counted from the first evaluation, and the last one (the final evaluation) always."""
    full = sum(1 for i in range(done, done + n) if i % every == 0)
    return full + int(n > 0 and (done + n - 1) % every != 0)


def _split(n: int, n_full: int) -> str:
    return "" if n_full >= n else f" ({n_full} complete, {n - n_full} without generation)"


def _ordinal(n: int) -> str:
    """2 -> '2nd', 11 -> '11th', 23 -> '23rd'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def cost_line(seconds: float, n: int | None, max_steps: int, budget: float, *, n_full: int | None = None,
              generation_every: int = 1) -> str:
    """The line after the baseline: one (complete) evaluation's time and the cadence's planned total (``n``
    evaluations, ``n_full`` of them complete; None: the automatic cadence, bounded by ``budget``). Evaluations
    without generation are counted at the complete one's cost until one is measured: an upper bound."""
    every = "" if generation_every == 1 else (f"; generation-based axes at every {_ordinal(generation_every)} evaluation "
                                              "only, the others cost less")
    if n is None:
        return (f"sago: one evaluation took {seconds:.1f} s (the baseline, a one-off set-up cost); the automatic "
                f"cadence keeps later evaluations, the final one included, within {100 * budget:.0f}% of training "
                f"time{every}")
    n_full = n if n_full is None else n_full
    bound = "about" if n_full >= n else "at most"
    return (f"sago: one evaluation took {seconds:.1f} s; the cadence plans {n} more up to step {max_steps}"
            f"{_split(n, n_full)}: {bound} {n * seconds:.0f} s (the share of training time follows once a few "
            f"steps are timed)")


def partial_cost_line(seconds: float, full_s: float | None, every: int) -> str:
    """The line after the first evaluation without generation: its cost against a complete one's."""
    ratio = f" ({100 * seconds / full_s:.0f}% of a complete one, {full_s:.1f} s)" if full_s else ""
    return (f"sago: an evaluation without generation-based axes took {seconds:.1f} s{ratio}; they are computed at "
            f"every {_ordinal(every)} evaluation (and at the final one)")


def share_line(step_s: float, steps_timed: int, steps: int, n: int, seconds: float, *, n_full: int | None = None,
               partial_s: float | None = None) -> str:
    """The line once a few steps are timed: estimated training time and the planned evaluations' share of it
    (evaluations without generation at ``partial_s``, else at the complete one's ``seconds``: an upper bound)."""
    train_s = step_s * steps
    n_full = n if n_full is None else n_full
    total = n_full * seconds + (n - n_full) * (seconds if partial_s is None else partial_s)
    bound = "at most " if n_full < n and partial_s is None else ""
    return (f"sago: at {step_s:.2f} s per training step ({steps_timed} steps timed), training takes about "
            f"{train_s:.0f} s; the {n} planned evaluations{_split(n, n_full)} take {bound}{total:.0f} s, "
            f"{bound}{100 * total / train_s:.0f}% of it")


def auto_share_line(step_s: float, steps_timed: int, steps: int, final_s: float, budget: float) -> str:
    """The automatic cadence's line once a few steps are timed: whether the final evaluation (at the
    baseline's cost) fits the budget, i.e. whether any periodic evaluation can run."""
    train_s = step_s * steps
    head = (f"sago: at {step_s:.2f} s per training step ({steps_timed} steps timed), training takes about "
            f"{train_s:.0f} s; ")
    share = final_s / train_s
    if share > budget:
        return (head + f"the final evaluation alone (about {final_s:.0f} s) is {100 * share:.0f}% of it, over the "
                f"{100 * budget:.0f}% budget, so no periodic evaluation will run (eval_steps sets a cadence; a "
                "lower max_groups or max_new_tokens makes evaluations cheaper)")
    tail = (head + f"evaluations after the baseline will take at most {100 * budget:.0f}% of it (about "
            f"{budget * train_s:.0f} s): the final one (about {final_s:.0f} s)")
    # A periodic evaluation is earned once the budget of the training so far covers it and the final one; with a
    # complete evaluation's cost as the bound (the only cost measured yet) that is 2 * final / budget.
    first_s = 2 * final_s / budget
    if first_s > train_s:
        return tail + f"; a periodic one would need about {first_s:.0f} s of training, so none is expected"
    return tail + f" and periodic ones while they fit (the first after about {first_s:.0f} s of training at most)"


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


def _strategy(args: Any) -> str:
    return str(getattr(args.eval_strategy, "value", args.eval_strategy))


def check_cadence(args: Any, state: Any, eval_steps: int | None) -> None:
    """Refuse (before any evaluation is paid for) a SAGO cadence that misses some Trainer evaluation step while
    ``metric_for_best_model`` names a SAGO metric: the Trainer would rank that step's checkpoint on no
    measurement of it. ``eval_steps=None`` (follow the Trainer) always covers it."""
    key = trainer_key(getattr(args, "metric_for_best_model", None))
    if key is None or eval_steps is None:
        return
    strategy = _strategy(args)
    fix = ("drop SAGOCallback's eval_steps (SAGO then evaluates whenever the Trainer does), or choose a "
           "metric_for_best_model that is not a sago/ metric")
    need = (f"metric_for_best_model={args.metric_for_best_model!r} needs a SAGO value at every Trainer evaluation, "
            f"but SAGOCallback(eval_steps={eval_steps}) evaluates every {eval_steps} steps")
    if strategy == "epoch":
        raise SagoInputError(
            f"{need} and the Trainer every epoch (TrainingArguments(eval_strategy='epoch')): expected "
            f"SAGOCallback(eval_steps=None) with eval_strategy='epoch', got eval_steps={eval_steps}",
            key="eval_steps", hint=fix)
    if strategy == "steps":
        every = getattr(state, "eval_steps", None) or args.eval_steps
        if every and every >= 1 and int(every) % eval_steps != 0:
            raise SagoInputError(
                f"{need} and the Trainer every {int(every)} steps (TrainingArguments(eval_steps={args.eval_steps})): "
                f"expected the Trainer's eval_steps to be a multiple of {eval_steps}, got {int(every)}",
                key="eval_steps", hint=f"{fix}, or set TrainingArguments.eval_steps to a multiple of {eval_steps}")


def needs_complete(key: str | None, sets: dict[str, VariantSet], config: SAGOConfig) -> bool:
    """Whether the watched ``key`` would be absent from an evaluation without generation (see
    ``generation_every``): accuracy; an axis left out on its set (generation, mirroring, confidence on groups
    without a reference); ``instability`` whenever some axis is left out (it is then dropped everywhere)."""
    if key is None:
        return False
    rest = key.removeprefix(f"{PREFIX}/")
    skipped: dict[str, set[str]] = {}
    for name, vs in sets.items():
        groups = [vs[i] for i in select_groups(vs, config.max_groups, config.seed)]
        axes = [get_axis(a) for a in config.axes]
        kept = {a.name for a in axes_computed(axes, groups, generation=False)}
        skipped[name] = {a.name for a in axes} - kept
    if rest.startswith(INSTABILITY):
        return any(skipped.values())
    set_name, _, metric = rest.partition("/")
    if set_name not in sets:
        return False
    candidates = [*config.axes, INSTABILITY, ACCURACY]
    axis = max((c for c in candidates if metric == c or metric.startswith(f"{c}_")), key=len, default=None)
    if axis == ACCURACY:
        return True
    if axis == INSTABILITY:
        return any(skipped.values())
    return axis is not None and axis in skipped[set_name]


def trainer_evaluates(args: Any) -> bool:
    """Whether the Trainer itself evaluates (``eval_strategy`` other than ``"no"``)."""
    return _strategy(args) != "no"


class Schedule:
    """The cadence of one run: :meth:`start` at train start, :meth:`due` at each step end, :meth:`begin` and
    :meth:`finished` around each evaluation. Decisions that every rank must share (an evaluation runs
    collectives) are measured on rank 0 and broadcast."""

    def __init__(self, options: MonitorOptions) -> None:
        self.options = options
        self.auto = False
        self.next_auto: int | None = None
        self.clock: EvalClock | None = None
        self.costs = CostNotes()
        self.complete_for_trainer = False  # evaluations feeding the Trainer's best-model metric compute generation
        self.all_complete = False  # no axis computable without generation: every evaluation is complete

    def start(self, args: Any, state: Any, sets: dict[str, VariantSet], config: SAGOConfig) -> None:
        """At train start: refuse a cadence that misses a Trainer evaluation when ``metric_for_best_model`` names
        a SAGO metric; plan complete evaluations for it when it needs generation; start the clock."""
        opts = self.options
        check_cadence(args, state, opts.eval_steps)
        watched = trainer_key(getattr(args, "metric_for_best_model", None))
        self.complete_for_trainer = opts.generation_every > 1 and needs_complete(watched, sets, config)
        if self.complete_for_trainer and distributed.is_main_process():
            logger.info("sago: metric_for_best_model=%s needs generation: the SAGO evaluations at the Trainer's "
                        "evaluation steps compute every axis (generation_every=%d applies to the others)",
                        printable(args.metric_for_best_model), opts.generation_every)
        axes = [get_axis(a) for a in config.axes]
        self.all_complete = opts.generation_every > 1 and not any(
            axes_computed(axes, list(vs.groups), generation=False) for vs in sets.values())
        if self.all_complete and distributed.is_main_process():
            logger.info("sago: every axis (%s) needs greedy generation, so every evaluation is complete and "
                        "generation_every=%d has no effect; add an axis that needs none (e.g. axes=\"%s,activation_rel\") "
                        "for cheaper evaluations between", ", ".join(config.axes), opts.generation_every,
                        ",".join(config.axes))
        self.auto = opts.eval_steps is None and not trainer_evaluates(args)
        self.next_auto = None
        self.clock = EvalClock(time.perf_counter(), state.global_step)
        self.costs = CostNotes()

    def planned_steps(self, args: Any, state: Any, *, done: int, complete_only: bool = False) -> list[int] | None:
        """The steps of the evaluations the cadence plans from train start up to ``max_steps``: the baseline (a
        fresh run with ``baseline``), every ``eval_steps`` (else the Trainer's evaluations) and the final one;
        ``complete_only``: only those that compute the generation-based axes (:meth:`wants_generation`, with
        ``done`` evaluations in the history already). Epoch ends are placed at ``max_steps / epochs`` apart.
        None when the cadence cannot say: the automatic cadence (it follows measured times) or no ``max_steps``."""
        opts, last, start = self.options, int(state.max_steps or 0), int(state.global_step)
        strategy, every = _strategy(args), opts.eval_steps
        if last <= 0 or (every is None and (strategy not in ("steps", "epoch")
                                            or (strategy == "steps" and not args.eval_steps))):
            return None
        if every is None and strategy == "steps":
            every = max(1, math.ceil(args.eval_steps * last) if args.eval_steps < 1 else int(args.eval_steps))
        if every is None:
            epochs = float(getattr(state, "num_train_epochs", 0) or args.num_train_epochs)
            ends = {min(last, round(e * last / epochs)) for e in range(1, math.ceil(epochs) + 1)} if epochs > 0 else set()
            steps = sorted(s for s in ends if s > start)
        else:
            steps = list(range((start // every + 1) * every, last + 1, every))
        if opts.evaluate_at_end and last not in steps:
            steps.append(last)
        if opts.baseline and start == 0 and done == 0:
            steps.insert(0, 0)
        if not complete_only or opts.generation_every == 1 or self.all_complete or (
                self.complete_for_trainer and opts.eval_steps is None):
            return steps
        every_gen = opts.generation_every
        return [s for i, s in enumerate(steps, start=done) if i == 0 or i % every_gen == 0 or s == last]

    def is_final(self, state: Any, control: Any) -> bool:
        """The last training step (the run ends here, or early stopping stops it)."""
        return bool(control.should_training_stop) or state.global_step >= state.max_steps > 0

    def wants_generation(self, state: Any, control: Any, done: int, complete: bool) -> bool:
        """Whether the next evaluation computes the generation-based axes: the baseline (the first evaluation),
        the final one, and every ``generation_every``-th counted from the first (``done`` evaluations so far:
        the count survives a resume, it is the number of evaluations in the history)."""
        return (complete or self.all_complete or done == 0 or self.is_final(state, control)
                or done % self.options.generation_every == 0)

    def due(self, state: Any, done: int) -> bool:
        """Whether a periodic evaluation is due at this step end (``eval_steps``, or the automatic cadence)."""
        if not self.auto:
            every = self.options.eval_steps
            return every is not None and state.global_step % every == 0
        if self.next_auto is not None and state.global_step < self.next_auto:
            return False
        if self.clock is None:  # set in start, before any step
            return False
        # The step where the next evaluation fits the budget is predicted from the measured time per step; at
        # that step the prediction is checked again with fresh timings (the first steps of a run are slower than
        # the rest), so the decision converges in a few looks. Measured on rank 0 and broadcast.
        complete_next = state.global_step >= state.max_steps > 0 or done % self.options.generation_every == 0
        more = self.clock.steps_until_due(time.perf_counter(), state.global_step, budget=self.options.overhead_budget,
                                          complete_next=complete_next)
        more = distributed.broadcast_object(more)
        if more <= 0:
            return True
        self.next_auto = state.global_step + more
        return False

    def on_step(self, state: Any) -> None:
        self.costs.on_step(state, self.clock, self.options.overhead_budget)

    def begin(self) -> float:
        """An evaluation starts: returns the clock's time."""
        now = time.perf_counter()
        if self.clock is not None:
            self.clock.begin(now)
        return now

    def finished(self, args: Any, state: Any, seconds: float, *, partial: bool, done: int) -> None:
        """An evaluation took ``seconds``: record it, say what one costs after the first (and the first without
        generation), and look again at the automatic cadence one step later at the earliest."""
        clock = self.clock
        if clock is None:
            return
        main = distributed.is_main_process()
        at_start = state.global_step == clock.step  # the baseline: a set-up cost, outside the budget
        if clock.add(seconds, partial=partial, at_start=at_start) and main:
            logger.info(partial_cost_line(seconds, clock.full, self.options.generation_every))
        if at_start and main:
            opts = self.options
            # Every evaluation is complete when all feed the Trainer's best-model metric.
            every = 1 if self.complete_for_trainer and opts.eval_steps is None else opts.generation_every
            self.costs.after_first(args, state, seconds, eval_steps=opts.eval_steps, at_end=opts.evaluate_at_end,
                                   done=done, generation_every=every, auto=self.auto, budget=opts.overhead_budget)
        if self.auto and state.global_step > clock.step:
            self.next_auto = state.global_step + 1
