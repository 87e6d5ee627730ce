"""The options of the Trainer callbacks, declared once (a field, its help and its one default): read by
:class:`~sago_train.SAGOCallback` and :class:`~sago_train.SAGOEarlyStoppingCallback` for their defaults and by
the recipe's ``monitor`` and ``early_stopping`` sections, which are these dataclasses. No torch or transformers
import here, so the CLI starts fast."""

from __future__ import annotations

from dataclasses import dataclass, field


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
                                  "complete. 1 = every evaluation complete."})
    log_level: str = field(default="default", metadata={"help": "What each evaluation sends to the Trainer log "
                           "(console, TensorBoard, W&B charts). default: per set the axis means, instability and "
                           "accuracy, plus the overall instability and the runtime; CI bounds, p-values, "
                           "_vs_baseline/_vs_best and set-level figures go only to history.jsonl and the W&B summary "
                           "and tables. full: every number in the log too."})


LOG_LEVELS = ("default", "full")


@dataclass
class EarlyStoppingOptions:
    """When :class:`~sago_train.SAGOEarlyStoppingCallback` stops training."""

    metric: str = field(default="", metadata={"help": "sago/<set>/<axis> to watch."})
    patience: int = field(default=3, metadata={"help": "Worse evaluations in a row before stopping."})
    alpha: float = field(default=0.05, metadata={"help": "Significance level of the paired test."})
    min_delta: float = field(default=0.0, metadata={"help": "Smallest change in the worse direction that counts."})
    mode: str = field(default="paired", metadata={"help": "paired (a one-sided paired test against the best "
                                                          "evaluation) or threshold (means only)."})
