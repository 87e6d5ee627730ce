"""Load recorded SAGO evaluations (eval and run directories, see :mod:`sago_train.results.store`) by the
paths a user types, and rank them across sets (docs/definitions.md#findings).

:func:`load_source` reads a directory into a :class:`~sago_train.results.store.Run` or an
:class:`~sago_train.results.evaluation.Evaluation`; ``RUN_DIR@STEP`` picks one evaluation of a run (so
checkpoints of one run can be compared). No torch, so ``sago-train report``/``compare`` start fast. Corrupt
files raise :class:`~sago_train.errors.SagoInputError` naming the file and line.

:func:`compare_evaluations` (in :mod:`sago_train.analysis.ranking`, re-exported here) ranks evaluations per set
on each axis: rankings, Kendall's tau between sets, order flips and which of them are robust (family-wise, see
docs/findings.md); :func:`reversal_headline` words them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from ..errors import SagoInputError
from ..results.evaluation import ACCURACY, BETWEEN, INSTABILITY, Evaluation, ordered_union
from ..results.layout import HISTORY, SAGO_DIR, SUMMARY
from ..results.store import Run
from .ranking import ALPHA, available_axes, compare_evaluations, paired_flip_test, reversal_headline

__all__ = ["ACCURACY", "ALPHA", "BETWEEN", "INSTABILITY", "Evaluation", "Run", "available_axes",
           "compare_evaluations", "load_evaluation", "load_source", "load_sources", "ordered_union",
           "paired_flip_test", "parse_spec", "reversal_headline", "unique_labels"]

_STEP_SPEC = re.compile(r"^(?P<path>.+)@(?P<step>-?\d+)$")


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
        return Evaluation.read(path)
    if (path / SAGO_DIR / HISTORY).is_file():
        sago_dir, run_dir = path / SAGO_DIR, path
    elif (path / HISTORY).is_file():
        # The run's sago/ folder itself; keep the path as the user wrote it where it has a parent part.
        sago_dir, run_dir = path, (path.parent if path.name not in ("", ".", "..") else path.resolve().parent)
    else:
        raise SagoInputError(
            f"{path} holds no SAGO results: expected summary.json (from 'sago-train eval --out') or "
            "sago/history.jsonl (a training run monitored by SAGOCallback)"
        )
    run = Run.read(run_dir, sago_dir)
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
        >>> a = Evaluation({}, label="m", path=Path("x/m"))
        >>> b = Evaluation({}, label="m", path=Path("y/m"))
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
