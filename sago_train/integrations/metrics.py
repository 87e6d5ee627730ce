"""What one SAGO evaluation during training becomes: the Trainer-log metrics (all of them, and the headline
subset the default log level sends) and the ``history.jsonl`` entry. The callback only routes them."""

from __future__ import annotations

import math
from typing import Any

from ..results.records import EvalResult

PREFIX = "eval_sago"


def headline_metrics(metrics: dict[str, float], result: EvalResult) -> dict[str, float]:
    """The keys of ``metrics`` that the default log level sends to the Trainer log: per set the axis means,
    ``instability`` and ``accuracy``; the overall instability; the runtime. At most sets x (axes + 2) + 2."""
    keep = {f"{PREFIX}/instability", f"{PREFIX}/runtime"}
    for name, s in result.sets.items():
        keep.update(f"{PREFIX}/{name}/{key}" for key in (*s.summaries, "instability", "accuracy"))
    return {k: v for k, v in metrics.items() if k in keep}


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
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}


def history_entry(step: int, epoch: float, result: EvalResult, compare: dict[str, Any], seconds: float,
                  is_baseline: bool) -> dict[str, Any]:
    """The ``history.jsonl`` line of one evaluation (SPEC "Training-time monitoring", plus what was resolved,
    the warnings and the set-level numbers)."""
    return {
        "step": int(step),
        "epoch": float(epoch),
        "sets": result.history_sets(),
        "baseline": is_baseline,
        "compare": compare,
        "correctness": {n: s.correctness for n, s in result.sets.items()},
        "resolved": result.config.get("resolved"),
        "warnings": list(result.warnings),
        "set_level": {n: s.set_level for n, s in result.sets.items() if s.set_level},
        "runtime_s": seconds,
    }
