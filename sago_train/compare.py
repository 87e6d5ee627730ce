"""Load recorded SAGO evaluations (eval and run directories) and rank them across sets (SPEC "Rank reversal").

Two kinds of directory hold SAGO results:

- an **evaluation directory** (``sago-train eval --out DIR``): ``summary.json`` and one ``<set>.jsonl`` of
  per-group records per set;
- a **run directory** (a ``Trainer`` ``output_dir`` monitored by :class:`~sago_train.SAGOCallback`):
  ``sago/history.jsonl`` (one line per evaluation) and ``sago/step-<step>/<set>.jsonl``. The ``sago`` folder
  itself is accepted too.

:func:`load_source` reads either into a :class:`Run` or an :class:`Evaluation`; ``RUN_DIR@STEP`` picks one
evaluation of a run (so checkpoints of one run can be compared). Everything here is plain JSON reading: no
torch, so ``sago-train report``/``compare`` start fast. Corrupt files raise
:class:`~sago_train.errors.SagoInputError` naming the file and line.

:func:`compare_evaluations` (in :mod:`sago_train.ranking`, re-exported here) ranks evaluations per set on
each axis: rankings, Kendall's tau between sets, order flips and which of them are robust.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .data.groups import read_jsonl, type_name
from .errors import SagoInputError
from .ranking import (
    ACCURACY,
    ALPHA,
    BETWEEN,
    INSTABILITY,
    available_axes,
    compare_evaluations,
    ordered_union,
    paired_flip_test,
)

__all__ = [
    "ACCURACY",
    "ALPHA",
    "BETWEEN",
    "INSTABILITY",
    "Evaluation",
    "Run",
    "available_axes",
    "compare_evaluations",
    "load_evaluation",
    "load_source",
    "load_sources",
    "ordered_union",
    "paired_flip_test",
    "parse_spec",
    "unique_labels",
]

SUMMARY = "summary.json"
HISTORY = "history.jsonl"
_STEP_SPEC = re.compile(r"^(?P<path>.+)@(?P<step>-?\d+)$")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _float(x: Any) -> float:
    """JSON number or null (NaN written as null by ``to_jsonable``) -> float, NaN for null."""
    return float(x) if _is_number(x) else math.nan


def _check_summaries(value: Any, *, source: str, line: int | None, where: str) -> dict[str, dict[str, Any]]:
    """Validate ``{axis: {"mean", "ci_low", "ci_high", "n"}}`` (numbers or null) and return it."""
    if not isinstance(value, dict):
        raise SagoInputError(f"expected an object of axis -> summary, got {type_name(value)}", source=source,
                             line=line, key=where)
    for axis, summary in value.items():
        if not isinstance(summary, dict) or "mean" not in summary:
            raise SagoInputError(f"expected an object with 'mean', 'ci_low', 'ci_high', 'n', got {summary!r}",
                                 source=source, line=line, key=f"{where}.{axis}")
        for k in ("mean", "ci_low", "ci_high"):
            if summary.get(k) is not None and not _is_number(summary[k]):
                raise SagoInputError(f"expected a number or null, got {summary[k]!r}", source=source, line=line,
                                     key=f"{where}.{axis}.{k}")
    return value


# ----------------------------------------------------------------------------------------------------------------
# One evaluation
# ----------------------------------------------------------------------------------------------------------------


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
        """``{"mean", "ci_low", "ci_high", "n"}`` of ``axis`` on ``set_name`` (``accuracy``: no CI), or None."""
        if axis == ACCURACY:
            acc = self.correctness.get(set_name) or {}
            if not _is_number(acc.get("accuracy")):
                return None
            return {"mean": float(acc["accuracy"]), "ci_low": None, "ci_high": None, "n": acc.get("n")}
        summary = self.summaries.get(set_name, {}).get(axis)
        if summary is None or not math.isfinite(_float(summary.get("mean"))):
            return None
        return summary

    def records_path(self, set_name: str) -> Path | None:
        return None if self.records_dir is None else self.records_dir / f"{set_name}.jsonl"

    def records(self, set_name: str) -> list[dict[str, Any]] | None:
        """Per-group records of a set (validated; cached), or None when the file is not there."""
        if set_name not in self._records:
            path = self.records_path(set_name)
            self._records[set_name] = _read_records(path) if path is not None and path.is_file() else None
        return self._records[set_name]

    def group_values(self, set_name: str, axis: str) -> dict[str, float] | None:
        """Per-group values of ``axis`` keyed by group id (NaN where undefined), or None without records."""
        recs = self.records(set_name)
        if recs is None:
            return None
        if axis == INSTABILITY:
            return {r["id"]: _float(r.get(INSTABILITY)) for r in recs}
        if axis == BETWEEN:
            return {r["id"]: _float((r.get("extra") or {}).get("activation_rel_between")) for r in recs}
        if axis == ACCURACY:  # the share of a group's variants answered right
            return {r["id"]: (sum(map(bool, r["correct"])) / len(r["correct"]) if r.get("correct") else math.nan)
                    for r in recs}
        return {r["id"]: _float(r["axes"].get(axis)) for r in recs}

    def describe(self) -> str:
        where = f"step {self.step}" if self.step is not None else "evaluation"
        return f"{self.label} ({where}, {self.path})"


def _read_records(path: Path) -> list[dict[str, Any]]:
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
            if value is not None and not _is_number(value):
                raise SagoInputError(f"expected a number or null, got {value!r}", source=src, line=lineno,
                                     key=f"axes.{axis}")
        if rec.get(INSTABILITY) is not None and not _is_number(rec[INSTABILITY]):
            raise SagoInputError(f"expected a number or null, got {rec[INSTABILITY]!r}", source=src, line=lineno,
                                 key=INSTABILITY)
        out.append({**rec, "id": gid})
    return out


def _load_eval_dir(path: Path) -> Evaluation:
    src = path / SUMMARY
    try:
        data = json.loads(src.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as err:
        raise SagoInputError(f"malformed JSON: {err.msg} (column {err.colno})", source=str(src),
                             line=err.lineno) from None
    except UnicodeDecodeError:
        raise SagoInputError("not valid UTF-8", source=str(src)) from None
    if not isinstance(data, dict) or not isinstance(data.get("sets"), dict):
        raise SagoInputError("expected an object with 'sets' (written by 'sago-train eval --out')",
                             source=str(src), key="sets")
    summaries: dict[str, dict[str, dict[str, Any]]] = {}
    correctness: dict[str, dict[str, Any]] = {}
    for name, entry in data["sets"].items():
        if not isinstance(entry, dict):
            raise SagoInputError(f"expected an object, got {type_name(entry)}", source=str(src),
                                 key=f"sets.{name}")
        per_axis = dict(_check_summaries(entry.get("axes", {}), source=str(src), line=None,
                                         where=f"sets.{name}.axes"))
        if entry.get(INSTABILITY) is not None:
            per_axis.update(_check_summaries({INSTABILITY: entry[INSTABILITY]}, source=str(src), line=None,
                                             where=f"sets.{name}"))
        summaries[name] = per_axis
        correctness[name] = entry.get("correctness") if isinstance(entry.get("correctness"), dict) else {}
    if not summaries:
        raise SagoInputError("no sets in the summary", source=str(src), key="sets")
    model = data.get("model") if isinstance(data.get("model"), str) else None
    return Evaluation(label=path.name, path=path, kind="eval", step=None, summaries=summaries,
                      correctness=correctness, records_dir=path, model=model)


# ----------------------------------------------------------------------------------------------------------------
# A training run
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Run:
    """The recorded SAGO history of one training run: ``history`` = the lines of ``history.jsonl`` by step."""

    label: str
    path: Path  # the run directory (Trainer output_dir)
    sago_dir: Path
    history: list[dict[str, Any]]

    @property
    def steps(self) -> list[int]:
        return [int(h["step"]) for h in self.history]

    @property
    def sets(self) -> list[str]:
        return ordered_union(list(h["sets"]) for h in self.history)

    def evaluation(self, step: int | None = None) -> Evaluation:
        """The evaluation at ``step`` (default: the last one)."""
        if step is None:
            entry = self.history[-1]
        else:
            matches = [h for h in self.history if int(h["step"]) == step]
            if not matches:
                raise SagoInputError(
                    f"no evaluation at step {step} in {self.sago_dir / HISTORY}; recorded steps: "
                    + ", ".join(map(str, self.steps))
                )
            entry = matches[-1]
        step = int(entry["step"])
        sets = entry["sets"]
        corr = entry.get("correctness") if isinstance(entry.get("correctness"), dict) else {}
        return Evaluation(
            label=self.label,
            path=self.path,
            kind="run",
            step=step,
            summaries={name: dict(per_axis) for name, per_axis in sets.items()},
            correctness={name: (corr.get(name) if isinstance(corr.get(name), dict) else {}) for name in sets},
            records_dir=self.sago_dir / f"step-{step}",
            epoch=_float(entry.get("epoch")) if entry.get("epoch") is not None else None,
        )

    def series(self, set_name: str, axis: str) -> list[tuple[int, dict[str, Any]]]:
        """``[(step, summary)]`` of ``axis`` on ``set_name`` over the evaluations that recorded it.

        ``axis="accuracy"`` gives ``{"mean": accuracy}`` from each line's correctness summary."""
        out = []
        for h in self.history:
            if axis == ACCURACY:
                acc = (h.get("correctness") or {}).get(set_name) or {}
                if _is_number(acc.get("accuracy")):
                    out.append((int(h["step"]), {"mean": float(acc["accuracy"]), "ci_low": None, "ci_high": None}))
                continue
            summary = h["sets"].get(set_name, {}).get(axis)
            if summary is not None:
                out.append((int(h["step"]), summary))
        return out


