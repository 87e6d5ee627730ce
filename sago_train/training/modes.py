"""The stability modes, registered as classes (as PEFT registers its tuners): each declares once the
:class:`~sago_train.training.config.StabilityConfig` fields that apply to it alone, checks them, computes its two
terms, and says what it needs (a teacher, items without a target, groups per micro-batch). The config, the loss,
the collator and the trainer ask the mode (:func:`get_mode`) instead of comparing its name.

A new mode is a subclass of :class:`StabilityMode` decorated with :func:`register_mode`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from ..errors import SagoInputError, short_repr, unknown_name_error
from ..functional.dispersion import activation_dispersion, anchor_activation_distance
from ..functional.divergence import consistency_divergence, divergence_from_logits
from ..functional.relative import contrastive_dispersion, relative_dispersion
from ..limits import MAX_LOSS_WEIGHT, MAX_NEW_TOKENS
from .batch import GroupLayout

DIVERGENCES = ("kl", "js")
TEACHERS = ("self", "frozen", "ema")
RELATIVE_FORMS = ("ratio", "infonce")


def _check_weight(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SagoInputError(f"expected a number, got {value!r}", key=name)
    if math.isnan(value) or math.isinf(value):
        raise SagoInputError(f"expected a finite number, got {value!r}", key=name)
    if value < 0:
        raise SagoInputError(
            f"expected a weight >= 0, got {value!r}", key=name, hint="a weight of 0 disables the term"
        )
    if value > MAX_LOSS_WEIGHT:
        raise SagoInputError(f"expected a number in [0, {MAX_LOSS_WEIGHT:g}] (MAX_LOSS_WEIGHT), got {value!r}",
                             key=name)
    return float(value)


def _check_int(name: str, value: Any, low: int, high: int, limit: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SagoInputError(f"expected an integer in [{low:,}, {high:,}] ({limit}), got {str(value)[:40]}",
                             key=name)
    return value


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SagoInputError(f"expected true or false, got {short_repr(value, 40)}", key=name)
    return value


def _check_unit(name: str, value: Any, *, closed_low: bool, open_high: bool) -> float:
    """A number in [0, 1) / (0, 1) (``closed_low``) ... (``open_high``: 1 excluded)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise SagoInputError(f"expected a number, got {value!r}", key=name)
    low_ok = value >= 0 if closed_low else value > 0
    high_ok = value < 1 if open_high else value <= 1
    if not (low_ok and high_ok):
        interval = ("[" if closed_low else "(") + "0, 1" + (")" if open_high else "]")
        raise SagoInputError(f"expected a number in {interval}, got {value!r}", key=name)
    return float(value)


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise unknown_name_error(name, str(value), choices, key=name)
    return value


def _check_temperature(name: str, value: Any) -> float:
    value = _check_weight(name, value)
    if value == 0:
        raise SagoInputError("expected a temperature > 0, got 0", key=name)
    return value


