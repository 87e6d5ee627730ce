"""The differentiable stability loss (SPEC "Stability loss"), independent of any trainer.

``loss = task_loss + lambda_act * L_act + lambda_conf * L_conf`` on batches made by
:class:`~sago_train.collator.VariantGroupCollator` (K variants ``x_k + t`` per group, group-major rows).

- ``L_act``: the activation dispersion of the K variants' representations (pooled over the shared target
  tokens, or at the last prompt token) at the chosen decoder blocks, averaged over layers and groups;
  ``centroid`` = mean pairwise cosine distance, ``anchor`` = cosine distance to the canonical variant
  with the canonical side detached.
- ``L_conf``: per target position j, the generalized Jensen-Shannon divergence of the K next-token
  distributions predicting target token j (``centroid``), or ``KL(stop_grad(P_canonical) || P_k)``
  (``anchor``); averaged over the group's target positions, then over groups (each group weighs the same
  whatever its target length).

Capture: forward hooks on the chosen decoder blocks keep a reference to each block's output during the one
forward pass (a tensor autograd keeps alive anyway, as the next block's saved input), and only the pooled
``[G, K, H]`` vectors are built from it. Nothing asks the model for ``output_hidden_states``. The hooks do
no tensor work inside the forward, which keeps them correct when a block is recomputed under activation
checkpointing: a recomputation happens during backward, after the hooks are removed; and if a model
re-runs a block within the forward, the first capture is kept and the repeats are counted. A hook on the
backbone keeps its output (the final hidden states); the LM head is applied to the target-predicting rows
only, and the divergence is a fused function that keeps only those logits for backward.

Everything is computed in float32 (float64 for a float64 model) with autocast off, whatever the forward
ran in.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from .collator import GROUP_KEYS
from .errors import SagoInputError, unknown_name_error
from .functional.dispersion import activation_dispersion, anchor_activation_distance
from .functional.divergence import divergence_from_logits
from .layers import block_output, get_decoder_layers, resolve_layers

MODES = ("centroid", "anchor")
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

    Usable with ``transformers.HfArgumentParser`` (each field has a ``help``).

    Example:
        >>> cfg = StabilityConfig(act_weight=0.5, conf_weight=0.1, mode="anchor", warmup_steps=100)
        >>> cfg.weights_at(50)
        (0.25, 0.05)
        >>> StabilityConfig(mode="centriod")
        Traceback (most recent call last):
        ...
        sago_train.errors.SagoInputError: field 'mode': unknown mode 'centriod'. Did you mean 'centroid'? Valid: anchor, centroid
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
        default="centroid",
        metadata={
            "help": "'centroid': symmetric dispersion / Jensen-Shannon divergence across the K variants; "
            "'anchor': distance / KL to the canonical variant, whose side is detached (a fixed target)."
        },
    )
    layers: Optional[list[int]] = field(  # noqa: UP045 - HfArgumentParser reads Optional[...]
        default=None,
        metadata={
            "help": "Decoder blocks for L_act (0-based; negative counts from the end). Default: 4 evenly "
            "spaced blocks ending with the last."
        },
    )
    pooling: str = field(
        default="target",
        metadata={"help": "'target': mean over the shared target tokens; 'last': the last prompt token."},
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
        self.pooling = _check_choice("pooling", self.pooling, POOLINGS)
        self.task_loss_variants = _check_choice("task_loss_variants", self.task_loss_variants, TASK_LOSS_VARIANTS)
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise SagoInputError(f"expected an integer >= 0, got {self.warmup_steps!r}", key="warmup_steps")
        if self.layers is not None:
            if isinstance(self.layers, int) and not isinstance(self.layers, bool):
                self.layers = [self.layers]
            if not isinstance(self.layers, (list, tuple)) or not self.layers:
                raise SagoInputError(f"expected a non-empty list of layer indices, got {self.layers!r}", key="layers")
            for layer in self.layers:
                if isinstance(layer, bool) or not isinstance(layer, int):
                    raise SagoInputError(f"layer indices must be integers, got {layer!r}", key="layers")
            self.layers = list(self.layers)

    @property
    def enabled(self) -> bool:
        return self.act_weight > 0 or self.conf_weight > 0

    def weights_at(self, step: int) -> tuple[float, float]:
        """``(lambda_act, lambda_conf)`` after ``step`` optimizer steps, with the linear warmup applied."""
        scale = 1.0 if self.warmup_steps == 0 else min(1.0, max(step, 0) / self.warmup_steps)
        return self.act_weight * scale, self.conf_weight * scale


# --------------------------------------------------------------------------------------------- batch layout
@dataclass
class GroupLayout:
    """Where the K variants of each group sit in a flat batch.

    ``order`` ``[G*K]`` lists the rows group by group, variants in order, so ``x[order].view(G, K, ...)``
    lines the variants up; ``canonical`` ``[G]``; ``prompt_length`` / ``target_length`` ``[N]`` per row.
    """

    num_groups: int
    group_size: int
    order: torch.Tensor
    canonical: torch.Tensor
    prompt_length: torch.Tensor
    target_length: torch.Tensor
    max_target: int


def split_batch(batch: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Separate the model inputs from the collator's group bookkeeping (``None`` when there is none)."""
    model_inputs = {k: v for k, v in batch.items() if k not in GROUP_KEYS}
    if "group_index" not in batch:
        return model_inputs, None
    missing = [k for k in GROUP_KEYS if k not in batch and k != "target_mask"]
    if missing:
        raise SagoInputError(
            f"the batch has 'group_index' but lacks {', '.join(missing)}",
            hint="build stability batches with sago_train.VariantGroupCollator",
        )
    return model_inputs, {k: batch[k] for k in GROUP_KEYS if k in batch}


