"""The options of the Trainer callbacks, each declared once (a field, its help and its one default), as TRL
declares ``SFTConfig``: :class:`MonitorOptions` is what :class:`~sago_train.SAGOCallback` takes (its keyword
arguments map onto these fields), the recipe's ``monitor`` section and the ``--sago_<option>`` flags;
:class:`EarlyStoppingOptions` the same for :class:`~sago_train.SAGOEarlyStoppingCallback`. Each checks its
values on construction (an error names the field). No torch or transformers import here, so the CLI starts
fast."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import SagoInputError, unknown_name_error

LOG_LEVELS = ("default", "full")


def _positive_int(value: Any, key: str, hint: str | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SagoInputError(f"expected a positive integer, got {value!r}", key=key, hint=hint)


@dataclass
class MonitorOptions:
    """When and how :class:`~sago_train.SAGOCallback` evaluates, and what it does around its evaluations.

    Example:
        >>> MonitorOptions(eval_steps=100).generation_every
        4
    """

    eval_steps: int | None = field(default=None, metadata={"help": "Evaluate every N optimizer steps. Default: "
                                   "whenever the Trainer evaluates, else an automatic cadence within overhead_budget."})
    baseline: bool = field(default=True, metadata={"help": "Evaluate once before the first training step."})
    overhead_budget: float = field(default=0.05, metadata={"help": "Automatic cadence: the share of training wall "
                                   "time that evaluations may take, the final one included; the baseline, before "
                                   "the first step, is a one-off set-up cost outside it (the cost line says what "
                                   "it took)."})
    generation_every: int = field(default=4, metadata={"help": "Compute the axes that need greedy generation "
                                  "(confidence, generation, mirroring, posix, accuracy; confidence_prob on groups without a "
                                  "reference) only "
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
    evaluate_at_end: bool = field(default=True, metadata={"help": "Evaluate at the last training step (the final "
                                  "evaluation), whatever the cadence."})
    log_unstable_groups: int = field(default=10, metadata={"help": "Rows of the W&B table of the most unstable "
                                     "groups (0 disables it)."})
    raise_on_error: bool = field(default=False, metadata={"help": "Re-raise an exception from an evaluation instead "
                                 "of logging it and training on."})
    overwrite: bool = field(default=False, metadata={"help": "Start a fresh (not resumed) run in an output directory "
                            "that holds another run's SAGO history (kept beside it as history.jsonl.<time>.old); "
                            "without it such a run is refused at train start."})
    new_baseline: bool = field(default=False, metadata={"help": "When a resumed run's monitored set (or a setting "
                               "that changes its numbers) differs from what its history measured: set that history "
                               "aside (history.jsonl.<time>.old) and measure a new baseline at the resumed step; "
                               "without it such a resume is refused at train start."})
    guard_reporters: bool = field(default=False, metadata={"help": "Wrap the Trainer's reporting integrations so that "
                                  "one that fails (a W&B that cannot start) is logged and switched off instead of "
                                  "stopping training."})

    def __post_init__(self) -> None:
        _positive_int(self.generation_every, "generation_every", "1 computes every axis at every evaluation")
        if self.eval_steps is not None:
            _positive_int(self.eval_steps, "eval_steps")
        budget = self.overhead_budget
        if isinstance(budget, bool) or not (isinstance(budget, (int, float)) and budget > 0 and math.isfinite(budget)):
            raise SagoInputError(f"expected a positive number, got {budget!r}", key="overhead_budget")
        if self.log_level not in LOG_LEVELS:
            raise SagoInputError(f"expected one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}", key="log_level")
        if isinstance(self.log_unstable_groups, bool) or not isinstance(self.log_unstable_groups, int) \
                or self.log_unstable_groups < 0:
            raise SagoInputError(f"expected an integer >= 0, got {self.log_unstable_groups!r}",
                                 key="log_unstable_groups")
        for name in ("baseline", "evaluate_at_end", "raise_on_error", "overwrite", "new_baseline", "guard_reporters"):
            if not isinstance(getattr(self, name), bool):
                raise SagoInputError(f"expected true or false, got {getattr(self, name)!r}", key=name)


MODES = ("paired", "threshold")


@dataclass
class EarlyStoppingOptions:
    """When :class:`~sago_train.SAGOEarlyStoppingCallback` stops training (the manual's "Early stopping" page,
    docs/early-stopping.md, says what each rule answers and its measured error rate).

    Example:
        >>> EarlyStoppingOptions("sago/paraphrase/activation_rel").patience
        3
    """

    metric: str = field(default="", metadata={"help": "sago/<set>/<quantity> to watch: an axis, instability, or "
                        "accuracy (higher is better: a guard against forgetting; the set needs references). "
                        "Several, comma-separated (sago/p/confidence,sago/p/accuracy): one stopper, each "
                        "metric tested at alpha / their number (union bound), stopping at the first worse."})
    patience: int = field(default=3, metadata={"help": "paired: how many evaluations make the reference (the "
                          "first ones) and the window compared with it (the latest ones, by their per-group mean). "
                          "threshold: worse evaluations in a row before stopping."})
    alpha: float = field(default=0.05, metadata={"help": "paired: the run-level false-stop rate. Each look (an "
                         "evaluation that can stop training) is tested at alpha / the looks the run plans (from "
                         "max_steps and the cadence; without a plan, a sequence of levels whose sum over any "
                         "number of looks is alpha): the one-sided Wilcoxon p must be below that level and the "
                         "paired-bootstrap CI at that level must exclude 0."})
    min_delta: float = field(default=0.0, metadata={"help": "Smallest change in the worse direction that counts."})
    mode: str = field(default="paired", metadata={"help": "paired (the window's per-group mean worse than the "
                                                          "reference's by the one verdict rule of report and "
                                                          "compare, at a level that holds the run-level false-stop "
                                                          "rate at alpha) or threshold (means only, against the "
                                                          "best so far, like transformers' EarlyStoppingCallback: "
                                                          "no error control).",
                                                  "choices": MODES})
    exclude_baseline: bool = field(default=True, metadata={"help": "Leave the step-0 evaluation (the baseline, "
                                   "before training) out of the reference, which then starts with the first "
                                   "evaluation after training starts; it is never the best either (no checkpoint "
                                   "to go back to). False: the reference starts with the model before training."})
    reference_step: int = field(default=0, metadata={"help": "paired: the reference starts with the first "
                                "evaluation at or after this global step (e.g. the end of a warm-up); earlier "
                                "evaluations are not compared."})

    def __post_init__(self) -> None:
        _positive_int(self.patience, "patience")
        if isinstance(self.alpha, bool) or not (isinstance(self.alpha, (int, float)) and 0 < self.alpha < 1):
            raise SagoInputError(f"expected a number in (0, 1), got {self.alpha!r}", key="alpha")
        delta = self.min_delta
        if isinstance(delta, bool) or not (isinstance(delta, (int, float)) and math.isfinite(delta) and delta >= 0):
            raise SagoInputError(f"expected a finite number >= 0, got {delta!r}", key="min_delta")
        if self.mode not in MODES:
            raise unknown_name_error("early-stopping mode", self.mode, MODES, key="mode")
        if not isinstance(self.exclude_baseline, bool):
            raise SagoInputError(f"expected true or false, got {self.exclude_baseline!r}", key="exclude_baseline")
        step = self.reference_step
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise SagoInputError(f"expected an integer >= 0, got {step!r}", key="reference_step")


def options_from_kwargs(cls: type, base: Any, kwargs: dict[str, Any], *, also: tuple[str, ...] = ()) -> tuple[Any, dict]:
    """``base`` (an instance of the options dataclass ``cls``, or None for its defaults) with the ``kwargs`` that
    name its fields applied; returns it and the remaining kwargs. A name that is neither a field of ``cls`` nor in
    ``also`` (the fields of another options object the caller takes) is an error with the closest valid name.

    Example:
        >>> opts, rest = options_from_kwargs(MonitorOptions, None, {"eval_steps": 5, "axes": "activation"},
        ...                                  also=("axes",))
        >>> opts.eval_steps, rest
        (5, {'axes': 'activation'})
    """
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in kwargs if k not in names and k not in also]
    if unknown:
        raise unknown_name_error("option", unknown[0], [*names, *also], key=unknown[0])
    own = {k: v for k, v in kwargs.items() if k in names}
    rest = {k: v for k, v in kwargs.items() if k not in names}
    return (dataclasses.replace(base, **own) if base is not None else cls(**own)), rest
