"""One early stopper over several metrics (a stability axis and accuracy, say): each watched by its own paired
rule at ``alpha / M``, so that by the union bound (Bonferroni) a run without any trend in any of the M is stopped
with a probability of at most ``alpha``; training stops at the first metric that is worse. One callback, so
transformers never warns that "there is already one" (docs/early-stopping.md).

Built by :class:`~sago_train.integrations.early_stopping.SAGOEarlyStoppingCallback` itself when given several
metrics (``SAGOEarlyStoppingCallback(["sago/p/activation_rel", "sago/p/accuracy"])``): the class
``MultiMetricEarlyStopping`` there is :class:`MultiMetricMixin` on it. This module does not import it (no cycle).
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerControl, TrainerState, TrainingArguments

from ..errors import SagoInputError
from .options import EarlyStoppingOptions
from .stopping_plan import split_metrics

logger = logging.getLogger(__name__)


class MultiMetricMixin:
    """Early stopping over several metrics: :attr:`watchers` holds one single-metric stopper (``_single``, the
    class it is mixed into) per metric, each at ``alpha / M``; the :class:`~sago_train.SAGOCallback` plans and
    checks each watcher, and every Trainer event is handed to each.

    Example:
        >>> from sago_train import SAGOEarlyStoppingCallback
        >>> stop = SAGOEarlyStoppingCallback("sago/p/activation_rel,sago/p/accuracy", alpha=0.05)
        >>> type(stop).__name__, [w.metric for w in stop.watchers], [w.alpha for w in stop.watchers]
        ('MultiMetricEarlyStopping', ['sago/p/activation_rel', 'sago/p/accuracy'], [0.025, 0.025])
    """

    _single: Any = None  # the single-metric stopper class (set where the mixin is used)
    _source: Any
    _started_over: bool

    def __init__(self, metric: Any, patience: int = EarlyStoppingOptions.patience,
                 alpha: float = EarlyStoppingOptions.alpha, min_delta: float = EarlyStoppingOptions.min_delta,
                 mode: str = EarlyStoppingOptions.mode, exclude_baseline: bool = EarlyStoppingOptions.exclude_baseline,
                 reference_step: int = EarlyStoppingOptions.reference_step) -> None:
        metrics = split_metrics(metric)
        if len(set(metrics)) != len(metrics):
            raise SagoInputError(f"early stopping lists a metric twice: {', '.join(metrics)}", key="metric")
        EarlyStoppingOptions(",".join(metrics), patience, alpha, min_delta, mode, exclude_baseline, reference_step)
        self.metrics = metrics
        self.metric = ",".join(metrics)
        self.set_name = self.quantity = None  # several: see watchers
        self.patience, self.alpha, self.min_delta, self.mode = patience, float(alpha), float(min_delta), mode
        self.exclude_baseline, self.reference_step = exclude_baseline, reference_step
        self.split = len(metrics)
        self.watchers = [self._single(m, patience, self.alpha / len(metrics), min_delta, mode,
                                                   exclude_baseline, reference_step) for m in metrics]
        for w in self.watchers:
            w.split = len(metrics)
        self._source = None
        self._warned: set[str] = set()
        self._started_over = False

    # ------------------------------------------------------------------ what the watchers say
    @property
    def decisions(self) -> list[dict[str, Any]]:
        """Every watcher's decisions, each with its ``metric``, in step order."""
        rows = [{"metric": w.metric, **d} for w in self.watchers for d in w.decisions]
        return sorted(rows, key=lambda d: d["step"])

    @property
    def stopped(self) -> Any:
        """The watcher that stopped training, else None."""
        return next((w for w in self.watchers if w.stopped_step is not None), None)

    @property
    def stopped_step(self) -> int | None:
        return None if self.stopped is None else self.stopped.stopped_step

    @property
    def reason(self) -> str | None:
        return None if self.stopped is None else self.stopped.reason

    @property
    def best_step(self) -> dict[str, int | None]:
        return {w.metric: w.best_step for w in self.watchers}

    def _fresh_state(self) -> None:
        for w in getattr(self, "watchers", []):
            w._fresh_state()

    def start_over(self) -> None:
        for w in self.watchers:
            w.start_over()
        self._started_over = True

    def plan(self, n_groups: int | None, steps: Any) -> None:
        for w in self.watchers:
            w.plan(n_groups, steps)

    def state(self) -> dict[str, Any]:
        return {"args": {"metric": self.metric, "patience": self.patience, "alpha": self.alpha,
                         "min_delta": self.min_delta, "mode": self.mode, "exclude_baseline": self.exclude_baseline,
                         "reference_step": self.reference_step},
                "attributes": {"watcher_states": self.watcher_states}}

    @property
    def watcher_states(self) -> list[dict[str, Any]]:
        """Each watcher's saved attributes (what a checkpoint keeps); set, they restore the watchers (as
        transformers' ``ExportableState.from_state`` and a resume do)."""
        return [w.state()["attributes"] for w in self.watchers]

    @watcher_states.setter
    def watcher_states(self, states: list[dict[str, Any]]) -> None:
        for w, attributes in zip(self.watchers, states):
            for key, value in attributes.items():
                setattr(w, key, value)

    # ------------------------------------------------------------------ Trainer events, handed to every watcher
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        for w in self.watchers:
            w._started_over = w._started_over or self._started_over
            w._check_trainer_direction(args)
            w._warn_threshold()
        if self._started_over or state.global_step == 0 or not isinstance(state.stateful_callbacks, dict):
            return
        saved = state.stateful_callbacks.get(type(self).__name__)
        for item in saved if isinstance(saved, list) else [saved]:
            if isinstance(item, dict) and item.get("args", {}).get("metric") == self.metric:
                self.watcher_states = item.get("attributes", {}).get("watcher_states", [])
                logger.info("sago early stopping: restored the state of %d metrics from the checkpoint",
                            len(self.watchers))
                return

    def connect(self, source: Any) -> None:
        self._source = source
        for w in self.watchers:
            w.connect(source)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        for w in self.watchers:
            w.on_save(args, state, control, **kwargs)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        for w in self.watchers:
            w.on_train_end(args, state, control, **kwargs)

    def on_sago_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, *,
                         evaluation: Any, **kwargs: Any) -> None:
        for w in self.watchers:
            if w.stopped_step is None:
                w.on_sago_evaluate(args, state, control, evaluation=evaluation, **kwargs)
