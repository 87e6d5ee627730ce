"""The differentiable stability loss (docs/definitions.md#stability-loss), independent of any trainer.

``loss = task_loss + lambda_act * L_act + lambda_conf * L_conf`` on batches made by
:class:`~sago_train.training.collator.VariantGroupCollator` (K variants ``x_k + t`` per group, group-major rows);
with ``weight_scale='relative'`` each term is first rescaled to the task loss's size,
``lambda * L * stop_grad(task_loss / L)`` (:meth:`StabilityLoss.weighted`).

- ``L_act``: the activation dispersion of the K variants' representations (pooled over the shared target
  tokens, or at the last prompt token) at the chosen decoder blocks, averaged over layers and groups;
  ``centroid`` = mean pairwise cosine distance, ``anchor`` = cosine distance to the canonical variant
  with the canonical side detached, ``relative`` = the dispersion measured against the dispersion between
  the batch's different groups (``ratio``: within / between, the ``activation_rel`` ratio; ``infonce``:
  supervised InfoNCE). Centroid and anchor are minimized by pulling *every* representation together;
  relative is not. Its between-group statistics come from the local micro-batch: under DDP each process
  compares its own groups (no collective), which keeps the term a per-micro-batch mean like the others.
- ``L_conf``: per target position j, the generalized Jensen-Shannon divergence of the K next-token
  distributions predicting target token j (``centroid`` and ``relative``), or
  ``KL(stop_grad(P_canonical) || P_k)`` (``anchor``), or the ``consistency`` mode's self-distillation (KL from
  a stop-gradient teacher given the canonical prompt, tempered and confidence-masked, or the symmetric JS
  control; :func:`~sago_train.functional.divergence.consistency_divergence`); averaged over the group's target
  positions, then over groups (each group weighs the same whatever its target length). In ``consistency`` mode
  L_act is the anchor's.

Capture: forward hooks on the chosen decoder blocks keep a reference to each block's output during the one
forward pass (a tensor autograd keeps alive anyway, as the next block's saved input), and only the pooled
``[G, K, H]`` vectors are built from it. Nothing asks the model for ``output_hidden_states``. The block hooks do
no tensor work inside the forward, which keeps them correct when a block is recomputed under activation
checkpointing: a recomputation happens during backward, after the hooks are removed; and if a model
re-runs a block within the forward, the first capture is kept and the repeats are counted. A hook on the
backbone keeps its output (the final hidden states); when the forward built no logits, the LM head is
applied to the target-predicting rows only; when it did, those rows are selected from its logits (after a
first batch checks that both agree). Given the batch (``capture(model, groups, input_ids)``, as
:meth:`StabilityLoss.forward` and the trainer do), a hook on the LM head selects those rows during the
forward, through an identity autograd function whose backward adds their gradient into the task loss's
logits gradient: no second logits-sized gradient buffer (at a 49k vocabulary it was 5% of a LoRA step's
peak memory). The divergence is a fused function that keeps one rows-sized tensor for backward.

Both terms are computed in float32 with autocast off, whatever the forward ran in (float64 for a float64
model, so gradients can be checked by finite differences).

The module was split: the settings live in :mod:`~sago_train.training.config`, the batch layout and
pooling in :mod:`~sago_train.training.batch`, the hooks in :mod:`~sago_train.model.hooks`; their names are
re-exported here.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import SagoInputError
from ..model.hooks import HiddenCapture, logits_from_hidden
from ..model.layers import get_decoder_layers, resolve_layers
from .batch import (
    GroupLayout,
    group_layout,
    pool_hidden,
    predicting_index,
    predicting_rows,
    split_batch,
    target_logprobs,
)
from .config import POOLINGS, TASK_LOSS_VARIANTS, StabilityConfig
from .modes import MODES, RELATIVE_FORMS

__all__ = [
    "MODES",
    "POOLINGS",
    "RELATIVE_FORMS",
    "TASK_LOSS_VARIANTS",
    "GroupLayout",
    "HiddenCapture",
    "StabilityConfig",
    "StabilityLoss",
    "StabilityTerms",
    "group_layout",
    "logits_from_hidden",
    "pool_hidden",
    "predicting_index",
    "predicting_rows",
    "split_batch",
    "target_logprobs",
]


@dataclass
class StabilityTerms:
    """The unweighted terms (float32 scalars, float64 for a float64 model; ``None`` when disabled)."""

    act: torch.Tensor | None = None
    conf: torch.Tensor | None = None

    def weighted(self, act_weight: float, conf_weight: float,
                 scales: tuple[torch.Tensor | float, torch.Tensor | float] = (1.0, 1.0)) -> torch.Tensor | None:
        """``act_weight * scale_act * act + conf_weight * scale_conf * conf`` over the enabled terms (``None`` if
        none); ``scales``: constants (``weight_scale='relative'``: :meth:`StabilityLoss.ratios`)."""
        total = None
        for term, weight, scale in ((self.act, act_weight, scales[0]), (self.conf, conf_weight, scales[1])):
            if term is not None:
                part = term * (weight * scale)
                total = part if total is None else total + part
        return total


class StabilityLoss:
    """The stability terms for one model: layer resolution, capture and computation.

    The confidence term reads the target-predicting rows of the model's logits when the forward built them,
    and otherwise projects the target-predicting final hidden states (captured by a hook) through the LM head
    (TRL's fused head builds no logits). The first batch with logits checks that both agree (a model whose
    head does something the projection misses) and warns if not.

    Example (a custom training loop):
        >>> loss_fn = StabilityLoss(StabilityConfig(act_weight=0.5, conf_weight=0.5), model)  # doctest: +SKIP
        >>> outputs, terms = loss_fn(model, batch)  # batch from VariantGroupCollator  # doctest: +SKIP
        >>> loss = outputs.loss + loss_fn.weighted(terms, outputs.loss, 0.5, 0.5)  # doctest: +SKIP

    ``weight_scale='relative'``: each term is rescaled to the size of the task loss (the ratio of the last
    micro-batch that had both where one is missing):
        >>> rel = StabilityLoss(StabilityConfig(conf_weight=0.5, weight_scale="relative"), torch.nn.Linear(1, 1))
        >>> terms = StabilityTerms(conf=torch.tensor(0.02))
        >>> float(rel.weighted(terms, torch.tensor(2.0), 0.0, 0.5))  # 0.5 * 0.02 * (2.0 / 0.02): half the task
        1.0
        >>> float(rel.weighted(StabilityTerms(conf=torch.tensor(0.01)), torch.tensor(0.0), 0.0, 0.5))  # ratio 100
        0.5
    """

    def __init__(self, config: StabilityConfig, model: nn.Module) -> None:
        self.config = config
        self.mode = config.stability_mode
        self.layers: list[int] = []
        if config.act_weight > 0 or config.layers is not None:
            n = len(get_decoder_layers(model))
            # Out-of-range layers fail here, at construction, with the valid range in the message.
            self.layers = resolve_layers(config.layers, n)
        if config.act_weight == 0:
            self.layers = []
        # None: not checked yet; True: project final hidden states; False: use the model's logits.
        self.head_from_hidden: bool | None = None
        # Micro-batches with fewer groups than the mode needs (relative: one), for which L_act was 0.
        self.single_group_batches = 0
        #: ``weight_scale='relative'``: the last ``task / term`` ratio of (L_act, L_conf), detached; None: none yet.
        self.last_ratios: list[torch.Tensor | None] = [None, None]

    def ratios(self, terms: StabilityTerms, task: torch.Tensor, *, update: bool = True
               ) -> tuple[torch.Tensor | float, torch.Tensor | float]:
        """The constants :meth:`StabilityTerms.weighted` scales each term by: 1 for ``weight_scale='absolute'``;
        for ``'relative'`` ``task / term`` (detached), or where ``task`` or the term is 0 the last ratio that
        had both (1 before any). ``update``: keep this micro-batch's ratios for later ones (training)."""
        if self.config.weight_scale == "absolute":
            return 1.0, 1.0
        out: list[torch.Tensor | float] = [1.0, 1.0]
        for i, term in enumerate((terms.act, terms.conf)):
            if term is None:
                continue
            value, t = term.detach(), task.detach().to(term.dtype)
            ok = (t > 0) & (value > 0) & torch.isfinite(t) & torch.isfinite(value)
            last = self.last_ratios[i]
            last = torch.ones_like(value) if last is None else last.to(value.device, value.dtype)
            out[i] = torch.where(ok, t / torch.where(ok, value, torch.ones_like(value)), last)
            if update:
                self.last_ratios[i] = out[i]  # type: ignore[assignment]
        return out[0], out[1]

    def weighted(self, terms: StabilityTerms, task: torch.Tensor, act_weight: float, conf_weight: float, *,
                 update: bool = True) -> torch.Tensor | None:
        """``lambda_act * L_act + lambda_conf * L_conf`` as ``weight_scale`` says (:meth:`ratios`; ``task``: the
        micro-batch's task loss), ``None`` when no term is enabled."""
        return terms.weighted(act_weight, conf_weight, self.ratios(terms, task, update=update))

    def _activation(self, vectors: torch.Tensor, layout: GroupLayout) -> torch.Tensor:
        """L_act of one layer's pooled vectors ``[G, K, H]``, per group ``[G]``."""
        if layout.num_groups < self.mode.min_groups:
            # The documented fallback: a micro-batch with one group (the last, partial batch of an epoch) has
            # no other group to measure against, so it adds 0 (no gradient) to L_act; counted and warned.
            if self.single_group_batches == 0:
                warnings.warn(
                    f"mode '{self.mode.name}' got a micro-batch with a single group; its L_act is 0 (no other group "
                    "to compare with). Use per_device_train_batch_size >= 2 and dataloader_drop_last=True to avoid "
                    "it", stacklevel=4,
                )
            return vectors.new_zeros(1, dtype=torch.float64 if vectors.dtype == torch.float64 else torch.float32)
        return self.mode.activation(vectors, layout, self.config)

    @property
    def wants_logits(self) -> bool:
        return self.config.conf_weight > 0

    def capture(
        self,
        model: nn.Module,
        groups: Mapping[str, torch.Tensor] | None = None,
        input_ids: torch.Tensor | None = None,
    ) -> HiddenCapture:
        """Hooks for one forward pass: the chosen blocks, and the backbone output for the confidence term.

        Given the batch's ``groups`` and ``input_ids`` (pass them when the forward's logits will be given to
        :meth:`terms`), the LM head's target-predicting rows are also selected during the forward, which
        keeps the confidence term's backward from adding a logits-sized buffer to the step's peak memory
        (see :class:`~sago_train.model.hooks.HiddenCapture`); the batch is validated here, before the forward.
        """
        head_index = head_shape = None
        if self.wants_logits and groups is not None and input_ids is not None and input_ids.dim() == 2:
            layout = group_layout(groups, input_ids)
            row_index, pos_index, _ = predicting_index(layout, input_ids.shape[1])
            head_index, head_shape = (row_index, pos_index), (int(input_ids.shape[0]), int(input_ids.shape[1]))
        return HiddenCapture(
            model, self.layers, final_hidden=self.wants_logits, head_index=head_index, head_shape=head_shape
        )

    @staticmethod
    def _logit_rows(capture: HiddenCapture, logits: torch.Tensor, layout: GroupLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """``predicting_rows(logits, layout)``; the rows selected during the forward when ``logits`` is the
        very tensor the LM head returned (the same values, an earlier node in the graph)."""
        if capture.head_rows is not None and capture.head_output is logits:
            _, _, mask = predicting_index(layout, logits.shape[1])
            return capture.head_rows, mask
        return predicting_rows(logits, layout)

    def _confidence_rows(
        self, capture: HiddenCapture, layout: GroupLayout, logits: torch.Tensor | None, model: nn.Module | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if logits is not None and self.head_from_hidden is not None:
            # The forward built the logits anyway: selecting the target-predicting rows costs no second LM-head
            # pass (at a 49k vocabulary that projection and its backward cost ~5% of a training step). The
            # projection below serves forwards that build no logits (TRL's fused head), checked once here.
            return self._logit_rows(capture, logits, layout)
        hidden_ok = capture.final is not None and model is not None and self.head_from_hidden is not False
        if hidden_ok:
            hidden_rows, mask = predicting_rows(capture.final, layout)
            # The LM head runs under the forward's own autocast (it may be a LoRA layer); the divergence is
            # computed in float32 regardless.
            rows = logits_from_hidden(model, hidden_rows)
            if logits is not None and self.head_from_hidden is None:
                with torch.no_grad():
                    reference, _ = predicting_rows(logits, layout)
                    scale = 1.0 + float(reference.float().abs().max())
                    close = float((rows.detach().float() - reference.float()).abs().max()) <= 1e-2 * scale
                self.head_from_hidden = close
                if not close:
                    warnings.warn(
                        "the LM head applied to the final hidden states does not reproduce this model's logits; "
                        "the confidence term uses the logits instead (more memory)",
                        stacklevel=3,
                    )
                    return self._logit_rows(capture, logits, layout)
            return rows, mask
        if logits is None:
            raise SagoInputError(
                "the confidence term needs the logits or the final hidden states, and neither is available",
                hint="set conf_weight=0, or do not skip the logits (e.g. liger kernels)",
            )
        return self._logit_rows(capture, logits, layout)

    def terms(
        self,
        groups: Mapping[str, torch.Tensor],
        capture: HiddenCapture,
        *,
        input_ids: torch.Tensor | None = None,
        logits: torch.Tensor | None = None,
        model: nn.Module | None = None,
        teacher_logits: torch.Tensor | None = None,
    ) -> StabilityTerms:
        """Compute the enabled terms from the captures (``model`` for the LM head; ``logits`` if the forward
        returned them; ``teacher_logits`` ``[G, T, V]``: the consistency mode's frozen / EMA teacher given the
        canonical prompts, see :meth:`~sago_train.training.teacher.Teacher.logits`)."""
        capture.check()
        layout = group_layout(groups, input_ids)
        cfg = self.config
        out = StabilityTerms()
        rows = mask = None
        if self.wants_logits:
            rows, mask = self._confidence_rows(capture, layout, logits, model)
        # Autocast off: the terms are computed in float32 whatever the forward ran in.
        with torch.autocast(device_type=layout.order.device.type, enabled=False):
            if self.layers:
                per_layer = [
                    self._activation(pool_hidden(capture.hidden[layer], layout, cfg.act_pooling), layout)
                    for layer in self.layers
                ]
                out.act = torch.stack(per_layer).mean()
                if layout.num_groups < self.mode.min_groups:
                    self.single_group_batches += 1
            if rows is not None and mask is not None:
                # The rows selected in the forward serve this call only (no node saved them): the divergence
                # may overwrite them with their gradient (no recompute in backward, no second rows-sized
                # tensor); the capture stops exposing them.
                consume = rows is capture.head_rows
                if consume:
                    capture.head_rows = None
                per_pos, mask = self.mode.confidence(rows, mask, layout, self.config, teacher_logits=teacher_logits,
                                                     consume=consume)  # [G, T]
                w = mask.to(per_pos.dtype)
                out.conf = ((per_pos * w).sum(-1) / w.sum(-1).clamp_min(1.0)).mean()
        return out

    def forward(self, model: nn.Module, batch: Mapping[str, Any], teacher: Any = None,
                **model_kwargs: Any) -> tuple[Any, StabilityTerms]:
        """Run ``model`` on a collated batch with the capture on; return its outputs and the terms.

        The model's own loss (``outputs.loss``, from ``labels``) is the task loss. ``teacher``: a frozen / EMA
        :class:`~sago_train.training.teacher.Teacher` for the consistency mode (run first, under ``no_grad``).
        """
        model_inputs, groups = split_batch(batch)
        if groups is None:
            raise SagoInputError("not a stability batch (no 'group_index')", hint="use VariantGroupCollator")
        teacher_logits = self.teacher_logits(model, teacher, model_inputs, groups)
        with self.capture(model, groups, model_inputs.get("input_ids")) as cap:
            outputs = model(**model_inputs, **model_kwargs)
        logits = getattr(outputs, "logits", None) if self.wants_logits else None
        return outputs, self.terms(groups, cap, input_ids=model_inputs.get("input_ids"), logits=logits, model=model,
                                   teacher_logits=teacher_logits)

    def teacher_logits(self, model: nn.Module, teacher: Any, model_inputs: Mapping[str, Any],
                       groups: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        """The frozen / EMA teacher's ``[G, T, V]`` logits for this batch, or ``None`` (teacher 'self', another
        mode, or no confidence term). ``model`` is the unwrapped model."""
        if not self.mode.needs_teacher or not self.wants_logits or teacher is None or teacher.kind == "self":
            return None
        input_ids = model_inputs["input_ids"]
        return teacher.logits(model, input_ids, model_inputs.get("attention_mask"), group_layout(groups, input_ids))

    __call__ = forward
