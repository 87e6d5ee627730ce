"""sago_train.functional.relative against brute-force loops over pairs, gradient checks and edge cases."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from sago_train.functional import (
    activation_dispersion,
    between_group_dispersion,
    contrastive_dispersion,
    group_between_dispersion,
    relative_dispersion,
)


def randn(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 0.0 if na == 0 or nb == 0 else float(a @ b) / (na * nb)


# ------------------------------------------------------------------------------- brute-force references
def ref_between(x: np.ndarray) -> float:
    """Mean 1 - cos over all pairs of vectors from different groups; ``x`` is [G, K, H]."""
    g, k, _ = x.shape
    d = [1 - cos(x[a, i], x[b, j]) for a, b in itertools.permutations(range(g), 2) for i in range(k) for j in range(k)]
    return sum(d) / len(d)


def ref_group_between(x: np.ndarray) -> list[float]:
    g, k, _ = x.shape
    return [
        float(np.mean([1 - cos(x[a, i], x[b, j]) for b in range(g) if b != a for i in range(k) for j in range(k)]))
        for a in range(g)
    ]


def ref_within(x: np.ndarray) -> list[float]:
    return [float(np.mean([1 - cos(grp[i], grp[j]) for i, j in itertools.combinations(range(len(grp)), 2)]))
            for grp in x]


def ref_infonce(x: np.ndarray, t: float) -> list[float]:
    """SupCon written out anchor by anchor, positive by positive."""
    g, k, _ = x.shape
    flat = [(a, x[a, i]) for a in range(g) for i in range(k)]
    per_group = [[] for _ in range(g)]
    for i, (ga, va) in enumerate(flat):
        denom = sum(math.exp(cos(va, vb) / t) for j, (_, vb) in enumerate(flat) if j != i)
        terms = [-math.log(math.exp(cos(va, vp) / t) / denom) for j, (gp, vp) in enumerate(flat) if j != i and gp == ga]
        per_group[ga].append(sum(terms) / len(terms) - math.log(k - 1))
    return [sum(v) / len(v) for v in per_group]


SHAPES = [(2, 2, 3), (3, 4, 8), (5, 3, 6), (2, 5, 4)]


@pytest.mark.parametrize("shape", SHAPES)
def test_closed_forms_match_pair_loops(shape):
    h = randn(*shape, seed=sum(shape))
    h[0, 1] = 0.0  # a zero vector: cos := 0 with everything, as in the loops
    x = h.numpy()
    assert float(between_group_dispersion(h)) == pytest.approx(ref_between(x), abs=1e-12)
    np.testing.assert_allclose(group_between_dispersion(h).numpy(), ref_group_between(x), atol=1e-12)
    within = np.array(ref_within(x))
    np.testing.assert_allclose(relative_dispersion(h).numpy(), within / ref_between(x), atol=1e-12)
    for t in (0.1, 1.0):
        np.testing.assert_allclose(contrastive_dispersion(h, temperature=t).numpy(), ref_infonce(x, t), atol=1e-10)
    # The group means of the per-group between values give the set value (equal group sizes).
    assert float(group_between_dispersion(h).mean()) == pytest.approx(ref_between(x), abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_float32_for_low_precision_and_matches_float64(dtype):
    h = randn(2, 3, 4, 8, seed=3, dtype=dtype)
    ref = h.double()
    for fn in (between_group_dispersion, group_between_dispersion, relative_dispersion, contrastive_dispersion):
        got = fn(h)
        assert got.dtype == torch.float32, fn.__name__
        torch.testing.assert_close(got.double(), fn(ref), atol=1e-5, rtol=1e-5)
    # Batch dims are independent problems.
    torch.testing.assert_close(relative_dispersion(ref)[1], relative_dispersion(ref[1]))


def test_gradcheck_float64():
    h = randn(3, 3, 5, seed=7).requires_grad_(True)
    assert torch.autograd.gradcheck(between_group_dispersion, (h,))
    assert torch.autograd.gradcheck(group_between_dispersion, (h,))
    assert torch.autograd.gradcheck(relative_dispersion, (h,))
    assert torch.autograd.gradcheck(lambda x: contrastive_dispersion(x, temperature=0.2), (h,))


def test_gradient_matches_autograd_through_the_pair_loop():
    # The closed form's gradient equals the gradient of the plain pairwise definition (ratio form).
    h = randn(3, 2, 4, seed=8)
    a = h.clone().requires_grad_(True)
    relative_dispersion(a).sum().backward()
    b = h.clone().requires_grad_(True)
    u = b / b.norm(dim=-1, keepdim=True)
    between = torch.stack([1 - u[p, i] @ u[q, j] for p, q in itertools.permutations(range(3), 2)
                           for i in range(2) for j in range(2)]).mean()
    within = torch.stack([1 - u[p, 0] @ u[p, 1] for p in range(3)])
    (within / between).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_collapse_does_not_lower_the_relative_terms():
    # Shrinking every vector toward a shared direction (anisotropy, or a loss that collapses everything)
    # lowers the raw dispersion but leaves the ratio about where it was; the contrastive value rises.
    # Groups with structure: a centre per group plus variant noise.
    h = randn(4, 1, 16, seed=9) + 0.5 * randn(4, 3, 16, seed=10)
    common = torch.ones(16) * 3.0
    squeezed = h * 0.2 + common
    assert float(activation_dispersion(squeezed).mean()) < 0.2 * float(activation_dispersion(h).mean())
    rel_before, rel_after = relative_dispersion(h).mean(), relative_dispersion(squeezed).mean()
    assert float(rel_after) == pytest.approx(float(rel_before), rel=0.35)
    assert float(contrastive_dispersion(squeezed).mean()) > float(contrastive_dispersion(h).mean())
    # Full collapse gives InfoNCE its known value log((M-1)/(K-1)), far above its minimum 0.
    same = torch.ones(4, 3, 16, dtype=torch.float64)
    assert torch.allclose(contrastive_dispersion(same), torch.full((4,), math.log(11 / 2), dtype=torch.float64))


def test_degenerate_inputs_are_finite_in_value_and_gradient():
    cases = [torch.zeros(2, 3, 4), torch.ones(3, 2, 4), randn(2, 2, 4, seed=1, dtype=torch.float32) * 1e-20]
    for h in cases:
        for fn in (between_group_dispersion, relative_dispersion, contrastive_dispersion):
            x = h.clone().requires_grad_(True)
            out = fn(x)
            assert torch.isfinite(out).all(), fn.__name__
            out.sum().backward()
            assert torch.isfinite(x.grad).all(), fn.__name__


def test_known_values():
    orth = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]])
    assert float(between_group_dispersion(orth)) == pytest.approx(1.0)
    assert relative_dispersion(orth).tolist() == [0.0, 0.0]
    # Variants as far apart as other groups: ratio 1.
    mixed = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]])
    assert relative_dispersion(mixed).tolist() == pytest.approx([2.0, 2.0])  # within 1, between 0.5
    with pytest.raises(ValueError, match="temperature"):
        contrastive_dispersion(orth, temperature=0.0)


def test_rejects_one_group_and_one_variant():
    with pytest.raises(ValueError, match="G=1"):
        relative_dispersion(torch.ones(1, 3, 4))
    with pytest.raises(ValueError, match="K=1"):
        between_group_dispersion(torch.ones(3, 1, 4))
    with pytest.raises(ValueError, match="shape"):
        contrastive_dispersion(torch.ones(3, 4))
