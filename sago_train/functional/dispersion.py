"""Dispersion of K variants' vectors and scalars: the O(K) formulas behind the axes and the loss.

Every function computes in float32 whatever the input dtype (bfloat16/float16 are upcast), except that
float64 stays float64, so that gradients can be checked by finite differences (as in ``divergence``).
"""

from __future__ import annotations

import torch


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 for float64 input, else float32: the precision of every term and axis."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def unit_vectors(vectors: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """``h / ||h||`` along the last dim in :func:`compute_dtype`; a zero vector stays zero (cos := 0)."""
    v = vectors.to(compute_dtype(vectors))
    # A floor on the squared norm keeps zero vectors finite (and their gradient defined).
    return v * torch.rsqrt((v * v).sum(-1, keepdim=True).clamp_min(eps))


def activation_dispersion(vectors: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Mean pairwise cosine distance of K vectors in O(K), differentiable.

    ``vectors`` has shape ``[..., K, H]``; the result has shape ``[...]``. With ``u_k = h_k / ||h_k||``
    (computed in float32, float64 for float64 input), the value is ``K/(K-1) * (1 - ||mean_k u_k||^2)``,
    which equals the mean of ``1 - cos(h_i, h_j)`` over the ``K(K-1)/2`` distinct pairs.

    Example:
        >>> h = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> float(activation_dispersion(h))
        1.0
    """
    if vectors.dim() < 2:
        raise ValueError(f"expected vectors of shape [..., K, H], got shape {tuple(vectors.shape)}")
    k = vectors.shape[-2]
    if k < 2:
        raise ValueError(f"need at least 2 variants along dim -2, got K={k}")
    u = unit_vectors(vectors, eps)
    # sum_{i != j} u_i.u_j = ||sum_k u_k||^2 - sum_k ||u_k||^2. For unit vectors this is the
    # K/(K-1) * (1 - ||mean u||^2) form above; subtracting the actual ||u_k||^2 (instead of assuming 1)
    # keeps it equal to the pairwise mean when a vector is zero (cos := 0, as in the functions below).
    s = u.sum(dim=-2)
    cos_sum = (s * s).sum(-1) - (u * u).sum(-1).sum(-1)
    return 1.0 - cos_sum / (k * (k - 1))


def anchor_activation_distance(vectors: torch.Tensor, canonical: int | torch.Tensor = 0, eps: float = 1e-12) -> torch.Tensor:
    """Mean cosine distance of each non-canonical variant to the canonical one, canonical side detached.

    ``vectors`` ``[..., K, H]`` -> ``[...]``. ``canonical`` is an index along K (an int, or a tensor of
    shape ``[...]`` for per-group canonical indices).

    Example:
        >>> h = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
        >>> float(anchor_activation_distance(h, 0))
        0.5
    """
    k = vectors.shape[-2]
    if k < 2:
        raise ValueError(f"need at least 2 variants along dim -2, got K={k}")
    u = unit_vectors(vectors, eps)
    if isinstance(canonical, int):
        idx = torch.full(u.shape[:-2], canonical, dtype=torch.long, device=u.device)
    else:
        idx = canonical.to(device=u.device, dtype=torch.long)
    anchor = torch.gather(u, -2, idx[..., None, None].expand(*u.shape[:-2], 1, u.shape[-1])).detach()
    dist = 1.0 - (u * anchor).sum(-1)  # [..., K]
    # Leave the canonical's distance to itself out explicitly: it is 0 only when its vector is non-zero.
    dist = dist.scatter(-1, idx[..., None], 0.0)
    return dist.sum(-1) / (k - 1)


def mean_pairwise_abs_diff(values: torch.Tensor) -> torch.Tensor:
    """Mean of ``|x_i - x_j|`` over distinct pairs along the last dim, in O(K log K).

    Uses the sorted identity ``sum_{i<j} |x_i - x_j| = sum_r (2r - K + 1) x_(r)``. Computed in float32, or
    float64 for float64 input.

    Example:
        >>> float(mean_pairwise_abs_diff(torch.tensor([0.0, 1.0, 0.5])))
        0.6666666865348816
    """
    k = values.shape[-1]
    if k < 2:
        raise ValueError(f"need at least 2 values along the last dim, got K={k}")
    x = values if values.dtype == torch.float64 else values.float()
    x, _ = x.sort(dim=-1)
    r = torch.arange(k, device=x.device, dtype=x.dtype)
    total = (x * (2 * r - k + 1)).sum(-1)
    return total / (k * (k - 1) / 2)


def per_variant_cosine_distance(vectors: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """For each variant, its mean cosine distance to the other K-1 variants: ``[..., K, H] -> [..., K]``.

    The mean over K of this equals :func:`activation_dispersion`, which makes it the per-variant share of
    the activation axis used for per-kind analysis.
    """
    k = vectors.shape[-2]
    u = unit_vectors(vectors, eps)
    s = u.sum(dim=-2, keepdim=True)
    # sum_{j != k} cos(u_k, u_j) = u_k . (S - u_k) = u_k . S - ||u_k||^2
    cos_sum = (u * s).sum(-1) - (u * u).sum(-1)
    return 1.0 - cos_sum / (k - 1)
