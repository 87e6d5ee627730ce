"""Confidence axes: how much the likelihood of the same continuation changes across variants
(docs/definitions.md#confidence).

``confidence`` compares the variants' per-token log-likelihoods of the scored continuation as ratios, so it does
not change when every variant's log-likelihood moves by the same amount: a fine-tune that makes the answer more
probable after every phrasing does not read as less stable. ``confidence_prob``, the first definition (a
difference of probabilities), grows with confidence itself and is kept for continuity.
"""

from __future__ import annotations

import math

import torch

from .. import mean_pairwise_abs_diff
from .registry import AxisValue, GroupInputs, register_axis


def _nan(k: int) -> AxisValue:
    return AxisValue(math.nan, [math.nan] * k, {"logprob_std": math.nan})


def _pairwise(d: torch.Tensor) -> tuple[float, list[float]]:
    """The mean of a symmetric ``[K, K]`` matrix over pairs i<j, and per variant over j != k (their mean over k
    equals the pairs' mean)."""
    k = d.shape[0]
    iu = torch.triu_indices(k, k, 1)
    return float(d[iu[0], iu[1]].mean()), (d.sum(1) / (k - 1)).tolist()


def confidence_instability(mean_logprobs: torch.Tensor) -> AxisValue:
    """``C = mean_{i<j} (1 - exp(-|lp_i - lp_j|))``: for each pair of variants, the share by which the less
    likely one falls short of the more likely one, ``1 - min(q_i, q_j) / max(q_i, q_j)`` with ``q_k = exp(lp_k)``
    the per-token (geometric mean) probability. In [0, 1); a common shift of every ``lp_k`` leaves it unchanged.
    The secondary number ``logprob_std`` is the (population) standard deviation of ``lp_k`` in nats. NaN when
    any ``lp_k`` is undefined.

    Example:
        >>> import torch
        >>> round(confidence_instability(torch.tensor([-0.1, -0.1 - math.log(2)])).value, 6)
        0.5
        >>> round(confidence_instability(torch.tensor([-3.1, -3.1 - math.log(2)])).value, 6)  # shifted: the same
        0.5
    """
    lp = mean_logprobs.double()
    if torch.isnan(lp).any():
        return _nan(lp.numel())
    gap = -torch.expm1(-(lp[:, None] - lp[None, :]).abs())  # 1 - exp(-|lp_i - lp_j|), accurate for small gaps
    value, per_variant = _pairwise(gap)
    return AxisValue(value, per_variant, {"logprob_std": float(lp.std(unbiased=False))})


def confidence_prob_instability(mean_logprobs: torch.Tensor) -> AxisValue:
    """The first definition, ``C_prob = mean_{i<j} |p_i - p_j|`` with ``p_k = exp(lp_k)``: a difference of
    probabilities, so it grows with the probability itself (an unsure model reads stable). NaN when any ``lp_k``
    is undefined.

    Example:
        >>> import torch
        >>> round(confidence_prob_instability(torch.tensor([math.log(0.9), math.log(0.6)])).value, 6)
        0.3
    """
    lp = mean_logprobs.double()
    if torch.isnan(lp).any():
        return _nan(lp.numel())
    p = lp.exp()
    value = float(mean_pairwise_abs_diff(p.unsqueeze(0)).squeeze(0))
    k = p.numel()
    # Per-variant share: mean |p_k - p_j| over j != k; its mean over k equals C_prob.
    per_variant = ((p[:, None] - p[None, :]).abs().sum(1) / (k - 1)).tolist()
    return AxisValue(value, per_variant, {"logprob_std": float(lp.std(unbiased=False))})


@register_axis("confidence", needs=["logprobs", "generations", "answer_logprobs"],
               description="relative spread of the likelihood of the answer, in the model's own form, across variants")
def _confidence(g: GroupInputs) -> AxisValue:
    if g.answer_logprobs is None:
        raise RuntimeError("the confidence axis needs the answer scored after the model's own lead-in")
    return confidence_instability(g.answer_logprobs)


@register_axis("confidence_prob", needs=["logprobs"],
               description="spread of p(reference) across variants (the first, scale-dependent definition)")
def _confidence_prob(g: GroupInputs) -> AxisValue:
    return confidence_prob_instability(g.logprobs)
