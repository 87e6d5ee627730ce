"""The record of one SAGO evaluation, the same type in memory and on disk (:class:`Evaluation`), and a
recorded training run (:class:`Run`).

An :class:`Evaluation` holds per-set summaries (``summaries[set][axis]`` = ``{"mean", "ci_low", "ci_high",
"n"}``), correctness summaries, and per-group records (``id``, ``axes``, ``instability``, ...) either in
memory (:meth:`Evaluation.from_result`, during training) or read lazily from ``<set>.jsonl`` files (an eval
directory, or a run's ``step-<N>`` folder; see :mod:`sago_train.results.store`). Callback, monitor, early
stopping, compare and report all read evaluations through it. Plain JSON, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SagoInputError, type_name
from ..io import read_jsonl

if TYPE_CHECKING:  # pragma: no cover
    from .records import EvalResult

INSTABILITY = "instability"  # the per-group mean of the axes (a convenience scalar, ranked like an axis)
ACCURACY = "accuracy"  # from the correctness summary; higher is better, never folded into stability
# Per group: its mean cosine distance to the other groups' variants (recorded with activation_rel). Not an
# instability: lower means representations pulled together (a collapse), so it is compared, never ranked.
BETWEEN = "between_dispersion"
#: What a group record keeps in memory: enough for paired comparisons, not the variants and outputs.
_SLIM_KEYS = ("id", "axes", INSTABILITY, "correct", "extra")


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def to_float(x: Any) -> float:
    """JSON number or null (NaN written as null by ``to_jsonable``) -> float, NaN for null."""
    return float(x) if is_number(x) else math.nan


def check_summaries(value: Any, *, source: str, line: int | None, where: str) -> dict[str, dict[str, Any]]:
    """Validate ``{axis: {"mean", "ci_low", "ci_high", "n"}}`` (numbers or null) and return it."""
    if not isinstance(value, dict):
        raise SagoInputError(f"expected an object of axis -> summary, got {type_name(value)}", source=source,
                             line=line, key=where)
    for axis, summary in value.items():
        if not isinstance(summary, dict) or "mean" not in summary:
            raise SagoInputError(f"expected an object with 'mean', 'ci_low', 'ci_high', 'n', got {summary!r}",
                                 source=source, line=line, key=f"{where}.{axis}")
        for k in ("mean", "ci_low", "ci_high"):
            if summary.get(k) is not None and not is_number(summary[k]):
                raise SagoInputError(f"expected a number or null, got {summary[k]!r}", source=source, line=line,
                                     key=f"{where}.{axis}.{k}")
    return value


@dataclass
class Evaluation:
    """One SAGO evaluation of one model (an eval directory, or one step of a run).

    ``summaries[set][axis]`` is ``{"mean", "ci_low", "ci_high", "n"}`` and includes ``"instability"`` when
    recorded; ``axes[set]`` lists the axes proper (without ``instability``); ``correctness[set]`` is the
    correctness summary (``accuracy``, ``n``, ...) or ``{}``. Per-group records are read lazily from
    ``records_dir/<set>.jsonl``.
    """

    label: str
    path: Path
    kind: str  # "eval" or "run"
    step: int | None
    summaries: dict[str, dict[str, dict[str, Any]]]
    correctness: dict[str, dict[str, Any]]
    records_dir: Path | None
    model: str | None = None
    epoch: float | None = None
    _records: dict[str, list[dict[str, Any]] | None] = field(default_factory=dict, repr=False)

    @property
    def sets(self) -> list[str]:
        return list(self.summaries)

    @property
    def axes(self) -> dict[str, list[str]]:
        return {s: [a for a in per_axis if a != INSTABILITY] for s, per_axis in self.summaries.items()}

    def score(self, set_name: str, axis: str) -> dict[str, Any] | None:
        """``{"mean", "ci_low", "ci_high", "n"}`` of ``axis`` on ``set_name`` (``accuracy``: its CI over groups when recorded), or None."""
        if axis == ACCURACY:
            acc = self.correctness.get(set_name) or {}
            if not is_number(acc.get("accuracy")):
                return None
            return {"mean": float(acc["accuracy"]), "ci_low": acc.get("accuracy_ci_low"),
                    "ci_high": acc.get("accuracy_ci_high"), "n": acc.get("n")}
        summary = self.summaries.get(set_name, {}).get(axis)
        if summary is None or not math.isfinite(to_float(summary.get("mean"))):
            return None
        return summary

    def records_path(self, set_name: str) -> Path | None:
        return None if self.records_dir is None else self.records_dir / f"{set_name}.jsonl"

    def records(self, set_name: str) -> list[dict[str, Any]] | None:
        """Per-group records of a set (validated; cached), or None when the file is not there."""
        if set_name not in self._records:
            path = self.records_path(set_name)
            self._records[set_name] = read_group_records(path) if path is not None and path.is_file() else None
        return self._records[set_name]

    def group_values(self, set_name: str, axis: str) -> dict[str, float] | None:
        """Per-group values of ``axis`` keyed by group id (NaN where undefined), or None without records."""
        recs = self.records(set_name)
        if recs is None:
            return None
        if axis == INSTABILITY:
            return {r["id"]: to_float(r.get(INSTABILITY)) for r in recs}
        if axis == BETWEEN:
            return {r["id"]: to_float((r.get("extra") or {}).get("activation_rel_between")) for r in recs}
        if axis == ACCURACY:  # the share of a group's variants answered right
            return {r["id"]: (sum(map(bool, r["correct"])) / len(r["correct"]) if r.get("correct") else math.nan)
                    for r in recs}
        return {r["id"]: to_float(r["axes"].get(axis)) for r in recs}

    @classmethod
    def from_result(cls, step: int | None, result: EvalResult, *, label: str = "", path: Path | None = None) -> Evaluation:
        """The in-memory record of a finished evaluation (per-group values kept, variants and outputs not)."""
        records = {name: [{k: r.get(k) for k in _SLIM_KEYS} for r in result.group_records(name)]
                   for name in result.sets}
        ev = cls(label=label, path=path or Path("."), kind="run", step=step, summaries=result.history_sets(),
                 correctness={n: dict(s.correctness) for n, s in result.sets.items()}, records_dir=None)
        ev._records.update(records)
        return ev

    @classmethod
    def from_records(cls, step: int | None, records: dict[str, list[dict[str, Any]]], *,
                     summaries: dict[str, dict[str, dict[str, Any]]] | None = None) -> Evaluation:
        """An evaluation from per-group records (``{set: [{"id", "axes", "instability"?}, ...]}``); the means
        are computed from them unless ``summaries`` are given."""
        if summaries is None:
            summaries = {}
            for name, recs in records.items():
                axes = ordered_axes(recs)
                summaries[name] = {a: _mean_summary([to_float(r["axes"].get(a)) for r in recs]) for a in axes}
                if any(INSTABILITY in r for r in recs):
                    summaries[name][INSTABILITY] = _mean_summary([to_float(r.get(INSTABILITY)) for r in recs])
        ev = cls(label="", path=Path("."), kind="run", step=step, summaries=summaries,
                 correctness={n: {} for n in records}, records_dir=None)
        ev._records.update(records)
        return ev

    def mean(self, set_name: str, axis: str) -> float:
        """The mean of ``axis`` on ``set_name`` (NaN when not recorded or undefined)."""
        score = self.score(set_name, axis)
        return math.nan if score is None else to_float(score.get("mean"))


def ordered_union(lists: Iterable[Iterable[str]]) -> list[str]:
    out: list[str] = []
    for names in lists:
        for n in names:
            if n not in out:
                out.append(n)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Ranking and rank reversal
# ----------------------------------------------------------------------------------------------------------------


def ordered_axes(records: list[dict[str, Any]]) -> list[str]:
    """The axes of a set's group records, in first-seen order."""
    out: dict[str, None] = {}
    for r in records:
        out.update(dict.fromkeys(r.get("axes") or {}))
    return list(out)


