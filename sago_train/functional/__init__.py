"""Pure tensor formulas (no model, no I/O): the maths behind the axes and the stability loss."""

from .dispersion import (
    activation_dispersion,
    anchor_activation_distance,
    mean_pairwise_abs_diff,
    per_variant_cosine_distance,
)
from .divergence import anchor_kl, js_divergence

__all__ = [
    "activation_dispersion",
    "anchor_activation_distance",
    "anchor_kl",
    "js_divergence",
    "mean_pairwise_abs_diff",
    "per_variant_cosine_distance",
]
