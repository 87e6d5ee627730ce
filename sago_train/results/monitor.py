"""What survives between evaluations during training: the run's SAGO history on disk (this run's alone: a lock
and no other run's history replaced), the baseline, the best evaluation so far per (set, quantity)
(:class:`~sago_train.results.best.Best`), and the paired changes of each evaluation against both
(:func:`sago_train.results.compare.compare`), which the callback records and reports and early stopping reads.
Free of the Trainer, so that resume logic (what is on disk, what to drop, what to reload) is plain code that is
tested without one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import distributed
from ..errors import SagoInputError
from ..formatting import printable
from ..io import acquire_run_lock, release_run_lock, set_aside
from . import store
from .best import Best
from .compare import VS_BASELINE, VS_BEST, Comparison, compare
from .degenerate import degenerate_sets
from .evaluation import Evaluation
from .layout import history_path, records_name, step_dir

logger = logging.getLogger("sago_train.integrations.callback")  # the callback's log


@dataclass
class MonitorState:
    """The evaluations of one training run, mirrored on disk under ``<output_dir>/sago``."""

    root: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    baseline: Evaluation | None = None
    best: Best = field(default_factory=Best)
    last: Evaluation | None = None
    # The baseline's sets whose outputs ignored the question already: nothing collapsed there, so their verdicts
    # stay as they are (early stopping and report leave them out alike).
    baseline_degenerate: set[str] = field(default_factory=set)
    skipped_lines: int = 0  # corrupt history lines skipped at the last load
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
        self.history, self.baseline, self.best, self.last, self.skipped_lines = [], None, Best(), None, 0
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
    def compare(self, ev: Evaluation, seed: int = 0) -> Comparison:
        """The paired changes of ``ev`` against the baseline and the best evaluation so far, per set and quantity
        (for an instability ``mean_diff > 0`` means *less* stable). On a set whose outputs no longer depend on the
        question, a "better" stability verdict is ``degenerate outputs`` (not on a set whose outputs ignored it at
        the baseline already)."""
        references = {VS_BASELINE: self.baseline, VS_BEST: self.best.evaluation}
        return compare(ev, references, degenerate=degenerate_sets(ev, self.baseline_degenerate), seed=seed)

    def observe(self, ev: Evaluation) -> None:
        """Update the baseline (the first evaluation), the last one and the per-(set, quantity) best (never the
        untrained step 0, nor a set whose outputs no longer depend on the question). Group records are kept
        without their variants and outputs."""
        degenerate = degenerate_sets(ev)
        ev = ev.slim()
        if self.baseline is None:
            # A copy: up to a37d3cf the same set object was also emptied below (an aliased ``-=``), so the
            # baseline's degenerate sets were never left out here, unlike in early stopping and report.
            self.baseline, self.baseline_degenerate = ev, set(degenerate)
        self.last = ev
        self.best.observe(ev, skip=degenerate - self.baseline_degenerate)

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
