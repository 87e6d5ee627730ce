"""What survives between evaluations during training: the run's history (through the results store), the
baseline, the best evaluation so far per (set, axis), and the paired comparison (groups paired by id, judged by
the one verdict rule :func:`sago_train.functional.stats.decide`) that the callback logs and early stopping
decides on.

Kept apart from the callback so that resume logic (what is on disk, what to drop, what to reload) is plain
code that can be tested without a Trainer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..functional import stats
from ..functional.axes.registry import higher_is_better
from ..results import store
from ..results.evaluation import Evaluation
from ..results.records import EvalResult


def is_improvement(axis: str, mean: float, best_mean: float | None) -> bool:
    """Whether ``mean`` beats ``best_mean`` on ``axis`` (its direction from the axis registry)."""
    if best_mean is None:
        return True
    return mean > best_mean if higher_is_better(axis) else mean < best_mean


def is_untrained(step: int | None) -> bool:
    """An evaluation at step 0 measures the model before any training step (the callback's baseline, or the
    Trainer's ``eval_on_start``): there is no checkpoint of it to go back to, so it is never the "best"."""
    return step == 0


def axis_verdict(axis: str, reference: Mapping[str, float], current: Mapping[str, float], *,
                 alpha: float = stats.ALPHA, min_delta: float = 0.0, seed: int = 0) -> stats.Verdict | None:
    """``current`` against ``reference`` on ``axis`` (``{group id: value}``, paired by id), judged by the one
    verdict rule (:func:`~sago_train.functional.stats.paired_verdict_by_id`) in the axis registry's direction:
    ``mean_diff`` = mean of (current - reference); ``p_worse`` is the one-sided Wilcoxon test that ``current`` is
    worse ("greater" for an instability, "less" for a higher-is-better quantity). None when no group is shared."""
    return stats.paired_verdict_by_id(reference, current, higher_is_better=higher_is_better(axis), alpha=alpha,
                                      min_delta=min_delta, seed=seed)


def change_entry(verdict: stats.Verdict, step: int | None) -> dict[str, Any]:
    """The ``_vs_baseline`` / ``_vs_best`` entry of ``history.jsonl``: ``p_value`` is the one-sided test of a
    regression (``p_worse``; the key predates the rule), ``verdict`` the rule's word."""
    return {"mean_diff": verdict.mean_diff, "ci_low": verdict.ci_low, "ci_high": verdict.ci_high,
            "p_value": verdict.p_worse, "p_better": verdict.p_better, "n": verdict.n, "verdict": verdict.verdict,
            "step": step}


@dataclass
class MonitorState:
    """The evaluations of one training run, mirrored on disk under ``<output_dir>/sago`` by the results store."""

    root: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    baseline: Evaluation | None = None
    best: dict[tuple[str, str], Evaluation] = field(default_factory=dict)
    skipped_lines: int = 0  # corrupt history lines skipped at the last load

    @property
    def history_path(self) -> Path:
        return store.history_path(self.root)

    def step_dir(self, step: int) -> Path:
        return store.step_dir(self.root, step)

    # ------------------------------------------------------------------ resume
    def load(self, resume_step: int | None, *, write: bool = True) -> None:
        """Reload the history. A fresh run (``resume_step`` None) starts empty; a resumed run keeps evaluations
        up to the checkpoint's step and drops later ones, which the resumed run will redo (so none is
        duplicated). A corrupt history line is logged (file and line) and skipped, and counted in
        ``skipped_lines``; the rewritten history drops it (see :mod:`~sago_train.results.store`)."""
        self.history, self.baseline, self.best, self.skipped_lines = [], None, {}, 0
        if resume_step is None or not self.history_path.exists():
            return
        run = store.Run.read(self.root.parent, self.root, self.root.name, allow_empty=True)
        self.skipped_lines = run.skipped_lines
        self.history = [h for h in run.history if int(h["step"]) <= resume_step]
        if write:  # only the main process writes
            store.write_history(self.root, self.history)
        for entry in self.history:
            ev = run.evaluation(int(entry["step"]))
            if all(ev.records_path(name) is not None and ev.records_path(name).is_file() for name in ev.sets):
                self.observe(ev)

    # ------------------------------------------------------------------ updates
    def compare(self, ev: Evaluation, alpha_seed: int = 0) -> dict[str, dict[str, dict[str, Any]]]:
        """Paired change of ``ev`` against the baseline and the best evaluation so far, per set and axis (see
        :func:`change_entry`); for an instability ``mean_diff > 0`` means *less* stable. ``alpha_seed`` seeds the
        bootstrap."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for name in ev.sets:
            for axis in ev.summaries[name]:
                current = ev.group_values(name, axis)
                if current is None:
                    continue
                entry: dict[str, Any] = {}
                for label, ref in (("vs_baseline", self.baseline), ("vs_best", self.best.get((name, axis)))):
                    if ref is None or ref.step == ev.step:
                        continue
                    res = axis_verdict(axis, ref.group_values(name, axis) or {}, current, seed=alpha_seed)
                    if res is not None:
                        entry[label] = stats.to_jsonable(change_entry(res, ref.step))
                if entry:
                    out.setdefault(name, {})[axis] = entry
        return out

    def observe(self, ev: Evaluation) -> None:
        """Update the baseline (the first evaluation) and the per-(set, axis) best (by mean, as the Trainer picks
        its best checkpoint; never the untrained step 0, see :func:`is_untrained`)."""
        if self.baseline is None:
            self.baseline = ev
        if is_untrained(ev.step):
            return
        for name in ev.sets:
            for axis in ev.summaries[name]:
                mean = ev.mean(name, axis)
                if not math.isfinite(mean):
                    continue
                cur = self.best.get((name, axis))
                if is_improvement(axis, mean, None if cur is None else cur.mean(name, axis)):
                    self.best[(name, axis)] = ev

    def record(self, step: int, result: EvalResult, entry: dict[str, Any]) -> None:
        """Write an evaluation: its group records first (a history line never points at records that are not
        on disk), then its history line (replacing any earlier line of the same step)."""
        for name in result.sets:
            store.write_group_records(self.step_dir(step), name, result.group_records(name))
        self.history = [h for h in self.history if int(h["step"]) != int(entry["step"])] + [entry]
        store.write_history(self.root, self.history)

    def steps(self) -> list[int]:
        return [int(h["step"]) for h in self.history]
