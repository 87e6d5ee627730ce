"""Pure tensor formulas (no model, no I/O): the maths behind the axes and the stability loss."""

from .dispersion import (
    activation_dispersion,
    anchor_activation_distance,
    mean_pairwise_abs_diff,
    per_variant_cosine_distance,
)

__all__ = [
    "activation_dispersion",
    "anchor_activation_distance",
    "mean_pairwise_abs_diff",
    "per_variant_cosine_distance",
]
