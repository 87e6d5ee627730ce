"""Tests for sago_train.functional.dispersion: the O(K) formulas against plain loops over pairs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sago_train.functional import (
    activation_dispersion,
    anchor_activation_distance,
    mean_pairwise_abs_diff,
    per_variant_cosine_distance,
)

FAST = settings(max_examples=60, deadline=None)


# --------------------------------------------------------------------------- plain references (float64 loops)


def cos_dist(a: np.ndarray, b: np.ndarray) -> float:
    """1 - cos(a, b), with cos := 0 when either vector is zero (the convention of all four functions)."""
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0
    return 1.0 - float(a @ b) / (na * nb)


def ref_dispersion(h: np.ndarray) -> np.ndarray:
    """Mean of 1 - cos over distinct pairs, for ``h`` of shape [..., K, H]."""
    lead = h.shape[:-2]
    out = np.zeros(lead)
    for idx in np.ndindex(*lead):
        x = h[idx]
        pairs = list(itertools.combinations(range(x.shape[0]), 2))
        out[idx] = sum(cos_dist(x[i], x[j]) for i, j in pairs) / len(pairs)
    return out


def ref_anchor(h: np.ndarray, canonical) -> np.ndarray:
    lead = h.shape[:-2]
    out = np.zeros(lead)
    canon = np.broadcast_to(np.asarray(canonical), lead)
    for idx in np.ndindex(*lead):
        x, c = h[idx], int(canon[idx])
        out[idx] = sum(cos_dist(x[k], x[c]) for k in range(x.shape[0]) if k != c) / (x.shape[0] - 1)
    return out


def ref_per_variant(h: np.ndarray) -> np.ndarray:
    out = np.zeros(h.shape[:-1])
    for idx in np.ndindex(*h.shape[:-2]):
        x = h[idx]
        k = x.shape[0]
        for a in range(k):
            out[idx + (a,)] = sum(cos_dist(x[a], x[b]) for b in range(k) if b != a) / (k - 1)
    return out


def ref_abs_diff(x: np.ndarray) -> np.ndarray:
    lead = x.shape[:-1]
    out = np.zeros(lead)
    for idx in np.ndindex(*lead):
        v = x[idx]
        pairs = list(itertools.combinations(range(v.shape[0]), 2))
        out[idx] = sum(abs(v[i] - v[j]) for i, j in pairs) / len(pairs)
    return out


def randn(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


SHAPES = [(2, 8), (3, 5), (5, 16), (8, 4), (4, 3, 7), (2, 3, 6, 5), (1, 2, 3)]


# --------------------------------------------------------------------------- activation_dispersion


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_activation_dispersion_matches_pair_loop(shape, dtype):
    h = randn(*shape, seed=sum(shape), dtype=dtype)
    got = activation_dispersion(h)
    # float32 for every input dtype except float64, which stays float64 (for gradient checks)
    assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert got.shape == shape[:-2]
    want = ref_dispersion(h.double().numpy())
    np.testing.assert_allclose(got.numpy(), want, atol=2e-6, rtol=1e-5)


def test_activation_dispersion_examples():
    assert float(activation_dispersion(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))) == pytest.approx(1.0)
    assert float(activation_dispersion(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))) == pytest.approx(2.0)
    assert float(activation_dispersion(torch.tensor([[2.0, 0.0], [5.0, 0.0], [0.1, 0.0]]))) == pytest.approx(
        0.0, abs=1e-7
    )


@pytest.mark.parametrize(
    "h",
    [
        pytest.param([[0.0, 0.0], [1.0, 0.0]], id="one-zero"),
        pytest.param([[0.0, 0.0], [0.0, 0.0]], id="two-zero"),
        pytest.param([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0], [2.0, 4.0, 6.1]], id="zero-of-three"),
    ],
)
def test_zero_vectors_consistent_across_functions(h):
    # A zero vector (e.g. an empty pooled span) has cos := 0 with everything: distance 1. The O(K)
    # formulas must keep agreeing with the pair loop, and with each other, there too.
    t = torch.tensor(h)
    want = ref_dispersion(np.asarray(h, dtype=np.float64))
    assert float(activation_dispersion(t)) == pytest.approx(float(want), abs=1e-6)
    assert float(per_variant_cosine_distance(t).mean()) == pytest.approx(float(want), abs=1e-6)
    np.testing.assert_allclose(
        per_variant_cosine_distance(t).numpy(), ref_per_variant(np.asarray(h)), atol=1e-6
    )
    assert float(anchor_activation_distance(t, 1)) == pytest.approx(
        float(ref_anchor(np.asarray(h), 1)), abs=1e-6
    )


def test_activation_dispersion_identical_vectors_zero():
    v = randn(16, seed=3)
    h = v.expand(4, 16).clone()
    assert float(activation_dispersion(h)) == pytest.approx(0.0, abs=1e-6)
    hb = torch.stack([h, h * 3.0])  # batch of two groups
    np.testing.assert_allclose(activation_dispersion(hb).numpy(), [0.0, 0.0], atol=1e-6)


@pytest.mark.parametrize(
    "h",
    [
        pytest.param(randn(3, 6, seed=1), id="random"),
        pytest.param(randn(6, seed=2).expand(3, 6).clone(), id="identical"),
        pytest.param(torch.cat([torch.zeros(1, 6), randn(2, 6, seed=4)]), id="zero-vector"),
        pytest.param(torch.zeros(3, 6), id="all-zero"),
        pytest.param(randn(2, 4, 6, seed=5, dtype=torch.bfloat16).float(), id="batched"),
    ],
)
def test_activation_dispersion_gradient_finite(h):
    h = h.clone().requires_grad_(True)
    out = activation_dispersion(h)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert h.grad is not None and torch.isfinite(h.grad).all()


def test_activation_dispersion_gradient_bfloat16_input():
    h = randn(3, 8, seed=7, dtype=torch.bfloat16).requires_grad_(True)
    activation_dispersion(h).backward()
    assert h.grad.dtype == torch.bfloat16 and torch.isfinite(h.grad.float()).all()


def test_activation_dispersion_gradient_matches_pair_loop():
    h = randn(4, 5, seed=11, dtype=torch.float64).requires_grad_(True)
    activation_dispersion(h).backward()
    h2 = h.detach().clone().requires_grad_(True)
    u = h2 / h2.norm(dim=-1, keepdim=True)
    pairs = list(itertools.combinations(range(4), 2))
    (sum(1 - u[i] @ u[j] for i, j in pairs) / len(pairs)).backward()
    torch.testing.assert_close(h.grad, h2.grad.to(h.grad.dtype), atol=1e-5, rtol=1e-4)


def test_activation_dispersion_rejects_bad_shapes():
    with pytest.raises(ValueError, match="K=1"):
        activation_dispersion(torch.ones(1, 4))
    with pytest.raises(ValueError, match="shape"):
        activation_dispersion(torch.ones(4))


# Hypothesis: arbitrary float32 values, zeros and repeated rows included.
group_arrays = st.tuples(st.integers(2, 6), st.integers(1, 8)).flatmap(
    lambda kh: hnp.arrays(
        np.float32,
        kh,
        elements=st.floats(-1e3, 1e3, width=32, allow_nan=False, allow_subnormal=False),
    )
)


@FAST
@given(group_arrays)
def test_activation_dispersion_in_range(h):
    v = float(activation_dispersion(torch.from_numpy(h)))
    assert -1e-5 <= v <= 2 + 1e-5


@FAST
@given(group_arrays, st.randoms(use_true_random=False))
def test_activation_dispersion_permutation_invariant(h, rnd):
    perm = list(range(h.shape[0]))
    rnd.shuffle(perm)
    a = float(activation_dispersion(torch.from_numpy(h)))
    b = float(activation_dispersion(torch.from_numpy(h[perm])))
    assert a == pytest.approx(b, abs=1e-5)


@FAST
@given(
    st.integers(0, 2**31 - 1),
    st.integers(2, 6),
    st.lists(st.floats(0.01, 100.0), min_size=6, max_size=6),
)
def test_activation_dispersion_scale_invariant(seed, k, scales):
    h = randn(k, 7, seed=seed)
    s = torch.tensor(scales[:k]).unsqueeze(-1)
    assert float(activation_dispersion(h * s)) == pytest.approx(float(activation_dispersion(h)), abs=1e-5)


# --------------------------------------------------------------------------- anchor_activation_distance


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("canonical", [0, 1])
def test_anchor_distance_matches_loop(shape, canonical):
    h = randn(*shape, seed=sum(shape) + 1)
    got = anchor_activation_distance(h, canonical)
    assert got.dtype == torch.float32 and got.shape == shape[:-2]
    np.testing.assert_allclose(got.numpy(), ref_anchor(h.double().numpy(), canonical), atol=2e-6, rtol=1e-5)


def test_anchor_distance_per_group_canonical_tensor():
    h = randn(4, 3, 6, seed=9)
    canon = torch.tensor([0, 2, 1, 2])
    got = anchor_activation_distance(h, canon)
    np.testing.assert_allclose(
        got.numpy(), ref_anchor(h.double().numpy(), canon.numpy()), atol=2e-6, rtol=1e-5
    )


def test_anchor_distance_bfloat16_input_gives_float32():
    h = randn(2, 3, 8, seed=10, dtype=torch.bfloat16)
    got = anchor_activation_distance(h, 0)
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), ref_anchor(h.double().numpy(), 0), atol=2e-6, rtol=1e-5)


def test_anchor_distance_stops_gradient_on_canonical():
    h = randn(3, 6, seed=12).requires_grad_(True)
    anchor_activation_distance(h, 1).backward()
    assert torch.isfinite(h.grad).all()
    # The canonical row is a fixed target: no gradient reaches it ...
    torch.testing.assert_close(h.grad[1], torch.zeros(6), atol=1e-6, rtol=0)
    # ... while the other variants are pulled towards it.
    assert h.grad[0].abs().sum() > 0 and h.grad[2].abs().sum() > 0


def test_gradcheck_float64_dispersion_and_anchor():
    # float64 stays float64, so finite differences check the analytic gradient (the audit found the anchor
    # gradient never checked). The anchor side is detached: gradcheck the non-canonical rows with the
    # canonical row held fixed, which is the function the detached gradient differentiates.
    h = randn(2, 4, 5, seed=21, dtype=torch.float64).requires_grad_(True)
    assert activation_dispersion(h).dtype == torch.float64
    assert torch.autograd.gradcheck(lambda x: activation_dispersion(x), (h,))
    assert torch.autograd.gradcheck(lambda x: per_variant_cosine_distance(x), (h,))
    canon = torch.tensor([2, 0])
    fixed = h.detach()
    rows = h.detach().clone().requires_grad_(True)

    def anchored(x: torch.Tensor) -> torch.Tensor:
        keep = torch.zeros(2, 4, 1, dtype=torch.bool)
        keep[torch.arange(2), canon] = True
        return anchor_activation_distance(torch.where(keep, fixed, x), canon)

    assert anchor_activation_distance(h, canon).dtype == torch.float64
    assert torch.autograd.gradcheck(anchored, (rows,))
    # And the detached gradient of the real function equals that of the fixed-anchor function.
    x = h.detach().clone().requires_grad_(True)
    anchor_activation_distance(x, canon).sum().backward()
    y = h.detach().clone().requires_grad_(True)
    anchored(y).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)


def test_anchor_distance_zero_for_identical_and_rejects_k1():
    h = randn(5, seed=13).expand(3, 5).clone()
    assert float(anchor_activation_distance(h, 2)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError):
        anchor_activation_distance(torch.ones(1, 4))


# --------------------------------------------------------------------------- mean_pairwise_abs_diff


@pytest.mark.parametrize("shape", [(2,), (3,), (7,), (4, 5), (2, 3, 6)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_mean_pairwise_abs_diff_matches_loop(shape, dtype):
    x = randn(*shape, seed=sum(shape) + 2, dtype=dtype)
    got = mean_pairwise_abs_diff(x)
    # float64 input keeps its precision; lower precisions are computed in float32.
    assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32) and got.shape == shape[:-1]
    np.testing.assert_allclose(got.numpy(), ref_abs_diff(x.double().numpy()), atol=1e-5, rtol=1e-5)


def test_mean_pairwise_abs_diff_example_and_errors():
    assert float(mean_pairwise_abs_diff(torch.tensor([0.0, 1.0, 0.5]))) == pytest.approx(2 / 3)
    assert float(mean_pairwise_abs_diff(torch.tensor([0.3, 0.3, 0.3]))) == 0.0
    with pytest.raises(ValueError):
        mean_pairwise_abs_diff(torch.tensor([1.0]))


@FAST
@given(
    st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=2, max_size=10),
    st.randoms(use_true_random=False),
)
def test_mean_pairwise_abs_diff_property(values, rnd):
    x = np.asarray(values, dtype=np.float32)
    got = float(mean_pairwise_abs_diff(torch.from_numpy(x)))
    want = float(ref_abs_diff(x.astype(np.float64)))
    assert got == pytest.approx(want, abs=1e-3, rel=1e-4)
    rnd.shuffle(values)
    assert float(mean_pairwise_abs_diff(torch.tensor(values))) == pytest.approx(got, abs=1e-3, rel=1e-4)


def test_mean_pairwise_abs_diff_gradient_finite_with_ties():
    x = torch.tensor([0.5, 0.5, 0.2], requires_grad=True)
    mean_pairwise_abs_diff(x).backward()
    assert torch.isfinite(x.grad).all()


# --------------------------------------------------------------------------- per_variant_cosine_distance


@pytest.mark.parametrize("shape", SHAPES)
def test_per_variant_matches_loop_and_averages_to_dispersion(shape):
    h = randn(*shape, seed=sum(shape) + 3)
    pv = per_variant_cosine_distance(h)
    assert pv.shape == shape[:-1] and pv.dtype == torch.float32
    np.testing.assert_allclose(pv.numpy(), ref_per_variant(h.double().numpy()), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(pv.mean(-1), activation_dispersion(h), atol=2e-6, rtol=1e-5)


@FAST
@given(group_arrays)
def test_per_variant_mean_equals_dispersion_property(h):
    t = torch.from_numpy(h)
    assert float(per_variant_cosine_distance(t).mean(-1)) == pytest.approx(
        float(activation_dispersion(t)), abs=1e-5
    )
