"""Pure tensor formulas (no model, no I/O): the maths behind the axes and the stability loss."""

from .dispersion import (
    activation_dispersion,
    anchor_activation_distance,
    mean_pairwise_abs_diff,
    per_variant_cosine_distance,
)
from .divergence import anchor_kl, js_divergence
from .relative import (
    between_group_dispersion,
    contrastive_dispersion,
    group_between_dispersion,
    relative_dispersion,
)

__all__ = [
    "activation_dispersion",
    "anchor_activation_distance",
    "anchor_kl",
    "between_group_dispersion",
    "contrastive_dispersion",
    "group_between_dispersion",
    "js_divergence",
    "mean_pairwise_abs_diff",
    "per_variant_cosine_distance",
    "relative_dispersion",
]
