"""What ``SAGOCallback`` settles at train start, before any step: which tokenizer it evaluates with (or that
it has none: an error, not a silent no-op), and that the run directory is this run's alone (a lock held
by one process, and no other run's history replaced)."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from .. import distributed
from ..errors import SagoInputError
from ..io import acquire_run_lock, release_run_lock
from ..results.store import claim_history

logger = logging.getLogger("sago_train.integrations.callback")


def find_tokenizer(explicit: Any, kwargs: dict[str, Any], trainer: Any) -> tuple[Any, str]:
    """The tokenizer to evaluate with and where it came from: ``SAGOCallback(tokenizer=...)``, else the
    Trainer's ``processing_class`` (or a processor's tokenizer), else its ``data_collator.tokenizer``."""
    candidates = [(explicit, "SAGOCallback(tokenizer=...)"),
                  (kwargs.get("processing_class"), "the Trainer's processing_class"),
                  (kwargs.get("tokenizer"), "the Trainer's tokenizer"),
                  (getattr(trainer, "processing_class", None), "the Trainer's processing_class"),
                  (getattr(getattr(trainer, "data_collator", None), "tokenizer", None),
                   "the Trainer's data_collator.tokenizer")]
    for tok, origin in candidates:
        if tok is not None and not callable(getattr(tok, "decode", None)):
            tok = getattr(tok, "tokenizer", None)  # a processor wrapping a tokenizer
        if tok is not None:
            return tok, origin
    return None, ""


def check_can_evaluate(kwargs: dict[str, Any], found: tuple[Any, str], *, soft_failures: bool) -> str | None:
    """None when evaluations can run (and the tokenizer is named once); otherwise raise, or with
    ``soft_failures`` return the reason every evaluation will be skipped and counted for."""
    tok, origin = found
    if kwargs.get("model") is None:
        problem = "SAGOCallback has no model to evaluate (the Trainer passed none to its callbacks)"
    elif tok is None:
        problem = ("SAGOCallback has no tokenizer: pass processing_class=tokenizer to the Trainer, or "
                   "SAGOCallback(..., tokenizer=tokenizer)")
    else:
        if distributed.is_main_process():
            name = getattr(tok, "name_or_path", "") or type(tok).__name__
            log = logger.warning if "data_collator" in origin else logger.info
            log("sago: evaluating with the tokenizer %s from %s", name, origin)
        return None
    if not soft_failures:
        raise SagoInputError(problem, hint="or SAGOCallback(soft_failures=True) to train on and count each "
                                           "skipped evaluation in failures")
    logger.error("sago: %s; every evaluation will be skipped and counted in failures (soft_failures=True)", problem)
    return problem


def claim_run_dir(sago_dir: Path, *, resumed: bool, overwrite: bool, locked: Path | None) -> Path | None:
    """Hold ``sago_dir`` (one process at a time) and refuse to replace another run's history; returns the lock
    held. Rank 0 decides and every rank raises the same error, so none waits in a collective for a rank that
    stopped."""

    error = None
    if distributed.is_main_process():
        try:
            if locked is None:
                locked = acquire_run_lock(sago_dir)
            claim_history(sago_dir, resuming=resumed, overwrite=overwrite)
        except SagoInputError as err:
            error = str(err)
        except OSError as err:  # e.g. an output_dir that cannot be created
            error = f"cannot use {sago_dir} for the SAGO history: {err.strerror or err}"
    error = distributed.broadcast_object(error)
    if error is not None:
        if locked is not None:
            release_run_lock(locked.parent)
        raise SagoInputError(error)
    return locked


class RNGGuard:
    """Save and restore every RNG an evaluation could touch, so monitoring never changes training."""

    def __enter__(self) -> RNGGuard:
        self.py = random.getstate()
        self.np = np.random.get_state()
        self.torch = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return self

    def __exit__(self, *exc: Any) -> None:
        random.setstate(self.py)
        np.random.set_state(self.np)
        torch.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


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
                             "and the SAGO history go on", type(wrapped).__name__, name, type(err).__name__, err)
                return None

        return safe


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


def is_oom(err: BaseException) -> bool:
    """Whether an exception is an out-of-memory error (CUDA's own type, or a RuntimeError that says so)."""
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()
