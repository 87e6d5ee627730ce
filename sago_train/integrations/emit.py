"""Where one evaluation's numbers go during training: the history on disk, the Trainer log (through
``Trainer.log`` when bound, else ``state.log_history``) and the W&B / TensorBoard extras. The callback decides
what to measure; these only route what was measured."""

from __future__ import annotations

import logging
from typing import Any

from .. import distributed
from ..functional.stats import to_jsonable
from ..results.records import EvalResult
from .metrics import RecordsWithoutInstability, history_entry, is_partial
from .monitor import MonitorState
from .wandb import log_tensorboard_histograms, log_wandb_extras

logger = logging.getLogger("sago_train.integrations.callback")  # the callback's log, as setup.py


def write_history(monitor: MonitorState | None, state: Any, result: EvalResult, compare: dict[str, Any],
                  seconds: float, failures: list[dict[str, Any]]) -> None:
    """Append the evaluation's ``history.jsonl`` line and its group records; a write error is logged and
    counted in ``failures`` (training goes on)."""
    if monitor is None:
        return
    is_baseline = monitor.baseline is not None and monitor.baseline.step == state.global_step
    entry = history_entry(state.global_step, float(state.epoch or 0.0), result, compare, seconds, is_baseline)
    try:
        # Group records first: a history line never points at records that are not on disk.
        monitor.record(state.global_step, RecordsWithoutInstability(result) if is_partial(result) else result,
                       to_jsonable(entry))
    except OSError as err:
        logger.error("sago: could not write the evaluation history (%s); training continues", err)
        failures.append({"step": state.global_step, "error": f"OSError: {err}"})


def log_metrics(trainer: Any, metrics: dict[str, float], state: Any, control: Any) -> None:
    """Send ``metrics`` to the Trainer log: through ``trainer.log`` when bound (every ``report_to``
    integration), else into ``state.log_history`` only."""
    if trainer is not None:
        # Trainer.log resets control.should_log (and the handler may touch other flags); keep the
        # Trainer's own plans for this step (its loss log, evaluation, checkpoint) intact.
        flags = (control.should_log, control.should_evaluate, control.should_save)
        trainer.log(dict(metrics))
        control.should_log, control.should_evaluate, control.should_save = flags
    else:
        # Unbound: what Trainer.log records, without the report_to integrations (see the callback's module doc).
        state.log_history.append({**metrics, "step": state.global_step})
        if distributed.is_main_process():
            logger.info("sago metrics: %s", metrics)


def report_extras(args: Any, state: Any, trainer: Any, result: EvalResult, metrics: dict[str, float],
                  logged: dict[str, float], settings: dict[str, Any], max_rows: int) -> None:
    """TensorBoard histograms and the W&B histograms, tables, summary (the metrics not ``logged``) and config
    (``settings``), for the integrations in ``args.report_to``."""
    if "tensorboard" in (args.report_to or []):
        log_tensorboard_histograms(trainer, state, result)
    if "wandb" in (args.report_to or []):
        details = {k: v for k, v in metrics.items() if k not in logged}
        log_wandb_extras(args, state, result, max_rows=max_rows, details=details, settings=to_jsonable(settings))
