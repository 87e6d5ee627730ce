"""Where evaluations live on disk, spelled here only: an evaluation directory (``summary.json`` + one
``<set>.jsonl`` of group records per set) and a run's ``sago/`` folder (``history.jsonl``, one line per
evaluation, and ``step-<N>/<set>.jsonl``). Reading and writing both.

One policy for a corrupt or invalid ``history.jsonl`` line, for every reader (callback resume, early
stopping, compare, report): a logged warning naming the file and line, then the line is skipped and counted
(:attr:`History.skipped`, :attr:`Run.skipped_lines`), so one damaged line does not cost the rest of a run's
record. A history with lines but no valid one is an error (``no evaluations in FILE``), never "ran, found
nothing". The files are written atomically, so a bad line is outside damage.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SagoInputError, type_name
from ..io import atomic_write_json, atomic_write_jsonl, atomic_write_text, read_jsonl, safe_child
from .evaluation import ACCURACY, INSTABILITY, Evaluation, check_summaries, is_number, ordered_union, to_float

logger = logging.getLogger(__name__)

SUMMARY = "summary.json"
HISTORY = "history.jsonl"
SAGO_DIR = "sago"  # a run's folder inside the Trainer's output_dir


def history_path(sago_dir: str | Path) -> Path:
    return Path(sago_dir) / HISTORY


def step_dir(sago_dir: str | Path, step: int) -> Path:
    """The folder of the group records of the evaluation at ``step``."""
    return Path(sago_dir) / f"step-{step}"


def write_group_records(directory: str | Path, set_name: str, records: list[dict[str, Any]]) -> None:
    atomic_write_jsonl(safe_child(directory, set_name, ".jsonl"), records)


def write_eval_dir(out_dir: str | Path, summary: dict[str, Any], records: dict[str, list[dict[str, Any]]]) -> Path:
    """An evaluation directory: ``summary.json`` and one ``<set>.jsonl`` of group records per set (atomically)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, recs in records.items():
        write_group_records(out, name, recs)
    atomic_write_json(out / SUMMARY, summary)
    return out


def write_history(sago_dir: str | Path, history: list[dict[str, Any]]) -> None:
    """Rewrite ``history.jsonl`` atomically (it is small): a crash never leaves half a line."""
    text = "".join(json.dumps(h, allow_nan=False) + "\n" for h in history)
    atomic_write_text(history_path(sago_dir), text)


def recorded_evaluations(sago_dir: str | Path) -> int:
    """How many evaluations ``sago_dir/history.jsonl`` records (0 when there is none)."""
    path = history_path(sago_dir)
    if not path.is_file():
        return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def claim_history(sago_dir: str | Path, *, resuming: bool, overwrite: bool) -> None:
    """Refuse to start a fresh run where another run's SAGO history is: its lines would be lost.

    Resuming keeps the history (later steps are redone); ``overwrite`` sets the old file aside as
    ``history.jsonl.<time>.old`` (nothing is deleted). Raises :class:`~sago_train.errors.SagoInputError`."""
    n = recorded_evaluations(sago_dir)
    if resuming or n == 0:
        return
    path = history_path(sago_dir)
    if not overwrite:
        raise SagoInputError(
            f"{path} already holds the SAGO history of another run ({n} evaluation(s)); a fresh run would replace it",
            hint="resume from its checkpoint (trainer.train(resume_from_checkpoint=...) or sago-train run --resume), "
                 "pass SAGOCallback(overwrite=True) or sago-train run --overwrite, or choose another output directory",
        )
    aside = path.with_name(f"{HISTORY}.{time.strftime('%Y%m%dT%H%M%S')}.old")
    path.replace(aside)
    logger.warning("sago: overwrite: the previous history (%d evaluation(s)) was moved to %s", n, aside)


@dataclass
class History:
    """The valid lines of a ``history.jsonl`` by step, and the corrupt lines skipped (each a located error)."""

    entries: list[dict[str, Any]]
    skipped: list[SagoInputError]


def _check_history_entry(entry: Any, src: str, lineno: int) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise SagoInputError(f"expected an evaluation (an object), got {type_name(entry)}", source=src, line=lineno)
    step = entry.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise SagoInputError(f"expected an integer step, got {step!r}", source=src, line=lineno, key="step")
    sets = entry.get("sets")
    if not isinstance(sets, dict) or not sets:
        raise SagoInputError(f"expected a non-empty object of set -> axes, got {sets!r}", source=src,
                             line=lineno, key="sets")
    for name, per_axis in sets.items():
        check_summaries(per_axis, source=src, line=lineno, where=f"sets.{name}")
    return entry


