"""Early stopping's plan in words and its looks: the metrics one stopper watches, the line it logs at train start,
the paired and threshold looks, per-group means over evaluations, the best so far as checkpoints save it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..functional import stats, verdict_rule
from ..functional.axes.registry import higher_is_better
from ..results.best import BestEntry
from ..results.compare import Change


class BestField:
    """One attribute of a stopper's best so far (``best_step``, ``best_mean``, ``best_ids``, ``best_values``), read
    from and written to its :class:`~sago_train.results.compare.Best` entry of the watched (set, quantity): the
    names a checkpoint saves and restores one by one (a state saved before the Best existed restores as it was)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.field = name.removeprefix("best_")

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        entry = obj.best.get(obj.set_name, obj.quantity)
        if entry is None:
            return [] if self.field in ("ids", "values") else None
        value = getattr(entry, self.field)
        return list(value) if isinstance(value, tuple) else value

    def __set__(self, obj: Any, value: Any) -> None:
        entry = obj.best.get(obj.set_name, obj.quantity)
        if self.field in ("ids", "values"):
            if entry is not None:  # lists of the best: nothing to hold them without one
                value = tuple(float(v) for v in value) if self.field == "values" else tuple(value)
                obj.best.set(obj.set_name, obj.quantity, dataclasses.replace(entry, **{self.field: value}))
            return
        entry = entry or BestEntry(0, math.nan)
        if value is None:  # no best (a fresh state, or one saved before any)
            obj.best.set(obj.set_name, obj.quantity, None)
            return
        value = int(value) if self.field == "step" else float(value)
        obj.best.set(obj.set_name, obj.quantity, dataclasses.replace(entry, **{self.field: value}))


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


def paired_look(self: Any, decision: dict[str, Any], step: int, values: dict[str, float]) -> bool:
    """The paired-mode look of the stopper ``self``: add the evaluation to the reference or the window; at a
    look, test the window against the reference (the one rule at the look's level)."""
    p = self.patience
    if not self.counts(step):
        decision["verdict"] = f"before the reference step ({self.reference_step})"
        return False
    entry = {"step": step, "values": values}
    if len(self.reference) < p:
        self.reference.append(entry)
        decision["verdict"] = f"reference ({len(self.reference)}/{p})"
        return False
    self.window = [*self.window, entry][-p:]
    if len(self.window) < p:
        decision["verdict"] = f"window ({len(self.window)}/{p})"
        return False
    self.looks_done += 1
    level = self.level(self.looks_done)
    decision.update({"look": self.looks_done, "looks": self.looks, "level": level})
    if level <= 0.0:
        decision["verdict"] = "past the planned looks (cannot stop)"
        self._warn_once("past plan", "sago early stopping: %s: evaluation at step %d is past the %d look(s) the "
                        "run planned, which spent alpha: it cannot stop training", self.metric, step, self.looks)
        return False
    ref, cur = group_means(self.reference), group_means(self.window)
    common = [g for g in cur if g in ref]
    res = verdict_rule.worse_verdict([ref[g] for g in common], [cur[g] for g in common],
                                     higher_is_better=higher_is_better(self.quantity), alpha=level,
                                     min_delta=self.min_delta)
    change = Change.of(res, self.quantity, self.set_name, self.reference[0]["step"])
    # A decision's p_value is the look's p of "worse", its delta how much worse (> 0: worse, either direction).
    decision.update(stats.to_jsonable({"delta": change.worse_by, "p_value": change.p_worse,
                                       "ci_low": change.ci_low, "ci_high": change.ci_high, "n": change.n}))
    decision["verdict"] = "worse" if res.verdict == stats.WORSE else res.words()
    if res.verdict == stats.NOT_ENOUGH:
        self._warn_once("few", "sago early stopping: %s shares %s with the reference, so it can never be called "
                        "worse; evaluate more groups (max_groups)", self.metric, res.words())
    if res.verdict != stats.WORSE:
        return False
    steps = [e["step"] for e in self.window], [e["step"] for e in self.reference]
    self.reason = (
        f"{self.metric}: the mean of the last {p} evaluation(s) (steps {span(steps[0])}) is worse than the "
        f"reference, the first {p} (steps {span(steps[1])}), by {decision['delta']:.4g} over {res.n} groups: "
        f"one-sided Wilcoxon p = {res.p_worse:.3g} below the look's level {level:.3g}, and the CI at that level "
        f"clear of 0 (look "
        f"{self.looks_done} of {self.looks or 'an unplanned number'}; run-level false-stop rate <= "
        f"{self.alpha:g}; min_delta={self.min_delta:g})")
    return True
