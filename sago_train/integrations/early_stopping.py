"""``SAGOEarlyStoppingCallback``: stop training when stability regresses significantly."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from ..errors import SagoInputError, did_you_mean, short_repr, unknown_name_error
from ..functional.axes.registry import higher_is_better
from ..results.evaluation import Evaluation
from .monitor import is_improvement, paired_regression
from .options import EarlyStoppingOptions

logger = logging.getLogger(__name__)

MODES = ("paired", "threshold")


def parse_metric(metric: str) -> tuple[str, str]:
    """``"sago/<set>/<axis>"`` (optionally prefixed ``eval_``) -> ``(set, axis)``."""
    name = metric[len("eval_"):] if metric.startswith("eval_") else metric
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != "sago" or not parts[1] or not parts[2]:
        raise SagoInputError(
            f"expected a metric of the form 'sago/<set>/<axis>', got {metric!r}",
            key="metric",
            hint="e.g. 'sago/paraphrase/activation'",
        )
    return parts[1], parts[2]


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

    In ``paired`` mode (default) an evaluation counts as worse when a one-sided Wilcoxon signed-rank test on
    the per-group values (current vs the best evaluation, paired by group id) gives ``p < alpha`` *and* the
    mean increased by at least ``min_delta``: noise does not stop training. ``threshold`` mode only compares
    means (``current > best + min_delta``), like transformers' ``EarlyStoppingCallback``. It works with a
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
    ) -> None:
        self.metric = metric
        self.set_name, self.axis = parse_metric(metric)
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise SagoInputError(f"expected a positive integer, got {patience!r}", key="patience")
        if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
            raise SagoInputError(f"expected a number in (0, 1), got {alpha!r}", key="alpha")
        if not (isinstance(min_delta, (int, float)) and math.isfinite(min_delta) and min_delta >= 0):
            raise SagoInputError(f"expected a finite number >= 0, got {min_delta!r}", key="min_delta")
        if mode not in MODES:
            raise unknown_name_error("early-stopping mode", mode, MODES, key="mode")
        self.patience = patience
        self.alpha = float(alpha)
        self.min_delta = float(min_delta)
        self.mode = mode
        # State (JSON-serializable so that it is saved with checkpoints).
        self.best_step: int | None = None
        self.best_mean: float | None = None
        self.best_ids: list[str] = []
        self.best_values: list[float] = []
        self.counter = 0
        self.stopped_step: int | None = None
        self.reason: str | None = None
        self.decisions: list[dict[str, Any]] = []
        self._source: Any = None  # the SAGOCallback that feeds this one (see connect)

    def state(self) -> dict[str, Any]:
        return {
            "args": {
                "metric": self.metric,
                "patience": self.patience,
                "alpha": self.alpha,
                "min_delta": self.min_delta,
                "mode": self.mode,
            },
            "attributes": {
                "best_step": self.best_step,
                "best_mean": self.best_mean,
                "best_ids": self.best_ids,
                "best_values": self.best_values,
                "counter": self.counter,
                "stopped_step": self.stopped_step,
                "reason": self.reason,
                "decisions": self.decisions,
            },
        }

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """On resume, restore the state saved in the checkpoint even when the Trainer's
        ``restore_callback_states_from_checkpoint`` is off (its default)."""
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
        """Called by the :class:`SAGOCallback` that will feed this one its evaluations."""
        self._source = source

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
        skipped = (getattr(result, "config", None) or {}).get("skipped_axes") or {}
        if self.axis not in evaluation.summaries.get(self.set_name, {}) and skipped.get(self.set_name):
            return
        check_target(self.set_name, self.axis, evaluation.sets, evaluation.summaries.get(self.set_name, {}))
        by_id = evaluation.group_values(self.set_name, self.axis) or {}
        ids = list(by_id)
        current = np.array([by_id[i] for i in ids], float)
        mean = float(np.nanmean(current)) if np.isfinite(current).any() else math.nan
        if not math.isfinite(mean):
            return
        decision: dict[str, Any] = {"step": state.global_step, "mean": mean}
        if is_improvement(self.axis, mean, self.best_mean):
            self.best_step, self.best_mean = state.global_step, mean
            self.best_ids, self.best_values = list(ids), [float(x) for x in current]
            self.counter = 0
            decision["verdict"] = "best"
        else:
            worse, detail = self._is_worse(ids, current, mean)
            decision.update(detail)
            if worse:
                self.counter += 1
                decision["verdict"] = f"worse ({self.counter}/{self.patience})"
            else:
                self.counter = 0
                decision["verdict"] = "not significantly worse"
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

    def _is_worse(self, ids: list[str], current: np.ndarray, mean: float) -> tuple[bool, dict[str, Any]]:
        if self.best_mean is None:
            return False, {}
        # Signed so that positive is worse, whichever direction the axis has (the registry says).
        sign = -1.0 if higher_is_better(self.axis) else 1.0
        delta = sign * (mean - self.best_mean)
        if self.mode == "threshold":
            return delta > self.min_delta, {"delta": delta}
        res = paired_regression(self.axis, dict(zip(self.best_ids, self.best_values)), dict(zip(ids, current)))
        if res is None:
            return False, {"delta": delta}
        worse = res.p_value is not None and res.p_value < self.alpha and sign * res.mean_diff >= self.min_delta
        return bool(worse), {"delta": float(sign * res.mean_diff), "p_value": float(res.p_value)}
