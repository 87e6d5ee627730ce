"""Confidence axis: spread of the probability the model gives the same continuation (docs/definitions.md#confidence)."""

from __future__ import annotations

import math

import torch

from .. import mean_pairwise_abs_diff
from .registry import AxisValue, GroupInputs, register_axis


def confidence_instability(mean_logprobs: torch.Tensor) -> AxisValue:
    """``C = mean_{i<j} |p_i - p_j|`` with ``p_k = exp(lp_k)``; the secondary number ``logprob_std`` is the
    (population) standard deviation of ``lp_k`` in nats. NaN when any ``lp_k`` is undefined."""
    lp = mean_logprobs.double()
    if torch.isnan(lp).any():
        nan = [math.nan] * lp.numel()
        return AxisValue(math.nan, nan, {"logprob_std": math.nan})
    p = lp.exp()
    value = float(mean_pairwise_abs_diff(p.unsqueeze(0)).squeeze(0))
    k = p.numel()
    # Per-variant share: mean |p_k - p_j| over j != k; its mean over k equals C.
    per_variant = ((p[:, None] - p[None, :]).abs().sum(1) / (k - 1)).tolist()
    return AxisValue(value, per_variant, {"logprob_std": float(lp.std(unbiased=False))})


@register_axis("confidence", needs=["logprobs"], description="spread of p(reference) across variants")
def _confidence(g: GroupInputs) -> AxisValue:
    return confidence_instability(g.logprobs)
