"""``SAGOCallback``: SAGO evaluation inside a Hugging Face ``Trainer`` (or TRL ``SFTTrainer``) run.

Metrics go through ``Trainer.log`` so that every ``report_to`` integration receives them at the right
global step, under ``eval_sago/<set>/<axis>`` (W&B shows ``eval/sago/<set>/<axis>``); when the Trainer
itself evaluates, they are also added to its metrics so ``metric_for_best_model="sago/<set>/<axis>"`` works.
"""

from __future__ import annotations

import inspect
import logging
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from . import distributed
from .callback_setup import check_can_evaluate, claim_run_dir, find_tokenizer
from .config import SAGOConfig
from .data.groups import SetsLike, resolve_sets
from .evaluator import SAGOEvaluator
from .monitoring import MonitorState, Snapshot
from .results import EvalResult
from .stats import to_jsonable

logger = logging.getLogger(__name__)

PREFIX = "eval_sago"


def find_trainer(max_depth: int = 12) -> Any | None:
    """The ``transformers.Trainer`` whose callback handler is calling us.

    Callbacks are not handed the Trainer, but logging through ``Trainer.log`` is the only way to reach every
    ``report_to`` integration at the right step, so we look up the caller's frame (``CallbackHandler`` is
    always called from a Trainer method).
    """
    from transformers import Trainer

    frame = inspect.currentframe()
    try:
        for _ in range(max_depth):
            if frame is None:
                return None
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, Trainer):
                return candidate
            frame = frame.f_back
    finally:
        del frame
    return None


class _RNGGuard:
    """Save and restore every RNG an evaluation could touch, so monitoring never changes training."""

    def __enter__(self) -> _RNGGuard:
        self.py = random.getstate()
        self.np = np.random.get_state()
        self.torch = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return self

    def __exit__(self, *exc: Any) -> None:
        random.setstate(self.py)
        np.random.set_state(self.np)
        torch.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


EVENTS = [name for name in dir(TrainerCallback) if name.startswith("on_")]


