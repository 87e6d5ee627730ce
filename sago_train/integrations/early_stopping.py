"""``SAGOEarlyStoppingCallback``: stop training when stability regresses significantly."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from ..errors import SagoInputError, did_you_mean, short_repr
from ..functional import stats
from ..functional.axes.registry import higher_is_better
from ..results.evaluation import Evaluation
from .keys import parse_metric, parse_metric_or_none
from .monitor import axis_verdict, is_improvement, is_untrained
from .options import EarlyStoppingOptions

logger = logging.getLogger(__name__)

def check_target(set_name: str | None, axis: str | None, sets: Iterable[str], axes: Iterable[str], *,
                 not_in: str = "monitored") -> None:
    """Early stopping must watch a monitored set and a computed axis: the one check, run by a recipe, before
    training (by :class:`SAGOCallback`) and on every evaluation. ``axes`` includes ``instability``."""
    sets, axes = list(sets), list(axes)
    if set_name is not None and set_name not in sets:
        raise SagoInputError(f"early stopping watches set {short_repr(set_name)}, which is not {not_in} "
                             f"({', '.join(sets) or 'none'}){did_you_mean(set_name, sets)}", key="metric")
    if axis is not None and axis not in axes:
        raise SagoInputError(f"early stopping watches axis {short_repr(axis)}, which is not computed (axes: "
                             f"{', '.join(axes)})", key="metric")


class SAGOEarlyStoppingCallback(TrainerCallback, ExportableState):
    """Stop when ``metric`` is worse than the best evaluation so far for ``patience`` evaluations in a row.

    In ``paired`` mode (default) an evaluation counts as worse only by the one verdict rule that report, compare
    and the callback's ``_vs_best`` use (:func:`sago_train.functional.stats.decide`): on the per-group values
    (current vs the best evaluation, paired by group id) the one-sided Wilcoxon signed-rank test gives
    ``p < alpha`` *and* the ``1 - alpha`` paired-bootstrap CI of the mean change excludes 0 on the worse side
    *and* the change is at least ``min_delta``: noise does not stop training. Too few shared groups for the test
    is recorded as ``"not enough groups"`` (and warned once), never as "not worse". ``threshold`` mode only
    compares means (``current > best + min_delta``), like transformers' ``EarlyStoppingCallback``.

    "Best" is the best mean, as the Trainer's ``metric_for_best_model`` picks it. With ``exclude_baseline``
    (default) the step-0 evaluation (the baseline, before any training step) is never the best: the Trainer keeps
    no checkpoint of it, so a "best" there could not be gone back to and would disagree with the Trainer's best
    checkpoint. With ``load_best_model_at_end=True`` and ``metric_for_best_model`` naming this ``metric``, the
    best *is* the Trainer's (``state.best_global_step``, confirmed when the Trainer saves), so an evaluation the
    Trainer did not checkpoint (e.g. a SAGO-only final evaluation) never becomes it. It works with a
    :class:`SAGOCallback` in the same Trainer, and its state survives checkpoint and resume. Watching an axis
    that needs generation (or ``instability``) with ``SAGOCallback(generation_every=N)``, N > 1: only the
    evaluations that compute it count, so ``patience`` counts those.

    Example:
        >>> stopper = SAGOEarlyStoppingCallback("sago/paraphrase/activation", patience=2, alpha=0.05)
        >>> stopper.set_name, stopper.axis
        ('paraphrase', 'activation')
    """

    def __init__(
        self,
        metric: str,
        patience: int = EarlyStoppingOptions.patience,
        alpha: float = EarlyStoppingOptions.alpha,
        min_delta: float = EarlyStoppingOptions.min_delta,
        mode: str = EarlyStoppingOptions.mode,
        exclude_baseline: bool = EarlyStoppingOptions.exclude_baseline,
    ) -> None:
        EarlyStoppingOptions(metric, patience, alpha, min_delta, mode, exclude_baseline)  # validates each value
        self.metric = metric
        self.set_name, self.axis = parse_metric(metric)
        self.patience = patience
        self.alpha = float(alpha)
        self.min_delta = float(min_delta)
        self.mode = mode
        self.exclude_baseline = exclude_baseline
        # State (JSON-serializable so that it is saved with checkpoints).
        self.best_step: int | None = None
        self.best_mean: float | None = None
        self.best_ids: list[str] = []
        self.best_values: list[float] = []
        # Following the Trainer's best: the last improvement, {"step", "mean", "ids", "values"}, until the
        # Trainer confirms it as its best (or a later evaluation replaces it).
        self.candidate: dict[str, Any] | None = None
        self.counter = 0
        self.stopped_step: int | None = None
        self.reason: str | None = None
        self.decisions: list[dict[str, Any]] = []
        self._source: Any = None  # the SAGOCallback that feeds this one (see connect)
        self._warned_few = False

    @classmethod
    def from_args(cls, args: Any) -> SAGOEarlyStoppingCallback:
        """Build from parsed :class:`~sago_train.SAGOArguments` (``--sago_early_stopping_*`` flags); an error names
        ``--sago_early_stopping_metric`` when it is not given."""
        return cls(**args.early_stopping_kwargs())

    def state(self) -> dict[str, Any]:
        return {
            "args": {
                "metric": self.metric,
                "patience": self.patience,
                "alpha": self.alpha,
                "min_delta": self.min_delta,
                "mode": self.mode,
                "exclude_baseline": self.exclude_baseline,
            },
            "attributes": {
                "best_step": self.best_step,
                "best_mean": self.best_mean,
                "best_ids": self.best_ids,
                "best_values": self.best_values,
                "candidate": self.candidate,
                "counter": self.counter,
                "stopped_step": self.stopped_step,
                "reason": self.reason,
                "decisions": self.decisions,
            },
        }

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """On resume, restore the state saved in the checkpoint even when the Trainer's
        ``restore_callback_states_from_checkpoint`` is off (its default). A state saved by an earlier version
        (without ``candidate``) restores too: the missing attributes keep their defaults."""
        self._check_trainer_direction(args)
        if state.global_step == 0 or not isinstance(state.stateful_callbacks, dict):
            return
        saved = state.stateful_callbacks.get(type(self).__name__)
        for item in saved if isinstance(saved, list) else [saved]:
            if isinstance(item, dict) and item.get("args", {}).get("metric") == self.metric:
                for key, value in item.get("attributes", {}).items():
                    setattr(self, key, value)
                logger.info("sago early stopping: restored state from the checkpoint (counter %d)", self.counter)
                return

    def connect(self, source: Any) -> None:
        """Called by the :class:`SAGOCallback` that will feed this one its evaluations (when it is bound to a
        Trainer, and again at train start before its baseline): a Trainer that ranks the metric the other way is
        refused here, before any evaluation is paid for."""
        self._source = source
        trainer = getattr(source, "trainer", None)
        if trainer is not None and getattr(trainer, "args", None) is not None:
            self._check_trainer_direction(trainer.args)

    def follows_trainer(self, args: TrainingArguments) -> bool:
        """Whether "best" is the Trainer's best checkpoint: ``load_best_model_at_end`` with
        ``metric_for_best_model`` naming this metric (with or without the ``eval_`` prefix)."""
        name = getattr(args, "metric_for_best_model", None) or ""
        return bool(getattr(args, "load_best_model_at_end", False)) and parse_metric_or_none(name) == (
            self.set_name, self.axis)

    def _check_trainer_direction(self, args: TrainingArguments) -> None:
        """Following the Trainer's best needs the Trainer to rank this metric the same way. transformers defaults
        ``greater_is_better`` to True for any metric not ending in "loss", so an unset one makes the Trainer keep
        the *least* stable checkpoint while this callback waits for it to confirm the most stable one: the two
        would silently disagree on every "best". Refuse before training instead."""
        if not self.follows_trainer(args):
            return
        want = higher_is_better(self.axis)
        got = getattr(args, "greater_is_better", None)
        if got is not None and bool(got) != want:
            raise SagoInputError(
                f"load_best_model_at_end with metric_for_best_model={args.metric_for_best_model!r} ranks it with "
                f"greater_is_better={got}, but '{self.axis}' is {'higher' if want else 'lower'}-is-better: the "
                f"Trainer's best checkpoint would be the {'least' if not want else 'most'} stable one, and early "
                f"stopping on {self.metric} could never agree with it",
                key="greater_is_better", hint=f"pass greater_is_better={want} in the TrainingArguments")

    def _sync_with_trainer(self, state: TrainerState) -> None:
        """Adopt the candidate once the Trainer has made its step the best (``best_global_step``)."""
        cand = self.candidate
        step = getattr(state, "best_global_step", None)
        if cand is not None and step is not None and int(cand["step"]) == int(step):
            self.best_step, self.best_mean = int(cand["step"]), float(cand["mean"])
            self.best_ids, self.best_values = list(cand["ids"]), [float(v) for v in cand["values"]]
            self.candidate = None

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        # The Trainer decides its best just before it saves: this is the first moment to agree with it.
        if self.follows_trainer(args):
            self._sync_with_trainer(state)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        if self.follows_trainer(args):
            self._sync_with_trainer(state)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        if self._source is None:
            # Without a feed this callback would never stop anything: say so instead of training on silently.
            raise SagoInputError(
                "SAGOEarlyStoppingCallback receives no SAGO evaluations: no SAGOCallback is bound to this Trainer",
                hint="bind the SAGOCallback with SAGOCallback(..., trainer=trainer) or callback.attach(trainer), "
                     "or call sago_callback.add_listener(early_stopping)",
            )

    def on_sago_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, *,
                         result: Any, evaluation: Evaluation, **kwargs: Any) -> None:
        """Called by :class:`SAGOCallback` after each evaluation. An evaluation without the watched quantity (one
        without generation, see ``SAGOCallback(generation_every=...)``) does not count: no decision, the
        counter unchanged."""
        watched = evaluation.sets.get(self.set_name)
        if watched is not None and self.axis not in watched.quantities and watched.skipped_axes:
            return
        check_target(self.set_name, self.axis, evaluation.sets, [] if watched is None else
                     [*watched.quantities, *(["accuracy"] if watched.accuracy is not None else [])])
        by_id = evaluation.group_values(self.set_name, self.axis) or {}
        ids = list(by_id)
        current = np.array([by_id[i] for i in ids], float)
        mean = float(np.nanmean(current)) if np.isfinite(current).any() else math.nan
        if not math.isfinite(mean):
            return
        follow = self.follows_trainer(args)
        if follow:
            self._sync_with_trainer(state)
        decision: dict[str, Any] = {"step": state.global_step, "mean": mean}
        if self.exclude_baseline and is_untrained(state.global_step):
            decision["verdict"] = "baseline (never the best: no checkpoint)"
        elif is_improvement(self.axis, mean, self.best_mean):
            snapshot = {"step": state.global_step, "mean": mean, "ids": list(ids),
                        "values": [float(x) for x in current]}
            if follow:
                self.candidate = snapshot
                decision["verdict"] = "improved (the best once the Trainer checkpoints it)"
            else:
                self.best_step, self.best_mean = state.global_step, mean
                self.best_ids, self.best_values = snapshot["ids"], snapshot["values"]
                decision["verdict"] = "best"
            self.counter = 0
        else:
            worse, detail = self._is_worse(ids, current, mean)
            decision.update(detail)
            if worse:
                self.counter += 1
                decision["verdict"] = f"worse ({self.counter}/{self.patience})"
            else:
                self.counter = 0
                decision["verdict"] = detail.get("rule") or "not significantly worse"
        self.decisions.append(decision)
        if self.counter >= self.patience:
            self.stopped_step = state.global_step
            self.reason = (
                f"{self.metric} was worse than the best evaluation (step {self.best_step}, mean "
                f"{self.best_mean:.4f}) for {self.counter} evaluations in a row "
                f"({self.mode} test, alpha={self.alpha}, min_delta={self.min_delta}); now {mean:.4f}"
            )
            logger.warning("sago early stopping at step %d: %s", state.global_step, self.reason)
            control.should_training_stop = True

    def warn_if_too_few_groups(self, n_groups: int) -> None:
        """Warn before training (once) when ``n_groups`` per evaluation can never reach a paired verdict:
        otherwise the warning comes at the first comparison, possibly at the end of training."""
        if self.mode != "paired" or self._warned_few or n_groups >= stats.min_groups(self.alpha):
            return
        self._warned_few = True
        logger.warning("sago early stopping: %s will be evaluated on %d group(s) per evaluation, and a paired "
                       "test at alpha %g needs >= %d, so it can never be called worse; evaluate more groups "
                       "(max_groups)", self.metric, n_groups, self.alpha, stats.min_groups(self.alpha))

    def _is_worse(self, ids: list[str], current: np.ndarray, mean: float) -> tuple[bool, dict[str, Any]]:
        if self.best_mean is None:
            return False, {}
        # Signed so that positive is worse, whichever direction the axis has (the registry says).
        sign = -1.0 if higher_is_better(self.axis) else 1.0
        delta = sign * (mean - self.best_mean)
        if self.mode == "threshold":
            return delta > self.min_delta, {"delta": delta}
        res = axis_verdict(self.axis, dict(zip(self.best_ids, self.best_values)), dict(zip(ids, current)),
                             alpha=self.alpha, min_delta=self.min_delta)
        if res is None:
            return False, {"delta": delta, "rule": stats.NOT_ENOUGH}
        detail = {"delta": float(sign * res.mean_diff), "p_value": float(res.p_worse), "ci_low": res.ci_low,
                  "ci_high": res.ci_high, "n": res.n}
        if res.verdict == stats.NOT_ENOUGH:
            detail["rule"] = res.words()
            if not self._warned_few:
                self._warned_few = True
                logger.warning("sago early stopping: %s shares %s with the best evaluation, so it can never be "
                               "called worse; evaluate more groups (max_groups)", self.metric, res.words())
        return res.verdict == stats.WORSE, stats.to_jsonable(detail)
