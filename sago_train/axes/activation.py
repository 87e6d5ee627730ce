"""Activation axis: dispersion of the variants' hidden states (SPEC "activation")."""

from __future__ import annotations

from ..functional import activation_dispersion, per_variant_cosine_distance
from .registry import AxisValue, GroupInputs, register_axis


def activation_instability(hidden) -> AxisValue:  # noqa: ANN001 - torch.Tensor [K, L, H]
    """Mean over layers of ``K/(K-1) * (1 - ||mean_k u_k||^2)``.

    The mean cosine distance lies in [0, 2] in theory; hidden states of real LMs share a dominant
    direction so it stays far below 1, and the axis is clipped to [0, 1] (float error can also give
    -1e-8) so that every axis lives on the same scale.
    """
    per_layer = activation_dispersion(hidden.transpose(0, 1))  # [L]
    value = float(per_layer.mean().clamp(0.0, 1.0))
    per_variant = per_variant_cosine_distance(hidden.transpose(0, 1)).mean(0)  # [K]
    extra = {f"layer_{i}": float(v) for i, v in enumerate(per_layer.tolist())}
    return AxisValue(value, [float(x) for x in per_variant], extra)


@register_axis("activation", needs=["hidden"], description="mean cosine distance of hidden states across variants")
def _activation(g: GroupInputs) -> AxisValue:
    return activation_instability(g.hidden)
