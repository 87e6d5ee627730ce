"""What survives between evaluations during training: the run's SAGO history on disk (this run's alone: a lock
and no other run's history replaced), the baseline, the best evaluation so far per (set, quantity), and the
paired change of each evaluation against both (groups paired by id, judged by the one verdict rule
:func:`sago_train.functional.verdict_rule.decide`), which the callback reports and early stopping decides on.

Quantities compared: every axis, ``instability`` (when both evaluations have it), accuracy (the share of a
group's variants answered right), ``accuracy_all`` (all of them right) and ``accuracy_worst_kind`` (the
variant of the kind answered worst over the two evaluations compared), and ``between_dispersion`` (to tell a collapse from stability). Kept
apart from the callback so that resume logic (what is on disk, what to drop, what to reload) is plain code that
is tested without a Trainer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import distributed
from ..errors import SagoInputError
from ..eval.degenerate import degenerate_sets
from ..functional import stats, verdict_rule
from ..functional.axes import ACCURACY, ACCURACY_ALL, ACCURACY_WORST_KIND, BETWEEN
from ..functional.axes.registry import higher_is_better
from ..functional.formatting import printable
from ..io import acquire_run_lock, release_run_lock, set_aside
from ..results import store
from ..results.evaluation import Evaluation
from ..results.layout import history_path, records_name, step_dir
from ..results.sets import paired_group_values, paired_worst_kind

logger = logging.getLogger("sago_train.integrations.callback")  # the callback's log

#: Correctness quantities compared beside the axes (higher is better).
ACCURACIES = (ACCURACY, ACCURACY_ALL, ACCURACY_WORST_KIND)


def is_improvement(quantity: str, mean: float, best_mean: float | None) -> bool:
    """Whether ``mean`` beats ``best_mean`` on ``quantity`` (its direction from the axis registry)."""
    if best_mean is None:
        return True
    return mean > best_mean if higher_is_better(quantity) else mean < best_mean


def is_untrained(step: int | None) -> bool:
    """An evaluation at step 0 measures the model before any training step (the callback's baseline, or the
    Trainer's ``eval_on_start``): there is no checkpoint of it to go back to, so it is never the "best"."""
    return step == 0


def quantities(ev: Evaluation, set_name: str) -> list[str]:
    """What ``set_name`` of ``ev`` can be compared on: its axes, ``instability`` when recorded, the accuracy
    quantities when it has correctness, ``between_dispersion`` with ``activation_rel``."""
    s = ev.sets[set_name]
    out = list(s.quantities)
    if s.accuracy is not None:
        out += [ACCURACY, ACCURACY_ALL] + ([ACCURACY_WORST_KIND] if s.worst_kind is not None else [])
    if "activation_rel" in s.set_level:
        out.append(BETWEEN)
    return out


def axis_verdict(quantity: str, reference: Mapping[str, float], current: Mapping[str, float], *,
                 alpha: float = stats.ALPHA, min_delta: float = 0.0, seed: int = 0) -> verdict_rule.Verdict | None:
    """``current`` against ``reference`` (``{group id: value}``, paired by id) by the one verdict rule
    (:func:`~sago_train.functional.verdict_rule.paired_verdict_by_id`) in the axis registry's direction: ``mean_diff`` =
    mean of (current - reference); ``p_worse`` is the one-sided Wilcoxon test that ``current`` is worse. None
    when no group is shared."""
    return verdict_rule.paired_verdict_by_id(reference, current, higher_is_better=higher_is_better(quantity), alpha=alpha,
                                      min_delta=min_delta, seed=seed)


def paired_change(reference: Evaluation, current: Evaluation, set_name: str, quantity: str, *,
                  alpha: float = stats.ALPHA, min_delta: float = 0.0, seed: int = 0) -> verdict_rule.Verdict | None:
    """:func:`axis_verdict` of one set and quantity of two evaluations; ``accuracy_worst_kind`` reads the kind
    answered worst over both (:func:`~sago_train.results.sets.paired_worst_kind`) in both. None without records
    of both or a shared group."""
    values = paired_group_values(reference.sets.get(set_name), current.sets[set_name], quantity)
    if values is None:
        return None
    return axis_verdict(quantity, *values, alpha=alpha, min_delta=min_delta, seed=seed)


def change_entry(verdict: verdict_rule.Verdict, step: int | None) -> dict[str, Any]:
    """The ``vs_baseline`` / ``vs_best`` entry of a ``history.jsonl`` line: ``p_value`` is the one-sided test of
    a regression (``p_worse``; the key predates the rule), ``verdict`` the rule's word."""
    return stats.to_jsonable({"mean_diff": verdict.mean_diff, "ci_low": verdict.ci_low, "ci_high": verdict.ci_high,
                              "p_value": verdict.p_worse, "p_better": verdict.p_better, "n": verdict.n,
                              "verdict": verdict.verdict, "step": step})


@dataclass
class MonitorState:
    """The evaluations of one training run, mirrored on disk under ``<output_dir>/sago``."""

    root: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    baseline: Evaluation | None = None
    best: dict[tuple[str, str], Evaluation] = field(default_factory=dict)
    last: Evaluation | None = None
    skipped_lines: int = 0  # corrupt history lines skipped at the last load
    baseline_degenerate: set[str] = field(default_factory=set)  # the baseline's sets whose outputs ignored the question
    _lock: Path | None = None

    @property
    def history_path(self) -> Path:
        return history_path(self.root)

    def step_dir(self, step: int) -> Path:
        return step_dir(self.root, step)

    # ------------------------------------------------------------------ the run directory
    def claim(self, *, resumed: bool, overwrite: bool) -> None:
        """Hold the run directory (one process at a time) and refuse to replace another run's history. Rank 0
        decides and every rank raises the same error, so none waits in a collective for a rank that stopped."""
        error = None
        if distributed.is_main_process():
            try:
                if self._lock is None:
                    self._lock = acquire_run_lock(self.root)
                store.claim_history(self.root, resuming=resumed, overwrite=overwrite)
            except SagoInputError as err:
                error = str(err)
            except OSError as err:  # e.g. an output_dir that cannot be created
                error = f"cannot use {self.root} for the SAGO history: {err.strerror or err}"
        error = distributed.broadcast_object(error)
        if error is not None:
            self.release()
            raise SagoInputError(error)

    def release(self) -> None:
        """Give the run directory back (the lock file is removed)."""
        if self._lock is not None:
            release_run_lock(self._lock.parent)
            self._lock = None

    # ------------------------------------------------------------------ resume
    def load(self, resume_step: int | None, *, write: bool = True, require_baseline: bool = True) -> None:
        """Reload the history. A fresh run (``resume_step`` None) starts empty; a resumed run keeps evaluations
        up to the checkpoint's step and drops later ones, which the resumed run will redo (so none is
        duplicated). A corrupt history line is logged (file and line) and skipped, and counted in
        ``skipped_lines``; the rewritten history drops it (see :mod:`~sago_train.results.store`)."""
        self.history, self.baseline, self.best, self.last, self.skipped_lines = [], None, {}, None, 0
        self.baseline_degenerate = set()
        if resume_step is None or not self.history_path.exists():
            return
        run = store.Run.read(self.root.parent, self.root, self.root.name, allow_empty=True)
        self.skipped_lines = run.skipped_lines
        self.history = [h for h in run.history if int(h["step"]) <= resume_step]
        later = [int(h["step"]) for h in run.history if int(h["step"]) > resume_step]
        if write and later:  # the lines the resumed run will redo: kept whole with their records, never deleted
            aside = set_aside(self.history_path)
            steps = store.set_aside_steps(self.root, later, aside)
            logger.warning("sago: resuming at step %d: the history's %d later evaluation(s) (steps %s) were set "
                           "aside: the whole history in %s%s", resume_step, len(later),
                           ", ".join(map(str, later[:10])) + (", ..." if len(later) > 10 else ""), printable(aside),
                           f", their step folders in {printable(steps)}" if steps else "")
        if write:  # only the main process writes
            store.write_history(self.root, self.history)
        for i, entry in enumerate(self.history):
            ev = run.evaluation(int(entry["step"]))
            if all(s.has_records for s in ev.sets.values()):
                self.observe(ev)
            elif i == 0 and require_baseline:  # without the baseline's records the changes would silently be against a later step
                missing = [records_name(n) for n, s in ev.sets.items() if not s.has_records]
                raise SagoInputError(
                    f"the baseline (step {entry['step']}) of {self.history_path} has no group records "
                    f"({self.step_dir(int(entry['step'])) / missing[0]} is missing): the resumed run would compare "
                    "with a later step instead", hint="restore the step folder, or resume with a new baseline "
                    "(sago-train run --resume --new-baseline, SAGOCallback(new_baseline=True))")

    # ------------------------------------------------------------------ one evaluation
    def compare(self, ev: Evaluation, seed: int = 0) -> dict[str, dict[str, dict[str, Any]]]:
        """Paired change of ``ev`` against the baseline and the best evaluation so far, per set and quantity
        (see :func:`change_entry`); for an instability ``mean_diff > 0`` means *less* stable. On a set whose
        outputs no longer depend on the question, a "better" stability verdict is ``degenerate outputs``."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        degenerate = degenerate_sets(ev, self.baseline_degenerate)
        for name in ev.sets:
            for quantity in quantities(ev, name):
                entry: dict[str, Any] = {}
                best = self.best.get((name, quantity))
                for label, ref in (("vs_baseline", self.baseline), ("vs_best", best)):
                    if ref is None or ref.step == ev.step or name not in ref.sets:
                        continue
                    verdict = paired_change(ref, ev, name, quantity, seed=seed)
                    if verdict is not None and verdict.n:
                        entry[label] = change_entry(verdict, ref.step)
                        if name in degenerate and quantity not in ACCURACIES and verdict.verdict == stats.BETTER:
                            entry[label]["verdict"] = stats.DEGENERATE
                        if quantity == ACCURACY_WORST_KIND:  # which kind was compared (chosen on both)
                            entry[label]["kind"] = paired_worst_kind(ref.sets[name], ev.sets[name])
                if entry:
                    out.setdefault(name, {})[quantity] = entry
        return out

    def observe(self, ev: Evaluation) -> None:
        """Update the baseline (the first evaluation), the last one and the per-(set, quantity) best (by mean,
        as the Trainer picks its best checkpoint; never the untrained step 0, see :func:`is_untrained`, nor a set
        whose outputs no longer depend on the question). Group records are kept without their variants and
        outputs."""
        degenerate = degenerate_sets(ev)
        ev = ev.slim()
        if self.baseline is None:
            self.baseline, self.baseline_degenerate = ev, degenerate
        degenerate -= self.baseline_degenerate
        self.last = ev
        if is_untrained(ev.step):
            return
        for name in ev.sets:
            if name in degenerate:
                continue
            for quantity in quantities(ev, name):
                mean = ev.mean(name, quantity) if quantity != BETWEEN else math.nan  # compared, never ranked
                if not math.isfinite(mean):
                    continue
                cur = self.best.get((name, quantity))
                if is_improvement(quantity, mean, None if cur is None else cur.mean(name, quantity)):
                    self.best[(name, quantity)] = ev

    def record(self, ev: Evaluation, line: dict[str, Any]) -> None:
        """Write an evaluation: its group records first (a history line never points at records that are not
        on disk), then its history line (replacing any earlier line of the same step)."""
        step = int(ev.step or 0)
        for name, s in ev.sets.items():
            store.write_group_records(self.step_dir(step), name, s.groups or [])
        self.history = [h for h in self.history if int(h["step"]) != step] + [line]
        store.write_history(self.root, self.history)

    def steps(self) -> list[int]:
        return [int(h["step"]) for h in self.history]
