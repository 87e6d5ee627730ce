"""``SAGOEarlyStoppingCallback``: stop training when the watched quantity regresses significantly, with the run's
false-stop rate held at ``alpha`` (docs/early-stopping.md)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from ..errors import SagoInputError
from ..formatting import printable
from ..functional import verdict_rule
from ..functional.axes.registry import higher_is_better
from ..functional.sequential import look_level, unreachable_look
from ..results.best import Best, BestEntry, is_untrained
from ..results.degenerate import degenerate_sets
from ..results.evaluation import Evaluation
from .early_stopping_multi import MultiMetricMixin
from .keys import check_target, parse_metric, parse_metric_or_none
from .options import EarlyStoppingOptions
from .stopping_plan import BestField, paired_look, split_metrics, start_line, threshold_look

logger = logging.getLogger(__name__)

class SAGOEarlyStoppingCallback(TrainerCallback, ExportableState):
    """Stop training when ``metric`` has become significantly worse than a reference fixed in advance, with the
    run-level false-stop rate (the chance that a run without any trend is stopped) at most ``alpha``; the manual's
    page docs/early-stopping.md has the rule in full and its measured false-stop rate and power.

    ``paired`` mode (default) answers "are the latest evaluations worse than the first ones?": the *reference*
    is the per-group mean of the first ``patience`` evaluations (from ``reference_step``; the step-0 baseline
    only with ``exclude_baseline=False``), the *window* that of the latest ``patience``. Each evaluation from the
    one that fills the window is a *look*: the window against the reference, paired by group id, by the one
    verdict rule (:func:`sago_train.functional.verdict_rule.decide`) at the look's level; training stops at the first
    look that is worse. The level is ``alpha / L`` for the ``L`` looks the run plans (:meth:`plan`, called by the
    :class:`SAGOCallback` at train start), so by the union bound a trendless run is stopped with a probability
    of at most ``alpha`` however many evaluations it has; a look past the plan cannot stop; without a plan the
    levels of :func:`sago_train.functional.sequential.look_level` sum to ``alpha`` over any number of looks. Not
    "worse than the best so far": that stopped 11-42% of trendless runs (the best is the luckiest draw). A level
    the groups cannot reach (a one-sided Wilcoxon p on n groups is >= ``2**-n``) is refused at train start.

    ``threshold`` mode compares means only (worse than the best so far by more than ``min_delta`` for ``patience``
    evaluations in a row), like transformers' ``EarlyStoppingCallback``: **no error control** (said once in the log).
    The best evaluation so far is kept (``best_step``, ``best_mean``; never the step-0 baseline with
    ``exclude_baseline``; with ``load_best_model_at_end`` and ``metric_for_best_model`` naming ``metric``, the
    Trainer's best checkpoint). ``sago/<set>/accuracy`` (higher is better) is watched like an axis. Several metrics
    (a list, or ``"a,b"``): one stopper (:class:`MultiMetricEarlyStopping`) tests each at
    ``alpha / M`` (union bound: the run's false-stop rate over all M stays at most ``alpha``) and stops at the first
    that is worse. At train start one line says the metric, its direction, the reference's steps, the planned looks
    and their level; every decision has a ``p_value``. Only evaluations with the watched quantity count
    (``generation_every``). The state survives checkpoint and resume.

    Example:
        >>> stopper = SAGOEarlyStoppingCallback("sago/paraphrase/activation", patience=2, alpha=0.05)
        >>> stopper.set_name, stopper.quantity
        ('paraphrase', 'activation')
        >>> stopper.plan(64, steps=list(range(0, 1001, 100)))  # baseline + 10: looks at the 4th to the 10th
        >>> stopper.looks, round(stopper.level(1), 6)
        (7, 0.007143)
    """

    def __new__(cls, metric: Any = "", *args: Any, **kwargs: Any) -> SAGOEarlyStoppingCallback:
        # Several metrics ("a,b" or a list): one stopper over all of them, alpha split by the union bound.
        if cls is SAGOEarlyStoppingCallback and len(split_metrics(metric)) > 1:
            return super().__new__(MultiMetricEarlyStopping)
        return super().__new__(cls)

    def __init__(
        self,
        metric: str,
        patience: int = EarlyStoppingOptions.patience,
        alpha: float = EarlyStoppingOptions.alpha,
        min_delta: float = EarlyStoppingOptions.min_delta,
        mode: str = EarlyStoppingOptions.mode,
        exclude_baseline: bool = EarlyStoppingOptions.exclude_baseline,
        reference_step: int = EarlyStoppingOptions.reference_step,
    ) -> None:
        EarlyStoppingOptions(metric, patience, alpha, min_delta, mode, exclude_baseline, reference_step)  # validates
        self.metric = metric
        self.set_name, self.quantity = parse_metric(metric)
        self.patience = patience
        self.alpha = float(alpha)
        self.min_delta = float(min_delta)
        self.mode = mode
        self.exclude_baseline = exclude_baseline
        self.reference_step = reference_step
        #: Among how many watched metrics alpha was split (a MultiMetricEarlyStopping's watchers say so).
        self.split = 1
        self._fresh_state()
        self._source: Any = None  # the SAGOCallback that feeds this one (see connect)
        self._warned: set[str] = set()
        self._started_over = False  # a new baseline (see start_over): the checkpoint's state is not restored

    @property
    def axis(self) -> str:
        """The watched quantity (an axis, ``instability`` or ``accuracy``): the name before :attr:`quantity`."""
        return self.quantity

    def _fresh_state(self) -> None:
        """The state of a run that has seen no evaluation (JSON-serializable, saved with checkpoints; the best
        so far is a :class:`~sago_train.results.compare.Best` of the watched quantity, saved as its
        ``best_step``, ``best_mean``, ``best_ids`` and ``best_values``)."""
        self.best = Best(untrained=not self.exclude_baseline)
        # Following the Trainer's best: the last improvement, {"step", "mean", "ids", "values"}, until confirmed.
        self.candidate: dict[str, Any] | None = None
        self.counter = 0  # threshold mode: worse evaluations in a row
        # paired mode: the first `patience` evaluations and the latest `patience`, each {"step", "values": {id: v}}
        self.reference: list[dict[str, Any]] = []
        self.window: list[dict[str, Any]] = []
        self.looks: int | None = None  # the looks the run plans (None: no plan, the spending sequence)
        self.looks_done = 0
        self.stopped_step: int | None = None
        self.reason: str | None = None
        self.decisions: list[dict[str, Any]] = []
        self.baseline_ignores: bool | None = None  # whether the first evaluation's outputs ignored the question

    # The best so far, as checkpoints save it (one Best entry, four attributes).
    best_step = BestField()
    best_mean = BestField()
    best_ids = BestField()
    best_values = BestField()

    def start_over(self) -> None:
        """Forget every evaluation seen, also the checkpoint's: a resumed run started a new baseline."""
        self._fresh_state()
        self._started_over = True

    @classmethod
    def from_args(cls, args: Any) -> SAGOEarlyStoppingCallback:
        """Build from parsed :class:`~sago_train.SAGOArguments` (``--sago_early_stopping_*`` flags); an error names
        ``--sago_early_stopping_metric`` when it is not given."""
        return cls(**args.early_stopping_kwargs())

    def state(self) -> dict[str, Any]:
        names = ("best_step", "best_mean", "best_ids", "best_values", "candidate", "counter", "reference", "window",
                 "looks", "looks_done", "stopped_step", "reason", "decisions", "baseline_ignores")
        return {
            "args": {"metric": self.metric, "patience": self.patience, "alpha": self.alpha,
                     "min_delta": self.min_delta, "mode": self.mode, "exclude_baseline": self.exclude_baseline,
                     "reference_step": self.reference_step},
            "attributes": {name: getattr(self, name) for name in names},
        }

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """On resume, restore the state saved in the checkpoint even when the Trainer's
        ``restore_callback_states_from_checkpoint`` is off (its default). A state saved by an earlier version
        restores too: the missing attributes keep their defaults."""
        self._check_trainer_direction(args)
        self._warn_threshold()
        if self._started_over or state.global_step == 0 or not isinstance(state.stateful_callbacks, dict):
            return
        saved = state.stateful_callbacks.get(type(self).__name__)
        for item in saved if isinstance(saved, list) else [saved]:
            if isinstance(item, dict) and item.get("args", {}).get("metric") == self.metric:
                for key, value in item.get("attributes", {}).items():
                    setattr(self, key, value)
                logger.info("sago early stopping: restored state from the checkpoint (%d look(s) done)",
                            self.looks_done)
                return

    def connect(self, source: Any) -> None:
        """Called by the :class:`SAGOCallback` that will feed this one its evaluations (when it is bound to a
        Trainer, and again at train start before its baseline): a Trainer that ranks the metric the other way is
        refused here, before any evaluation is paid for."""
        self._source = source
        trainer = getattr(source, "trainer", None)
        if trainer is not None and getattr(trainer, "args", None) is not None:
            self._check_trainer_direction(trainer.args)

    # ------------------------------------------------------------------ the plan (train start)
    def counts(self, step: int) -> bool:
        """Whether an evaluation at ``step`` takes part in the paired rule (reference or window)."""
        return step >= self.reference_step and not (self.exclude_baseline and is_untrained(step))

    def plan(self, n_groups: int | None, steps: Sequence[int] | None) -> None:
        """At train start, before any evaluation (the :class:`SAGOCallback` calls it with the steps of the
        evaluations it plans that will have the watched quantity, None when it cannot say): fix the number of
        looks, hence each look's level, and refuse a level that ``n_groups`` can never reach. Kept once a look
        has spent part of alpha (a resumed run goes on with its plan)."""
        if self.mode != "paired":
            self._warn_threshold()
            logger.info("%s", start_line(self, steps))
            return
        if self.looks_done == 0:
            if steps is None:
                self.looks = None
            else:
                future = sum(1 for s in steps if self.counts(int(s)))
                before_first = (self.patience - len(self.reference)) + max(0, self.patience - len(self.window))
                self.looks = max(0, future - max(1, before_first) + 1)
        logger.info("%s", start_line(self, steps))
        if self.looks == 0:
            self._warn_once("no look", "sago early stopping: %s: the run plans too few evaluations for patience %d "
                            "(the reference and the window need %d), so it can never stop training; lower patience "
                            "or evaluate more often (eval_steps)", self.metric, self.patience, 2 * self.patience)
            return
        if self.looks is None:
            logger.info("sago early stopping: %s: the number of evaluations is not planned (automatic cadence), so "
                        "look k is tested at alpha * 10 / ((k + 9)(k + 10)) (%.2g at the first, ever smaller "
                        "later; their sum is alpha): a fixed eval_steps with max_steps gives every look alpha / "
                        "looks", printable(self.metric), self.level(1))
        if n_groups is None:
            return
        bad = unreachable_look(self.alpha, self.looks, n_groups)
        if bad == 1:
            level = self.level(1)
            raise SagoInputError(
                f"early stopping on {self.metric} tests its first look at level {level:.3g} (alpha {self.alpha:g} "
                f"over {self.looks or 'an unplanned number of'} look(s)), which a one-sided Wilcoxon test on "
                f"{n_groups} group(s) can never reach (its smallest p is 2^-{n_groups}); it needs >= "
                f"{verdict_rule.min_groups(level)} groups", key="max_groups",
                hint="evaluate more groups (max_groups, or a larger set), plan fewer evaluations (a larger "
                     "eval_steps), or raise alpha")
        if bad is not None and bad < 1000:
            self._warn_once("late looks", "sago early stopping: %s: with %d group(s), the levels of an "
                            "unplanned cadence (ever stricter) can never be reached from look %d on, so those looks "
                            "cannot stop training; evaluate more groups or set eval_steps", self.metric, n_groups, bad)

    def level(self, look: int) -> float:
        """The significance level of look ``look`` (1-based), from the plan: see
        :func:`~sago_train.functional.sequential.look_level`."""
        return look_level(self.alpha, look, self.looks)

    # ------------------------------------------------------------------ the Trainer's best
    def follows_trainer(self, args: TrainingArguments) -> bool:
        """Whether "best" is the Trainer's best checkpoint: ``load_best_model_at_end`` with
        ``metric_for_best_model`` naming this metric (with or without the ``eval_`` prefix)."""
        name = getattr(args, "metric_for_best_model", None) or ""
        return bool(getattr(args, "load_best_model_at_end", False)) and parse_metric_or_none(name) == (
            self.set_name, self.quantity)

    def _check_trainer_direction(self, args: TrainingArguments) -> None:
        """Following the Trainer's best needs the Trainer to rank this metric the same way. transformers defaults
        ``greater_is_better`` to True for any metric not ending in "loss", so an unset one makes the Trainer keep
        the *least* stable checkpoint while this callback waits for it to confirm the most stable one: the two
        would silently disagree on every "best". Refuse before training instead."""
        if not self.follows_trainer(args):
            return
        want = higher_is_better(self.quantity)
        got = getattr(args, "greater_is_better", None)
        if got is not None and bool(got) != want:
            raise SagoInputError(
                f"load_best_model_at_end with metric_for_best_model={args.metric_for_best_model!r} ranks it with "
                f"greater_is_better={got}, but '{self.quantity}' is {'higher' if want else 'lower'}-is-better: the "
                f"Trainer's best checkpoint would be the {'least' if not want else 'most'} stable one, and early "
                f"stopping on {self.metric} could never agree with it",
                key="greater_is_better", hint=f"pass greater_is_better={want} in the TrainingArguments")

    def _sync_with_trainer(self, state: TrainerState) -> None:
        """Adopt the candidate once the Trainer has made its step the best (``best_global_step``)."""
        cand = self.candidate
        step = getattr(state, "best_global_step", None)
        if cand is not None and step is not None and int(cand["step"]) == int(step):
            self.best.set(self.set_name, self.quantity, BestEntry(int(cand["step"]), float(cand["mean"]), None,
                                                                  tuple(cand["ids"]),
                                                                  tuple(float(v) for v in cand["values"])))
            self.candidate = None

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        # The Trainer decides its best just before it saves: this is the first moment to agree with it.
        if self.follows_trainer(args):
            self._sync_with_trainer(state)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        if self.follows_trainer(args):
            self._sync_with_trainer(state)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        if self._source is None:
            # Without a feed this callback would never stop anything: say so instead of training on silently.
            raise SagoInputError(
                "SAGOEarlyStoppingCallback receives no SAGO evaluations: no SAGOCallback is bound to this Trainer",
                hint="bind the SAGOCallback with SAGOCallback(..., trainer=trainer) or callback.attach(trainer), "
                     "or call sago_callback.add_listener(early_stopping)",
            )

    # ------------------------------------------------------------------ one evaluation
    def on_sago_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, *,
                         evaluation: Evaluation, **kwargs: Any) -> None:
        """Called by :class:`SAGOCallback` after each evaluation (``kwargs``: its ``comparison`` and ``monitor``,
        unused: the paired rule compares windows, not two evaluations). An evaluation without the watched
        quantity (one without generation, see ``SAGOCallback(generation_every=...)``) does not count: no
        decision."""
        watched = evaluation.sets.get(self.set_name)
        if watched is not None and self.quantity not in watched.quantities and watched.skipped_axes:
            return
        check_target(self.set_name, self.quantity, evaluation.sets, [] if watched is None else watched.axes,
                     correctness=watched is not None and watched.accuracy is not None)
        by_id = evaluation.group_values(self.set_name, self.quantity) or {}
        ids = list(by_id)
        current = np.array([by_id[i] for i in ids], float)
        mean = float(np.nanmean(current)) if np.isfinite(current).any() else math.nan
        if not math.isfinite(mean):
            return
        step = int(state.global_step)
        follow = self.follows_trainer(args)
        if follow:
            self._sync_with_trainer(state)
        decision: dict[str, Any] = {"step": step, "mean": mean}
        if self.exclude_baseline and is_untrained(step):
            decision["verdict"] = "baseline (never the best: no checkpoint; not in the reference)"
            self._record(decision)
            return
        # A step whose outputs no longer depend on the question agrees across variants: never the best.
        ignored = self.set_name in degenerate_sets(evaluation)
        if self.baseline_ignores is None:
            self.baseline_ignores = ignored
        if ignored := ignored and not self.baseline_ignores:
            decision["degenerate"] = "the outputs no longer depend on the question: never the best"
        improved = None if ignored else self._track_best(step, ids, current, mean, follow)
        if self.mode == "threshold":
            self._warn_threshold()
            stop = self._threshold_look(decision, improved, mean)
        else:
            stop = self._paired_look(decision, step, dict(zip(ids, (float(x) for x in current))))
        self._record(decision)
        if stop:
            self.stopped_step = step
            logger.warning("sago early stopping at step %d: %s", step, printable(self.reason))
            control.should_training_stop = True

    def _record(self, decision: dict[str, Any]) -> None:
        """Keep a decision; every one has a ``p_value``: the look's one-sided Wilcoxon p, 1.0 where no test ran
        (the baseline, the reference, a window not yet full, threshold mode) or none could (too few groups)."""
        if decision.get("p_value") is None:
            decision["p_value"] = 1.0
            decision.setdefault("tested", False)
        self.decisions.append(decision)

    def _track_best(self, step: int, ids: list[str], current: np.ndarray, mean: float, follow: bool) -> str | None:
        """Keep the best evaluation so far; returns the word for an improvement, else None."""
        if not self.best.improves(self.set_name, self.quantity, step, mean):
            return None
        if follow:
            self.candidate = {"step": step, "mean": mean, "ids": list(ids), "values": [float(x) for x in current]}
            return "improved (the best once the Trainer checkpoints it)"
        self.best.offer(self.set_name, self.quantity, step, mean, ids=ids, values=current)
        return "best"

    def _paired_look(self, decision: dict[str, Any], step: int, values: dict[str, float]) -> bool:
        return paired_look(self, decision, step, values)

    def _threshold_look(self, decision: dict[str, Any], improved: str | None, mean: float) -> bool:
        return threshold_look(self, decision, improved, mean)

    def _warn_threshold(self) -> None:
        if self.mode == "threshold":
            self._warn_once("threshold", "sago early stopping: %s in threshold mode compares means only and has no "
                            "error control: noise alone can stop training (mode='paired' holds the run's false-stop "
                            "rate at alpha)", self.metric)

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *(printable(a) if isinstance(a, str) else a for a in args))  # the metric


class MultiMetricEarlyStopping(MultiMetricMixin, SAGOEarlyStoppingCallback):
    """:class:`SAGOEarlyStoppingCallback` over several metrics (:class:`~.early_stopping_multi.MultiMetricMixin`)."""

    _single = SAGOEarlyStoppingCallback
