"""The SAGO axes. Importing this package registers the built-in axes."""

from . import activation, confidence, generation, mirroring, posix  # noqa: F401 - registration side effects
from .activation import activation_instability, activation_relative, between_dispersion
from .confidence import confidence_instability, confidence_prob_instability
from .correctness import choice_index, correctness_summary, is_correct, variant_correct
from .generation import generation_instability
from .mirroring import mirroring_instability
from .posix import posix_index
from .registry import (
    ACCURACY,
    ACCURACY_ALL,
    ACCURACY_WORST_KIND,
    AXES,
    BETWEEN,
    INSTABILITY,
    Axis,
    AxisValue,
    GroupInputs,
    SetLevel,
    add_partials,
    get_axis,
    in_instability,
    parse_axes,
    register_axis,
)

DEFAULT_AXES = ("confidence", "generation")

__all__ = [
    "ACCURACY",
    "ACCURACY_ALL",
    "ACCURACY_WORST_KIND",
    "AXES",
    "BETWEEN",
    "INSTABILITY",
    "DEFAULT_AXES",
    "Axis",
    "AxisValue",
    "GroupInputs",
    "SetLevel",
    "activation_instability",
    "activation_relative",
    "add_partials",
    "between_dispersion",
    "choice_index",
    "confidence_instability",
    "confidence_prob_instability",
    "correctness_summary",
    "generation_instability",
    "get_axis",
    "in_instability",
    "is_correct",
    "mirroring_instability",
    "parse_axes",
    "posix_index",
    "register_axis",
    "variant_correct",
]
