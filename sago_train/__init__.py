"""sago_train: does this fine-tune generalize, or did it just learn one phrasing?

SAGO measures, per example and across variants of the same input, how much a model's behaviour changes
along independent axes (activation, confidence, generation, mirroring).

Example:
    >>> from sago_train import SAGOEvaluator, bundled_sets, tiny_model_path
    >>> result = SAGOEvaluator.from_pretrained(tiny_model_path()).evaluate(bundled_sets())  # doctest: +SKIP
"""

from .axes import AXES, DEFAULT_AXES, AxisValue, GroupInputs, register_axis
from .config import SAGOConfig
from .data import VariantGroup, VariantSet, bundled_sets, resolve_sets
from .errors import SagoInputError
from .evaluator import SAGOEvaluator
from .functional import activation_dispersion, anchor_activation_distance, mean_pairwise_abs_diff
from .results import EvalResult, GroupResult, SetResult
from .stats import axis_correlation, bootstrap_ci, kind_effect, paired_comparison, rank_reversal
from .version import __version__

__all__ = [
    "AXES",
    "DEFAULT_AXES",
    "AxisValue",
    "EvalResult",
    "GroupInputs",
    "GroupResult",
    "SAGOConfig",
    "SAGOEvaluator",
    "SagoInputError",
    "SetResult",
    "VariantGroup",
    "VariantSet",
    "__version__",
    "activation_dispersion",
    "anchor_activation_distance",
    "axis_correlation",
    "bootstrap_ci",
    "bundled_sets",
    "kind_effect",
    "mean_pairwise_abs_diff",
    "paired_comparison",
    "rank_reversal",
    "register_axis",
    "resolve_sets",
]
