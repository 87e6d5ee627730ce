"""The shift-invariant confidence axis against a plain reference (docs/definitions.md#confidence)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sago_train.functional.axes import confidence_instability, confidence_prob_instability


def ref_confidence(lp: list[float]) -> tuple[float, list[float]]:
    """Per pair, 1 - (smaller per-token probability) / (larger), with q = exp(lp), in plain floats."""
    q = [math.exp(x) for x in lp]
    k = len(q)

    def gap(i: int, j: int) -> float:
        return 1.0 - min(q[i], q[j]) / max(q[i], q[j])

    pairs = list(itertools.combinations(range(k), 2))
    value = sum(gap(i, j) for i, j in pairs) / len(pairs)
    per_variant = [sum(gap(a, b) for b in range(k) if b != a) / (k - 1) for a in range(k)]
    return value, per_variant


@pytest.mark.parametrize(
    "lp", [[-0.1, -0.1], [-0.1, -2.0], [0.0, -1.0, -3.0], [-0.5, -0.7, -0.2, -4.0, -0.01], [-20.0, -0.0001]])
def test_confidence_matches_reference(lp):
    got = confidence_instability(torch.tensor(lp, dtype=torch.float64))
    value, per_variant = ref_confidence(lp)
    assert got.value == pytest.approx(value, abs=1e-9)
    assert got.per_variant == pytest.approx(per_variant, abs=1e-9)
    assert sum(got.per_variant) / len(lp) == pytest.approx(got.value, abs=1e-12)


def test_confidence_hand_example():
    # q = 0.8, 0.4, 0.2: gaps 0.5, 0.75, 0.5 -> 1.75 / 3
    got = confidence_instability(torch.tensor([math.log(0.8), math.log(0.4), math.log(0.2)]))
    assert got.value == pytest.approx(1.75 / 3, abs=1e-6)


def test_confidence_nan_when_undefined():
    got = confidence_instability(torch.tensor([-0.1, float("nan"), -0.3]))
    assert math.isnan(got.value) and all(math.isnan(x) for x in got.per_variant)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-30.0, 0.0, allow_nan=False), min_size=2, max_size=8), st.floats(-10.0, 10.0))
def test_confidence_invariant_to_a_common_shift(lp, shift):
    base = confidence_instability(torch.tensor(lp, dtype=torch.float64))
    moved = confidence_instability(torch.tensor([x + shift for x in lp], dtype=torch.float64))
    assert 0.0 <= base.value < 1.0
    assert moved.value == pytest.approx(base.value, abs=1e-9)
    assert base.value == pytest.approx(ref_confidence(lp)[0], abs=1e-9)


def test_the_scale_bias_of_the_probability_form_is_gone():
    """The known truth that motivated the change: an unsure model whose variants differ 10x in probability is
    unstable; a confident one whose variants all give the answer 0.9-0.95 is stable. The probability form reads
    them the other way round."""
    unsure_unstable = torch.tensor([math.log(0.001), math.log(0.01), math.log(0.003)])
    confident_stable = torch.tensor([math.log(0.95), math.log(0.9), math.log(0.93)])
    assert confidence_instability(unsure_unstable).value > 0.5 > 0.1 > confidence_instability(confident_stable).value
    assert confidence_prob_instability(unsure_unstable).value < confidence_prob_instability(confident_stable).value