def group_layout(groups: Mapping[str, torch.Tensor], input_ids: torch.Tensor | None = None) -> GroupLayout:
    """Check the group bookkeeping of a batch and return its layout.

    Raises :class:`SagoInputError` when a group has fewer than 2 variants, when groups have different sizes
    or were split (a batch sliced across devices), when a target is empty, or, given ``input_ids``, when the
    variants of a group do not share the same target tokens.
    """
    gi = groups["group_index"]
    device = gi.device
    # One small host transfer: the layout (G, K, per-group lengths) must be known on the host to reshape.
    table = torch.stack(
        [groups[k].reshape(-1).long() for k in ("group_index", "variant_index", "canonical_index", "prompt_length", "target_length")]
    ).tolist()
    g_idx, v_idx, c_idx, p_len, t_len = table
    n = len(g_idx)
    if n == 0:
        raise SagoInputError("empty stability batch")
    seq_len = input_ids.shape[1] if input_ids is not None else None
    members: dict[int, list[int]] = {}
    for row, g in enumerate(g_idx):
        members.setdefault(g, []).append(row)
    k = len(next(iter(members.values())))
    order: list[int] = []
    canonical: list[int] = []
    for g, rows in members.items():
        if len(rows) != k:
            raise SagoInputError(
                f"group {g} has {len(rows)} sequences in this batch but another has {k}: groups are split or "
                "have different sizes",
                hint="each item must be a whole group; do not slice collated batches (accelerate dispatch_batches)",
            )
        rows = sorted(rows, key=lambda r: v_idx[r])
        if [v_idx[r] for r in rows] != list(range(k)):
            raise SagoInputError(
                f"group {g} has variant indices {[v_idx[r] for r in rows]}, expected 0..{k - 1}: the group was split",
                hint="each item must be a whole group; do not slice collated batches (accelerate dispatch_batches)",
            )
        if k < 2:
            raise SagoInputError(
                f"group {g} has K={k} variant; the stability loss needs at least 2 variants per group", key="variants"
            )
        lengths = {t_len[r] for r in rows}
        if len(lengths) != 1:
            raise SagoInputError(
                f"the variants of group {g} have targets of different lengths {sorted(lengths)}: a group's variants "
                "must share one target",
                key="target",
            )
        if lengths == {0}:
            raise SagoInputError(f"group {g} has an empty target", key="target")
        for r in rows:
            if p_len[r] < 1:
                raise SagoInputError(f"group {g}: a variant has an empty prompt", key="variants")
            if seq_len is not None and p_len[r] + t_len[r] > seq_len:
                raise SagoInputError(
                    f"group {g}: prompt_length + target_length ({p_len[r]} + {t_len[r]}) exceeds the sequence length {seq_len}"
                )
        cans = {c_idx[r] for r in rows}
        if len(cans) != 1 or not 0 <= c_idx[rows[0]] < k:
            raise SagoInputError(f"group {g} has canonical index {sorted(cans)}, expected one index in [0, {k - 1}]",
                                 key="canonical")
        order.extend(rows)
        canonical.append(c_idx[rows[0]])
    layout = GroupLayout(
        num_groups=len(members),
        group_size=k,
        order=torch.tensor(order, dtype=torch.long, device=device),
        canonical=torch.tensor(canonical, dtype=torch.long, device=device),
        prompt_length=groups["prompt_length"].to(device=device, dtype=torch.long).reshape(-1),
        target_length=groups["target_length"].to(device=device, dtype=torch.long).reshape(-1),
        max_target=max(t_len),
    )
    if input_ids is not None:
        _check_shared_targets(layout, input_ids)
    return layout


