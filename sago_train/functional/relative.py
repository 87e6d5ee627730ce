"""Dispersion of variants measured against the dispersion between different groups (docs/definitions.md#activation_rel,
"Stability loss", mode ``relative``).

Hidden states share a common direction (anisotropy), so a raw within-group dispersion can be lowered by
pulling *every* representation together. These functions compare each group's variants with the other
groups of the same batch, so collapse does not minimize them:

- :func:`between_group_dispersion`: mean cosine distance over pairs of vectors from different groups, in
  closed form from sums of unit vectors (``O(G K H)``, no pairwise loop).
- :func:`relative_dispersion`: within-group dispersion / between-group dispersion, per group (the
  ``activation_rel`` ratio); the loss's ``ratio`` form.
- :func:`contrastive_dispersion`: a supervised InfoNCE term (the group's other variants are positives, the
  other groups' variants negatives); the loss's ``infonce`` form.
- :func:`group_between_dispersion`: for each group, the mean cosine distance of its variants to the variants
  of every other group (a per-group between-group value, for paired tests).

Inputs are ``[..., G, K, H]``: G groups of K variants. All need ``G >= 2`` and ``K >= 2``. Computed in float32
(float64 stays float64, for gradient checks). Zero vectors count as having cosine 0 with everything, as in
:mod:`~sago_train.functional.dispersion`.
"""

from __future__ import annotations

import math

import torch

from .dispersion import activation_dispersion, unit_vectors

# The between-group dispersion is floored here before it divides: a batch whose groups all coincide would
# otherwise divide by zero. Far below any dispersion between real prompts (0.03-0.06 on a real model).
MIN_BETWEEN = 1e-6


def _check_groups(vectors: torch.Tensor) -> tuple[int, int]:
    if vectors.dim() < 3:
        raise ValueError(f"expected vectors of shape [..., G, K, H], got shape {tuple(vectors.shape)}")
    g, k = vectors.shape[-3], vectors.shape[-2]
    if g < 2:
        raise ValueError(
            f"need at least 2 groups along dim -3, got G={g}: the dispersion between groups is undefined for one group"
        )
    if k < 2:
        raise ValueError(f"need at least 2 variants along dim -2, got K={k}")
    return g, k


def between_group_dispersion(vectors: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Mean cosine distance over ordered pairs of vectors from different groups: ``[..., G, K, H] -> [...]``.

    With ``s`` the sum of all unit vectors and ``s_g`` the sum of group g's, the summed cosine similarity over
    ordered cross-group pairs is ``||s||^2 - sum_g ||s_g||^2``, over ``M^2 - G K^2`` pairs (``M = G K``).

    Example:
        >>> h = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]])  # two orthogonal groups
        >>> float(between_group_dispersion(h))
        1.0
    """
    g, k = _check_groups(vectors)
    u = unit_vectors(vectors, eps)
    s_g = u.sum(-2)  # [..., G, H]
    s = s_g.sum(-2)  # [..., H]
    cross = (s * s).sum(-1) - (s_g * s_g).sum(-1).sum(-1)
    m = g * k
    return 1.0 - cross / (m * m - g * k * k)


def group_between_dispersion(vectors: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """For each group, the mean cosine distance of its K vectors to the ``(G-1) K`` vectors of the other
    groups: ``[..., G, K, H] -> [..., G]``. Its mean over groups equals :func:`between_group_dispersion`."""
    g, k = _check_groups(vectors)
    u = unit_vectors(vectors, eps)
    s_g = u.sum(-2)  # [..., G, H]
    s = s_g.sum(-2, keepdim=True)  # [..., 1, H]
    cross = (s_g * (s - s_g)).sum(-1)
    return 1.0 - cross / (k * (g - 1) * k)


def relative_dispersion(vectors: torch.Tensor, eps: float = 1e-12, min_between: float = MIN_BETWEEN) -> torch.Tensor:
    """Each group's within-group dispersion divided by the between-group dispersion of all the groups:
    ``[..., G, K, H] -> [..., G]``.

    0 = the group's variants coincide; 1 = they are as far apart as variants of different groups. Pulling
    every vector together shrinks numerator and denominator alike, so collapse does not lower it; the
    gradient flows through both (it pulls a group's variants together and pushes the groups apart). The
    denominator is floored at ``min_between`` so identical groups give a finite value.

    Example:
        >>> h = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]])
        >>> relative_dispersion(h).tolist()  # identical variants, orthogonal groups
        [0.0, 0.0]
    """
    within = activation_dispersion(vectors, eps)  # [..., G]
    between = between_group_dispersion(vectors, eps)  # [...]
    return within / between.clamp_min(min_between).unsqueeze(-1)


def contrastive_dispersion(vectors: torch.Tensor, temperature: float = 0.1, eps: float = 1e-12) -> torch.Tensor:
    """Supervised InfoNCE over a batch of groups: ``[..., G, K, H] -> [..., G]``, >= 0.

    For each vector i of group g (the anchor), with ``z = cos / temperature``: ``-mean_{p in g, p != i}
    log( exp(z_ip) / sum_{a != i} exp(z_ia) )`` (Khosla et al. 2020, "SupCon", positives = the group's other
    variants, negatives = every variant of the other groups), averaged over the group's anchors, minus
    ``log(K-1)``, its value when the other groups are infinitely far and the variants coincide (by Jensen's
    inequality it cannot go lower), so 0 is the ideal. Collapse does not minimize it: identical vectors
    everywhere give ``log((M-1)/(K-1))``. ``O((G K)^2 H)``, small for a training batch.

    Example:
        >>> h = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[-1.0, 0.0], [-1.0, 0.0]]])
        >>> [round(x, 6) for x in contrastive_dispersion(h, temperature=0.05).tolist()]  # e^-40: 0 in float32
        [0.0, 0.0]
    """
    if not temperature > 0 or math.isinf(temperature):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    g, k = _check_groups(vectors)
    u = unit_vectors(vectors, eps)
    m = g * k
    flat = u.reshape(*u.shape[:-3], m, u.shape[-1])
    z = flat @ flat.transpose(-1, -2) / temperature  # [..., M, M]
    eye = torch.eye(m, dtype=torch.bool, device=u.device)
    # The anchor itself is left out of the denominator; a finite fill (not -inf) keeps logsumexp's gradient
    # clean, and exp of it is exactly 0 next to |z| <= 1/temperature.
    fill = -(2.0 / temperature + 1e4)
    log_denominator = torch.logsumexp(z.masked_fill(eye, fill), dim=-1)  # [..., M]
    group = torch.arange(m, device=u.device) // k
    positive = (group[:, None] == group[None, :]) & ~eye  # [M, M]
    pos_z = (z * positive.to(z.dtype)).sum(-1) / (k - 1)  # mean over the K-1 positives
    per_anchor = log_denominator - pos_z - math.log(k - 1)  # [..., M]
    return per_anchor.reshape(*u.shape[:-3], g, k).mean(-1)
