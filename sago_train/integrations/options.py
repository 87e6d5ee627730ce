"""The options of the Trainer callbacks, declared once (a field, its help and its one default): read by
:class:`~sago_train.SAGOCallback` and :class:`~sago_train.SAGOEarlyStoppingCallback` for their defaults and by
the recipe's ``monitor`` and ``early_stopping`` sections, which are these dataclasses. No torch or transformers
import here, so the CLI starts fast."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import SagoInputError


@dataclass
class MonitorOptions:
    """When :class:`~sago_train.SAGOCallback` evaluates."""

    eval_steps: int | None = field(default=None, metadata={"help": "Evaluate every N optimizer steps. Default: "
                                   "whenever the Trainer evaluates, else an automatic cadence within overhead_budget."})
    baseline: bool = field(default=True, metadata={"help": "Evaluate once before the first training step."})
    overhead_budget: float = field(default=0.05, metadata={"help": "Automatic cadence: the share of training wall "
                                   "time that evaluations may take, the final one included; the baseline, before "
                                   "the first step, is a one-off set-up cost outside it (the cost line says what "
                                   "it took)."})
    generation_every: int = field(default=4, metadata={"help": "Compute the axes that need greedy generation "
                                  "(generation, mirroring, accuracy; confidence on groups without a reference) only "
                                  "at every N-th evaluation; the others compute the rest, with the same values, at "
                                  "a fraction of the cost. The baseline and the final evaluation are always "
                                  "complete, and so are those at the Trainer's evaluation steps when "
                                  "metric_for_best_model names a sago/ metric that needs generation. 1 = every "
                                  "evaluation complete."})
    log_level: str = field(default="default", metadata={"help": "What each evaluation sends to the Trainer log "
                           "(console, TensorBoard, W&B charts). default: per set the axis means, instability and "
                           "accuracy, plus the overall instability and the runtime; CI bounds, p-values, "
                           "_vs_baseline/_vs_best and set-level figures go only to history.jsonl and the W&B summary "
                           "and tables. full: every number in the log too."})


LOG_LEVELS = ("default", "full")


def check_monitor_options(*, eval_steps: object, generation_every: object, overhead_budget: object,
                          log_level: object) -> None:
    """Refuse a :class:`MonitorOptions` value of the wrong kind or range (SagoInputError naming the key)."""
    if isinstance(generation_every, bool) or not isinstance(generation_every, int) or generation_every < 1:
        raise SagoInputError(f"expected a positive integer, got {generation_every!r}", key="generation_every",
                             hint="1 computes every axis at every evaluation")
    if eval_steps is not None and (not isinstance(eval_steps, int) or eval_steps < 1):
        raise SagoInputError(f"expected a positive integer, got {eval_steps!r}", key="eval_steps")
    if not (isinstance(overhead_budget, (int, float)) and overhead_budget > 0 and math.isfinite(overhead_budget)):
        raise SagoInputError(f"expected a positive number, got {overhead_budget!r}", key="overhead_budget")
    if log_level not in LOG_LEVELS:
        raise SagoInputError(f"expected one of {', '.join(LOG_LEVELS)}, got {log_level!r}", key="log_level")


@dataclass
class EarlyStoppingOptions:
    """When :class:`~sago_train.SAGOEarlyStoppingCallback` stops training."""

    metric: str = field(default="", metadata={"help": "sago/<set>/<axis> to watch."})
    patience: int = field(default=3, metadata={"help": "Worse evaluations in a row before stopping."})
    alpha: float = field(default=0.05, metadata={"help": "Significance level of the paired verdict: the one-sided "
                         "Wilcoxon p must be below it and the 1 - alpha paired-bootstrap CI must exclude 0."})
    min_delta: float = field(default=0.0, metadata={"help": "Smallest change in the worse direction that counts."})
    mode: str = field(default="paired", metadata={"help": "paired (worse than the best evaluation by the one "
                                                          "verdict rule of report and compare: one-sided Wilcoxon "
                                                          "p < alpha and the 1 - alpha paired-bootstrap CI above 0 "
                                                          "on the worse side, per group) or threshold (means only)."})
    exclude_baseline: bool = field(default=True, metadata={"help": "Never take the step-0 evaluation (the baseline, "
                                   "before training) as the best: it has no checkpoint to go back to. With "
                                   "load_best_model_at_end and metric_for_best_model naming the watched metric, the "
                                   "best is always the Trainer's best checkpoint."})


@dataclass
class CallbackOptions:
    """How :class:`~sago_train.SAGOCallback` behaves around its evaluations: its defaults, and flags of
    :class:`~sago_train.SAGOArguments`. Not a recipe section (``sago-train run`` sets ``overwrite`` from its own
    flag)."""

    evaluate_at_end: bool = field(default=True, metadata={"help": "Evaluate at the last training step (the final "
                                  "evaluation), whatever the cadence."})
    log_unstable_groups: int = field(default=10, metadata={"help": "Rows of the W&B table of the most unstable "
                                     "groups (0 disables it)."})
    raise_on_error: bool = field(default=False, metadata={"help": "Re-raise an exception from an evaluation instead "
                                 "of logging it and training on."})
    overwrite: bool = field(default=False, metadata={"help": "Start a fresh (not resumed) run in an output directory "
                            "that holds another run's SAGO history (kept beside it as history.jsonl.<time>.old); "
                            "without it such a run is refused at train start."})
    guard_reporters: bool = field(default=False, metadata={"help": "Wrap the Trainer's reporting integrations so that "
                                  "one that fails (a W&B that cannot start) is logged and switched off instead of "
                                  "stopping training."})
