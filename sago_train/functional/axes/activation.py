"""Activation axes: dispersion of the variants' hidden states (docs/definitions.md#activation), raw and relative to the
dispersion between different groups of the same set (docs/definitions.md#activation_rel)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import activation_dispersion, per_variant_cosine_distance
from .registry import AxisValue, GroupInputs, SetLevel, add_partials, register_axis

_EPS = 1e-12
NOTE_FEW_GROUPS = "activation_rel needs at least 2 groups in the set"
NOTE_NO_BETWEEN = "the between-group dispersion is 0 (every group has the same hidden states)"


def layer_keys(layers: Sequence[int] | None, n_layers: int) -> list[str]:
    """The per-layer extra keys ``layer_<block>``: the decoder block each of the ``n_layers`` hidden layers
    came from (``layers``, resolved 0-based block indices), or ``0..n_layers-1`` when ``layers`` is None."""
    blocks = list(range(n_layers)) if layers is None else [int(b) for b in layers]
    if len(blocks) != n_layers:
        raise ValueError(f"{n_layers} hidden layers but {len(blocks)} block indices {blocks}")
    return [f"layer_{b}" for b in blocks]


def activation_instability(hidden: torch.Tensor, layers: Sequence[int] | None = None) -> AxisValue:
    """Mean over layers of ``A_l = K/(K-1) * (1 - ||mean_k u_k||^2)``, the mean cosine distance of the
    variants' hidden states at layer l.

    A cosine distance lies in [0, 2]. Every reported number of this axis is clipped to [0, 1], at the same
    place: each layer's value ``extra["layer_<block>"]`` (``layers``: the decoder block of each of the L
    layers, see :func:`layer_keys`) and each variant's per-layer distance to the others
    are clipped, then averaged over layers, so the value is the mean of the reported layer values. Only
    anti-aligned hidden states (mean cosine < 0, never seen on trained LMs) reach the clip; then the mean
    of the per-variant values can differ from the value. ``activation_rel`` uses the unclipped distances.
    """
    hidden_lk = hidden.transpose(0, 1)  # [L, K, H]
    per_layer = activation_dispersion(hidden_lk).clamp(0.0, 1.0)  # [L]
    per_variant = per_variant_cosine_distance(hidden_lk).clamp(0.0, 1.0).mean(0)  # [K]
    extra = {key: float(v) for key, v in zip(layer_keys(layers, per_layer.numel()), per_layer.tolist())}
    return AxisValue(float(per_layer.mean()), [float(x) for x in per_variant], extra)


@register_axis("activation", needs=["hidden"], description="mean cosine distance of hidden states across variants")
def _activation(g: GroupInputs) -> AxisValue:
    return activation_instability(g.hidden, g.layers)


# ---------------------------------------------------------------------------------------------------- relative
def unit_vectors(hidden: torch.Tensor) -> torch.Tensor:
    """``u = h / ||h||`` in float64 (zero vectors stay zero). The ratio divides by a between-group
    dispersion that is small under anisotropy, so it is computed from float64 unit vectors: float32 ones
    carry ``||u||^2 = 1 +- 1e-7``, which shifts ``1 - mean cos`` by that much (a negative within-group
    dispersion for identical variants) and, divided by a small between-group dispersion, the ratio by ~1e-5."""
    v = hidden.double()
    return v * torch.rsqrt((v * v).sum(-1, keepdim=True).clamp_min(_EPS))


def group_partial(hidden: torch.Tensor, layers: Sequence[int] | None = None) -> dict[str, Any]:
    """The additive statistics one group ``[K, L, H]`` contributes to its set's between-group dispersion:
    ``sum`` = s_g per layer ``[L, H]``, ``sq`` = ||s_g||^2 per layer ``[L]``, ``m`` = K, ``k2`` = K^2.
    Sums of these over the groups give s, sum_g ||s_g||^2, M and sum_g K_g^2 (float64). ``layers`` (a
    tuple, the same for every group, not summed) are the layers' block indices, for the summary."""
    s_g = unit_vectors(hidden).sum(0).numpy()  # [L, H]
    k = int(hidden.shape[0])
    blocks = tuple(range(s_g.shape[0])) if layers is None else tuple(int(b) for b in layers)
    return {"sum": s_g, "sq": (s_g * s_g).sum(-1), "m": k, "k2": k * k, "groups": 1, "layers": blocks}


def between_dispersion(totals: dict[str, Any]) -> np.ndarray:
    """Mean cosine distance over ordered pairs of vectors from different groups, per layer, in closed form:
    ``1 - (||s||^2 - sum_g ||s_g||^2) / (M^2 - sum_g K_g^2)``. NaN with fewer than 2 groups."""
    pairs = float(totals["m"]) ** 2 - float(totals["k2"])
    s = np.asarray(totals["sum"], dtype=np.float64)
    if int(totals["groups"]) < 2 or pairs <= 0:
        return np.full(s.shape[0], math.nan)
    cross = (s * s).sum(-1) - np.asarray(totals["sq"], dtype=np.float64)
    return 1.0 - cross / pairs


