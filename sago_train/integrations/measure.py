"""One SAGO evaluation of the model being trained: with what tokenizer, with every RNG restored afterwards (so
monitoring never changes training), retried at half the batch on out-of-memory (results do not depend on the
batch size), and with progress that survives a log file (a bar draws nothing when stderr is not a terminal, so
an evaluation of minutes would be silent in ``nohup``/SLURM/CI logs: :class:`SetProgress` writes one line per
finished set instead)."""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from .. import distributed
from ..data.groups import VariantSet
from ..errors import SagoInputError
from ..eval.config import SAGOConfig
from ..eval.evaluator import SAGOEvaluator
from ..formatting import printable
from ..results.evaluation import Evaluation

logger = logging.getLogger("sago_train.integrations.callback")  # the callback's log

def find_tokenizer(explicit: Any, kwargs: dict[str, Any], trainer: Any) -> tuple[Any, str]:
    """The tokenizer to evaluate with and where it came from: ``SAGOCallback(tokenizer=...)``, else the
    Trainer's ``processing_class`` (or a processor's tokenizer), else its ``data_collator.tokenizer``, else the
    tokenizer of the training dataloader's collate function (a Trainer built as the transformers docs show: a
    collator holding the tokenizer, no ``processing_class``)."""
    collate = getattr(kwargs.get("train_dataloader"), "collate_fn", None)
    collate = getattr(collate, "data_collator", collate)  # transformers' RemoveColumnsCollator wraps the collator
    candidates = [(explicit, "SAGOCallback(tokenizer=...)"),
                  (kwargs.get("processing_class"), "the Trainer's processing_class"),
                  (kwargs.get("tokenizer"), "the Trainer's tokenizer"),
                  (getattr(trainer, "processing_class", None), "the Trainer's processing_class"),
                  (getattr(getattr(trainer, "data_collator", None), "tokenizer", None),
                   "the Trainer's data_collator.tokenizer"),
                  (getattr(collate, "tokenizer", None), "the training data collator's tokenizer")]
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
            log = logger.warning if "collator" in origin else logger.info
            log("sago: evaluating with the tokenizer %s from %s", printable(name), origin)
        return None
    if not soft_failures:
        raise SagoInputError(problem, hint="or SAGOCallback(soft_failures=True) to train on and count each "
                                           "skipped evaluation in failures")
    logger.error("sago: %s; every evaluation will be skipped and counted in failures (soft_failures=True)", problem)
    return problem


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


def is_oom(err: BaseException) -> bool:
    """Whether an exception is an out-of-memory error (CUDA's own type, or a RuntimeError that says so)."""
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


def run_evaluator(model: Any, tokenizer: Any, sets: Mapping[str, VariantSet], config: SAGOConfig, step: int, *,
                  disable_bar: bool, generation: bool = True, remedy_style: str = "callback") -> Evaluation:
    """Evaluate ``sets`` with ``config``, every RNG restored afterwards; out of memory on a single process,
    retry with half the batch (results do not depend on the batch size) down to 1. ``remedy_style``: how its
    warnings name a setting (``callback``: SAGOCallback's arguments; ``recipe``: a recipe's keys)."""
    with RNGGuard():
        return _run_with_retry(model, tokenizer, sets, config, step, disable_bar=disable_bar, generation=generation,
                               remedy_style=remedy_style)


def _run_with_retry(model: Any, tokenizer: Any, sets: Mapping[str, VariantSet], config: SAGOConfig, step: int, *,
                    disable_bar: bool, generation: bool, remedy_style: str) -> Evaluation:
    while True:
        evaluator = SAGOEvaluator(model, tokenizer, config=config)
        evaluator.remedy_style = remedy_style
        tick, bar = evaluation_progress(evaluator, sets, step, disable_bar=disable_bar, say=logger.info,
                                        generation=generation)
        try:
            return evaluator.evaluate(sets, progress=tick, generation=generation)
        except RuntimeError as err:
            # Under torch.distributed a retry on one rank would leave the others waiting in a collective.
            if not is_oom(err) or config.batch_size == 1 or distributed.world_size() > 1:
                raise
            logger.warning("sago: out of memory at batch size %d, retrying with %d", config.batch_size,
                           config.batch_size // 2)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            config = SAGOConfig(**{**config.to_dict(), "batch_size": max(1, config.batch_size // 2)})
        finally:
            if bar is not None:
                bar.close()


def stderr_is_terminal() -> bool:
    """Whether a progress bar on stderr would be seen (False for log files and pipes)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


class SetProgress:
    """A ``progress(n)`` callable for :meth:`SAGOEvaluator.evaluate`: ``counts`` is the number of sequences of
    each set, in evaluation order; ``say`` receives one line per finished set, e.g.
    ``sago step 10: set 'paraphrase' done (1/2 sets, 96/160 sequences, 12.3 s)``."""

    def __init__(self, counts: Mapping[str, int], say: Callable[[str], None], label: str = "sago") -> None:
        self.counts = dict(counts)
        self.total = sum(self.counts.values())
        self.say = say
        self.label = label
        self.done = 0
        self._next = 0  # index of the next set to finish
        self._ends = []
        acc = 0
        for n in self.counts.values():
            acc += n
            self._ends.append(acc)
        self._start = time.perf_counter()

    def __call__(self, n: int) -> None:
        self.done += n
        names = list(self.counts)
        while self._next < len(names) and self.done >= self._ends[self._next]:
            seconds = time.perf_counter() - self._start
            self.say(f"{self.label}: set '{names[self._next]}' done ({self._next + 1}/{len(names)} sets, "
                     f"{self._ends[self._next]}/{self.total} sequences, {seconds:.1f} s)")
            self._next += 1


class ProgressAwareHandler(logging.StreamHandler):
    """A log handler that never glues a line to a progress bar: each line goes through ``tqdm.write``, which
    clears the bars drawn on the terminal (the Trainer's, SAGO's own), prints the line on a line of its own and
    redraws the bars below it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except Exception:  # noqa: BLE001 - logging must never raise (as logging.StreamHandler)
            self.handleError(record)


def ensure_console(level: int) -> None:
    """Show ``sago_train``'s log lines (the cost line, per-set progress) on stderr when nobody configured logging:
    Python drops INFO lines otherwise. Does nothing when the application (or pytest) has set up a handler."""
    lib = logging.getLogger("sago_train")
    if lib.handlers or logging.getLogger().handlers:
        return
    handler = ProgressAwareHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    lib.addHandler(handler)
    lib.setLevel(level)
    lib.propagate = False  # root has no handler now; if one is added later, lines would otherwise print twice


def evaluation_progress(evaluator: Any, sets: Mapping[str, Any], step: int, *, disable_bar: bool,
                        say: Callable[[str], None], generation: bool = True
                        ) -> tuple[Callable[[int], None] | None, Any]:
    """``(progress callable, bar to close)`` for one evaluation on the main process: a tqdm bar on a
    terminal, one line per finished set (:class:`SetProgress`) in a log file, nothing on other ranks."""
    if not distributed.is_main_process():
        return None, None
    if not stderr_is_terminal():  # a log file: a bar would draw nothing there
        counts = {name: evaluator.count_sequences({name: vs}, generation) for name, vs in sets.items()}
        return SetProgress(counts, say, label=f"sago step {step}"), None
    if disable_bar:
        return None, None
    from tqdm.auto import tqdm

    bar = tqdm(total=evaluator.count_sequences(sets, generation), desc="SAGO eval", leave=False, dynamic_ncols=True)
    return bar.update, bar