class StabilityMode:
    """One stability mode: what ``mode=<name>`` measures and needs.

    Example:
        >>> get_mode("relative").fields, get_mode("relative").min_groups, get_mode("consistency").needs_teacher
        (('relative_form', 'temperature'), 2, True)
    """

    name: ClassVar[str] = ""
    #: The StabilityConfig fields that apply to this mode only (checked here, whatever the mode in use).
    fields: ClassVar[tuple[str, ...]] = ()
    #: Groups a micro-batch needs for L_act to measure anything (fewer: the documented fallback of 0).
    min_groups: ClassVar[int] = 1
    #: Whether a frozen / EMA teacher may be built for it (``teacher``), and items may lack a target.
    needs_teacher: ClassVar[bool] = False
    unlabeled: ClassVar[bool] = False
    #: Whether L_conf measures each variant against the canonical one (else against the group's centroid).
    anchored: ClassVar[bool] = False

    @classmethod
    def check(cls, config: Any) -> None:
        """Check (and normalise) this mode's own fields of ``config``."""

    def activation(self, vectors: torch.Tensor, layout: GroupLayout, config: Any) -> torch.Tensor:
        """L_act of one layer's pooled vectors ``[G, K, H]``, per group ``[G]``."""
        if self.anchored:
            return anchor_activation_distance(vectors, layout.canonical)
        return activation_dispersion(vectors)

    def confidence(self, rows: torch.Tensor, mask: torch.Tensor, layout: GroupLayout, config: Any, *,
                   teacher_logits: torch.Tensor | None, consume: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-position L_conf ``[G, T]`` of the target-predicting ``rows`` and the mask of the positions it
        counts."""
        canonical = layout.canonical[:, None].expand_as(mask) if self.anchored else None
        return divergence_from_logits(rows, canonical, consume=consume), mask  # JS, or KL to the canonical


MODES_REGISTRY: dict[str, StabilityMode] = {}


def register_mode(cls: type[StabilityMode]) -> type[StabilityMode]:
    """Register a :class:`StabilityMode` subclass under its ``name``."""
    if not cls.name or cls.name in MODES_REGISTRY:
        raise ValueError(f"a stability mode needs a new name, got {cls.name!r}")
    MODES_REGISTRY[cls.name] = cls()
    return cls


def get_mode(name: str) -> StabilityMode:
    """The registered mode ``name`` (an error lists the valid ones)."""
    if name not in MODES_REGISTRY:
        raise unknown_name_error("mode", str(name), sorted(MODES_REGISTRY), key="mode")
    return MODES_REGISTRY[name]


@register_mode
class Centroid(StabilityMode):
    """Symmetric dispersion / Jensen-Shannon divergence across the K variants."""

    name = "centroid"


@register_mode
class Anchor(StabilityMode):
    """Distance / KL to the canonical variant, whose side is detached (a fixed target)."""

    name = "anchor"
    anchored = True


@register_mode
class Relative(StabilityMode):
    """L_act against the dispersion between the batch's groups, which pulling every representation together
    cannot lower; L_conf as in ``centroid``."""

    name = "relative"
    fields = ("relative_form", "temperature")
    min_groups = 2

    @classmethod
    def check(cls, config: Any) -> None:
        config.relative_form = _check_choice("relative_form", config.relative_form, RELATIVE_FORMS)
        config.temperature = _check_temperature("temperature", config.temperature)

    def activation(self, vectors: torch.Tensor, layout: GroupLayout, config: Any) -> torch.Tensor:
        if config.relative_form == "ratio":
            return relative_dispersion(vectors)
        return contrastive_dispersion(vectors, temperature=config.temperature)


@register_mode
class Consistency(StabilityMode):
    """Self-distillation: KL from a stop-gradient teacher given the canonical prompt to each other variant;
    L_act as in ``anchor``; items may be unlabeled prompts (the teacher's greedy answer is the target)."""

    name = "consistency"
    fields = ("divergence", "teacher", "ema_decay", "teacher_temperature", "confidence_threshold",
              "unlabeled_max_new_tokens", "unlabeled_task_loss")
    needs_teacher = True
    unlabeled = True
    anchored = True

    @classmethod
    def check(cls, config: Any) -> None:
        config.divergence = _check_choice("divergence", config.divergence, DIVERGENCES)
        config.teacher = _check_choice("teacher", config.teacher, TEACHERS)
        config.ema_decay = _check_unit("ema_decay", config.ema_decay, closed_low=True, open_high=True)
        config.teacher_temperature = _check_temperature("teacher_temperature", config.teacher_temperature)
        config.confidence_threshold = _check_unit("confidence_threshold", config.confidence_threshold,
                                                  closed_low=True, open_high=True)
        config.unlabeled_max_new_tokens = _check_int("unlabeled_max_new_tokens", config.unlabeled_max_new_tokens, 1,
                                                     MAX_NEW_TOKENS, "MAX_NEW_TOKENS")
        config.unlabeled_task_loss = _check_bool("unlabeled_task_loss", config.unlabeled_task_loss)
        if config.divergence == "js" and config.teacher != "self":
            raise SagoInputError(
                f"divergence 'js' compares the canonical and each variant without a stop-gradient, so it has no "
                f"teacher; got teacher={config.teacher!r}", key="teacher", hint="use teacher='self' with divergence='js'"
            )

    def confidence(self, rows: torch.Tensor, mask: torch.Tensor, layout: GroupLayout, config: Any, *,
                   teacher_logits: torch.Tensor | None, consume: bool) -> tuple[torch.Tensor, torch.Tensor]:
        per_pos, top = consistency_divergence(
            rows, layout.canonical[:, None].expand_as(mask), divergence=config.divergence,
            teacher_logits=teacher_logits, temperature=config.teacher_temperature, consume=consume)
        if config.confidence_threshold > 0:
            mask = mask & (top >= config.confidence_threshold)
        return per_pos, mask


MODES = tuple(MODES_REGISTRY)