def _read_history(sago_dir: Path) -> list[dict[str, Any]]:
    path = sago_dir / HISTORY
    src = str(path)
    by_step: dict[int, dict[str, Any]] = {}
    for lineno, entry in read_jsonl(path):
        if not isinstance(entry, dict):
            raise SagoInputError(f"expected an evaluation (an object), got {type_name(entry)}", source=src,
                                 line=lineno)
        step = entry.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            raise SagoInputError(f"expected an integer step, got {step!r}", source=src, line=lineno, key="step")
        sets = entry.get("sets")
        if not isinstance(sets, dict) or not sets:
            raise SagoInputError(f"expected a non-empty object of set -> axes, got {sets!r}", source=src,
                                 line=lineno, key="sets")
        for name, per_axis in sets.items():
            _check_summaries(per_axis, source=src, line=lineno, where=f"sets.{name}")
        by_step[step] = entry  # a repeated step (a resumed run redoing it) keeps the later line
    if not by_step:
        raise SagoInputError("no evaluations recorded (the history is empty)", source=src)
    return [by_step[s] for s in sorted(by_step)]


# ----------------------------------------------------------------------------------------------------------------
# Loading directories
# ----------------------------------------------------------------------------------------------------------------


def parse_spec(spec: str) -> tuple[Path, int | None]:
    """``"DIR"`` -> ``(DIR, None)``; ``"RUN_DIR@STEP"`` -> ``(RUN_DIR, STEP)``.

    A path that exists as given wins, so a directory whose name contains ``@`` still works.

    Example:
        >>> parse_spec("out/run@200")
        (PosixPath('out/run'), 200)
    """
    path = Path(spec)
    if path.exists():
        return path, None
    m = _STEP_SPEC.match(spec)
    if m:
        return Path(m.group("path")), int(m.group("step"))
    return path, None


