"""State that survives between evaluations during training: history file, baseline and best evaluations.

Kept apart from the callback so that resume logic (what is on disk, what to drop, what to reload) is plain
code that can be tested without a Trainer.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import stats
from .io import atomic_write_jsonl, atomic_write_text, safe_child
from .results import EvalResult

logger = logging.getLogger(__name__)

HISTORY = "history.jsonl"


def recorded_evaluations(sago_dir: str | Path) -> int:
    """How many evaluations ``sago_dir/history.jsonl`` records (0 when there is none)."""
    path = Path(sago_dir) / HISTORY
    if not path.is_file():
        return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def claim_history(sago_dir: str | Path, *, resuming: bool, overwrite: bool) -> None:
    """Refuse to start a fresh run where another run's SAGO history is: its lines would be lost.

    Resuming keeps the history (later steps are redone); ``overwrite`` sets the old file aside as
    ``history.jsonl.<time>.old`` (nothing is deleted). Raises :class:`~sago_train.errors.SagoInputError`."""
    from .errors import SagoInputError

    n = recorded_evaluations(sago_dir)
    if resuming or n == 0:
        return
    path = Path(sago_dir) / HISTORY
    if not overwrite:
        raise SagoInputError(
            f"{path} already holds the SAGO history of another run ({n} evaluation(s)); a fresh run would replace it",
            hint="resume from its checkpoint (trainer.train(resume_from_checkpoint=...) or sago-train run --resume), "
                 "pass SAGOCallback(overwrite=True) or sago-train run --overwrite, or choose another output directory",
        )
    import time

    aside = path.with_name(f"{HISTORY}.{time.strftime('%Y%m%dT%H%M%S')}.old")
    path.replace(aside)
    logger.warning("sago: overwrite: the previous history (%d evaluation(s)) was moved to %s", n, aside)


@dataclass
class Snapshot:
    """Per-group values of one evaluation: ``values[set][axis]`` aligned with ``ids[set]``."""

    step: int
    ids: dict[str, list[str]]
    values: dict[str, dict[str, list[float]]]
    means: dict[str, dict[str, float]]

    @classmethod
    def from_result(cls, step: int, result: EvalResult) -> Snapshot:
        ids, values, means = {}, {}, {}
        for name, s in result.sets.items():
            ids[name] = [g.id for g in s.groups]
            values[name] = {a: [float(x) for x in s.values(a)] for a in s.axes}
            values[name]["instability"] = [float(g.instability) for g in s.groups]
            means[name] = {a: float(sm.mean) for a, sm in s.summaries.items()}
            means[name]["instability"] = float(s.instability.mean)
        return cls(step, ids, values, means)

    @classmethod
    def from_records(cls, step: int, records: dict[str, list[dict[str, Any]]]) -> Snapshot:
        ids, values, means = {}, {}, {}
        for name, recs in records.items():
            ids[name] = [r["id"] for r in recs]
            axes = list(recs[0]["axes"]) if recs else []
            values[name] = {
                a: [np.nan if r["axes"].get(a) is None else float(r["axes"][a]) for r in recs] for a in axes
            }
            values[name]["instability"] = [np.nan if r.get("instability") is None else r["instability"] for r in recs]
            means[name] = {a: float(np.nanmean(v)) if np.isfinite(v).any() else math.nan
                           for a, v in values[name].items()}
        return cls(step, ids, values, means)

    def aligned(self, other: Snapshot, set_name: str, axis: str) -> tuple[np.ndarray, np.ndarray]:
        """Values of ``self`` and ``other`` on the groups both evaluated (paired by id)."""
        mine = dict(zip(self.ids.get(set_name, []), self.values.get(set_name, {}).get(axis, [])))
        theirs = dict(zip(other.ids.get(set_name, []), other.values.get(set_name, {}).get(axis, [])))
        common = [i for i in self.ids.get(set_name, []) if i in theirs]
        return np.array([mine[i] for i in common], float), np.array([theirs[i] for i in common], float)


@dataclass
class MonitorState:
    """The history of evaluations of one training run, mirrored on disk under ``<output_dir>/sago``."""

    root: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    baseline: Snapshot | None = None
    best: dict[tuple[str, str], Snapshot] = field(default_factory=dict)

    @property
    def history_path(self) -> Path:
        return self.root / HISTORY

    def step_dir(self, step: int) -> Path:
        return self.root / f"step-{step}"

    def evaluated_steps(self) -> set[int]:
        return {int(h["step"]) for h in self.history}

    # ------------------------------------------------------------------ resume
    def load(self, resume_step: int | None, *, write: bool = True) -> None:
        """Reload the history. A fresh run (``resume_step`` None or 0 with nothing done) starts empty; a
        resumed run keeps evaluations up to the checkpoint's step and drops later ones, which the resumed
        run will redo (so none is duplicated)."""
        self.history, self.baseline, self.best = [], None, {}
        if resume_step is None or not self.history_path.exists():
            return
        kept = []
        for line in self.history_path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                logger.warning("sago: ignoring a corrupt line in %s", self.history_path)
                continue
            if int(entry.get("step", -1)) <= resume_step:
                kept.append(entry)
        self.history = kept
        if write:  # only the main process writes
            self._rewrite_history()
        for entry in kept:
            snap = self._load_snapshot(int(entry["step"]), list(entry.get("sets", {})))
            if snap is not None:
                self.observe(snap)

    def _load_snapshot(self, step: int, set_names: list[str]) -> Snapshot | None:
        records: dict[str, list[dict[str, Any]]] = {}
        for name in set_names:
            path = safe_child(self.step_dir(step), name, ".jsonl")
            if not path.exists():
                return None
            records[name] = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
        return Snapshot.from_records(step, records)

    # ------------------------------------------------------------------ updates
    def compare(self, snap: Snapshot, alpha_seed: int = 0) -> dict[str, dict[str, dict[str, Any]]]:
        """Paired change of ``snap`` against the baseline and the best evaluation so far, per set and axis.
        ``mean_diff > 0`` means *less* stable; the p-value is the one-sided test of that."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for name, axes in snap.values.items():
            for axis in axes:
                entry: dict[str, Any] = {}
                refs = [("vs_baseline", self.baseline), ("vs_best", self.best.get((name, axis)))]
                for label, ref in refs:
                    if ref is None or ref.step == snap.step:
                        continue
                    before, after = snap.aligned(ref, name, axis)[::-1]
                    if before.size == 0:
                        continue
                    res = stats.paired_comparison(before, after, alternative="greater", seed=alpha_seed)
                    entry[label] = {**res.to_dict(), "step": ref.step}
                if entry:
                    out.setdefault(name, {})[axis] = entry
        return out

    def observe(self, snap: Snapshot) -> None:
        """Update baseline (the first evaluation) and the per-(set, axis) best (lowest mean)."""
        if self.baseline is None:
            self.baseline = snap
        for name, axes in snap.means.items():
            for axis, mean in axes.items():
                if not math.isfinite(mean):
                    continue
                cur = self.best.get((name, axis))
                if cur is None or mean < cur.means[name][axis]:
                    self.best[(name, axis)] = snap

    def append(self, entry: dict[str, Any]) -> None:
        self.history = [h for h in self.history if int(h["step"]) != int(entry["step"])] + [entry]
        self._rewrite_history()

    def write_groups(self, step: int, result: EvalResult) -> None:
        for name in result.sets:
            atomic_write_jsonl(safe_child(self.step_dir(step), name, ".jsonl"), result.group_records(name))

    def _rewrite_history(self) -> None:
        # The whole file is rewritten atomically (it is small): a crash never leaves half a line.
        text = "".join(json.dumps(h, allow_nan=False) + "\n" for h in self.history)
        atomic_write_text(self.history_path, text)
