"""Family-wise control helpers (docs/findings.md) against plain references: Holm by its definition, and
"could this test reach alpha at all" by trying its most extreme p-value."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sago_train.functional.multiplicity import bonferroni_confidence, holm, holm_reachable


def _holm_by_definition(p: list[float]) -> list[float]:
    """Adjusted p_i = max over the tests ranked at or before i of (m - rank) * p, capped at 1."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    out = [0.0] * m
    for pos, i in enumerate(order):
        out[i] = min(1.0, max((m - r) * p[order[r]] for r in range(pos + 1)))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_holm_matches_its_definition(seed):
    p = list(np.random.default_rng(seed).random(7) ** 3)
    assert holm(p) == pytest.approx(_holm_by_definition(p))


def test_holm_controls_the_family_wise_rate_under_a_global_null():
    # 2000 families of 10 independent uniform p-values: the share with any adjusted p < 0.05 is <= 0.05 (MC SE
    # 0.005), where raw p-values give 1 - 0.95^10 = 0.40.
    p = np.random.default_rng(0).random((2000, 10))
    any_holm = np.mean([min(holm(list(row))) < 0.05 for row in p])
    any_raw = np.mean((p < 0.05).any(axis=1))
    assert any_holm <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 2000)
    assert any_raw == pytest.approx(1 - 0.95**10, abs=0.03)


def test_holm_reachable_is_holm_with_the_most_extreme_p():
    rng = np.random.default_rng(3)
    for trial in range(80):
        p = list(rng.random(5) * 0.2)
        p_min = list(rng.random(5) * 0.05)
        if trial % 2:  # ties, and a p_min above its own p
            p[1] = p[3] = p[0]
            p_min[2] = 0.5
        got = holm_reachable(p, p_min, 0.05)
        for i in range(5):
            trial = list(p)
            trial[i] = min(p[i], p_min[i])
            assert got[i] == (_holm_by_definition(trial)[i] < 0.05)
    # Holm only grows with a p-value: unreachable means the observed test cannot pass either.
    p, p_min = [0.01, 0.2, 0.3], [0.001, 1 / 24, 1 / 24]
    reach = holm_reachable(p, p_min, 0.05)
    assert reach == [True, False, False]
    assert all(h >= 0.05 for h, ok in zip(holm(p), reach) if not ok)
    assert holm_reachable([math.nan, 0.01], [0.001, 0.001], 0.05) == [False, True]


def test_bonferroni_intervals_hold_together():
    assert bonferroni_confidence(0.05, 27) == pytest.approx(1 - 0.05 / 27)
    assert bonferroni_confidence(0.05, 0) == pytest.approx(0.95)
    # 27 independent intervals at that level all cover with probability >= 0.95.
    level = bonferroni_confidence(0.05, 27)
    assert level**27 >= 0.95 and (1 - (1 - level) * 27) == pytest.approx(0.95)
