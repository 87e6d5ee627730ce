"""What one SAGO evaluation during training becomes: the Trainer-log metrics (all of them, and the headline
subset the default log level sends) and the ``history.jsonl`` entry. The callback only routes them."""

from __future__ import annotations

import math
from typing import Any

from ..results.evaluation import INSTABILITY, Evaluation
from ..results.records import EvalResult

PREFIX = "eval_sago"


def skipped_axes(result: EvalResult) -> dict[str, list[str]]:
    """Per set, the axes an evaluation without generation left out (empty for a complete evaluation)."""
    return {n: list(a) for n, a in (result.config.get("skipped_axes") or {}).items() if a}


def is_partial(result: EvalResult) -> bool:
    """Whether ``result`` skipped axes (an evaluation without generation, see ``generation_every``). Its
    ``instability`` (the mean of the axes computed) would be a mean over fewer axes than the complete
    evaluations', so it is left out of its log, history line and comparisons rather than compared."""
    return bool(skipped_axes(result))


def partial_evaluation(ev: Evaluation) -> Evaluation:
    """``ev`` without ``instability`` (see :func:`is_partial`): no summary and no per-group value, so the
    baseline/best comparisons and early stopping see an absent quantity, never a different one."""
    for per_axis in ev.summaries.values():
        per_axis.pop(INSTABILITY, None)
    for name in ev.sets:
        for rec in ev.records(name) or []:
            rec[INSTABILITY] = None
    return ev


def headline_metrics(metrics: dict[str, float], result: EvalResult) -> dict[str, float]:
    """The keys of ``metrics`` that the default log level sends to the Trainer log: per set the axis means,
    ``instability`` and ``accuracy``; the overall instability; the runtime. At most sets x (axes + 2) + 2."""
    keep = {f"{PREFIX}/instability", f"{PREFIX}/runtime"}
    for name, s in result.sets.items():
        keep.update(f"{PREFIX}/{name}/{key}" for key in (*s.summaries, "instability", "accuracy"))
    return {k: v for k, v in metrics.items() if k in keep}


class RecordsWithoutInstability:
    """What the results store writes for an evaluation without generation: its sets and group records, each
    record's ``instability`` null (see :func:`is_partial`), so per-group plots and comparisons read from disk see
    it absent too."""

    def __init__(self, result: EvalResult) -> None:
        self.sets = result.sets
        self._result = result

    def group_records(self, set_name: str) -> list[dict[str, Any]]:
        return [{**r, INSTABILITY: None} for r in self._result.group_records(set_name)]


def evaluation_metrics(result: EvalResult, compare: dict[str, Any], seconds: float) -> dict[str, float]:
    """Every finite number of one evaluation under ``eval_sago/...``: the result's metrics, each paired change
    against the baseline and the best so far with its p-value, and the runtime."""
    metrics = result.metrics(prefix=PREFIX)
    for name, axes in compare.items():
        for axis, entry in axes.items():
            for label, res in entry.items():
                metrics[f"{PREFIX}/{name}/{axis}_{label}"] = res["mean_diff"]
                metrics[f"{PREFIX}/{name}/{axis}_{label}_p"] = res["p_value"]
    metrics[f"{PREFIX}/runtime"] = seconds
    if is_partial(result):  # absent, never a mean over fewer axes (see is_partial)
        metrics = {k: v for k, v in metrics.items() if not k.endswith(f"/{INSTABILITY}")}
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}


def history_entry(step: int, epoch: float, result: EvalResult, compare: dict[str, Any], seconds: float,
                  is_baseline: bool) -> dict[str, Any]:
    """The ``history.jsonl`` line of one evaluation (SPEC "Training-time monitoring", plus what was resolved,
    the warnings and the set-level numbers). An evaluation without generation has ``"skipped_axes"`` (per
    set) and no ``instability``."""
    sets = result.history_sets()
    skipped = skipped_axes(result)
    if skipped:
        for per_axis in sets.values():
            per_axis.pop(INSTABILITY, None)
    return {
        "step": int(step),
        "epoch": float(epoch),
        "sets": sets,
        **({"skipped_axes": skipped} if skipped else {}),
        "baseline": is_baseline,
        "compare": compare,
        "correctness": {n: s.correctness for n, s in result.sets.items()},
        "resolved": result.config.get("resolved"),
        "warnings": list(result.warnings),
        "set_level": {n: s.set_level for n, s in result.sets.items() if s.set_level},
        "runtime_s": seconds,
    }