def within_dispersion(hidden: torch.Tensor, layers: Sequence[int] | None = None) -> dict[str, Any]:
    """The group's unclipped ``A_l`` per layer (``within``, ``[L]``) and each variant's mean cosine distance
    to the others per layer (``per_variant``, ``[L, K]``): all ``activation_rel`` needs from the group's
    hidden states once the set's between-group dispersion is known. The activation axis's formulas, in
    float64 (see :func:`unit_vectors`). ``layers``: the layers' block indices, for the extra keys."""
    u = unit_vectors(hidden).transpose(0, 1)  # [L, K, H]
    k = u.shape[1]
    s = u.sum(1, keepdim=True)  # [L, 1, H]
    norms = (u * u).sum(-1)  # [L, K]: 1, or 0 for a zero vector (cos := 0, as in the activation axis)
    within = 1.0 - (((s * s).sum(-1).squeeze(1) - norms.sum(-1)) / (k * (k - 1)))
    per_variant = 1.0 - ((u * s).sum(-1) - norms) / (k - 1)
    return {"within": within.numpy(), "per_variant": per_variant.numpy(), "sum": s.squeeze(1).numpy(),
            "layers": None if layers is None else [int(b) for b in layers]}


def group_between(within: dict[str, np.ndarray], totals: dict[str, Any]) -> np.ndarray:
    """One group's mean cosine distance to the variants of every *other* group of the set, per layer:
    ``1 - s_g . (s - s_g) / (K_g (M - K_g))``. The set's between-group dispersion is the average of these
    weighted by ``K_g (M - K_g)`` (the plain mean when every group has the same K); per group, it lets two
    models be compared with a paired test (did a fine-tune pull unrelated prompts together?)."""
    s_g = within["sum"]
    k = within["per_variant"].shape[1]
    others = float(totals["m"]) - k
    if others <= 0:
        return np.full(s_g.shape[0], math.nan)
    s = np.asarray(totals["sum"], dtype=np.float64)
    return 1.0 - (s_g * (s - s_g)).sum(-1) / (k * others)


def relative_value(within: dict[str, Any], between: np.ndarray) -> AxisValue:
    """``R_l = within_l / between_l`` per layer (extra ``layer_<block>``); the value is the mean over layers,
    not clipped. Per-variant
    values are each variant's distance to the others over ``between_l``, averaged over layers (their mean
    over variants is the value). NaN where the between-group dispersion is not positive."""
    b = np.asarray(between, dtype=np.float64)
    k = within["per_variant"].shape[1]
    keys = layer_keys(within.get("layers"), b.size)
    if not bool(np.all(np.isfinite(b)) and np.all(b > 0)):
        return AxisValue(math.nan, [math.nan] * k, dict.fromkeys(keys, math.nan))
    ratio = within["within"] / b
    per_variant = (within["per_variant"] / b[:, None]).mean(0)
    extra = {key: float(v) for key, v in zip(keys, ratio.tolist())}
    return AxisValue(float(ratio.mean()), [float(x) for x in per_variant], extra)


def activation_relative(
    groups: list[torch.Tensor], layers: Sequence[int] | None = None
) -> tuple[list[AxisValue], np.ndarray]:
    """``activation_rel`` of every group of a set (each ``[K_g, L, H]``; ``extra["between"]`` = the group's
    own distance to the other groups, see :func:`group_between`; ``layers``: the block indices of the L
    layers) and the set's between-group dispersion per layer: the evaluator's computation in one call, for
    scripts and tests."""
    totals: dict[str, Any] | None = None
    for h in groups:
        totals = add_partials(totals, group_partial(h, layers))
    if not totals:
        return [], np.array([])
    values = [_finalize_relative(AxisValue(math.nan, [], pending=within_dispersion(h, layers)), totals) for h in groups]
    return values, between_dispersion(totals)


def _finalize_relative(value: AxisValue, totals: dict[str, Any]) -> AxisValue:
    out = relative_value(value.pending, between_dispersion(totals))
    out.extra["between"] = float(np.mean(group_between(value.pending, totals)))
    return out


def _summarize_relative(totals: dict[str, Any]) -> dict[str, Any]:
    """The set's between-group dispersion (per layer, with ``layers`` naming each entry's decoder block, and
    its mean), n groups and variants, and a note when ``activation_rel`` cannot be computed."""
    if not totals or int(totals.get("groups", 0)) == 0:
        return {"between_dispersion": {"mean": math.nan, "per_layer": [], "n_groups": 0, "n_variants": 0},
                "note": f"{NOTE_FEW_GROUPS}; the set has no evaluated group"}
    between = between_dispersion(totals)
    blocks = totals.get("layers")
    out: dict[str, Any] = {"between_dispersion": {
        "mean": float(np.mean(between)), "per_layer": between.tolist(),
        "layers": list(blocks) if blocks is not None else list(range(between.size)),
        "n_groups": int(totals["groups"]), "n_variants": int(totals["m"])}}
    if int(totals["groups"]) < 2:
        out["note"] = f"{NOTE_FEW_GROUPS}; the set has {int(totals['groups'])} evaluated group: not computed"
    elif not bool(np.all(between > 0)):
        out["note"] = f"{NOTE_NO_BETWEEN}: activation_rel not computed"
    return out


@register_axis(
    "activation_rel",
    needs=["hidden"],
    description="within-group activation dispersion over the set's between-group dispersion",
    # A ratio (1 = variants as far apart as unrelated prompts, can exceed 1) does not average with [0, 1] axes.
    in_instability=False,
    set_level=SetLevel(finalize=_finalize_relative, summary=_summarize_relative),
)
def _activation_rel(g: GroupInputs) -> AxisValue:
    nan = [math.nan] * int(g.hidden.shape[0])
    # The value needs the whole set: only O(L x (H + K)) numbers per group travel to the set-level step.
    return AxisValue(math.nan, nan, partial=group_partial(g.hidden, g.layers),
                     pending=within_dispersion(g.hidden, g.layers))