def guard_reporters(trainer: Any) -> list[str]:
    """Make the Trainer's ``report_to`` integrations (W&B, TensorBoard, ...) fail softly.

    A reporter that raises (W&B failing to start, or dying mid-run) is logged once and switched off, so the
    other reporters, the SAGO history and the training run go on. Returns the names of guarded callbacks.
    """
    from transformers.integrations import INTEGRATION_TO_CALLBACK

    reporter_types = tuple(c for c in INTEGRATION_TO_CALLBACK.values() if isinstance(c, type))
    guarded = []
    for cb in trainer.callback_handler.callbacks:
        if not isinstance(cb, reporter_types) or getattr(cb, "_sago_guarded", False):
            continue
        cb._sago_guarded = True
        cb._sago_disabled = False
        for event in EVENTS:
            method = getattr(cb, event, None)
            if method is None:
                continue

            def safe(*args: Any, _method: Any = method, _cb: Any = cb, _event: str = event, **kwargs: Any) -> Any:
                if _cb._sago_disabled:
                    return None
                try:
                    return _method(*args, **kwargs)
                except Exception as err:  # noqa: BLE001 - a reporter must not cost the training run
                    _cb._sago_disabled = True
                    logger.error("sago: %s failed in %s (%s: %s); it is switched off, training, the other reporters "
                                 "and the SAGO history go on", type(_cb).__name__, _event, type(err).__name__, err)
                    return None

            setattr(cb, event, safe)
        guarded.append(type(cb).__name__)
    return guarded


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


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
            the baseline and the final one included (0.05 = 5%); the next step is re-estimated after every
            evaluation from measured times. A run shorter than about ``2 * eval_time / budget`` gets only the
            baseline and the final evaluation.
        raise_on_error: re-raise an exception from an evaluation instead of logging it and training on.
        guard_reporters: make the Trainer's reporting integrations fail softly (a W&B that cannot start or
            dies mid-run is logged and switched off instead of stopping training).
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

    Example:
        >>> from transformers import Trainer
        >>> from sago_train import SAGOCallback, VariantSet
        >>> cb = SAGOCallback({"paraphrase": "sets/paraphrase.jsonl"}, eval_steps=100, max_groups=64)  # doctest: +SKIP
        >>> trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb])  # doctest: +SKIP
    """

    def __init__(
        self,
        sets: SetsLike,
        *,
        eval_steps: int | None = None,
        baseline: bool = True,
        overhead_budget: float = 0.05,
        raise_on_error: bool = False,
        guard_reporters: bool = True,
        log_unstable_groups: int = 10,
        evaluate_at_end: bool = True,
        config: SAGOConfig | None = None,
        tokenizer: Any = None,
        overwrite: bool = False,
        soft_failures: bool = False,
        **options: Any,
    ) -> None:
        self.sets = resolve_sets(sets)
        self.config = config if config is not None else SAGOConfig.from_kwargs(**options)
        if eval_steps is not None and (not isinstance(eval_steps, int) or eval_steps < 1):
            from .errors import SagoInputError

            raise SagoInputError(f"expected a positive integer, got {eval_steps!r}", key="eval_steps")
        self.eval_steps = eval_steps
        self.baseline = baseline
        if not (isinstance(overhead_budget, (int, float)) and overhead_budget > 0 and math.isfinite(overhead_budget)):
            from .errors import SagoInputError

            raise SagoInputError(f"expected a positive number, got {overhead_budget!r}", key="overhead_budget")
        self.overhead_budget = float(overhead_budget)
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
        self._own_cadence: int | None = None
        self._auto = False
        self._next_auto: int | None = None
        self._clock: dict[str, float] = {}
        self._pending = False
        self._listeners: list[Any] = []
        self._attempted: set[int] = set()  # steps evaluated or tried (a failed step is not retried at the end)
        # Metrics per evaluated step, kept on every rank: decisions must not depend on rank 0's history file,
        # or ranks would disagree about evaluating (and an evaluation runs collectives).
        self._done: dict[int, dict[str, float]] = {}

    # ------------------------------------------------------------------ wiring
    def attach(self, trainer: Any) -> SAGOCallback:
        """Bind to a Trainer explicitly (done automatically when passed in ``callbacks=[...]``)."""
        self.trainer = trainer
        return self

    def add_listener(self, listener: Any) -> None:
        """Objects with ``on_sago_evaluate(args, state, control, result, snapshot)`` (early stopping)."""
        if listener not in self._listeners:
            self._listeners.append(listener)

    def _discover(self) -> None:
        if self.trainer is None:
            self.trainer = find_trainer()
        if self.trainer is not None:
            if self.guard_reporters:
                guard_reporters(self.trainer)
            for cb in self.trainer.callback_handler.callbacks:
                if hasattr(cb, "on_sago_evaluate"):
                    self.add_listener(cb)

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        self._discover()

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        # Resuming replaces stateful callbacks (early stopping) with restored instances: find them afresh.
        self._listeners = []
        self._discover()
        self._check_can_evaluate(kwargs)
        self.monitor = MonitorState(Path(args.output_dir) / "sago")
        resumed = state.global_step > 0
        main = distributed.is_main_process()
        self._claim_output(resumed)
        self.monitor.load(state.global_step if resumed else None, write=main)
        self._done = {int(h["step"]): {} for h in self.monitor.history}
        self._check_listeners()
        self._own_cadence = self._cadence(args, state)
        self._auto = self._own_cadence is None and self.eval_steps is None and not self._trainer_evaluates(args)
        self._next_auto = None
        self._clock = {"start": time.perf_counter(), "step": state.global_step, "eval": 0.0, "last_eval": 0.0}
        if self.baseline and state.global_step not in self._done and not resumed:
            self._evaluate(args, state, control, kwargs)

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
            from .io import release_run_lock

            release_run_lock(self._locked.parent)
            self._locked = None

    def _check_listeners(self) -> None:
        """Early stopping must watch a monitored set and a computed axis: fail before training, not later."""
        from .errors import SagoInputError

        axes = [*self.config.axes, "instability"]
        for listener in self._listeners:
            set_name, axis = getattr(listener, "set_name", None), getattr(listener, "axis", None)
            if set_name is not None and set_name not in self.sets:
                raise SagoInputError(f"early stopping watches set '{set_name}', which is not monitored; monitored "
                                     f"sets: {', '.join(self.sets)}", key="metric")
            if axis is not None and axis not in axes:
                raise SagoInputError(f"early stopping watches axis '{axis}', which is not computed; computed: "
                                     f"{', '.join(axes)}", key="metric")

    @staticmethod
    def _trainer_evaluates(args: TrainingArguments) -> bool:
        return str(getattr(args.eval_strategy, "value", args.eval_strategy)) != "no"

    def _cadence(self, args: TrainingArguments, state: TrainerState) -> int | None:
        """Fixed steps between our own evaluations; None when following the Trainer or the automatic cadence."""
        return self.eval_steps

    def _schedule_auto(self, state: TrainerState) -> bool:
        """Automatic cadence: is an evaluation due now? If not, when should we look again?

        An evaluation may run once ``eval_total + 2 * last_eval <= overhead_budget * train_time`` (all
        evaluation time, the baseline included, plus a reserve for the final one). The step where that
        holds is predicted from the measured time per step; at that step the prediction is checked again
        with fresh timings (the first steps of a run are slower than the rest), so the decision converges
        in a few looks. Times are measured on rank 0 and broadcast, so every rank evaluates at the same step
        (an evaluation runs collectives)."""
        now = time.perf_counter()
        steps = max(1, state.global_step - int(self._clock["step"]))
        train_s = max(1e-9, now - self._clock["start"] - self._clock["eval"])
        step_s = train_s / steps
        needed_s = (self._clock["eval"] + 2 * self._clock["last_eval"]) / self.overhead_budget
        more = math.ceil((needed_s - train_s) / step_s)
        more = distributed.broadcast_object(more)
        if more <= 0:
            return True
        self._next_auto = state.global_step + more
        return False

    # ------------------------------------------------------------------ events
    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        final = self.evaluate_at_end and (control.should_training_stop or state.global_step >= state.max_steps > 0)
        if final and state.global_step not in self._done and state.global_step not in self._attempted:
            # The final evaluation runs here, at the last step, not in on_train_end: by then the Trainer may
            # have loaded the best checkpoint (load_best_model_at_end), and the weights would not be this step's.
            if control.should_evaluate:
                self._pending = True
            else:
                self._evaluate(args, state, control, kwargs)
            return
        if self._auto:
            if self._next_auto is not None and state.global_step < self._next_auto:
                return
            if not self._schedule_auto(state):
                return
        elif self._own_cadence is None or state.global_step % self._own_cadence != 0:
            return
        if control.should_evaluate:
            self._pending = True  # the Trainer evaluates right after: join its metrics in on_evaluate
        else:
            self._evaluate(args, state, control, kwargs)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, metrics=None,
                    **kwargs: Any):
        new: dict[str, float] = {}
        if self._pending or (self._own_cadence is None and not self._auto):
            self._pending = False
            if state.global_step in self._done:
                new = self._done[state.global_step]  # already measured at this step (e.g. eval_on_start)
            else:
                new = self._evaluate(args, state, control, kwargs)
        if metrics is not None:
            metrics.update(new)
            self._ensure_best_model_metric(args, metrics)

    def _ensure_best_model_metric(self, args: TrainingArguments, metrics: dict[str, float]) -> None:
        """With ``metric_for_best_model="sago/..."`` the Trainer raises KeyError when the key is missing (a
        failed or skipped evaluation, a NaN mean, or a SAGO cadence other than the Trainer's). Monitoring must
        not cost the run, so the last known value stands in, or the worst possible one with a warning."""
        name = args.metric_for_best_model
        if not name or not name.removeprefix("eval_").startswith("sago/"):
            return
        key = name if name.startswith("eval_") else f"eval_{name}"
        if key in metrics:
            return
        known = [m[key] for _, m in sorted(self._done.items()) if key in m]
        if known:
            metrics[key] = known[-1]
        else:
            metrics[key] = -math.inf if args.greater_is_better else math.inf
            logger.warning("sago: no value for %s at step %s; using the worst value so that this checkpoint is "
                           "not chosen as the best", key, self.trainer.state.global_step if self.trainer else "?")

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        # Only a fallback: the final evaluation normally runs at the last step (see on_step_end); after
        # load_best_model_at_end the weights are the best checkpoint's, so measuring them here would mislabel.
        try:
            if not self.evaluate_at_end or self.monitor is None or args.load_best_model_at_end:
                return
            if state.global_step not in self._done and state.global_step not in self._attempted:
                self._evaluate(args, state, control, kwargs)
        finally:
            self._release_lock()

    # ------------------------------------------------------------------ evaluation
    def _progress(self, args: TrainingArguments, total: int) -> tuple[Callable[[int], None] | None, Any]:
        if args.disable_tqdm or not distributed.is_main_process():
            return None, None
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="SAGO eval", leave=False, dynamic_ncols=True)
        return bar.update, bar

    def _run_evaluator(self, model: Any, tokenizer: Any, args: TrainingArguments) -> EvalResult:
        config = self.config
        while True:
            evaluator = SAGOEvaluator(model, tokenizer, config=config)
            tick, bar = self._progress(args, evaluator.count_sequences(self.sets))
            try:
                return evaluator.evaluate(self.sets, progress=tick)
            except RuntimeError as err:
                # Under torch.distributed a retry on one rank would leave the others waiting in a collective.
                if not _is_oom(err) or config.batch_size == 1 or distributed.world_size() > 1:
                    raise
                # Out of memory: retry with half the batch (results do not depend on the batch size).
                logger.warning("sago: out of memory at batch size %d, retrying with %d", config.batch_size,
                               config.batch_size // 2)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                config = SAGOConfig(**{**config.to_dict(), "batch_size": max(1, config.batch_size // 2)})
            finally:
                if bar is not None:
                    bar.close()

    def _evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                  kwargs: dict[str, Any]) -> dict[str, float]:
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
        self._attempted.add(state.global_step)
        try:
            with _RNGGuard():
                result = self._run_evaluator(model, tokenizer, args)
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
        if self._clock:
            self._clock["eval"] += seconds
            self._clock["last_eval"] = seconds
            self._clock["eval_step"] = state.global_step
        if self._auto and state.global_step > int(self._clock["step"]):
            # Look again one step later at the earliest; _schedule_auto then predicts the next due step.
            self._next_auto = state.global_step + 1
        snap = Snapshot.from_result(state.global_step, result)
        compare = self.monitor.compare(snap, alpha_seed=self.config.seed)
        self.monitor.observe(snap)
        self.last_result = result
        if distributed.is_main_process():
            for note in result.warnings:  # degenerate outputs: empty or question-independent generations
                logger.warning("sago: step %d: %s", state.global_step, note)
        metrics = result.metrics(prefix=PREFIX)
        for name, axes in compare.items():
            for axis, entry in axes.items():
                for label, res in entry.items():
                    metrics[f"{PREFIX}/{name}/{axis}_{label}"] = res["mean_diff"]
                    metrics[f"{PREFIX}/{name}/{axis}_{label}_p"] = res["p_value"]
        metrics[f"{PREFIX}/runtime"] = seconds
        metrics = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        self.last_metrics = metrics
        self._done[state.global_step] = metrics
        if distributed.is_main_process():
            self._write(state, result, compare, seconds)
        self._log(metrics, control)
        self._log_wandb(args, state, result)
        for listener in self._listeners:
            listener.on_sago_evaluate(args, state, control, result=result, snapshot=snap, monitor=self.monitor)
        return metrics

    def _write(self, state: TrainerState, result: EvalResult, compare: dict[str, Any], seconds: float) -> None:
        if self.monitor is None:
            return
        entry = {
            "step": int(state.global_step),
            "epoch": float(state.epoch or 0.0),
            "sets": result.history_sets(),
            "baseline": self.monitor.baseline is not None and self.monitor.baseline.step == state.global_step,
            "compare": compare,
            "correctness": {n: s.correctness for n, s in result.sets.items()},
            "resolved": result.config.get("resolved"),
            "warnings": list(result.warnings),
            "set_level": {n: s.set_level for n, s in result.sets.items() if s.set_level},
            "runtime_s": seconds,
        }
        try:
            # Group records first: a history line never points at records that are not on disk.
            self.monitor.write_groups(state.global_step, result)
            self.monitor.append(to_jsonable(entry))
        except OSError as err:
            logger.error("sago: could not write the evaluation history (%s); training continues", err)
            self.failures.append({"step": state.global_step, "error": f"OSError: {err}"})

    def _log(self, metrics: dict[str, float], control: TrainerControl) -> None:
        if self.trainer is not None:
            # Trainer.log resets control.should_log (and the handler may touch other flags); keep the
            # Trainer's own plans for this step (its loss log, evaluation, checkpoint) intact.
            flags = (control.should_log, control.should_evaluate, control.should_save)
            self.trainer.log(dict(metrics))
            control.should_log, control.should_evaluate, control.should_save = flags
        elif distributed.is_main_process():
            logger.info("sago metrics: %s", metrics)

    def _log_wandb(self, args: TrainingArguments, state: TrainerState, result: EvalResult) -> None:
        """Histograms of per-group values and a table of the most unstable groups, when W&B is active."""
        if not distributed.is_main_process() or "wandb" not in (args.report_to or []):
            return
        try:
            import wandb

            if wandb.run is None:
                return
            payload: dict[str, Any] = {"train/global_step": state.global_step}
            rows = []
            for name, s in result.sets.items():
                for axis in s.axes:
                    values = [v for v in s.values(axis) if math.isfinite(v)]
                    if values:
                        payload[f"eval/sago/{name}/{axis}_hist"] = wandb.Histogram(values)
                for g in s.groups:
                    rows.append((g.instability, name, g))
            if self.log_unstable_groups > 0 and rows:
                rows.sort(key=lambda r: -r[0] if math.isfinite(r[0]) else 0.0)
                table = wandb.Table(columns=["set", "id", "instability", "axes", "variants", "outputs"])
                for inst, name, g in rows[: self.log_unstable_groups]:
                    table.add_data(name, g.id, inst, str({a: round(v, 4) for a, v in g.axes.items()}),
                                   "\n".join(map(str, g.variants)), "\n".join(g.outputs or []))
                payload["eval/sago/unstable_groups"] = table
            wandb.log(payload)
        except Exception as err:  # noqa: BLE001 - a failing W&B must not stop the other reporters
            logger.warning("sago: W&B logging failed (%s: %s); other reporters and the history go on",
                           type(err).__name__, err)
