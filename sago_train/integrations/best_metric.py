"""``metric_for_best_model="sago/..."``: the Trainer ranks checkpoints on a SAGO number, so every Trainer
evaluation must carry one that SAGO measured at that very step. Checked at train start (SAGO's cadence must
cover every Trainer evaluation step), planned (an evaluation that feeds the Trainer computes the watched axis,
whatever ``generation_every`` says) and filled (a failed or skipped evaluation gets the worst value, never
another step's), so the Trainer's best checkpoint is always one whose SAGO value was measured on it."""

from __future__ import annotations

import logging
import math
from typing import Any

from ..data.groups import VariantSet
from ..errors import SagoInputError
from ..eval.config import SAGOConfig
from ..eval.plan import axes_computed, select_groups
from ..functional.axes import get_axis
from ..results.evaluation import INSTABILITY
from .metrics import PREFIX

logger = logging.getLogger("sago_train.integrations.callback")  # the callback's log, as setup.py


def watched_key(args: Any) -> str | None:
    """The Trainer metric key (``eval_sago/...``) that ``args.metric_for_best_model`` names, or None when it
    names no SAGO metric."""
    name = getattr(args, "metric_for_best_model", None)
    if not name or not name.removeprefix("eval_").startswith("sago/"):
        return None
    return name if name.startswith("eval_") else f"eval_{name}"


def _strategy(args: Any) -> str:
    return str(getattr(args.eval_strategy, "value", args.eval_strategy))


def check_cadence(args: Any, state: Any, eval_steps: int | None) -> None:
    """Refuse (before any evaluation is paid for) a SAGO cadence that misses some Trainer evaluation step while
    ``metric_for_best_model`` names a SAGO metric: the Trainer would rank that step's checkpoint on no
    measurement of it. ``eval_steps=None`` (follow the Trainer) always covers it."""
    key = watched_key(args)
    if key is None or eval_steps is None:
        return
    strategy = _strategy(args)
    fix = ("drop SAGOCallback's eval_steps (SAGO then evaluates whenever the Trainer does), or choose a "
           "metric_for_best_model that is not a sago/ metric")
    need = (f"metric_for_best_model={args.metric_for_best_model!r} needs a SAGO value at every Trainer evaluation, "
            f"but SAGOCallback(eval_steps={eval_steps}) evaluates every {eval_steps} steps")
    if strategy == "epoch":
        raise SagoInputError(
            f"{need} and the Trainer every epoch (TrainingArguments(eval_strategy='epoch')): expected "
            f"SAGOCallback(eval_steps=None) with eval_strategy='epoch', got eval_steps={eval_steps}",
            key="eval_steps", hint=fix)
    if strategy == "steps":
        every = getattr(state, "eval_steps", None) or args.eval_steps
        if every and every >= 1 and int(every) % eval_steps != 0:
            raise SagoInputError(
                f"{need} and the Trainer every {int(every)} steps (TrainingArguments(eval_steps={args.eval_steps})): "
                f"expected the Trainer's eval_steps to be a multiple of {eval_steps}, got {int(every)}",
                key="eval_steps", hint=f"{fix}, or set TrainingArguments.eval_steps to a multiple of {eval_steps}")


def needs_complete(key: str | None, sets: dict[str, VariantSet], config: SAGOConfig) -> bool:
    """Whether the watched ``key`` would be absent from an evaluation without generation (see
    ``generation_every``): accuracy; an axis left out on its set (generation, mirroring, confidence on groups
    without a reference); ``instability`` whenever some axis is left out (it is then dropped everywhere)."""
    if key is None:
        return False
    rest = key.removeprefix(f"{PREFIX}/")
    skipped: dict[str, set[str]] = {}
    for name, vs in sets.items():
        groups = [vs[i] for i in select_groups(vs, config.max_groups, config.seed)]
        axes = [get_axis(a) for a in config.axes]
        kept = {a.name for a in axes_computed(axes, groups, generation=False)}
        skipped[name] = {a.name for a in axes} - kept
    if rest.startswith(INSTABILITY):
        return any(skipped.values())
    set_name, _, metric = rest.partition("/")
    if set_name not in sets:
        return False
    candidates = [*config.axes, INSTABILITY, "accuracy"]
    axis = max((c for c in candidates if metric == c or metric.startswith(f"{c}_")), key=len, default=None)
    if axis == "accuracy":
        return True
    if axis == INSTABILITY:
        return any(skipped.values())
    return axis is not None and axis in skipped[set_name]


def fill_missing(metrics: dict[str, float], key: str | None, greater_is_better: bool | None, step: Any) -> None:
    """Give the Trainer a value for ``key`` when this step has none (a failed or skipped evaluation, a NaN mean):
    the Trainer raises KeyError without one, and monitoring must not cost the run. The worst possible value,
    with a warning, so that this checkpoint is never chosen as the best; never another step's value."""
    if key is None or key in metrics:
        return
    metrics[key] = -math.inf if greater_is_better else math.inf
    logger.warning("sago: no value for %s at step %s (the SAGO evaluation failed, was skipped or gave no finite "
                   "value); using the worst value so that this checkpoint is not chosen as the best", key, step)
