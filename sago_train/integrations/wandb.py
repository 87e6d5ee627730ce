"""What SAGO sends to W&B beyond the scalars that go through ``Trainer.log``: histograms of per-group values
and a table of the most unstable groups (when W&B is in ``report_to`` and a run is active)."""

from __future__ import annotations

import logging
import math
from typing import Any

from transformers import TrainerState, TrainingArguments

from .. import distributed
from ..results.records import EvalResult

logger = logging.getLogger(__name__)


def log_wandb_extras(args: TrainingArguments, state: TrainerState, result: EvalResult, *, max_rows: int) -> None:
    """Histograms of per-group values and a table of the ``max_rows`` most unstable groups (0: no table).
    A failing W&B is logged, never raised: the other reporters and the history go on."""
    if not distributed.is_main_process() or "wandb" not in (args.report_to or []):
        return
    try:
        import wandb

        if wandb.run is None:
            return
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
            table = wandb.Table(columns=["set", "id", "instability", "axes", "variants", "outputs"])
            for inst, name, g in rows[: max_rows]:
                table.add_data(name, g.id, inst, str({a: round(v, 4) for a, v in g.axes.items()}),
                               "\n".join(map(str, g.variants)), "\n".join(g.outputs or []))
            payload["eval/sago/unstable_groups"] = table
        wandb.log(payload)
    except Exception as err:  # noqa: BLE001 - a failing W&B must not stop the other reporters
        logger.warning("sago: W&B logging failed (%s: %s); other reporters and the history go on",
                       type(err).__name__, err)
