"""Settings of the stability loss (docs/definitions.md#stability-loss): :class:`StabilityConfig`."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import SagoInputError, unknown_name_error
from ..model.layers import check_layer_indices

MODES = ("centroid", "anchor", "relative")
RELATIVE_FORMS = ("ratio", "infonce")
POOLINGS = ("target", "last")
TASK_LOSS_VARIANTS = ("all", "canonical")


def _check_weight(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SagoInputError(f"expected a number, got {value!r}", key=name)
    if math.isnan(value) or math.isinf(value):
        raise SagoInputError(f"expected a finite number, got {value!r}", key=name)
    if value < 0:
        raise SagoInputError(
            f"expected a weight >= 0, got {value!r}", key=name, hint="a weight of 0 disables the term"
        )
    return float(value)


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise unknown_name_error(name, str(value), choices, key=name)
    return value


@dataclass
class StabilityConfig:
    """Settings of the stability loss; every field is checked on construction.

    Usable with ``transformers.HfArgumentParser`` (each field has a ``help``). The one declaration of the
    stability settings and their defaults: a recipe's ``stability`` section is this dataclass, and with group
    data and no ``stability`` section a recipe trains with ``StabilityConfig()``, as ``StabilityTrainer``
    does without ``stability_config`` (set ``act_weight: 0`` and ``conf_weight: 0`` to train on the groups
    without the stability terms).

    Example:
        >>> cfg = StabilityConfig(act_weight=0.5, conf_weight=0.1, mode="anchor", warmup_steps=100)
        >>> cfg.weights_at(50)
        (0.25, 0.05)
        >>> StabilityConfig(mode="centriod")
        Traceback (most recent call last):
        ...
        sago_train.errors.SagoInputError: field 'mode': unknown mode 'centriod'. Did you mean 'centroid'? Valid: anchor, centroid, relative
    """

    act_weight: float = field(
        default=0.1,
        metadata={"help": "lambda_act, weight of the activation-dispersion term L_act (0 disables it)."},
    )
    conf_weight: float = field(
        default=0.1,
        metadata={"help": "lambda_conf, weight of the next-token divergence term L_conf (0 disables it)."},
    )
    mode: str = field(
        # The default because it is the only mode that pulling every representation together cannot satisfy;
        # in the demo it lowered held-out activation_rel against augmentation (docs/demos.md).
        default="relative",
        metadata={
            "help": "'centroid': symmetric dispersion / Jensen-Shannon divergence across the K variants; "
            "'anchor': distance / KL to the canonical variant, whose side is detached (a fixed target); "
            "'relative': L_act measured against the dispersion between the batch's different groups (see "
            "relative_form), which pulling every representation together cannot lower; L_conf as in 'centroid'. "
            "'relative' needs >= 2 groups per batch."
        },
    )
    relative_form: str = field(
        # Chosen on the demo's tuning split (docs/demo_tuning.md), not on its monitoring sets.
        default="infonce",
        metadata={
            "help": "Mode 'relative' only. 'ratio': each group's within-group dispersion / the batch's "
            "between-group dispersion (as the activation_rel axis); 'infonce': supervised InfoNCE, the group's "
            "other variants positives, other groups' variants negatives."
        },
    )
    temperature: float = field(
        default=0.1,
        metadata={"help": "Mode 'relative', form 'infonce' only: the temperature dividing the cosine similarities."},
    )
    layers: Optional[list[int]] = field(  # noqa: UP045 - HfArgumentParser reads Optional[...]
        default=None,
        metadata={
            "help": "Decoder blocks for L_act (0-based; negative counts from the end). Default: 4 evenly "
            "spaced blocks ending with the last."
        },
    )
    act_pooling: str = field(
        # The activation axes pool at the last prompt token; pooled over the target, the relative loss did not
        # move them on the demo's tuning split (docs/demo_tuning.md).
        default="last",
        metadata={"help": "Hidden-state pooling for L_act: 'last' = the last prompt token (as the activation axes); "
                  "'target' = mean over the shared target tokens."},
    )
    pooling: Optional[str] = field(  # noqa: UP045 - HfArgumentParser reads Optional[...]
        default=None, metadata={"help": "Deprecated name of act_pooling."}
    )
    warmup_steps: int = field(
        default=0,
        metadata={"help": "Optimizer steps over which both weights ramp linearly from 0 to their value."},
    )
    task_loss_variants: str = field(
        default="all",
        metadata={"help": "Which sequences the task loss covers: 'all' variants, or only the 'canonical' one."},
    )

    def __post_init__(self) -> None:
        self.act_weight = _check_weight("act_weight", self.act_weight)
        self.conf_weight = _check_weight("conf_weight", self.conf_weight)
        self.mode = _check_choice("mode", self.mode, MODES)
        self.relative_form = _check_choice("relative_form", self.relative_form, RELATIVE_FORMS)
        self.temperature = _check_weight("temperature", self.temperature)
        if self.temperature == 0:
            raise SagoInputError("expected a temperature > 0, got 0", key="temperature")
        if self.pooling is not None:
            warnings.warn("StabilityConfig(pooling=...) is deprecated: use act_pooling (evaluation has its own "
                          "prompt_pooling)", DeprecationWarning, stacklevel=3)
            self.act_pooling, self.pooling = _check_choice("pooling", self.pooling, POOLINGS), None
        self.act_pooling = _check_choice("act_pooling", self.act_pooling, POOLINGS)
        self.task_loss_variants = _check_choice("task_loss_variants", self.task_loss_variants, TASK_LOSS_VARIANTS)
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise SagoInputError(f"expected an integer >= 0, got {self.warmup_steps!r}", key="warmup_steps")
        self.layers = check_layer_indices(self.layers)

    @property
    def enabled(self) -> bool:
        return self.act_weight > 0 or self.conf_weight > 0

    def weights_at(self, step: int) -> tuple[float, float]:
        """``(lambda_act, lambda_conf)`` after ``step`` optimizer steps, with the linear warmup applied."""
        scale = 1.0 if self.warmup_steps == 0 else min(1.0, max(step, 0) / self.warmup_steps)
        return self.act_weight * scale, self.conf_weight * scale
