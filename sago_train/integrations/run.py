"""One SAGO evaluation of the model being trained, with the out-of-memory fallback and a progress display."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from .. import distributed
from ..data.groups import VariantSet
from ..eval.config import SAGOConfig
from ..eval.evaluator import SAGOEvaluator
from ..results.records import EvalResult
from .progress import evaluation_progress
from .setup import is_oom

logger = logging.getLogger("sago_train.integrations.callback")  # the callback's log, as setup.py


def run_evaluator(model: Any, tokenizer: Any, sets: Mapping[str, VariantSet], config: SAGOConfig, step: int, *,
                  disable_bar: bool, generation: bool = True) -> EvalResult:
    """Evaluate ``sets`` with ``config``; out of memory on a single process, retry with half the batch (results
    do not depend on the batch size) down to 1."""
    while True:
        evaluator = SAGOEvaluator(model, tokenizer, config=config)
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
