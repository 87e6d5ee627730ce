"""Significance levels for a test repeated at every evaluation of a run (early stopping's "looks").

A run that tests at level alpha at each of L looks rejects a true null at some look with a probability up to
L x alpha. Giving look k the level ``a_k``, with the ``a_k`` of all the looks a run can make summing to at most
alpha, bounds that run-level probability by alpha (the union bound), whatever the dependence between looks (they
share a reference and overlap). Pure arithmetic: no I/O, no randomness.
"""

from __future__ import annotations

import math

__all__ = ["SPENDING_HORIZON", "look_level", "unreachable_look"]

#: Without a plan, look k gets alpha * h / ((k + h - 1) * (k + h)): about alpha / (h + 1) at the first look,
#: alpha / (4h - 2) at the h-th, ever smaller later, and the sum over every k >= 1 is exactly alpha (the terms
#: telescope: h * (1 / (k + h - 1) - 1 / (k + h))). h = 10 spreads the level over the first tens of looks.
SPENDING_HORIZON = 10


def look_level(alpha: float, look: int, looks: int | None) -> float:
    """The level of look ``look`` (1-based) of a run that plans ``looks`` of them: ``alpha / looks`` (Bonferroni),
    0 for a look past the plan (it cannot reject, so the plan's sum stays alpha); without a plan (None) the
    spending sequence of :data:`SPENDING_HORIZON`, whose sum over any number of looks is at most alpha.

    Example:
        >>> look_level(0.05, 1, 10), look_level(0.05, 10, 10), look_level(0.05, 11, 10)
        (0.005, 0.005, 0.0)
        >>> round(look_level(0.05, 1, None), 6), round(sum(look_level(0.05, k, None) for k in range(1, 10**5)), 4)
        (0.004545, 0.05)
    """
    if look < 1:
        raise ValueError(f"look counts from 1, got {look}")
    if looks is not None:
        return alpha / looks if look <= looks else 0.0
    h = SPENDING_HORIZON
    return alpha * h / ((look + h - 1) * (look + h))


def unreachable_look(alpha: float, looks: int | None, n: int) -> int | None:
    """The first look whose level a one-sided Wilcoxon test on ``n`` pairs can never reach (its smallest p is
    ``2**-n``, as :func:`~sago_train.functional.verdict_rule.min_groups` says), or None when every planned look can. Without
    a plan the levels keep falling, so some look always is.

    Example:
        >>> unreachable_look(0.05, 20, 16), unreachable_look(0.05, 20, 8), unreachable_look(0.05, None, 8)
        (None, 1, 2)
    """
    smallest_p = 0.5**n
    if looks is not None:
        return None if looks < 1 or smallest_p < look_level(alpha, 1, looks) else 1
    # Solve (k + h - 1)(k + h) >= alpha * h / 2**-n for k, then step onto the exact first k (float rounding).
    h = SPENDING_HORIZON
    c = alpha * h / smallest_p
    look = max(1, math.ceil((math.sqrt(1.0 + 4.0 * c) - 1.0) / 2.0) - h + 1)
    if look > 10**6:
        return look  # past any run's evaluations; exact steps here would take too long for no purpose
    while look > 1 and smallest_p >= look_level(alpha, look - 1, None):
        look -= 1
    while smallest_p < look_level(alpha, look, None):
        look += 1
    return look