def _mean_summary(values: list[float]) -> dict[str, Any]:
    finite = [v for v in values if math.isfinite(v)]
    return {"mean": (sum(finite) / len(finite)) if finite else None, "ci_low": None, "ci_high": None,
            "n": len(finite)}


def read_group_records(path: Path) -> list[dict[str, Any]]:
    """Group records (one JSON object per line with ``id`` and ``axes``), with file:line errors."""
    out: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    src = str(path)
    for lineno, rec in read_jsonl(path):
        if not isinstance(rec, dict):
            raise SagoInputError(f"expected a group record (an object), got {type_name(rec)}", source=src,
                                 line=lineno)
        gid = rec.get("id")
        if isinstance(gid, bool) or not isinstance(gid, (str, int)):
            raise SagoInputError(f"expected a string id, got {gid!r}", source=src, line=lineno, key="id")
        gid = str(gid)
        if gid in seen:
            # Paired comparisons match groups by id: a repeated id would pair arbitrarily.
            raise SagoInputError(f"duplicate id '{gid}' (first on line {seen[gid]})", source=src, line=lineno,
                                 key="id")
        seen[gid] = lineno
        axes = rec.get("axes")
        if not isinstance(axes, dict):
            raise SagoInputError(f"expected an object of axis -> value, got {type_name(axes)}", source=src,
                                 line=lineno, key="axes")
        for axis, value in axes.items():
            if value is not None and not is_number(value):
                raise SagoInputError(f"expected a number or null, got {value!r}", source=src, line=lineno,
                                     key=f"axes.{axis}")
        if rec.get(INSTABILITY) is not None and not is_number(rec[INSTABILITY]):
            raise SagoInputError(f"expected a number or null, got {rec[INSTABILITY]!r}", source=src, line=lineno,
                                 key=INSTABILITY)
        out.append({**rec, "id": gid})
    return out
