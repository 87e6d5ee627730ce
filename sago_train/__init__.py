"""sago_train: does this fine-tune generalize, or did it just learn one phrasing?

SAGO measures, per example and across variants of the same input, how much a model's behaviour changes
along independent axes (activation, confidence, generation, mirroring).

Example:
    >>> from sago_train import SAGOEvaluator, bundled_sets, tiny_model_path
    >>> result = SAGOEvaluator.from_pretrained(tiny_model_path()).evaluate(bundled_sets())  # doctest: +SKIP

The public names below are imported lazily (as in transformers and TRL), so ``import sago_train`` and the
CLI start fast and torch/transformers load only when used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__  # noqa: F401 - re-exported

_IMPORT_STRUCTURE: dict[str, list[str]] = {
    "functional.axes": ["AXES", "DEFAULT_AXES", "AxisValue", "GroupInputs", "register_axis"],
    "integrations.callback": ["SAGOCallback"],
    "integrations.arguments": ["SAGOArguments"],
    "training.collator": ["VariantGroupCollator"],
    "eval.config": ["SAGOConfig"],
    "data": ["VariantGroup", "VariantSet", "build_variant_set", "bundled_sets", "make_generator", "resolve_sets"],
    "integrations.early_stopping": ["SAGOEarlyStoppingCallback"],
    "errors": ["SagoInputError"],
    "eval.evaluator": ["SAGOEvaluator"],
    "functional": [
        "activation_dispersion",
        "anchor_activation_distance",
        "anchor_kl",
        "between_group_dispersion",
        "contrastive_dispersion",
        "js_divergence",
        "mean_pairwise_abs_diff",
        "relative_dispersion",
    ],
    "training.loss": ["StabilityConfig", "StabilityLoss"],
    "cli.recipe": ["Recipe", "load_recipe"],
    "results.evaluation": ["Evaluation", "GroupRecord", "SetEvaluation"],
    "integrations.options": ["MonitorOptions", "EarlyStoppingOptions"],
    "training.trainer": ["StabilityTrainer", "StabilitySFTTrainer"],
    "functional.stats": ["bootstrap_ci", "paired_comparison"],
    "functional.relations": ["axis_correlation", "kind_effect", "rank_reversal"],
    "model.tiny": ["tiny_model_path", "load_tiny_model"],
    "model.loading": ["load_model_and_tokenizer"],
    "model.real": ["real_model_path"],
}
_NAME_TO_MODULE = {name: module for module, names in _IMPORT_STRUCTURE.items() for name in names}

__all__ = sorted(["__version__", *_NAME_TO_MODULE])


def __getattr__(name: str) -> Any:
    module = _NAME_TO_MODULE.get(name)
    if module is None:
        raise AttributeError(f"module 'sago_train' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from .cli.recipe import Recipe, load_recipe  # noqa: F401
    from .data import (  # noqa: F401
        VariantGroup,
        VariantSet,
        build_variant_set,
        bundled_sets,
        make_generator,
        resolve_sets,
    )
    from .errors import SagoInputError  # noqa: F401
    from .eval.config import SAGOConfig  # noqa: F401
    from .eval.evaluator import SAGOEvaluator  # noqa: F401
    from .functional import (  # noqa: F401
        activation_dispersion,
        anchor_activation_distance,
        anchor_kl,
        between_group_dispersion,
        contrastive_dispersion,
        js_divergence,
        mean_pairwise_abs_diff,
        relative_dispersion,
    )
    from .functional.axes import AXES, DEFAULT_AXES, AxisValue, GroupInputs, register_axis  # noqa: F401
    from .functional.relations import axis_correlation, kind_effect, rank_reversal  # noqa: F401
    from .functional.stats import bootstrap_ci, paired_comparison  # noqa: F401
    from .integrations.arguments import SAGOArguments  # noqa: F401
    from .integrations.callback import SAGOCallback  # noqa: F401
    from .integrations.early_stopping import SAGOEarlyStoppingCallback  # noqa: F401
    from .integrations.options import EarlyStoppingOptions, MonitorOptions  # noqa: F401
    from .model.loading import load_model_and_tokenizer  # noqa: F401
    from .model.real import real_model_path  # noqa: F401
    from .model.tiny import load_tiny_model, tiny_model_path  # noqa: F401
    from .results.evaluation import Evaluation, GroupRecord, SetEvaluation  # noqa: F401
    from .training.collator import VariantGroupCollator  # noqa: F401
    from .training.loss import StabilityConfig, StabilityLoss  # noqa: F401
    from .training.trainer import StabilitySFTTrainer, StabilityTrainer  # noqa: F401
