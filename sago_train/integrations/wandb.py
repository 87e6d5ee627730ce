"""What SAGO sends to W&B beyond the scalars that go through ``Trainer.log``: histograms of per-group values,
a table of the most unstable groups, and the details the default log level keeps out of the charts (CI bounds,
paired changes and their p-values) as one table per evaluation and one nested summary entry, so the run summary
is not flooded (when W&B is in ``report_to`` and a run is active); and the per-group histograms for
TensorBoard."""

from __future__ import annotations

import logging
import math
from typing import Any

from transformers import TrainerState, TrainingArguments

from .. import distributed
from ..results.records import EvalResult

logger = logging.getLogger(__name__)


DETAIL_COLUMNS = ("mean", "ci_low", "ci_high", "vs_baseline", "vs_baseline_p", "vs_best", "vs_best_p")


def detail_rows(result: EvalResult, details: dict[str, float], prefix: str = "eval_sago") -> list[list[Any]]:
    """One numeric row per (set, axis): ``DETAIL_COLUMNS`` (None where a value is missing)."""
    rows = []
    for name, s in result.sets.items():
        for axis, sm in s.summaries.items():
            extra = {c: details.get(f"{prefix}/{name}/{axis}_{c}") for c in DETAIL_COLUMNS[3:]}
            rows.append([name, axis, sm.mean, sm.ci_low, sm.ci_high, *extra.values()])
    return rows


def log_wandb_extras(args: TrainingArguments, state: TrainerState, result: EvalResult, *, max_rows: int,
                     details: dict[str, float] | None = None, settings: dict[str, Any] | None = None) -> None:
    """Histograms of per-group values, a table of the ``max_rows`` most unstable groups (0: no table) with one
    numeric (sortable) column per axis, and ``details`` (the numbers left out of the Trainer log) as a table and
    a nested summary entry; ``settings`` (the callback's options) go to ``wandb.config["sago"]``. A failing W&B is logged, never raised: the other reporters and the history go on."""
    if not distributed.is_main_process() or "wandb" not in (args.report_to or []):
        return
    try:
        import wandb

        if wandb.run is None:
            return
        if settings:  # the SAGO settings beside the Trainer's, under one key (same values at every evaluation)
            wandb.config.update({"sago": settings}, allow_val_change=True)
        payload: dict[str, Any] = {"train/global_step": state.global_step}
        rows = []
        for name, s in result.sets.items():
            for axis in s.axes:
                values = [v for v in s.values(axis) if math.isfinite(v)]
                if values:
                    payload[f"eval/sago/{name}/{axis}_hist"] = wandb.Histogram(values)
            for g in s.groups:
                rows.append((g.instability, name, g))
        if max_rows > 0 and rows:
            rows.sort(key=lambda r: -r[0] if math.isfinite(r[0]) else 0.0)
            axes = sorted({a for _, _, g in rows for a in g.axes})
            table = wandb.Table(columns=["set", "id", "instability", *axes, "variants", "outputs"])
            for inst, name, g in rows[: max_rows]:
                table.add_data(name, g.id, inst, *(g.axes.get(a) for a in axes),
                               "\n".join(map(str, g.variants)), "\n".join(g.outputs or []))
            payload["eval/sago/unstable_groups"] = table
        if details:
            payload["eval/sago/details"] = wandb.Table(columns=["set", "axis", *DETAIL_COLUMNS],
                                                       data=detail_rows(result, details))
            wandb.run.summary["eval/sago/details"] = {k.removeprefix("eval_sago/"): v for k, v in details.items()}
        wandb.log(payload)
    except Exception as err:  # noqa: BLE001 - a failing W&B must not stop the other reporters
        logger.warning("sago: W&B logging failed (%s: %s); other reporters and the history go on",
                       type(err).__name__, err)


def log_tensorboard_histograms(trainer: Any, state: TrainerState, result: EvalResult) -> None:
    """Histograms of per-group values per set and axis (``eval/sago/<set>/<axis>``) through the writer of the
    Trainer's own TensorBoard integration, when it is there and open. A failure is logged, never raised."""
    if trainer is None or not distributed.is_main_process():
        return
    writer = next((getattr(cb, "tb_writer", None) for cb in trainer.callback_handler.callbacks
                   if type(cb).__name__ == "TensorBoardCallback"), None)
    if writer is None:
        return
    try:
        import numpy as np

        for name, s in result.sets.items():
            for axis in s.axes:
                values = np.array([v for v in s.values(axis) if math.isfinite(v)], dtype=float)
                if values.size:
                    writer.add_histogram(f"eval/sago/{name}/{axis}", values, state.global_step)
        writer.flush()
    except Exception as err:  # noqa: BLE001 - a failing reporter must not stop the others
        logger.warning("sago: TensorBoard histograms failed (%s: %s); other reporters and the history go on",
                       type(err).__name__, err)
