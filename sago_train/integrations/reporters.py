"""Where one evaluation's numbers go during training, and what the run prints: :func:`report` sends the
metrics to the Trainer log (its own row, so every ``report_to`` integration gets them at the right step), the
extras to W&B (histograms, a table of the most unstable groups, the details the default log level keeps out
of the charts with every quantity's verdicts) and TensorBoard (histograms), and one console line per set with
the change since the baseline, the accuracy quantities beside the axes (and a warning when accuracy fell:
docs/accuracy.md); :func:`run_summary_lines` says baseline -> best -> final at the end.
:class:`GuardedReporter` keeps a failing reporter from stopping training."""

from __future__ import annotations

import logging
import math
from typing import Any

from transformers import Trainer, TrainerCallback

from .. import distributed
from ..formatting import printable
from ..functional.axes import BETWEEN, INSTABILITY
from ..functional.stats import to_jsonable
from ..results.compare import LABELS, Comparison, quantities
from ..results.evaluation import Evaluation
from ..results.monitor import MonitorState
from ..results.wording import accuracy_warnings, change_lines
from .keys import PREFIX, evaluation_metrics, headline
from .options import MonitorOptions

logger = logging.getLogger("sago_train.integrations.callback")  # the callback's log


def report(trainer: Any, args: Any, state: Any, control: Any, ev: Evaluation, changes: Comparison,
           seconds: float, options: MonitorOptions, monitor: MonitorState, settings: dict[str, Any]) -> dict[str, float]:
    """Report one evaluation (see the module doc); returns every metric (the Trainer's evaluation metrics get
    them all, so ``metric_for_best_model`` may name any)."""
    metrics = evaluation_metrics(ev, changes, seconds)
    logged = metrics if options.log_level == "full" else headline(metrics, ev)
    log_metrics(trainer, logged, state, control)
    if "tensorboard" in (args.report_to or []):
        log_tensorboard_histograms(trainer, state, ev)
    if "wandb" in (args.report_to or []):
        details = {k: v for k, v in metrics.items() if k not in logged}
        log_wandb_extras(args, state, ev, max_rows=options.log_unstable_groups, details=details,
                         settings=to_jsonable(settings), changes=changes)
    if distributed.is_main_process():
        # Log lines carry user text (kinds, ids, stop strings): printable, so none acts on a terminal.
        for note in ev.warnings:  # degenerate outputs: empty or question-independent generations
            logger.warning("sago: step %d: %s", state.global_step, printable(note))
        for line in change_lines(ev, changes, monitor.baseline):
            logger.info(printable(line))
        for line in accuracy_warnings(ev, changes, monitor.baseline):
            logger.warning(printable(line))
    return metrics


# ---------------------------------------------------------------------------------------------- the Trainer log
def log_metrics(trainer: Any, metrics: dict[str, float], state: Any, control: Any) -> None:
    """Send ``metrics`` to the Trainer log as a row of their own: through ``transformers.Trainer.log`` when
    bound (every ``report_to`` integration), else into ``state.log_history`` only. The base ``Trainer.log`` is
    called, not a subclass's: TRL's ``SFTTrainer.log`` folds its accumulated training metrics (``entropy``,
    ``mean_token_accuracy``, ``num_tokens``) into whatever row it logs, which would move them out of TRL's own
    training row into SAGO's."""
    if trainer is None:
        # Unbound: what Trainer.log records, without the report_to integrations (see the callback's module doc).
        state.log_history.append({**metrics, "step": state.global_step})
        if distributed.is_main_process():
            logger.info("sago metrics: %s", printable(metrics))
        return
    # Trainer.log resets control.should_log (and the handler may touch other flags); keep the Trainer's own
    # plans for this step (its loss log, evaluation, checkpoint) intact.
    flags = (control.should_log, control.should_evaluate, control.should_save)
    if isinstance(trainer, Trainer):
        Trainer.log(trainer, dict(metrics))
    else:
        trainer.log(dict(metrics))
    control.should_log, control.should_evaluate, control.should_save = flags


# ---------------------------------------------------------------------------------------------- W&B, TensorBoard
DETAIL_COLUMNS = ("mean", "ci_low", "ci_high", "vs_baseline", "vs_baseline_p", "vs_baseline_verdict", "vs_best",
                  "vs_best_p", "vs_best_verdict")


def detail_rows(ev: Evaluation, changes: Comparison | None = None) -> list[list[Any]]:
    """One row per (set, quantity) that the monitor compares (every axis, ``instability``, the accuracy
    quantities, ``between_dispersion``): ``DETAIL_COLUMNS``, its mean and CI from the evaluation, each paired
    change (``mean_diff``, ``p_worse``, the one rule's verdict) from ``changes`` (None where a value is
    missing)."""
    rows = []
    changes = changes or Comparison()
    for name, s in ev.sets.items():
        for q in quantities(ev, name):
            sm = s.score(q)
            mean, lo, hi = (s.between_dispersion, None, None) if q == BETWEEN else \
                (None, None, None) if sm is None else (sm.mean, sm.ci_low, sm.ci_high)
            row: list[Any] = [name, q, *(None if v is None or not math.isfinite(v) else v for v in (mean, lo, hi))]
            for label in LABELS:
                change = changes.get(name, q, label)
                row += [None, None, None] if change is None else \
                    [_finite(change.mean_diff), _finite(change.p_worse), change.verdict]
            rows.append(row)
    return rows


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def detail_verdicts(changes: Comparison) -> dict[str, str]:
    """``{"<set>/<quantity>_<vs_baseline|vs_best>_verdict": verdict}``: the words beside the W&B details'
    numbers."""
    return {f"{c.set_name}/{c.quantity}_{label}_verdict": c.verdict for label, c in changes}


