"""Where evaluations live on disk, spelled here only (see the manual's "Results on disk"):

- an evaluation directory: ``summary.json`` and one ``<set>.jsonl`` of group records per set
  (``sago-train eval --out DIR``, :meth:`~sago_train.results.evaluation.Evaluation.write`);
- a training run's ``<output_dir>/sago/`` folder: ``history.jsonl`` (one line per evaluation) and
  ``step-<N>/<set>.jsonl`` (the group records of the evaluation at step N), plus the run's ``run.lock``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..io import safe_child, validate_set_name

SUMMARY = "summary.json"
HISTORY = "history.jsonl"
SAGO_DIR = "sago"  # a run's folder inside the Trainer's output_dir
REPORT_MD = "report.md"  # what ``sago-train report`` writes, beside its plots (report_files)
CORRELATION_PLOT = "axis_correlation.png"
RESOLVED_RECIPE = "recipe.yaml"  # a recipe run's output_dir: the recipe as it ran (after overrides)


def history_path(sago_dir: str | Path) -> Path:
    """``<sago_dir>/history.jsonl``.

    Example:
        >>> history_path("out/sago").as_posix()
        'out/sago/history.jsonl'
    """
    return Path(sago_dir) / HISTORY


def step_dir(sago_dir: str | Path, step: int) -> Path:
    """The folder of the group records of the evaluation at ``step``.

    Example:
        >>> step_dir("out/sago", 12).as_posix()
        'out/sago/step-12'
    """
    return Path(sago_dir) / f"step-{step}"


def records_path(directory: str | Path, set_name: str) -> Path:
    """``<directory>/<set>.jsonl``; a set name that is not one safe path component is refused."""
    return safe_child(directory, set_name, ".jsonl")


def records_name(set_name: str) -> str:
    """``<set>.jsonl``, the file name of a set's group records (the set name checked as in :func:`records_path`,
    nothing resolved: a link in its place is for the writer's check to refuse).

    Example:
        >>> records_name("paraphrase")
        'paraphrase.jsonl'
    """
    return f"{validate_set_name(set_name)}.jsonl"


def report_plot(out_dir: str | Path, kind: str, set_name: str | None = None) -> Path:
    """A plot of ``sago-train report``: ``<kind>_<set>.png`` (``steps``, ``groups``), or without a set the axis
    correlation; a set name that is not one safe path component is refused.

    Example:
        >>> report_plot("rep", "steps", "paraphrase").as_posix(), report_plot("rep", "correlation").name
        ('rep/steps_paraphrase.png', 'axis_correlation.png')
    """
    if set_name is None:
        return Path(out_dir) / CORRELATION_PLOT
    return Path(out_dir) / f"{kind}_{validate_set_name(set_name)}.png"


def report_files(out_dir: str | Path, set_names: list[str]) -> list[Path]:
    """Every file ``sago-train report`` may write in ``out_dir`` for these sets: each is checked before any plot
    is drawn (a directory or a link where a plot goes is refused, not found after the work).

    Example:
        >>> [p.name for p in report_files("rep", ["s"])]
        ['report.md', 'steps_s.png', 'groups_s.png', 'axis_correlation.png']
    """
    plots = [report_plot(out_dir, kind, s) for s in set_names for kind in ("steps", "groups")]
    return [Path(out_dir) / REPORT_MD, *plots, report_plot(out_dir, "correlation")]


def result_files(directory: str | Path) -> dict[str, Path]:
    """The result files a reader finds in ``directory`` (an evaluation directory, a run's output_dir or its
    ``sago/`` folder), each with its own label for error messages: what ``compare`` and ``report`` read, and so
    what their outputs must never replace. Every file is listed (each ``<set>.jsonl`` of group records, each
    ``step-<N>/<set>.jsonl``, the summary and the history), not one per directory.

    Example:
        >>> result_files("/tmp/sago-no-such-dir")
        {}
    """
    root = Path(directory)
    found: dict[str, Path] = {}
    for base in (root, root / SAGO_DIR):
        for path in [base / SUMMARY, base / HISTORY, *sorted(base.glob("*.jsonl")), *sorted(base.glob("step-*/*.jsonl"))]:
            if path.is_file():
                what = ("the summary" if path.name == SUMMARY else "the history" if path.name == HISTORY
                        else "group records")
                found.setdefault(f"a results file read from {root} ({what} {path.relative_to(root).as_posix()})",
                                 path)
    return found


PREVIOUS_PREFIX = "previous-"  # an evaluation directory's earlier evaluation, kept when a new one is written


def evaluation_files(directory: str | Path) -> list[Path]:
    """The files of the evaluation in ``directory``: its ``summary.json`` and every ``<set>.jsonl`` beside it
    (regular files only); empty when it holds no evaluation (no summary).

    Example:
        >>> evaluation_files("/tmp/sago-no-such-dir")
        []
    """
    root = Path(directory)
    summary = root / SUMMARY
    if not summary.is_file() or summary.is_symlink():
        return []
    return [summary, *(p for p in sorted(root.glob("*.jsonl")) if p.is_file() and not p.is_symlink())]


def move_into_new_folder(paths: list[Path], folder_name: Callable[[int], Path], what: str) -> Path:
    """Move ``paths`` into the first folder ``folder_name(0)``, ``folder_name(1)``, ... that does not exist yet.
    The folder is made with ``mkdir``, which never gives a name twice, so no earlier copy is ever replaced."""
    import os

    from ..errors import SagoInputError

    for n in range(10_000):
        folder = folder_name(n)
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        for path in paths:
            os.rename(path, folder / path.name)
        return folder
    raise SagoInputError(f"cannot set {what} aside: 10,000 earlier copies are kept", hint="remove old ones")


def set_aside_evaluation(directory: str | Path) -> tuple[Path, int] | None:
    """Move the evaluation in ``directory`` (:func:`evaluation_files`) into a new folder
    ``previous-<time>[.N]`` inside it, which stays an evaluation directory that ``compare`` and ``report`` read;
    return it and how many files moved, or None when there was no evaluation."""
    import time

    files = evaluation_files(directory)
    if not files:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside = move_into_new_folder(files, lambda n: Path(directory) / f"{PREVIOUS_PREFIX}{stamp}{'' if n == 0 else f'.{n}'}",
                                 f"the evaluation in {directory}")
    return aside, len(files)
