"""POSIX, the prompt sensitivity index of Chatterjee et al. (EMNLP 2024, Eq. 1), as an axis
(docs/definitions.md#posix)."""

from __future__ import annotations

import math

import torch

from .registry import AxisValue, GroupInputs, register_axis


def posix_index(response_logprobs: torch.Tensor) -> AxisValue:
    """``POSIX = 1/(K(K-1)) sum_{i != j} |log P(y_j | x_i) - log P(y_j | x_j)| / L(y_j)`` from
    ``M[i, j] = log P(y_j | x_i) / L(y_j)``, the mean log-probability per token of variant j's greedy response
    after variant i's prompt. An empty response (``L = 0``, a NaN column) is equally likely after every prompt
    and contributes 0. The per-variant value of j is the mean over ``i != j`` of its response's terms (their mean
    over j is POSIX); the extra ``empty`` is the share of empty responses. In nats per token, >= 0, unbounded.

    Example:
        >>> import torch
        >>> m = torch.tensor([[-1.0, -2.0], [-1.5, -1.0]])  # |-1.5 - -1.0| and |-2.0 - -1.0|
        >>> posix_index(m).value
        0.75
    """
    m = response_logprobs.double()
    k = m.shape[0]
    if m.shape != (k, k) or k < 2:
        raise ValueError(f"posix needs a [K, K] matrix with K >= 2, got shape {tuple(m.shape)}")
    empty = torch.isnan(m).all(0)
    if bool(torch.isnan(m[:, ~empty]).any()):
        nan = [math.nan] * k
        return AxisValue(math.nan, nan, {"empty": float(empty.double().mean())})
    diff = (m - m.diagonal()[None, :]).abs()  # [i, j]: |M[i, j] - M[j, j]|, 0 on the diagonal
    diff[:, empty] = 0.0
    per_variant = (diff.sum(0) / (k - 1)).tolist()
    return AxisValue(float(diff.sum() / (k * (k - 1))), per_variant, {"empty": float(empty.double().mean())})


@register_axis("posix", needs=["generations", "response_logprobs"], in_instability=False,
               description="POSIX: mean log-likelihood change per token of each variant's own response across prompts")
def _posix(g: GroupInputs) -> AxisValue:
    if g.response_logprobs is None:
        raise RuntimeError("the posix axis needs every response scored after every prompt")
    return posix_index(g.response_logprobs)