def load_source(spec: str | Path) -> Run | Evaluation:
    """Read an eval directory (an :class:`Evaluation`) or a run directory (a :class:`Run`).

    ``RUN_DIR@STEP`` gives the run's :class:`Evaluation` at that step. Labels are the directory names (use
    :func:`unique_labels` to disambiguate several).

    Raises:
        SagoInputError: the directory does not exist, holds neither kind of results, or a file is corrupt.
    """
    path, step = parse_spec(str(spec))
    if not path.exists():
        raise SagoInputError(f"directory not found: {path}", hint="check the path")
    if not path.is_dir():
        raise SagoInputError(f"{path} is a file; expected an evaluation or run directory")
    if (path / SUMMARY).is_file():
        if step is not None:
            raise SagoInputError(f"{path} is an evaluation directory (summary.json): it has no steps to pick "
                                 f"with @{step}")
        return _load_eval_dir(path)
    if (path / "sago" / HISTORY).is_file():
        sago_dir, run_dir = path / "sago", path
    elif (path / HISTORY).is_file():
        # The run's sago/ folder itself; keep the path as the user wrote it where it has a parent part.
        sago_dir, run_dir = path, (path.parent if path.name not in ("", ".", "..") else path.resolve().parent)
    else:
        raise SagoInputError(
            f"{path} holds no SAGO results: expected summary.json (from 'sago-train eval --out') or "
            "sago/history.jsonl (a training run monitored by SAGOCallback)"
        )
    run = Run(label=run_dir.resolve().name, path=run_dir, sago_dir=sago_dir, history=_read_history(sago_dir))
    if step is None:
        return run
    ev = run.evaluation(step)
    ev.label = f"{run.label}@{step}"
    return ev


