"""Settings of the stability loss (docs/definitions.md#stability-loss): :class:`StabilityConfig`."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ..data.generators import FREE_TEXT_KINDS, GENERATORS
from ..errors import SagoInputError, did_you_mean, unknown_name_error
from ..limits import MAX_FRESH_VARIANTS, MAX_TRAINING_STEPS
from ..model.layers import check_layer_indices
from .modes import (
    MODES_REGISTRY,
    StabilityMode,
    _check_bool,
    _check_choice,
    _check_int,
    _check_weight,
    get_mode,
)

DEFAULT_FRESH_KINDS = ("typo", "casing", "whitespace")
POOLINGS = ("target", "last")
TASK_LOSS_VARIANTS = ("all", "canonical")
WEIGHT_SCALES = ("absolute", "relative")


def _check_fresh_kinds(value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise SagoInputError(f"expected a non-empty list of generator names, got {value!r}", key="fresh_kinds")
    for kind in value:
        if not isinstance(kind, str) or kind not in GENERATORS:
            raise unknown_name_error("generator", str(kind), GENERATORS, key="fresh_kinds")
        if kind not in FREE_TEXT_KINDS:
            raise SagoInputError(
                f"generator '{kind}' cannot rewrite a bare free-text prompt with its default settings, so it cannot "
                f"draw fresh variants.{did_you_mean(kind, FREE_TEXT_KINDS)} Usable: {', '.join(FREE_TEXT_KINDS)}",
                key="fresh_kinds",
                hint="build variants of the other kinds into the data (sago_train.data.build_variant_set)",
            )
    return list(value)


@dataclass
class StabilityConfig:
    """Settings of the stability loss; every field is checked on construction.

    Usable with ``transformers.HfArgumentParser`` (each field has a ``help``). The one declaration of the
    stability settings and their defaults: a recipe's ``stability`` section is this dataclass, and with group
    data and no ``stability`` section a recipe trains with ``StabilityConfig()``, as ``StabilityTrainer``
    does without ``stability_config``.

    ``StabilityConfig()`` has both weights at 0: the task loss on every variant of a group, i.e. data
    augmentation. That is what the loss experiment recommends (docs/loss-experiment.md): no stability term beat
    augmentation on held-out behaviour there, and the previous default (relative, 0.1 / 0.1) cost canonical
    accuracy. A term is turned on by giving it a weight; the mode then says what it measures.

    Example:
        >>> cfg = StabilityConfig(act_weight=0.5, conf_weight=0.1, mode="anchor", warmup_steps=100)
        >>> cfg.weights_at(50)
        (0.25, 0.05)
        >>> StabilityConfig(mode="centriod")
        Traceback (most recent call last):
        ...
        sago_train.errors.SagoInputError: field 'mode': unknown mode 'centriod'. Did you mean 'centroid'? Valid: anchor, centroid, consistency, relative
        >>> StabilityConfig(mode="consistency", fresh_variants=2, fresh_kinds=["typo", "format"])
        Traceback (most recent call last):
        ...
        sago_train.errors.SagoInputError: field 'fresh_kinds': generator 'format' cannot rewrite a bare free-text prompt with its default settings, so it cannot draw fresh variants. Usable: typo, casing, whitespace (build variants of the other kinds into the data (sago_train.data.build_variant_set))
    """

    # Both 0 by default: augmentation alone was the arm to beat and no term beat it (docs/loss-experiment.md).
    act_weight: float = field(
        default=0.0,
        metadata={"help": "lambda_act, weight of the activation-dispersion term L_act (0, the default, disables it)."},
    )
    conf_weight: float = field(
        default=0.0,
        metadata={"help": "lambda_conf, weight of the next-token divergence term L_conf (0, the default, disables it)."},
    )
    mode: str = field(
        # The mode a weight turns on: the only one that pulling every representation together cannot satisfy; in
        # the demo it lowered held-out activation_rel against augmentation (docs/demos.md), behaviour aside.
        default="relative",
        metadata={
            "help": "'centroid': symmetric dispersion / Jensen-Shannon divergence across the K variants; "
            "'anchor': distance / KL to the canonical variant, whose side is detached (a fixed target); "
            "'relative': L_act measured against the dispersion between the batch's different groups (see "
            "relative_form), which pulling every representation together cannot lower; L_conf as in 'centroid'. "
            "'relative' needs >= 2 groups per batch. "
            "'consistency': self-distillation, L_conf = mean over response positions of KL(stop-grad teacher "
            "distribution given the canonical prompt || the distribution given each other variant) (see divergence, "
            "teacher); L_act as in 'anchor'; items may be unlabeled prompts (the teacher's greedy answer is the target)."
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
    weight_scale: str = field(
        default="absolute",
        metadata={"help": "'absolute': loss = task + lambda_act * L_act + lambda_conf * L_conf; 'relative': each "
                  "term is first rescaled to the size of the task loss, lambda * L * stopgrad(task / L), so that "
                  "lambda = 1 weighs the term like the task loss whatever their units (under Adam the overall scale "
                  "cancels, only this ratio matters). Where a micro-batch has no task loss (unlabeled prompts only) "
                  "or a term is 0, the ratio of the last micro-batch that had both is used (1 before any)."},
    )

    divergence: str = field(
        default="kl",
        metadata={"help": "Mode 'consistency' only. 'kl': KL(stop-grad teacher || variant); 'js': symmetric "
                  "Jensen-Shannon between the canonical and each variant, with no stop-gradient (needs teacher 'self')."},
    )
    teacher: str = field(
        default="self",
        metadata={"help": "Mode 'consistency' only. 'self': the canonical row of the same forward, detached; "
                  "'frozen': the model at the start of training (a PEFT model with its adapter disabled; a full "
                  "model is copied, a second model in memory); 'ema': an exponential moving average of the "
                  "trainable parameters (one copy of them)."},
    )
    ema_decay: float = field(
        default=0.99,
        metadata={"help": "Teacher 'ema' only: after each optimizer step, ema = decay * ema + (1 - decay) * param."},
    )
    teacher_temperature: float = field(
        default=1.0,
        metadata={"help": "Mode 'consistency' only: the teacher's logits are divided by it (> 0) before the softmax."},
    )
    confidence_threshold: float = field(
        default=0.0,
        metadata={"help": "Mode 'consistency' only, in [0, 1): response positions where the teacher's largest "
                  "probability is below it are left out of L_conf (0 keeps all)."},
    )
    fresh_variants: int = field(
        default=0,
        metadata={"help": "Variants drawn afresh from each group's canonical prompt every time the group is "
                  "collated (seeded by the training seed, the group id and its draw count); any mode."},
    )
    fresh_kinds: Optional[list[str]] = field(  # noqa: UP045 - HfArgumentParser reads Optional[...]
        default=None,
        metadata={"help": "Generators drawing the fresh variants (default typo, casing, whitespace: the kinds "
                  "that rewrite a free-text prompt)."},
    )
    fixed_variants: bool = field(
        default=True,
        metadata={"help": "Keep each item's own phrasings beside the fresh ones; False: canonical + fresh only."},
    )
    unlabeled_max_new_tokens: int = field(
        default=16,
        metadata={"help": "Mode 'consistency', items without a target: the most tokens of the teacher's greedy "
                  "answer used as their response (it stops at EOS)."},
    )
    unlabeled_task_loss: bool = field(
        default=False,
        metadata={"help": "Mode 'consistency', items without a target: also train the task loss (cross-entropy) "
                  "on the teacher's greedy answer to the canonical prompt, on every variant (as task_loss_variants "
                  "says; BCT: the model's own clean answer as the target under each perturbation); False: only "
                  "L_conf (and L_act) train on them."},
    )

    def __post_init__(self) -> None:
        self.act_weight = _check_weight("act_weight", self.act_weight)
        self.conf_weight = _check_weight("conf_weight", self.conf_weight)
        self.mode = _check_choice("mode", self.mode, tuple(MODES_REGISTRY))  # a registered mode, also a new one
        if self.pooling is not None:
            warnings.warn("StabilityConfig(pooling=...) is deprecated: use act_pooling (evaluation has its own "
                          "prompt_pooling)", DeprecationWarning, stacklevel=3)
            self.act_pooling, self.pooling = _check_choice("pooling", self.pooling, POOLINGS), None
        self.act_pooling = _check_choice("act_pooling", self.act_pooling, POOLINGS)
        self.task_loss_variants = _check_choice("task_loss_variants", self.task_loss_variants, TASK_LOSS_VARIANTS)
        self.weight_scale = _check_choice("weight_scale", self.weight_scale, WEIGHT_SCALES)
        self.warmup_steps = _check_int("warmup_steps", self.warmup_steps, 0, MAX_TRAINING_STEPS, "MAX_TRAINING_STEPS")
        self.layers = check_layer_indices(self.layers)
        for mode in MODES_REGISTRY.values():  # each mode checks its own fields, whichever mode is used
            mode.check(self)
        self.fresh_variants = _check_int("fresh_variants", self.fresh_variants, 0, MAX_FRESH_VARIANTS,
                                         "MAX_FRESH_VARIANTS")
        if self.fresh_kinds is not None:
            self.fresh_kinds = _check_fresh_kinds(self.fresh_kinds)
        self.fixed_variants = _check_bool("fixed_variants", self.fixed_variants)
        if not self.fixed_variants and self.fresh_variants < 1:
            raise SagoInputError("fixed_variants=False keeps only the canonical prompt, so a group needs fresh "
                                 "variants", key="fixed_variants", hint="set fresh_variants >= 1")

    @property
    def stability_mode(self) -> StabilityMode:
        """The registered :class:`~sago_train.training.modes.StabilityMode` of :attr:`mode`."""
        return get_mode(self.mode)

    @property
    def kinds_to_draw(self) -> list[str]:
        """The generators of the fresh variants (``fresh_kinds``, or the default free-text kinds)."""
        return list(self.fresh_kinds) if self.fresh_kinds is not None else list(DEFAULT_FRESH_KINDS)

    @property
    def enabled(self) -> bool:
        return self.act_weight > 0 or self.conf_weight > 0

    def check_unlabeled_trains(self) -> None:
        """Refuse items without a target where nothing would train on them: both weights 0 and
        ``unlabeled_task_loss`` False (the trainer calls it on a batch that holds some, before the teacher answers).

        Example:
            >>> StabilityConfig(mode="consistency", unlabeled_task_loss=True).check_unlabeled_trains()  # BCT alone
            >>> StabilityConfig(mode="consistency").check_unlabeled_trains()
            Traceback (most recent call last):
            ...
            sago_train.errors.SagoInputError: field 'conf_weight': a batch holds unlabeled prompts (items without a target), which train through the stability terms or, with unlabeled_task_loss, the task loss on the teacher's answer; act_weight and conf_weight are both 0 and unlabeled_task_loss is False, so nothing would train on them (set conf_weight > 0 or unlabeled_task_loss=True, or give every item a target)
        """
        if not (self.enabled or self.unlabeled_task_loss):
            raise SagoInputError(
                "a batch holds unlabeled prompts (items without a target), which train through the stability terms "
                "or, with unlabeled_task_loss, the task loss on the teacher's answer; act_weight and conf_weight "
                "are both 0 and unlabeled_task_loss is False, so nothing would train on them", key="conf_weight",
                hint="set conf_weight > 0 or unlabeled_task_loss=True, or give every item a target")

    def weights_at(self, step: int) -> tuple[float, float]:
        """``(lambda_act, lambda_conf)`` after ``step`` optimizer steps, with the linear warmup applied."""
        scale = 1.0 if self.warmup_steps == 0 else min(1.0, max(step, 0) / self.warmup_steps)
        return self.act_weight * scale, self.conf_weight * scale