def _positions(layout: GroupLayout, start: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, T]`` positions ``start + j`` (clamped into the sequence) and the mask ``j < target_length``."""
    j = torch.arange(layout.max_target, device=start.device)
    pos = (start[:, None] + j).clamp_(0, seq_len - 1)
    mask = j < layout.target_length[:, None]
    return pos, mask


def _gather_rows(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``x[n, pos[n, j]]`` for ``x`` ``[N, S, D]`` and ``pos`` ``[N, T]`` -> ``[N, T, D]``."""
    return x.gather(1, pos[..., None].expand(-1, -1, x.shape[-1]))


def _check_shared_targets(layout: GroupLayout, input_ids: torch.Tensor) -> None:
    pos, mask = _positions(layout, layout.prompt_length, input_ids.shape[1])
    tokens = input_ids.gather(1, pos)[layout.order].view(layout.num_groups, layout.group_size, -1)
    mask = mask[layout.order].view(layout.num_groups, layout.group_size, -1)
    differs = ((tokens != tokens[:, :1]) & mask).any(-1).any(-1)
    if bool(differs.any()):
        bad = differs.nonzero().flatten().tolist()
        raise SagoInputError(
            f"the variants of group(s) {bad} (position in the batch) have different target tokens: the "
            "stability loss compares next-token distributions position by position, so a group's variants must "
            "share one target",
            key="target",
        )


