"""What ``SAGOCallback`` settles at train start, before any step: which tokenizer it evaluates with (or that
it has none: an error, not a silent no-op), and that the run directory is this run's alone (a lock held
by one process, and no other run's history replaced)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from . import distributed
from .errors import SagoInputError

logger = logging.getLogger("sago_train.callback")


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
    from .io import acquire_run_lock, release_run_lock
    from .monitoring import claim_history

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
