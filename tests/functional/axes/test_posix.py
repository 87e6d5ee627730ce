"""POSIX (Chatterjee et al. 2024, Eq. 1) against a brute-force reference (docs/definitions.md#posix)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sago_train.functional.axes import posix_index


def ref_posix(sums: list[list[float]], lengths: list[int]) -> float:
    """Eq. 1 written out: sums[i][j] = log P(y_j | x_i) summed over y_j's tokens, lengths[j] = L(y_j); an empty
    response contributes 0."""
    k = len(lengths)
    total = 0.0
    for i in range(k):
        for j in range(k):
            if i != j and lengths[j]:
                total += abs(sums[i][j] - sums[j][j]) / lengths[j]
    return total / (k * (k - 1))


def _mean_matrix(sums: list[list[float]], lengths: list[int]) -> torch.Tensor:
    return torch.tensor([[s / n if n else math.nan for s, n in zip(row, lengths)] for row in sums],
                        dtype=torch.float64)


def test_posix_hand_example():
    # Response 0 (2 tokens) loses 1 nat after prompt 1; response 1 (1 token) gains 0.5 nats after prompt 0.
    sums = [[-2.0, -1.5], [-3.0, -2.0]]
    got = posix_index(_mean_matrix(sums, [2, 1]))
    assert got.value == pytest.approx((1.0 / 2 + 0.5 / 1) / 2)
    assert got.per_variant == pytest.approx([0.5, 0.5])
    assert got.extra["empty"] == 0.0


def test_posix_empty_response_contributes_zero():
    sums = [[-2.0, 0.0, -1.0], [-4.0, 0.0, -1.0], [-2.0, 0.0, -3.0]]
    got = posix_index(_mean_matrix(sums, [2, 0, 1]))
    assert got.value == pytest.approx(ref_posix(sums, [2, 0, 1]))
    assert got.per_variant[1] == 0.0 and got.extra["empty"] == pytest.approx(1 / 3)


def test_posix_undefined_score_is_nan():
    m = torch.tensor([[-1.0, -2.0], [float("nan"), -1.0]])
    assert math.isnan(posix_index(m).value)
    with pytest.raises(ValueError, match="K, K"):
        posix_index(torch.zeros(3, 2))


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6).flatmap(lambda k: st.tuples(
    st.lists(st.lists(st.floats(-40.0, 0.0), min_size=k, max_size=k), min_size=k, max_size=k),
    st.lists(st.integers(0, 7), min_size=k, max_size=k))))
def test_posix_matches_reference(case):
    sums, lengths = case
    got = posix_index(_mean_matrix(sums, lengths))
    assert got.value == pytest.approx(ref_posix(sums, lengths), abs=1e-9)
    assert sum(got.per_variant) / len(lengths) == pytest.approx(got.value, abs=1e-9)
    assert got.value >= 0.0