# ------------------------------------------------------------------------------------------------- capture
def _unwrap(model: nn.Module) -> nn.Module:
    """The transformers model inside DDP/FSDP/PEFT wrappers."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def _backbone(model: nn.Module) -> nn.Module:
    inner = _unwrap(model)
    prefix = getattr(inner, "base_model_prefix", None)
    backbone = getattr(inner, prefix, None) if prefix else None
    if not isinstance(backbone, nn.Module):
        raise SagoInputError(
            f"could not find the backbone of {type(inner).__name__} (the module under base_model_prefix)",
            hint="the confidence term needs the final hidden states of a transformers causal LM",
        )
    return backbone


class HiddenCapture:
    """Context manager: forward hooks that keep the output of the chosen decoder blocks (and, optionally,
    the backbone's final hidden state) for one forward pass.

    The first capture of each module wins; later firings inside the window (a second forward without
    gradient, a block re-run) are counted in ``repeats`` and ignored. Hooks are removed on exit, so
    activation-checkpointing recomputation during backward never reaches them.

    Example:
        >>> with HiddenCapture(model, [0, 3]) as cap:  # doctest: +SKIP
        ...     model(**inputs)
        >>> cap.hidden[3].shape  # doctest: +SKIP
        torch.Size([6, 20, 64])
    """

    def __init__(self, model: nn.Module, layers: Sequence[int], final_hidden: bool = False) -> None:
        self.model = model
        self.layers = list(layers)
        self.final_hidden = final_hidden
        self.hidden: dict[int, torch.Tensor] = {}
        self.final: torch.Tensor | None = None
        self.repeats = 0
        self.ran_without_grad = False
        self._handles: list[Any] = []
        self._grad_expected = False

    def _record(self, key: int | str, value: torch.Tensor) -> None:
        store_has = self.final is not None if key == "final" else key in self.hidden
        if store_has:
            self.repeats += 1
            return
        if self._grad_expected and not torch.is_grad_enabled():
            # The block ran under no_grad inside a forward that expects gradients: a reentrant checkpoint
            # wraps the module call (the graph is only built on recomputation, too late for this loss).
            self.ran_without_grad = True
        if key == "final":
            self.final = value
        else:
            self.hidden[int(key)] = value

    def __enter__(self) -> HiddenCapture:
        self._grad_expected = torch.is_grad_enabled() and self.model.training
        try:
            backbone = _backbone(self.model)
        except SagoInputError:
            backbone = None
        if backbone is not None:
            # Whether a forward builds a graph is decided where it starts (the backbone is never inside a
            # checkpoint), not where the window opens: a user may run a no_grad forward inside the window.
            def start_hook(module: nn.Module, _args: Any) -> None:
                if not self.hidden and self.final is None:
                    self._grad_expected = torch.is_grad_enabled() and module.training

            self._handles.append(backbone.register_forward_pre_hook(start_hook))
        if self.layers:
            blocks = get_decoder_layers(self.model)
            for layer in self.layers:
                self._handles.append(
                    blocks[layer].register_forward_hook(lambda _m, _i, out, layer=layer: self._record(layer, block_output(out)))
                )
        if self.final_hidden and backbone is not None:

            def final_hook(_m: nn.Module, _i: Any, out: Any) -> None:
                last = getattr(out, "last_hidden_state", None)
                self._record("final", last if isinstance(last, torch.Tensor) else block_output(out))

            self._handles.append(backbone.register_forward_hook(final_hook))
        # Without a recognizable backbone the final hidden state stays None and the confidence term falls
        # back to the logits of the outputs.
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def check(self) -> None:
        """Raise when the captures cannot carry gradients or are missing."""
        if self.ran_without_grad:
            raise SagoInputError(
                "the decoder blocks ran without gradients inside a training forward, which happens when a "
                "reentrant activation checkpoint wraps the blocks' hooks; the stability loss would get no gradient",
                hint="use activation_checkpointing_kwargs={'use_reentrant': False} "
                "(gradient_checkpointing_kwargs before transformers 5)",
            )
        missing = [layer for layer in self.layers if layer not in self.hidden]
        if missing:
            raise SagoInputError(f"decoder blocks {missing} did not run during the forward pass", key="layers")


def logits_from_hidden(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Apply the model's LM head to final hidden states, with the logit scaling / soft-capping its config
    declares (as transformers' and TRL's heads do). The confidence term projects only the target-predicting
    positions this way, which works whether or not the forward built the logits (TRL's fused LM head does
    not) and keeps its memory proportional to the target length rather than the sequence length."""
    inner = _unwrap(model)
    head = inner.get_output_embeddings()
    if head is None:
        raise SagoInputError(f"{type(inner).__name__} has no output embeddings (LM head)")
    logits = head(hidden)
    config = inner.config.get_text_config() if hasattr(inner.config, "get_text_config") else inner.config
    scale = getattr(config, "logit_scale", None)
    if scale is None:
        scale = getattr(config, "output_multiplier", None)
    if scale is None:
        scale = getattr(config, "lm_head_multiplier", None)
    if scale is None and getattr(config, "logits_scaling", None) is not None:
        scale = config.logits_scaling if config.model_type == "hyperclovax" else 1 / config.logits_scaling
    if scale is not None and scale != 1.0:
        logits = logits * scale
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


# ---------------------------------------------------------------------------------------------------- terms
@dataclass
class StabilityTerms:
    """The unweighted terms (float32 scalars; ``None`` when disabled)."""

    act: torch.Tensor | None = None
    conf: torch.Tensor | None = None

    def weighted(self, act_weight: float, conf_weight: float) -> torch.Tensor | None:
        """``act_weight * act + conf_weight * conf`` over the enabled terms (``None`` if none)."""
        total = None
        for term, weight in ((self.act, act_weight), (self.conf, conf_weight)):
            if term is not None:
                total = term * weight if total is None else total + term * weight
        return total


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """float32 for half/bfloat16/float32 inputs; float64 stays float64 (gradient checks)."""
    return x if x.dtype == torch.float64 else x.float()


def pool_hidden(hidden: torch.Tensor, layout: GroupLayout, pooling: str) -> torch.Tensor:
    """Pool a block output ``[N, S, H]`` per row and line the variants up: ``[G, K, H]`` float32."""
    n = hidden.shape[0]
    if pooling == "last":
        vec = _upcast(hidden[torch.arange(n, device=hidden.device), layout.prompt_length - 1])
    else:
        pos, mask = _positions(layout, layout.prompt_length, hidden.shape[1])
        if hidden.dtype in (torch.float32, torch.float64):
            # A weighted sum over the sequence: autograd keeps a reference to `hidden` (alive anyway as the
            # next block's input) and the small weights, instead of a copy of the target rows.
            weights = torch.zeros(hidden.shape[:2], dtype=hidden.dtype, device=hidden.device)
            weights.scatter_add_(1, pos, mask.to(hidden.dtype))
            weights = weights / weights.sum(1, keepdim=True).clamp_min(1.0)
            vec = torch.bmm(weights.unsqueeze(1), hidden).squeeze(1)
        else:
            # Low precision: upcast the target rows before summing (float32 accumulation and result).
            rows = _upcast(_gather_rows(hidden, pos))
            w = mask.to(rows.dtype).unsqueeze(-1)
            vec = (rows * w).sum(1) / w.sum(1).clamp_min(1.0)
    return vec[layout.order].view(layout.num_groups, layout.group_size, -1)


def predicting_rows(x: torch.Tensor, layout: GroupLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of ``x`` ``[N, S, D]`` that predict each target token, lined up as ``[G, T, K, D]``, and
    the position mask ``[G, T]``.

    The distribution predicting target token j sits at position ``prompt_length - 1 + j``. Because the
    target is shared, position j means the same target token for every variant of a group.
    """
    g, k, t = layout.num_groups, layout.group_size, layout.max_target
    pos, mask = _positions(layout, layout.prompt_length - 1, x.shape[1])
    row_index = layout.order.view(g, k)[:, None, :].expand(g, t, k)
    pos_index = pos[layout.order].view(g, k, t).transpose(1, 2)
    mask = mask[layout.order].view(g, k, t)[:, 0]
    return x[row_index, pos_index], mask


def target_logprobs(logits: torch.Tensor, layout: GroupLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities ``[G, T, K, V]`` (float32) of the distributions predicting each target token, from
    full-sequence logits ``[N, S, V]``, and the position mask ``[G, T]`` (the plain, autograd way)."""
    rows, mask = predicting_rows(logits, layout)
    return torch.log_softmax(_upcast(rows), dim=-1), mask


class StabilityLoss:
    """The stability terms for one model: layer resolution, capture and computation.

    The confidence term projects only the target-predicting final hidden states through the LM head (the
    backbone's output is captured by a hook), so it works whether or not the forward built the logits (TRL's
    fused head does not). When the logits are available too, the first batch checks that both agree (a model
    whose head does something this projection misses) and falls back to the logits if not.

    Example (a custom training loop):
        >>> loss_fn = StabilityLoss(StabilityConfig(act_weight=0.5, conf_weight=0.5), model)  # doctest: +SKIP
        >>> outputs, terms = loss_fn(model, batch)  # batch from VariantGroupCollator  # doctest: +SKIP
        >>> loss = outputs.loss + terms.weighted(0.5, 0.5)  # doctest: +SKIP
    """

    def __init__(self, config: StabilityConfig, model: nn.Module) -> None:
        self.config = config
        self.layers: list[int] = []
        if config.act_weight > 0 or config.layers is not None:
            n = len(get_decoder_layers(model))
            # Out-of-range layers fail here, at construction, with the valid range in the message.
            self.layers = resolve_layers(config.layers, n)
        if config.act_weight == 0:
            self.layers = []
        # None: not checked yet; True: project final hidden states; False: use the model's logits.
        self.head_from_hidden: bool | None = None

    @property
    def wants_logits(self) -> bool:
        return self.config.conf_weight > 0

    def capture(self, model: nn.Module) -> HiddenCapture:
        """Hooks for one forward pass: the chosen blocks, and the backbone output for the confidence term."""
        return HiddenCapture(model, self.layers, final_hidden=self.wants_logits)

    def _confidence_rows(
        self, capture: HiddenCapture, layout: GroupLayout, logits: torch.Tensor | None, model: nn.Module | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
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
                    return predicting_rows(logits, layout)
            return rows, mask
        if logits is None:
            raise SagoInputError(
                "the confidence term needs the logits or the final hidden states, and neither is available",
                hint="set conf_weight=0, or do not skip the logits (e.g. liger kernels)",
            )
        return predicting_rows(logits, layout)

    def terms(
        self,
        groups: Mapping[str, torch.Tensor],
        capture: HiddenCapture,
        *,
        input_ids: torch.Tensor | None = None,
        logits: torch.Tensor | None = None,
        model: nn.Module | None = None,
    ) -> StabilityTerms:
        """Compute the enabled terms from the captures (``model`` for the LM head; ``logits`` if the forward
        returned them)."""
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
                per_layer = []
                for layer in self.layers:
                    vectors = pool_hidden(capture.hidden[layer], layout, cfg.pooling)
                    if cfg.mode == "centroid":
                        per_layer.append(activation_dispersion(vectors))
                    else:
                        per_layer.append(anchor_activation_distance(vectors, layout.canonical))
                out.act = torch.stack(per_layer).mean()
            if rows is not None and mask is not None:
                canonical = None if cfg.mode == "centroid" else layout.canonical[:, None].expand_as(mask)
                per_pos = divergence_from_logits(rows, canonical)  # [G, T]: JS, or KL to the canonical
                w = mask.to(per_pos.dtype)
                out.conf = ((per_pos * w).sum(-1) / w.sum(-1).clamp_min(1.0)).mean()
        return out

    def forward(self, model: nn.Module, batch: Mapping[str, Any], **model_kwargs: Any) -> tuple[Any, StabilityTerms]:
        """Run ``model`` on a collated batch with the capture on; return its outputs and the terms.

        The model's own loss (``outputs.loss``, from ``labels``) is the task loss.
        """
        model_inputs, groups = split_batch(batch)
        if groups is None:
            raise SagoInputError("not a stability batch (no 'group_index')", hint="use VariantGroupCollator")
        with self.capture(model) as cap:
            outputs = model(**model_inputs, **model_kwargs)
        logits = getattr(outputs, "logits", None) if self.wants_logits else None
        return outputs, self.terms(groups, cap, input_ids=model_inputs.get("input_ids"), logits=logits, model=model)

    __call__ = forward
