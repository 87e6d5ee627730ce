"""Where evaluations live on disk, spelled here only (see the manual's "Results on disk"):

- an evaluation directory: ``summary.json`` and one ``<set>.jsonl`` of group records per set
  (``sago-train eval --out DIR``, :meth:`~sago_train.results.evaluation.Evaluation.write`);
- a training run's ``<output_dir>/sago/`` folder: ``history.jsonl`` (one line per evaluation) and
  ``step-<N>/<set>.jsonl`` (the group records of the evaluation at step N), plus the run's ``run.lock``.
"""

from __future__ import annotations

from pathlib import Path

from ..io import safe_child

SUMMARY = "summary.json"
HISTORY = "history.jsonl"
SAGO_DIR = "sago"  # a run's folder inside the Trainer's output_dir


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