def log_wandb_extras(args: Any, state: Any, ev: Evaluation, *, max_rows: int,
                     details: dict[str, float] | None = None, settings: dict[str, Any] | None = None,
                     changes: Comparison | None = None) -> None:
    """Histograms of per-group values, a table of the ``max_rows`` most unstable groups (0: no table) with one
    numeric (sortable) column per axis, and ``details`` (the numbers left out of the Trainer log) with the
    verdicts of ``changes`` (every axis' and the accuracy quantities') as a table and a nested summary entry; ``settings`` (the callback's options) go to ``wandb.config["sago"]``. Into the run
    the Trainer's W&B integration opened; a failing W&B is logged, never raised: the other reporters and the
    history go on."""
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
        for name, s in ev.sets.items():
            for axis in s.axes:
                values = [v for v in s.values(axis) if math.isfinite(v)]
                if values:
                    payload[f"eval/sago/{name}/{axis}_hist"] = wandb.Histogram(values)
            for g in s.groups or []:
                rows.append((g.value(INSTABILITY), name, g))
        if max_rows > 0 and rows:
            rows.sort(key=lambda r: -r[0] if math.isfinite(r[0]) else 0.0)
            axes = sorted({a for _, _, g in rows for a in g.axes})
            table = wandb.Table(columns=["set", "id", "instability", *axes, "variants", "outputs"])
            for inst, name, g in rows[: max_rows]:
                table.add_data(name, g.id, inst, *(g.axes.get(a) for a in axes),
                               "\n".join(map(str, g.variants)), "\n".join(g.outputs or []))
            payload["eval/sago/unstable_groups"] = table
        if details or changes:
            payload["eval/sago/details"] = wandb.Table(columns=["set", "quantity", *DETAIL_COLUMNS],
                                                       data=detail_rows(ev, changes))
            wandb.run.summary["eval/sago/details"] = {
                **{k.removeprefix(f"{PREFIX}/"): v for k, v in (details or {}).items()},
                **detail_verdicts(changes or Comparison())}
        wandb.log(payload)
    except Exception as err:  # noqa: BLE001 - a failing W&B must not stop the other reporters
        logger.warning("sago: W&B logging failed (%s: %s); other reporters and the history go on",
                       type(err).__name__, printable(err))


def log_tensorboard_histograms(trainer: Any, state: Any, ev: Evaluation) -> None:
    """Histograms of per-group values per set and axis (``eval/sago/<set>/<axis>``) through the writer of the
    Trainer's own TensorBoard integration, when it is there and open. A failure is logged, never raised."""
    if trainer is None or not distributed.is_main_process():
        return
    writer = next((getattr(cb, "tb_writer", None) for cb in trainer.callback_handler.callbacks
                   if type(getattr(cb, "wrapped", cb)).__name__ == "TensorBoardCallback"), None)
    if writer is None:
        return
    try:
        import numpy as np

        for name, s in ev.sets.items():
            for axis in s.axes:
                values = np.array([v for v in s.values(axis) if math.isfinite(v)], dtype=float)
                if values.size:
                    writer.add_histogram(f"eval/sago/{name}/{axis}", values, state.global_step)
        writer.flush()
    except Exception as err:  # noqa: BLE001 - a failing reporter must not stop the others
        logger.warning("sago: TensorBoard histograms failed (%s: %s); other reporters and the history go on",
                       type(err).__name__, printable(err))


# ---------------------------------------------------------------------------------------------- the guard
class GuardedReporter(TrainerCallback):
    """Wraps (never modifies) a reporting integration (W&B, TensorBoard, ...) so that one that raises is
    logged once and switched off, and the other reporters, the SAGO history and training go on. Installed in
    place of the reporter in the Trainer's callback list by ``SAGOCallback(guard_reporters=True)``; the
    reporter itself is :attr:`wrapped`."""

    def __init__(self, wrapped: TrainerCallback) -> None:
        self.wrapped = wrapped
        self.disabled = False

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("on_"):
            return object.__getattribute__(self, name)
        wrapped = object.__getattribute__(self, "wrapped")
        method = getattr(wrapped, name)

        def safe(*args: Any, **kwargs: Any) -> Any:
            if self.disabled:
                return None
            try:
                return method(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - a reporter must not cost the training run
                self.disabled = True
                logger.error("sago: %s failed in %s (%s: %s); it is switched off, training, the other reporters "
                             "and the SAGO history go on", type(wrapped).__name__, name, type(err).__name__, printable(err))
                return None

        return safe

    def __getattr__(self, name: str) -> Any:  # tb_writer and the like, read by other callbacks
        if name == "wrapped":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(object.__getattribute__(self, "wrapped"), name)


def guard_reporters(trainer: Any) -> list[str]:
    """Wrap the Trainer's ``report_to`` integrations in :class:`GuardedReporter` (in its callback list; the
    integrations are not modified). Returns the names of the guarded callbacks."""
    from transformers.integrations import INTEGRATION_TO_CALLBACK

    reporter_types = tuple(c for c in INTEGRATION_TO_CALLBACK.values() if isinstance(c, type))
    callbacks = trainer.callback_handler.callbacks
    guarded = []
    for i, cb in enumerate(callbacks):
        if isinstance(cb, reporter_types):
            callbacks[i] = GuardedReporter(cb)
            guarded.append(type(cb).__name__)
    return guarded
