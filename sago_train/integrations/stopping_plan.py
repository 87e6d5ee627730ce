"""Early stopping's plan in words and its small helpers: the metrics one stopper watches, the line it logs at
train start, per-group means over evaluations."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..functional.axes.registry import higher_is_better


def split_metrics(metric: Any) -> list[str]:
    """The metrics one stopper watches: a list, or one string (comma-separated for several)."""
    if isinstance(metric, str):
        return [m.strip() for m in metric.split(",") if m.strip()] or [metric]
    return [str(m) for m in metric] if isinstance(metric, (list, tuple)) else [metric]


def start_line(stopper: Any, steps: Sequence[int] | None) -> str:
    """The one line early stopping logs at train start: the metric and its direction, the reference's steps,
    the planned looks and each look's level."""
    better = "higher" if higher_is_better(stopper.quantity) else "lower"
    head = f"sago early stopping: {stopper.metric} ({better} is better, {stopper.mode})"
    if stopper.mode != "paired":
        return (f"{head}: stops after {stopper.patience} evaluation(s) in a row worse than the best by more than "
                f"min_delta={stopper.min_delta:g}; no error control")
    counted = [int(s) for s in steps or [] if stopper.counts(int(s))]
    ref = counted[:stopper.patience]
    if steps is None:
        ref_text = "steps not planned"
    elif len(ref) == stopper.patience:
        ref_text = f"steps {', '.join(map(str, ref))}"
    else:
        ref_text = f"only {len(ref)} planned evaluation(s) count"
    share = f", alpha {stopper.alpha:g} its share of {stopper.split} metrics" if stopper.split > 1 else ""
    if stopper.looks is None:
        looks = f"looks not planned (automatic cadence): look k at alpha * 10 / ((k + 9)(k + 10)), {stopper.level(1):.3g} first"
    elif stopper.looks == 0:
        looks = "no look planned: it can never stop this run"
    else:
        looks = f"{stopper.looks} planned look(s), each at level {stopper.level(1):.3g} (alpha {stopper.alpha:g} / {stopper.looks or 1})"
    return (f"{head}: reference = the first {stopper.patience} evaluation(s) from step {stopper.reference_step} "
            f"({ref_text}), window = the latest {stopper.patience}; {looks}{share}")


def group_means(entries: list[dict[str, Any]]) -> dict[str, float]:
    """Per group id (the last entry's), the mean of its values over ``entries`` (NaN where an entry lacks it or
    has NaN, so that the group is left out of the paired test)."""
    ids = list(entries[-1]["values"])
    table = np.array([[e["values"].get(g, math.nan) for g in ids] for e in entries], float)
    return dict(zip(ids, table.mean(axis=0).tolist()))


def span(steps: list[int]) -> str:
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])


def threshold_look(self: Any, decision: dict[str, Any], improved: str | None, mean: float) -> bool:
    """The threshold-mode look of the stopper ``self``: means only, against the best so far, ``patience`` worse
    evaluations in a row (no error control)."""
    if improved is not None:
        self.counter = 0
        decision["verdict"] = improved
        return False
    if self.best_mean is None:
        decision["verdict"] = "no best yet"
        return False
    delta = (-1.0 if higher_is_better(self.quantity) else 1.0) * (mean - self.best_mean)
    decision["delta"] = delta
    self.counter = self.counter + 1 if delta > self.min_delta else 0
    decision["verdict"] = f"worse ({self.counter}/{self.patience})" if self.counter else "not worse"
    if self.counter < self.patience:
        return False
    self.reason = (f"{self.metric} was worse than the best evaluation (step {self.best_step}, mean "
                   f"{self.best_mean:.4f}) for {self.counter} evaluations in a row (threshold mode: means only, "
                   f"no error control; min_delta={self.min_delta}); now {mean:.4f}")
    return True
