"""Tests for sago_train.functional.sequential: the per-look levels against their definitions."""

from __future__ import annotations

import math

import pytest
from scipy import stats as sps

from sago_train.functional.sequential import SPENDING_HORIZON, look_level, unreachable_look
from sago_train.functional.verdict_rule import min_groups


def test_planned_looks_share_alpha_and_a_look_past_the_plan_has_none():
    for looks in (1, 7, 50):
        levels = [look_level(0.05, k, looks) for k in range(1, looks + 3)]
        assert levels[:looks] == [0.05 / looks] * looks and levels[looks:] == [0.0, 0.0]
        assert math.fsum(levels) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="from 1"):
        look_level(0.05, 0, 3)


def test_unplanned_levels_follow_the_telescoping_sequence_and_sum_to_alpha():
    h = SPENDING_HORIZON
    levels = [look_level(0.1, k, None) for k in range(1, 100_001)]
    assert levels[:3] == pytest.approx([0.1 * h / ((k + h - 1) * (k + h)) for k in (1, 2, 3)])
    assert all(a > b for a, b in zip(levels, levels[1:]))  # ever stricter
    # Partial sums: alpha * (1 - h / (K + h)) exactly, so no number of looks ever exceeds alpha.
    for k in (1, 10, 1000, 100_000):
        assert math.fsum(levels[:k]) == pytest.approx(0.1 * (1 - h / (k + h)), rel=1e-9)


def test_unreachable_look_is_where_the_smallest_wilcoxon_p_is_not_below_the_level():
    for n in range(1, 20):
        # brute force: the first look whose level the exact one-sided p of n same-sign pairs (2^-n) cannot beat
        k = 1
        while min_groups(look_level(0.05, k, None)) <= n:
            k += 1
        assert unreachable_look(0.05, None, n) == k, n
        smallest = sps.wilcoxon(list(range(1, n + 1)), alternative="greater").pvalue  # = 2^-n
        assert smallest >= look_level(0.05, k, None) and (k == 1 or smallest < look_level(0.05, k - 1, None))
    assert unreachable_look(0.05, 20, 9) is None and unreachable_look(0.05, 20, 8) == 1
    assert unreachable_look(0.05, 0, 1) is None  # no look planned: nothing to reach
    assert unreachable_look(0.05, None, 256) > 10**30  # never, in any run
