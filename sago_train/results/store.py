"""A training run's SAGO history on disk: ``<output_dir>/sago/history.jsonl`` (one line per evaluation, see
:meth:`Evaluation.to_history_line <sago_train.results.evaluation.Evaluation.to_history_line>`) and its
``step-<N>/<set>.jsonl`` group records; reading it back as a :class:`Run` (one :class:`Evaluation` per step).

One policy for a corrupt or invalid ``history.jsonl`` line, for every reader (callback resume, early
stopping, compare, report): a logged warning naming the file and line, then the line is skipped and counted
(:attr:`History.n_skipped`, :attr:`Run.skipped_lines`), so one damaged line does not cost the rest of a run's
record. A history with lines but no valid one is an error (``no evaluations in FILE``), never "ran, found
nothing". The files are written atomically, so a bad line is outside damage.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SagoInputError
from ..formatting import printable
from ..functional.stats import Summary
from ..io import (
    LOCK_NAME,
    atomic_write_jsonl,
    atomic_write_text,
    count_records,
    first_link,
    read_jsonl,
    set_aside,
)
from ..limits import MAX_REPEATED_WARNINGS
from .evaluation import Evaluation, ordered_union
from .group import GroupRecord
from .layout import HISTORY as HISTORY_NAME
from .layout import history_path, move_into_new_folder, records_name, records_path, step_dir

logger = logging.getLogger(__name__)


def _refuse_link(path: Path, root: Path) -> None:
    link = first_link(path, root)
    if link is not None:
        raise SagoInputError(f"{link} is a symbolic link; sago_train never writes through one (it would write "
                             f"outside {root})", hint="remove the link; the run creates its own files and folders")


def check_run_dir(sago_dir: str | Path) -> None:
    """Refuse a run's ``sago/`` folder where a write would follow a symbolic link out of the run directory: the
    folder itself, ``history.jsonl``, ``run.lock`` or a ``step-<N>`` folder being a link. Checked before anything
    runs (the CLI before the model loads, the callback at train start) and again at each write."""
    root = Path(sago_dir)
    for path in (history_path(root), root / LOCK_NAME, *(sorted(root.glob("step-*")) if root.is_dir() else [])):
        _refuse_link(path, root.parent)


def write_group_records(directory: str | Path, set_name: str, groups: Sequence[GroupRecord]) -> None:
    """``<directory>/<set>.jsonl``, atomically; ``directory`` (a run's ``step-<N>``) must not be a link."""
    _refuse_link(Path(directory) / records_name(set_name), Path(directory).parent)  # before anything resolves it
    atomic_write_jsonl(records_path(directory, set_name), [g.to_dict() for g in groups])


def write_history(sago_dir: str | Path, lines: list[dict[str, Any]]) -> None:
    """Rewrite ``history.jsonl`` atomically (it is small): a crash never leaves half a line."""
    text = "".join(json.dumps(h, allow_nan=False) + "\n" for h in lines)
    _refuse_link(history_path(sago_dir), Path(sago_dir).parent)
    atomic_write_text(history_path(sago_dir), text)


def recorded_evaluations(sago_dir: str | Path) -> int:
    """How many evaluations ``sago_dir/history.jsonl`` records (0 when there is none)."""
    path = history_path(sago_dir)
    if not path.is_file():
        return 0
    # Counted with read_history's bounds (file size, line length), never a whole 3 GB line held in memory.
    return count_records(path, what="SAGO history")


def claim_history(sago_dir: str | Path, *, resuming: bool, overwrite: bool) -> None:
    """Refuse to start a fresh run where another run's SAGO history is: its lines would be lost.

    Resuming keeps the history (later steps are redone); ``overwrite`` sets the old file aside as
    ``history.jsonl.<time>.old`` (nothing is deleted, no earlier copy replaced: see :func:`set_aside`). A
    ``sago/`` folder with a link a write would follow is refused (:func:`check_run_dir`). Raises
    :class:`~sago_train.errors.SagoInputError`."""
    check_run_dir(sago_dir)
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
    aside = set_aside(path)
    steps = set_aside_steps(sago_dir, None, aside)
    logger.warning("sago: overwrite: the previous history (%d evaluation(s)) was moved to %s%s", n, printable(aside),
                   f", its step folders to {printable(steps)}" if steps else "")


def set_aside_steps(sago_dir: str | Path, steps: list[int] | None, history_aside: Path) -> Path | None:
    """Move the step folders ``step-<N>`` (those of ``steps``, or all) into a new folder named after the history
    set aside with them (``history.jsonl.<time>.old`` -> ``steps.<time>.old``), so that a new run never writes
    its records over those the kept history points at. The folder is made with ``mkdir``, which never gives a
    name twice. Returns it, or None when there was nothing to move."""
    root = Path(sago_dir)
    found = [p for p in sorted(root.glob("step-*")) if p.is_dir() and not p.is_symlink()
             and (steps is None or p.name in {f"step-{s}" for s in steps})]
    if not found:
        return None
    stem = "steps" + history_aside.name[len(HISTORY_NAME):]
    return move_into_new_folder(found, lambda n: root / (stem if n == 0 else f"{stem[:-4]}.{n}.old"),
                                f"the step folders of {root}")


@dataclass
class History:
    """The valid lines of a ``history.jsonl`` in step order, how many corrupt lines were skipped, and the first
    of them (at most ``MAX_REPEATED_WARNINGS``, each a located error: 300,000 kept whole took a gigabyte)."""

    entries: list[dict[str, Any]]
    skipped: list[SagoInputError]
    n_skipped: int = 0


def read_history(sago_dir: str | Path, *, allow_empty: bool = False) -> History:
    """The evaluations of ``sago_dir/history.jsonl`` in step order (a repeated step keeps its later line).

    A corrupt line (malformed JSON, not an evaluation) is logged as a warning naming the file and line and
    skipped; ``History.skipped`` holds the first few and ``History.n_skipped`` counts them all. Raises :class:`~sago_train.errors.SagoInputError` when no line
    is valid: always when some line was skipped, and for an empty history unless ``allow_empty``."""
    path = history_path(sago_dir)
    src = str(path)
    skipped: list[SagoInputError] = []
    count = [0]

    def skip(err: SagoInputError) -> None:
        count[0] += 1
        if count[0] <= MAX_REPEATED_WARNINGS:  # the rest are counted, said once below
            skipped.append(err.with_traceback(None))
            logger.warning("sago: skipped a corrupt history line: %s", printable(err.format()))

    by_step: dict[int, dict[str, Any]] = {}
    for lineno, entry in read_jsonl(path, what="SAGO history", on_bad_line=skip):
        try:
            Evaluation.from_history_line(entry, source=src, lineno=lineno)  # validates the whole line
        except SagoInputError as err:
            skip(err)
            continue
        by_step[int(entry["step"])] = entry  # a repeated step (a resumed run redoing it) keeps the later line
    if count[0] > MAX_REPEATED_WARNINGS:
        logger.warning("sago: ... and %s more corrupt lines in %s, skipped", f"{count[0] - MAX_REPEATED_WARNINGS:,}",
                       printable(src))
    if not by_step and skipped:
        raise SagoInputError(f"no evaluations in {src}: all {count[0]:,} line(s) are corrupt; the first: "
                             f"{skipped[0].format()}", hint="restore the file from a copy, or start a fresh run")
    if not by_step and not allow_empty:
        raise SagoInputError(f"no evaluations in {src} (the history is empty)")
    return History([by_step[s] for s in sorted(by_step)], skipped, count[0])


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
                   sago_dir=Path(sago_dir), history=history.entries, skipped_lines=history.n_skipped)

    @property
    def steps(self) -> list[int]:
        return [int(h["step"]) for h in self.history]

    @property
    def sets(self) -> list[str]:
        return ordered_union(list(h["sets"]) for h in self.history)

    def evaluation(self, step: int | None = None) -> Evaluation:
        """The evaluation at ``step`` (default: the last one), its group records read from ``step-<N>/`` on
        first use."""
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
        return Evaluation.from_history_line(entry, source=str(history_path(self.sago_dir)),
                                            records_dir=step_dir(self.sago_dir, int(entry["step"])), label=self.label,
                                            path=self.path)

    def evaluations(self) -> list[Evaluation]:
        """Every recorded evaluation, in step order."""
        return [self.evaluation(int(h["step"])) for h in self.history]

    def series(self, set_name: str, name: str) -> list[tuple[int, Summary]]:
        """``[(step, summary)]`` of an axis, ``instability`` or ``accuracy`` on ``set_name`` over the evaluations
        that recorded it (accuracy without a CI in lines written before the CI was recorded)."""
        out = []
        for ev in self.evaluations():
            summary = ev.score(set_name, name)
            if summary is not None:
                out.append((int(ev.step or 0), summary))
        return out