def load_evaluation(spec: str | Path) -> Evaluation:
    """Like :func:`load_source`, but a run directory gives its last evaluation."""
    src = load_source(spec)
    return src.evaluation() if isinstance(src, Run) else src


def load_sources(specs: Sequence[str | Path], *, last_only: bool = False) -> list[Run | Evaluation]:
    """Load several directories and give them unique labels (see :func:`unique_labels`)."""
    items: list[Run | Evaluation] = [load_evaluation(s) if last_only else load_source(s) for s in specs]
    for item, label in zip(items, unique_labels(items)):
        item.label = label
    return items


def unique_labels(items: Sequence[Run | Evaluation]) -> list[str]:
    """Labels that tell the items apart: the directory name, then more of the path, then ``#2``, ``#3``...

    Example:
        >>> a = Evaluation("m", Path("x/m"), "eval", None, {}, {}, None)
        >>> b = Evaluation("m", Path("y/m"), "eval", None, {}, {}, None)
        >>> unique_labels([a, b])
        ['x/m', 'y/m']
    """
    suffixes = []
    for item in items:
        # A label like "run@200" keeps its step suffix when the path part is lengthened.
        step = getattr(item, "step", None)
        suffixes.append(f"@{step}" if step is not None and item.label.endswith(f"@{step}") else "")
    parts = [Path(item.path).resolve().parts for item in items]
    depth = [1] * len(items)

    def label(i: int) -> str:
        if depth[i] == 1:
            return items[i].label
        return "/".join(parts[i][-depth[i]:]).lstrip("/") + suffixes[i]

    while True:
        labels = [label(i) for i in range(len(items))]
        # Lengthen only labels shared with a *different* directory; the same directory given twice is numbered.
        clashes = [i for i in range(len(items)) if depth[i] < len(parts[i]) and any(
            labels[j] == labels[i] and parts[j] != parts[i] for j in range(len(items)))]
        if not clashes:
            break
        for i in clashes:
            depth[i] += 1
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if seen[lab] == 1 else f"{lab}#{seen[lab]}")
    return out
