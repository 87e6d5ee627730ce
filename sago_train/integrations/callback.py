"""``SAGOCallback``: SAGO evaluation inside a Hugging Face ``Trainer`` (or TRL ``SFTTrainer``) run.

Bind it to the Trainer explicitly (as TRL's callbacks are): ``SAGOCallback(sets, trainer=trainer)`` or
``callback.attach(trainer)`` (which adds it when it is not there yet). Bound, metrics go through ``Trainer.log``,
so every ``report_to`` integration receives them at the right global step, under ``eval_sago/<set>/<axis>``
(W&B shows ``eval/sago/<set>/<axis>``). Passed only in ``callbacks=[...]`` it still evaluates, writes the
history, and adds its metrics to ``trainer.state.log_history`` and to the Trainer's own evaluation metrics (so
``metric_for_best_model="sago/<set>/<axis>"`` works), but ``report_to`` integrations do not see them: the
Trainer does not hand callbacks to itself, and this callback does not look for it (a warning says so).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from .. import distributed
from ..data.sources import SetsLike, resolve_sets
from ..eval.config import IN_TRAINING_MAX_GROUPS, SAGOConfig
from ..io import release_run_lock
from ..results.evaluation import Evaluation
from ..results.records import EvalResult
from ..results.store import SAGO_DIR
from .best_metric import check_cadence, fill_missing, needs_complete, watched_key
from .cadence import EvalClock
from .costs import CostNotes
from .early_stopping import check_target
from .emit import log_metrics, report_extras, write_history
from .metrics import evaluation_metrics, headline_metrics, is_partial, partial_evaluation
from .monitor import MonitorState
from .options import CallbackOptions, MonitorOptions, check_monitor_options
from .progress import ensure_console, partial_cost_line
from .run import run_evaluator
from .setup import RNGGuard, check_can_evaluate, claim_run_dir, find_tokenizer, guard_reporters

logger = logging.getLogger(__name__)

class SAGOCallback(TrainerCallback):
    """Measure SAGO on held-out variant sets while a model trains.

    Args:
        sets: a :class:`VariantSet`, a dict name -> set or JSONL path, a path, or a list of these.
        eval_steps: evaluate every N optimizer steps. Default: whenever the Trainer evaluates; when the
            Trainer never evaluates (no eval dataset), an automatic cadence that keeps evaluation time within
            ``overhead_budget`` of training time.
        baseline: evaluate once before the first training step; later evaluations report their paired
            change against it (``..._vs_baseline``) and against the best evaluation so far (``..._vs_best``).
        overhead_budget: for the automatic cadence, the share of training wall time that evaluations may take,
            the final one included (0.05 = 5%); the baseline, before the first step, is a one-off set-up cost
            outside the budget (the cost line after it says what it took). The next step is re-estimated after
            every evaluation from measured times. A run shorter than about ``(eval_time + final_time) / budget``
            gets only the baseline and the final evaluation.
        generation_every: compute the axes that need greedy generation (generation, mirroring, accuracy, and
            confidence on groups without a reference) only at every N-th evaluation (counted from the baseline,
            also across a resume); the others compute the remaining axes, with identical values, without
            decoding. The baseline and the final evaluation are always complete (except when early stopping
            stops training at an evaluation without generation: that one is the last). An evaluation without
            generation has no ``instability`` (a mean over fewer axes would not compare), its comparisons cover
            the axes it has, and early stopping on a skipped axis only counts the evaluations that have it. When
            ``metric_for_best_model`` names a SAGO metric that needs generation, every evaluation at a Trainer
            evaluation step is complete.
        log_level: ``"default"``: each evaluation logs, per set, the axis means, ``instability`` and accuracy, plus
            the overall instability and the runtime; CI bounds, p-values, ``_vs_baseline`` / ``_vs_best`` and
            set-level figures go to ``history.jsonl`` and the W&B summary and tables only. ``"full"``: all of them
            in the Trainer log too. Either way the Trainer's evaluation metrics get every number, so
            ``metric_for_best_model`` may name any of them.
        raise_on_error: re-raise an exception from an evaluation instead of logging it and training on.
        trainer: the Trainer to log through (see the module doc); or bind later with :meth:`attach`.
        guard_reporters: opt-in: when bound, wrap the Trainer's reporting integrations so that one that fails
            (a W&B that cannot start or dies mid-run) is logged and switched off instead of stopping training.
            The integrations are not modified: each is wrapped in the Trainer's callback list.
        log_unstable_groups: rows of the W&B table of the most unstable groups (0 disables it).
        tokenizer: the tokenizer to evaluate with. Default: the Trainer's ``processing_class``, else its data
            collator's ``tokenizer``; the one used is named once at train start.
        overwrite: start a fresh (not resumed) run in an output directory that holds another run's SAGO history;
            the old ``history.jsonl`` is kept beside it as ``history.jsonl.<time>.old``. Without it such a run is
            refused at train start, so no history line is lost.
        soft_failures: when the callback cannot evaluate at all (no model or tokenizer), log it and count every
            skipped evaluation in ``failures`` instead of failing at train start.
        **options: evaluation options of ``sago-train eval`` (:class:`SAGOConfig` fields: ``axes``,
            ``layers``, ``pooling``, ``similarity``, ``max_new_tokens``, ``batch_size``, ``max_groups``, ``seed``...).
            ``max_groups`` not given (None) means 64 groups per set here (a seeded subset, the same at every
            evaluation), not every group as for ``sago-train eval``; ``max_groups=0`` evaluates every group.

    Example:
        >>> from transformers import Trainer
        >>> from sago_train import SAGOCallback, VariantSet
        >>> cb = SAGOCallback({"paraphrase": "sets/paraphrase.jsonl"}, eval_steps=100, max_groups=64)  # doctest: +SKIP
        >>> trainer = Trainer(model=model, args=args, train_dataset=ds)  # doctest: +SKIP
        >>> cb.attach(trainer)  # doctest: +SKIP
    """

    def __init__(
        self,
        sets: SetsLike,
        *,
        eval_steps: int | None = MonitorOptions.eval_steps,
        baseline: bool = MonitorOptions.baseline,
        overhead_budget: float = MonitorOptions.overhead_budget,
        generation_every: int = MonitorOptions.generation_every,
        log_level: str = MonitorOptions.log_level,
        raise_on_error: bool = CallbackOptions.raise_on_error,
        trainer: Any = None,
        guard_reporters: bool = CallbackOptions.guard_reporters,
        log_unstable_groups: int = CallbackOptions.log_unstable_groups,
        evaluate_at_end: bool = CallbackOptions.evaluate_at_end,
        config: SAGOConfig | None = None,
        tokenizer: Any = None,
        overwrite: bool = CallbackOptions.overwrite,
        soft_failures: bool = False,
        **options: Any,
    ) -> None:
        self.sets = resolve_sets(sets)
        config = config if config is not None else SAGOConfig.from_kwargs(**options)
        if config.max_groups is None:  # the in-training default: every evaluation costs training time
            config = dataclasses.replace(config, max_groups=IN_TRAINING_MAX_GROUPS)
        self.config = config
        check_monitor_options(eval_steps=eval_steps, generation_every=generation_every,
                              overhead_budget=overhead_budget, log_level=log_level)
        self.generation_every = generation_every
        self.eval_steps = eval_steps
        self.baseline = baseline
        self.overhead_budget = float(overhead_budget)
        self.log_level = log_level
        self.raise_on_error = raise_on_error
        self.guard_reporters = guard_reporters
        self.log_unstable_groups = log_unstable_groups
        self.evaluate_at_end = evaluate_at_end
        self.tokenizer = tokenizer
        self.overwrite = overwrite
        self.soft_failures = soft_failures
        self._cannot_evaluate: str | None = None  # why no evaluation can run (soft_failures), else None
        self._locked: Path | None = None
        self.trainer: Any | None = None
        self.monitor: MonitorState | None = None
        self.last_result: EvalResult | None = None
        self.last_metrics: dict[str, float] = {}
        self.failures: list[dict[str, Any]] = []
        self._auto = False
        self._next_auto: int | None = None
        self._clock: EvalClock | None = None
        self._costs = CostNotes()
        self._watched: str | None = None  # metric_for_best_model's key when it names a SAGO metric
        self._complete_for_trainer = False  # evaluations feeding the Trainer's best-model metric compute generation
        self._pending = False
        self._listeners: list[Any] = []
        self._attempted: set[int] = set()  # steps evaluated or tried (a failed step is not retried at the end)
        # Metrics per evaluated step, kept on every rank: decisions must not depend on rank 0's history file,
        # or ranks would disagree about evaluating (and an evaluation runs collectives).
        self._done: dict[int, dict[str, float]] = {}
        if trainer is not None:
            self.attach(trainer)

    @classmethod
    def from_args(cls, args: Any, *, trainer: Any = None, **kwargs: Any) -> SAGOCallback:
        """Build from parsed :class:`~sago_train.SAGOArguments` (``--sago_*`` flags of an ``HfArgumentParser`` or
        ``TrlParser`` script) and bind to ``trainer`` when given; ``kwargs`` (``tokenizer``, ``soft_failures``...)
        as in the constructor, winning over the flags."""
        return cls(args.variant_sets(), trainer=trainer, **{**args.callback_kwargs(), **kwargs})

    # ------------------------------------------------------------------ wiring
    def attach(self, trainer: Any) -> SAGOCallback:
        """Bind to ``trainer`` (adding this callback to it when it is not there yet): metrics then go through
        ``trainer.log`` to every ``report_to`` integration, and early-stopping callbacks in the Trainer are found.
        Returns ``self``."""
        self.trainer = trainer
        handler = trainer.callback_handler
        if self not in handler.callbacks:
            trainer.add_callback(self)
        if self.guard_reporters:
            guard_reporters(trainer)
        for cb in handler.callbacks:
            self.add_listener(cb)
        return self

    def add_listener(self, listener: Any) -> None:
        """Objects with ``on_sago_evaluate(args, state, control, *, result, evaluation, monitor)`` (early
        stopping); found in the Trainer when bound, else add them here."""
        if hasattr(listener, "on_sago_evaluate") and listener not in self._listeners:
            self._listeners.append(listener)
            if hasattr(listener, "connect"):
                listener.connect(self)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        if self.trainer is not None:
            # Resuming replaces stateful callbacks (early stopping) with restored instances: find them afresh.
            self._listeners = []
            self.attach(self.trainer)
        elif args.report_to and distributed.is_main_process():
            logger.warning("sago: SAGOCallback is not bound to the Trainer, so its metrics reach the history, "
                           "trainer.state.log_history and the Trainer's evaluation metrics but not %s; bind it with "
                           "SAGOCallback(..., trainer=trainer) or callback.attach(trainer)", ", ".join(args.report_to))
        self._check_can_evaluate(kwargs)
        self._check_best_model_metric(args, state)
        self.monitor = MonitorState(Path(args.output_dir) / SAGO_DIR)
        resumed = state.global_step > 0
        main = distributed.is_main_process()
        self._claim_output(resumed)
        self.monitor.load(state.global_step if resumed else None, write=main)
        self._done = {step: {} for step in self.monitor.steps()}
        self._check_listeners()
        self._auto = self.eval_steps is None and not self._trainer_evaluates(args)
        self._next_auto = None
        self._clock = EvalClock(time.perf_counter(), state.global_step)
        self._costs = CostNotes()
        if main:
            ensure_console(logging.INFO)
        if self.baseline and state.global_step not in self._done and not resumed:
            self._evaluate(args, state, control, kwargs, complete=True)

    def _check_best_model_metric(self, args: TrainingArguments, state: TrainerState) -> None:
        """``metric_for_best_model="sago/..."``: refuse a cadence that misses a Trainer evaluation; evaluations
        feeding the Trainer are complete when the watched metric needs generation (see :mod:`.best_metric`)."""
        self._watched = watched_key(args)
        check_cadence(args, state, self.eval_steps)
        self._complete_for_trainer = self.generation_every > 1 and needs_complete(self._watched, self.sets,
                                                                                  self.config)
        if self._complete_for_trainer and distributed.is_main_process():
            logger.info("sago: metric_for_best_model=%s needs generation: the SAGO evaluations at the Trainer's "
                        "evaluation steps compute every axis (generation_every=%d applies to the others)",
                        args.metric_for_best_model, self.generation_every)

    def _find_tokenizer(self, kwargs: dict[str, Any]) -> tuple[Any, str]:
        return find_tokenizer(self.tokenizer, kwargs, self.trainer)

    def _check_can_evaluate(self, kwargs: dict[str, Any]) -> None:
        """Fail at train start when no evaluation could ever run, instead of skipping each one silently."""
        self._cannot_evaluate = check_can_evaluate(kwargs, self._find_tokenizer(kwargs),
                                                   soft_failures=self.soft_failures)

    def _claim_output(self, resumed: bool) -> None:
        if self.monitor is not None:
            self._locked = claim_run_dir(self.monitor.root, resumed=resumed, overwrite=self.overwrite,
                                         locked=self._locked)

    def _release_lock(self) -> None:
        if self._locked is not None:
            release_run_lock(self._locked.parent)
            self._locked = None

    def _check_listeners(self) -> None:
        """Early stopping must watch a monitored set and a computed axis: fail before training, not later."""
        for listener in self._listeners:
            check_target(getattr(listener, "set_name", None), getattr(listener, "axis", None), self.sets,
                         [*self.config.axes, "instability"])
            if hasattr(listener, "warn_if_too_few_groups") and listener.set_name in self.sets:
                size, cap = len(self.sets[listener.set_name]), self.config.max_groups
                listener.warn_if_too_few_groups(min(size, cap) if cap else size)

    @staticmethod
    def _trainer_evaluates(args: TrainingArguments) -> bool:
        return str(getattr(args.eval_strategy, "value", args.eval_strategy)) != "no"

    def _schedule_auto(self, state: TrainerState) -> bool:
        """Automatic cadence: is an evaluation due now? If not, when should we look again?

        The step where the next evaluation fits the budget (:meth:`EvalClock.steps_until_due`) is predicted
        from the measured time per step; at that step the prediction is checked again with fresh timings (the
        first steps of a run are slower than the rest), so the decision converges in a few looks. Times are
        measured on rank 0 and broadcast, so every rank evaluates at the same step (an evaluation runs
        collectives)."""
        if self._clock is None:  # set in on_train_begin, before any step
            return False
        more = self._clock.steps_until_due(time.perf_counter(), state.global_step, budget=self.overhead_budget,
                                           complete_next=self._wants_generation(state, TrainerControl(), False))
        more = distributed.broadcast_object(more)
        if more <= 0:
            return True
        self._next_auto = state.global_step + more
        return False

    # ------------------------------------------------------------------ events
    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        self._costs.on_step(state, self._clock, self.overhead_budget)
        final = self.evaluate_at_end and (control.should_training_stop or state.global_step >= state.max_steps > 0)
        if final and state.global_step not in self._done and state.global_step not in self._attempted:
            # The final evaluation runs here, at the last step, not in on_train_end: by then the Trainer may
            # have loaded the best checkpoint (load_best_model_at_end), and the weights would not be this step's.
            if control.should_evaluate:
                self._pending = True
            else:
                self._evaluate(args, state, control, kwargs, complete=True)
            return
        if self._auto:
            if self._next_auto is not None and state.global_step < self._next_auto:
                return
            if not self._schedule_auto(state):
                return
        elif self.eval_steps is None or state.global_step % self.eval_steps != 0:
            return
        if control.should_evaluate:
            self._pending = True  # the Trainer evaluates right after: join its metrics in on_evaluate
        else:
            self._evaluate(args, state, control, kwargs)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, metrics=None,
                    **kwargs: Any):
        new: dict[str, float] = {}
        # A watched sago/ metric is measured at every Trainer evaluation: the cadence check covers the periodic
        # ones; this also covers eval_on_start without a baseline.
        if self._pending or (self.eval_steps is None and not self._auto) or self._watched is not None:
            self._pending = False
            if state.global_step in self._done:
                new = self._done[state.global_step]  # already measured at this step (e.g. eval_on_start)
            else:
                new = self._evaluate(args, state, control, kwargs, complete=self._complete_for_trainer)
        if metrics is not None:
            metrics.update(new)
            fill_missing(metrics, self._watched, args.greater_is_better, state.global_step)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        # Only a fallback: the final evaluation normally runs at the last step (see on_step_end); after
        # load_best_model_at_end the weights are the best checkpoint's, so measuring them here would mislabel.
        try:
            if not self.evaluate_at_end or self.monitor is None or args.load_best_model_at_end:
                return
            if state.global_step not in self._done and state.global_step not in self._attempted:
                self._evaluate(args, state, control, kwargs, complete=True)
        finally:
            self._release_lock()

    # ------------------------------------------------------------------ evaluation
    def _wants_generation(self, state: TrainerState, control: TrainerControl, complete: bool) -> bool:
        """Whether this evaluation computes the generation-based axes: the baseline (the first evaluation), the
        final one, and every ``generation_every``-th counted from the first (the count survives a resume: it
        is the number of evaluations in the history)."""
        final = control.should_training_stop or state.global_step >= state.max_steps > 0
        return complete or final or len(self._done) % self.generation_every == 0

    def _run_evaluator(self, model: Any, tokenizer: Any, args: TrainingArguments, step: int,
                       generation: bool = True) -> EvalResult:
        return run_evaluator(model, tokenizer, self.sets, self.config, step, disable_bar=args.disable_tqdm,
                             generation=generation)

    def _evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                  kwargs: dict[str, Any], complete: bool = False) -> dict[str, float]:
        model = kwargs.get("model")
        tokenizer, _ = self._find_tokenizer(kwargs)
        if model is None or tokenizer is None or self.monitor is None:
            # Only reachable with soft_failures=True (otherwise on_train_begin failed): counted, never silent.
            reason = self._cannot_evaluate or "SAGOCallback has no model or tokenizer"
            self._attempted.add(state.global_step)
            self.failures.append({"step": state.global_step, "error": f"skipped: {reason}"})
            logger.warning("sago: evaluation at step %d skipped: %s", state.global_step, reason)
            return {}
        start = time.perf_counter()
        if self._clock is not None:
            self._clock.begin(start)
        self._attempted.add(state.global_step)
        generation = self._wants_generation(state, control, complete or not self._done)
        try:
            with RNGGuard():
                result = self._run_evaluator(model, tokenizer, args, state.global_step, generation)
        except Exception as err:  # noqa: BLE001 - monitoring must never cost the training run
            if self.raise_on_error or distributed.world_size() > 1:
                # With several processes the other ranks may be waiting in a collective of this evaluation:
                # skipping on this rank alone would hang the job, so it fails loudly instead.
                raise
            self.failures.append({"step": state.global_step, "error": f"{type(err).__name__}: {err}"})
            logger.error("sago: evaluation at step %d failed and was skipped (%s: %s); training continues",
                         state.global_step, type(err).__name__, err, exc_info=True)
            return {}
        seconds = time.perf_counter() - start
        partial = is_partial(result)
        clock = self._clock
        if clock is not None:
            at_start = state.global_step == clock.step  # the baseline: a set-up cost, outside the budget
            if clock.add(seconds, partial=partial, at_start=at_start) and distributed.is_main_process():
                logger.info(partial_cost_line(seconds, clock.full, self.generation_every))
            if at_start and distributed.is_main_process():
                # Every evaluation is complete when all feed the Trainer's best-model metric.
                every = 1 if self._complete_for_trainer and self.eval_steps is None else self.generation_every
                self._costs.after_first(args, state, seconds, eval_steps=self.eval_steps, at_end=self.evaluate_at_end,
                                        done=len(self._done), generation_every=every, auto=self._auto,
                                        budget=self.overhead_budget)
        if self._auto and clock is not None and state.global_step > clock.step:
            # Look again one step later at the earliest; _schedule_auto then predicts the next due step.
            self._next_auto = state.global_step + 1
        evaluation = Evaluation.from_result(state.global_step, result)
        if partial:
            evaluation = partial_evaluation(evaluation)
        compare = self.monitor.compare(evaluation, alpha_seed=self.config.seed)
        self.monitor.observe(evaluation)
        self.last_result = result
        if distributed.is_main_process():
            for note in result.warnings:  # degenerate outputs: empty or question-independent generations
                logger.warning("sago: step %d: %s", state.global_step, note)
        metrics = evaluation_metrics(result, compare, seconds)
        self.last_metrics = metrics
        self._done[state.global_step] = metrics
        if distributed.is_main_process():
            write_history(self.monitor, state, result, compare, seconds, self.failures)
        logged = metrics if self.log_level == "full" else headline_metrics(metrics, result)
        log_metrics(self.trainer, logged, state, control)
        settings = {"eval_steps": self.eval_steps, "baseline": self.baseline, "log_level": self.log_level,
                    "overhead_budget": self.overhead_budget, "generation_every": self.generation_every,
                    "sets": list(self.sets), **self.config.to_dict()}
        report_extras(args, state, self.trainer, result, metrics, logged, settings, self.log_unstable_groups)
        for listener in self._listeners:
            listener.on_sago_evaluate(args, state, control, result=result, evaluation=evaluation, monitor=self.monitor)
        return metrics
