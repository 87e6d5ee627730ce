"""Where the K variants of each group sit in a collated stability batch, and how rows are pooled and lined
up as ``[G, K, ...]`` for the terms of the stability loss."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import SagoInputError
from .collator import DRAWN_KEY, GROUP_KEYS


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
    model_inputs = {k: v for k, v in batch.items() if k not in GROUP_KEYS and k != DRAWN_KEY}
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


def predicting_index(layout: GroupLayout, seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``(row_index, pos_index)`` pair ``[G, T, K]`` each that :func:`predicting_rows` uses to pick the
    target-predicting rows of a ``[N, seq_len, D]`` tensor, and the position mask ``[G, T]``."""
    g, k, t = layout.num_groups, layout.group_size, layout.max_target
    pos, mask = _positions(layout, layout.prompt_length - 1, seq_len)
    row_index = layout.order.view(g, k)[:, None, :].expand(g, t, k)
    pos_index = pos[layout.order].view(g, k, t).transpose(1, 2)
    mask = mask[layout.order].view(g, k, t)[:, 0]
    return row_index, pos_index, mask


def predicting_rows(x: torch.Tensor, layout: GroupLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of ``x`` ``[N, S, D]`` that predict each target token, lined up as ``[G, T, K, D]``, and
    the position mask ``[G, T]``.

    The distribution predicting target token j sits at position ``prompt_length - 1 + j``. Because the
    target is shared, position j means the same target token for every variant of a group.
    """
    row_index, pos_index, mask = predicting_index(layout, x.shape[1])
    return x[row_index, pos_index], mask


def target_logprobs(logits: torch.Tensor, layout: GroupLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities ``[G, T, K, V]`` (float32) of the distributions predicting each target token, from
    full-sequence logits ``[N, S, V]``, and the position mask ``[G, T]`` (the plain, autograd way)."""
    rows, mask = predicting_rows(logits, layout)
    return torch.log_softmax(_upcast(rows), dim=-1), mask