def read_history(sago_dir: str | Path, *, allow_empty: bool = False) -> History:
    """The evaluations of ``sago_dir/history.jsonl`` in step order (a repeated step keeps its later line).

    A corrupt line (malformed JSON, not an evaluation) is logged as a warning naming the file and line and
    skipped; ``History.skipped`` holds them. Raises :class:`~sago_train.errors.SagoInputError` when no line
    is valid: always when some line was skipped, and for an empty history unless ``allow_empty``."""
    path = history_path(sago_dir)
    src = str(path)
    skipped: list[SagoInputError] = []

    def skip(err: SagoInputError) -> None:
        skipped.append(err)
        logger.warning("sago: skipped a corrupt history line: %s", err.format())

    by_step: dict[int, dict[str, Any]] = {}
    for lineno, entry in read_jsonl(path, what="SAGO history", on_bad_line=skip):
        try:
            entry = _check_history_entry(entry, src, lineno)
        except SagoInputError as err:
            skip(err)
            continue
        by_step[int(entry["step"])] = entry  # a repeated step (a resumed run redoing it) keeps the later line
    if not by_step and skipped:
        raise SagoInputError(f"no evaluations in {src}: all {len(skipped)} line(s) are corrupt; the first: "
                             f"{skipped[0].format()}", hint="restore the file from a copy, or start a fresh run")
    if not by_step and not allow_empty:
        raise SagoInputError(f"no evaluations in {src} (the history is empty)")
    return History([by_step[s] for s in sorted(by_step)], skipped)



@dataclass
class Run:
    """The recorded SAGO history of one training run: ``history`` = the lines of ``history.jsonl`` by step."""

    label: str
    path: Path  # the run directory (Trainer output_dir)
    sago_dir: Path
    history: list[dict[str, Any]]
    skipped_lines: int = 0  # corrupt history lines skipped when it was read (each logged with file and line)

    @classmethod
    def read(cls, run_dir: Path, sago_dir: Path, label: str | None = None, *, allow_empty: bool = False) -> Run:
        """The run recorded in ``sago_dir/history.jsonl`` (see :func:`read_history` for corrupt lines)."""
        history = read_history(sago_dir, allow_empty=allow_empty)
        return cls(label=label if label is not None else Path(run_dir).resolve().name, path=Path(run_dir),
                   sago_dir=Path(sago_dir), history=history.entries, skipped_lines=len(history.skipped))

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
                    f"no evaluation at step {step} in {history_path(self.sago_dir)}; recorded steps: "
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
            records_dir=step_dir(self.sago_dir, step),
            epoch=to_float(entry.get("epoch")) if entry.get("epoch") is not None else None,
        )

    def series(self, set_name: str, axis: str) -> list[tuple[int, dict[str, Any]]]:
        """``[(step, summary)]`` of ``axis`` on ``set_name`` over the evaluations that recorded it.

        ``axis="accuracy"`` gives its mean and CI from each line's correctness summary (no CI in lines written
        before the CI was recorded)."""
        out = []
        for h in self.history:
            if axis == ACCURACY:
                acc = (h.get("correctness") or {}).get(set_name) or {}
                if is_number(acc.get("accuracy")):
                    out.append((int(h["step"]), {"mean": float(acc["accuracy"]), "ci_low": acc.get("accuracy_ci_low"),
                                                 "ci_high": acc.get("accuracy_ci_high")}))
                continue
            summary = h["sets"].get(set_name, {}).get(axis)
            if summary is not None:
                out.append((int(h["step"]), summary))
        return out



def load_eval_dir(path: Path) -> Evaluation:
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
        per_axis = dict(check_summaries(entry.get("axes", {}), source=str(src), line=None,
                                         where=f"sets.{name}.axes"))
        if entry.get(INSTABILITY) is not None:
            per_axis.update(check_summaries({INSTABILITY: entry[INSTABILITY]}, source=str(src), line=None,
                                             where=f"sets.{name}"))
        summaries[name] = per_axis
        correctness[name] = entry.get("correctness") if isinstance(entry.get("correctness"), dict) else {}
    if not summaries:
        raise SagoInputError("no sets in the summary", source=str(src), key="sets")
    model = data.get("model") if isinstance(data.get("model"), str) else None
    return Evaluation(label=path.name, path=path, kind="eval", step=None, summaries=summaries,
                      correctness=correctness, records_dir=path, model=model)


