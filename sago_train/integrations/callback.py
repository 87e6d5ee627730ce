"""``SAGOCallback``: SAGO evaluation inside a Hugging Face ``Trainer`` (or TRL ``SFTTrainer``) run.

Bind it to the Trainer explicitly (as TRL's callbacks are): ``SAGOCallback(sets, trainer=trainer)`` or
``callback.attach(trainer)`` (which adds it when it is not there yet). Bound, metrics go through ``Trainer.log``,
so every ``report_to`` integration receives them at the right global step, under ``eval_sago/<set>/<axis>``
(W&B shows ``eval/sago/<set>/<axis>``). Passed only in ``callbacks=[...]`` it still evaluates, writes the
history, and adds its metrics to ``trainer.state.log_history`` and to the Trainer's own evaluation metrics (so
``metric_for_best_model="sago/<set>/<axis>"`` works), but ``report_to`` integrations do not see them: the
Trainer does not hand callbacks to itself, and this callback does not look for it (a warning says so).

One evaluation, in :meth:`SAGOCallback._evaluate`, is a straight sequence: run it (:mod:`.measure`), compare
it with the baseline and the best so far and record it in the history (:mod:`sago_train.results.monitor`), report it (the
Trainer log, W&B, TensorBoard, the console: :mod:`.reporters`), then hand it to the listeners (early stopping).
When to evaluate is :mod:`.schedule`'s.
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
from ..errors import SagoInputError
from ..eval.config import SAGOConfig
from ..eval.plan import has_correctness
from ..formatting import printable
from ..io import set_aside
from ..model.tokenize import resolve_chat_template
from ..results import store
from ..results.compare import Comparison
from ..results.evaluation import Evaluation
from ..results.layout import SAGO_DIR
from ..results.monitor import MonitorState
from ..results.wording import run_summary_lines
from .early_stopping import check_target
from .fingerprint import FINGERPRINT_KEY, changed_sets, set_fingerprints
from .keys import fill_missing, trainer_key
from .measure import check_can_evaluate, ensure_console, find_tokenizer, run_evaluator
from .options import MonitorOptions, options_from_kwargs
from .reporters import guard_reporters, report
from .schedule import Schedule, needs_complete

logger = logging.getLogger(__name__)


class SAGOCallback(TrainerCallback):
    """Measure SAGO on held-out variant sets while a model trains.

    Args:
        sets: a :class:`VariantSet`, a dict name -> set or JSONL path, a path, or a list of these.
        options: a :class:`~sago_train.integrations.options.MonitorOptions` (when and how to evaluate: cadence,
            baseline, ``generation_every``, log level, ...; each field documents itself), as TRL's trainers take
            an ``SFTConfig``. Keyword arguments naming its fields (``eval_steps=100``) override it.
        config: a :class:`SAGOConfig` (what an evaluation computes: axes, layers, ``max_groups``, ...); or give
            its fields as keyword arguments. ``max_groups`` not given (None) means 64 groups per set here (a seeded
            subset, the same at every evaluation), not every group as for ``sago-train eval``; ``max_groups=0``
            evaluates every group.
        trainer: the Trainer to log through (see the module doc); or bind later with :meth:`attach`.
        tokenizer: the tokenizer to evaluate with. Default: the Trainer's ``processing_class``, else its data
            collator's ``tokenizer``, else the training dataloader's collator's; the one used is named once at
            train start.
        soft_failures: when the callback cannot evaluate at all (no model or tokenizer), log it and count every
            skipped evaluation in ``failures`` instead of failing at train start.

    Example:
        >>> from sago_train import SAGOCallback, bundled_sets
        >>> cb = SAGOCallback(bundled_sets(), eval_steps=100, max_groups=16)
        >>> cb.options.eval_steps, cb.config.max_groups, cb.options.generation_every
        (100, 16, 4)
    """

    def __init__(self, sets: SetsLike, options: MonitorOptions | None = None, *, config: SAGOConfig | None = None,
                 trainer: Any = None, tokenizer: Any = None, soft_failures: bool = False, **kwargs: Any) -> None:
        self.options, evaluation_options = options_from_kwargs(MonitorOptions, options, kwargs,
                                                               also=tuple(SAGOConfig.field_names()))
        if config is not None and evaluation_options:
            raise SagoInputError(f"pass either config= or evaluation options ({', '.join(evaluation_options)}), "
                                 "not both", key=next(iter(evaluation_options)))
        # Every evaluation costs training time: a capped subset by default.
        self.config = (config if config is not None else SAGOConfig.from_kwargs(**evaluation_options)).in_training()
        # Files are read lazily: only the groups the capped subset evaluates are parsed (the rest only counted).
        self.sets = resolve_sets(sets, max_groups=self.config.max_groups, seed=self.config.seed)
        # Recorded in every history line: a resume on an edited set (or other settings) is refused, see _resumable.
        self.fingerprints = set_fingerprints(self.sets, self.config)
        self.tokenizer = tokenizer
        self.soft_failures = soft_failures
        #: How warnings name a remedy: this callback's arguments (``sago-train run`` sets ``recipe``: its keys).
        self.remedy_style = "callback"
        self.trainer: Any | None = None
        self.monitor: MonitorState | None = None
        self.schedule = Schedule(self.options)
        self.last_result: Evaluation | None = None
        self.last_metrics: dict[str, float] = {}
        self.last_comparison = Comparison()
        self.failures: list[dict[str, Any]] = []
        self._cannot_evaluate: str | None = None  # why no evaluation can run (soft_failures), else None
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
        the Trainer log to every ``report_to`` integration, and early-stopping callbacks in the Trainer are
        found. Returns ``self``."""
        self.trainer = trainer
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        if self.options.guard_reporters:
            guard_reporters(trainer)
        for cb in trainer.callback_handler.callbacks:
            self.add_listener(cb)
        self._check_rendering(trainer)
        return self

    def _check_rendering(self, trainer: Any) -> None:
        """Warn when the Trainer's variant-group collator renders string prompts otherwise than this callback's
        evaluations do (the model would be judged on another prompt format than it is trained on)."""
        renderer = getattr(getattr(trainer, "data_collator", None), "renderer", None)
        if renderer is None or not hasattr(renderer, "chat_template"):
            return
        try:
            wanted = resolve_chat_template(self.config.chat_template, renderer.tokenizer)
        except SagoInputError:
            return  # the evaluator refuses the rule itself, with its own message
        if wanted != renderer.chat_template:
            logger.warning("sago: training renders string prompts with chat template '%s' but SAGOCallback evaluates "
                           "them with '%s'; give the trainer chat_template='%s' (or the collator the same rule)",
                           renderer.chat_template, wanted, self.config.chat_template)

    def add_listener(self, listener: Any) -> None:
        """Objects with ``on_sago_evaluate(args, state, control, *, evaluation, comparison, monitor, ...)`` (early
        stopping: the :class:`~sago_train.results.compare.Comparison` is this evaluation's changes);
        found in the Trainer when bound, else add them here."""
        if hasattr(listener, "on_sago_evaluate") and listener not in self._listeners:
            self._listeners.append(listener)
            if hasattr(listener, "connect"):
                listener.connect(self)

    # ------------------------------------------------------------------ train start
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        main = distributed.is_main_process()
        if self.trainer is not None:
            # Resuming replaces stateful callbacks (early stopping) with restored instances: find them afresh.
            self._listeners = []
            self.attach(self.trainer)
        elif args.report_to and main:
            logger.warning("sago: SAGOCallback is not bound to the Trainer, so its metrics reach the history, "
                           "trainer.state.log_history and the Trainer's evaluation metrics but not %s; bind it with "
                           "SAGOCallback(..., trainer=trainer) or callback.attach(trainer)", ", ".join(args.report_to))
        # Everything that could make every evaluation fail is checked before the first one is paid for.
        self._cannot_evaluate = check_can_evaluate(kwargs, self._find_tokenizer(kwargs),
                                                   soft_failures=self.soft_failures)
        self.schedule.start(args, state, self.sets, self.config)
        resumed = state.global_step > 0
        self.monitor = MonitorState(Path(args.output_dir) / SAGO_DIR)
        self.monitor.claim(resumed=resumed, overwrite=self.options.overwrite)
        try:
            self.monitor.load(state.global_step if resumed else None, write=main,
                              require_baseline=not self.options.new_baseline)
        except SagoInputError:
            self.monitor.release()
            raise
        new_baseline = resumed and self._new_baseline_needed(self.monitor, main)
        if new_baseline:  # early stopping's reference and looks were measured against the old baseline
            for listener in self._listeners:
                if hasattr(listener, "start_over"):
                    listener.start_over()
        self._done = {step: {} for step in self.monitor.steps()}
        if main:  # before the listeners' plan: early stopping's start-up line reaches the console
            ensure_console(logging.INFO)
        self._check_listeners(args, state)
        if self.options.baseline and state.global_step not in self._done and (not resumed or new_baseline):
            self._evaluate(args, state, control, kwargs, complete=True)

    def check_resume(self, history: list[dict[str, Any]], path: Path) -> tuple[str, int] | None:
        """The first monitored set whose fingerprint differs from the one ``history`` (the lines a resume keeps,
        read from ``path``) recorded, as ``(set, step)``, else None. Without ``new_baseline`` that is refused:
        the new evaluations would be paired by id with a baseline of other prompts (a fake change). Called at
        train start, and by ``sago-train run --resume`` before the model loads."""
        changed = changed_sets(history, self.fingerprints)
        if not changed:
            return None
        name, step = next(iter(changed.items()))
        if not self.options.new_baseline:
            raise SagoInputError(
                f"cannot resume: the monitored set '{name}' (its groups or the settings that change its numbers) "
                f"is not what {path} measured at step {step}; new evaluations would be compared with a baseline "
                "of other prompts", hint="restore the set and settings, or start a new baseline "
                "(sago-train run --resume --new-baseline, SAGOCallback(new_baseline=True)); the old history is kept")
        return name, step

    def _new_baseline_needed(self, monitor: MonitorState, main: bool) -> bool:
        """After a resume: :meth:`check_resume`; with ``new_baseline`` the old history is set aside whole and the
        resumed run starts a new one, its baseline measured now. Every rank reads the same history, so every
        rank decides the same."""
        try:
            changed = self.check_resume(monitor.history, monitor.history_path)
        except SagoInputError:
            monitor.release()
            raise
        if changed is None:
            return False
        if main:
            aside = set_aside(monitor.history_path)
            steps = store.set_aside_steps(monitor.root, None, aside)  # the new history's records never replace them
            logger.warning("sago: set '%s' changed since step %d: new baseline; the previous history was moved to "
                           "%s%s", *changed, printable(aside), f", its step folders to {printable(steps)}" if steps
                           else "")
        monitor.load(None)
        return True

    def _find_tokenizer(self, kwargs: dict[str, Any]) -> tuple[Any, str]:
        return find_tokenizer(self.tokenizer, kwargs, self.trainer)

    def _check_listeners(self, args: TrainingArguments, state: TrainerState) -> None:
        """Early stopping must watch a monitored set and a computed quantity, and reach its per-look level with
        the groups evaluated: fail before training, not later. Each listener learns the evaluations planned."""
        # A stopper over several metrics is checked and planned per metric (its watchers).
        for listener in [w for x in self._listeners for w in (getattr(x, "watchers", None) or [x])]:
            set_name = getattr(listener, "set_name", None)
            vs = self.sets.get(set_name) if set_name is not None else None
            correctness = vs is not None and has_correctness(vs.groups)
            watched = getattr(listener, "quantity", getattr(listener, "axis", None))  # a listener of before #31: .axis
            check_target(set_name, watched, self.sets, self.config.axes, correctness=correctness)
            if hasattr(listener, "plan") and vs is not None:
                cap = self.config.max_groups
                key = trainer_key(getattr(listener, "metric", None))
                needs = needs_complete(key, self.sets, self.config)
                steps = self.schedule.planned_steps(args, state, done=len(self._done), complete_only=needs)
                listener.plan(min(len(vs), cap) if cap else len(vs), steps)

    # ------------------------------------------------------------------ events
    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        self.schedule.on_step(state)
        step = state.global_step
        final = self.options.evaluate_at_end and self.schedule.is_final(state, control)
        if final and step not in self._done and step not in self._attempted:
            # The final evaluation runs here, at the last step, not in on_train_end: by then the Trainer may
            # have loaded the best checkpoint (load_best_model_at_end), and the weights would not be this step's.
            complete = True
        elif self.schedule.due(state, len(self._done)):
            complete = False
        else:
            return
        if control.should_evaluate:
            self._pending = True  # the Trainer evaluates right after: join its metrics in on_evaluate
        else:
            self._evaluate(args, state, control, kwargs, complete=complete)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, metrics=None,
                    **kwargs: Any):
        new: dict[str, float] = {}
        watched = trainer_key(getattr(args, "metric_for_best_model", None))
        # A watched sago/ metric is measured at every Trainer evaluation: the cadence check covers the periodic
        # ones; this also covers eval_on_start without a baseline.
        if self._pending or (self.options.eval_steps is None and not self.schedule.auto) or watched is not None:
            self._pending = False
            if state.global_step in self._done:
                new = self._done[state.global_step]  # already measured at this step (e.g. eval_on_start)
            else:
                new = self._evaluate(args, state, control, kwargs, complete=self.schedule.complete_for_trainer)
        if metrics is not None:
            metrics.update(new)
            if fill_missing(metrics, watched, args.greater_is_better):
                logger.warning("sago: no value for %s at step %s (the SAGO evaluation failed, was skipped or gave no "
                               "finite value); using the worst value so that this checkpoint is not chosen as the "
                               "best", printable(watched), state.global_step)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        # Only a fallback: the final evaluation normally runs at the last step (see on_step_end); after
        # load_best_model_at_end the weights are the best checkpoint's, so measuring them here would mislabel.
        try:
            if self.monitor is None:
                return
            done = state.global_step in self._done or state.global_step in self._attempted
            if self.options.evaluate_at_end and not args.load_best_model_at_end and not done:
                self._evaluate(args, state, control, kwargs, complete=True)
            if distributed.is_main_process():
                for line in run_summary_lines(self.monitor, self.last_comparison):
                    logger.info(printable(line))  # kinds are user text
        finally:
            if self.monitor is not None:
                self.monitor.release()

    # ------------------------------------------------------------------ one evaluation
    def _run_evaluator(self, model: Any, tokenizer: Any, args: TrainingArguments, step: int,
                       generation: bool = True) -> Evaluation:
        return run_evaluator(model, tokenizer, self.sets, self.config, step, disable_bar=args.disable_tqdm,
                             generation=generation, remedy_style=self.remedy_style)

    def _evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                  kwargs: dict[str, Any], complete: bool = False) -> dict[str, float]:
        """Run, compare, record, report, hand to the listeners; returns the evaluation's metrics ({} when it
        could not run: counted in ``failures``)."""
        step = state.global_step
        model = kwargs.get("model")
        tokenizer, _ = self._find_tokenizer(kwargs)
        self._attempted.add(step)
        if model is None or tokenizer is None or self.monitor is None:
            # Only reachable with soft_failures=True (otherwise on_train_begin failed): counted, never silent.
            reason = self._cannot_evaluate or "SAGOCallback has no model or tokenizer"
            self.failures.append({"step": step, "error": f"skipped: {reason}"})
            logger.warning("sago: evaluation at step %d skipped: %s", step, printable(reason))
            return {}
        main = distributed.is_main_process()
        # 1. run
        start = self.schedule.begin()
        generation = self.schedule.wants_generation(state, control, len(self._done), complete)
        try:
            ev = self._run_evaluator(model, tokenizer, args, step, generation)
        except Exception as err:  # noqa: BLE001 - monitoring must never cost the training run
            if self.options.raise_on_error or distributed.world_size() > 1:
                # With several processes the other ranks may be waiting in a collective of this evaluation:
                # skipping on this rank alone would hang the job, so it fails loudly instead.
                raise
            self.failures.append({"step": step, "error": f"{type(err).__name__}: {err}"})
            logger.error("sago: evaluation at step %d failed and was skipped (%s: %s); training continues",
                         step, type(err).__name__, printable(err), exc_info=True)
            return {}
        seconds = time.perf_counter() - start
        ev.step, ev.epoch = step, float(state.epoch or 0.0)
        self.schedule.finished(args, state, seconds, partial=ev.partial, done=len(self._done))
        # 2. compare with the baseline and the best so far
        comparison = self.monitor.compare(ev, seed=self.config.seed)
        baseline = self.monitor.baseline is None
        self.monitor.observe(ev)
        # 3. record
        if main:
            line = ev.to_history_line(baseline=baseline, compare=comparison.to_dict(), runtime_s=seconds,
                                      **{FINGERPRINT_KEY: {n: self.fingerprints[n] for n in ev.sets}})
            try:
                self.monitor.record(ev, line)
            except OSError as err:
                logger.error("sago: could not write the evaluation history (%s); training continues", printable(err))
                self.failures.append({"step": step, "error": f"OSError: {err}"})
        # 4. report
        settings = {**dataclasses.asdict(self.options), "sets": list(self.sets), **self.config.to_dict()}
        metrics = report(self.trainer, args, state, control, ev, comparison, seconds, self.options, self.monitor,
                         settings)
        self._done[step], self.last_result, self.last_metrics, self.last_comparison = metrics, ev, metrics, comparison
        # 5. the listeners (early stopping)
        for listener in self._listeners:
            listener.on_sago_evaluate(args, state, control, evaluation=ev, comparison=comparison, monitor=self.monitor)
        return metrics
