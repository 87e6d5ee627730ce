"""Family-wise error control for the claims one command prints (docs/findings.md).

Every finding the tool words ("not noise", "related", a robust rank flip, the kind that moves most) is one test of
a family: the claims of that kind one command prints. Each claim is made only when its Holm-adjusted p-value is
below alpha, so the chance of printing at least one false claim of the kind is at most alpha (the family-wise
error rate), whatever the number of sets and axes. Pure numpy:

- :func:`holm` -- Holm-Bonferroni adjusted p-values.
- :func:`holm_reachable` -- whether a test could reach alpha at all with the groups at hand (its smallest
  attainable p-value in place of its own): where it cannot, the output says "not enough groups to test" rather
  than "not shown".
- :func:`bonferroni_confidence` -- the level of each of ``m`` intervals that hold together with ``1 - alpha``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["NOT_ENOUGH_TO_TEST", "bonferroni_confidence", "holm", "holm_reachable"]

#: The words for a claim the groups at hand cannot support at the family's error rate (never a claim, never
#: silence).
NOT_ENOUGH_TO_TEST = "not enough groups to test"
_NAN = float("nan")


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (step-down; monotone; capped at 1), NaN entries kept as NaN and not
    counted in the family.

    Example:
        >>> holm([0.01, 0.04, 0.03])
        [0.03, 0.06, 0.06]
    """
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(p.shape, _NAN)
    ok = np.flatnonzero(~np.isnan(p))
    m = ok.size
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return [round(float(v), 12) if math.isfinite(v) else _NAN for v in out]


def holm_reachable(p_values: Sequence[float], p_min: Sequence[float], alpha: float) -> list[bool]:
    """Whether each test of a Holm family could be rejected at ``alpha`` had its own data been the most extreme
    possible (``p_min[i]``: its smallest attainable p-value with its groups), the others' p-values as observed.
    Holm's adjusted p only grows with any one p-value, so where this is False the test's adjusted p is at least
    ``alpha`` whatever its data: the groups at hand cannot support the claim. NaN p-values are no test (False).

    Example:
        >>> holm_reachable([0.2, 0.3], [1 / 24, 1 / 720], 0.05)  # 4 groups: 1/24 x 2 tests > 0.05
        [False, True]
    """
    p = np.asarray(p_values, dtype=np.float64)
    best = np.minimum(p, np.asarray(p_min, dtype=np.float64))
    ok = ~np.isnan(p) & ~np.isnan(best)
    s = np.sort(p[~np.isnan(p)])
    m = s.size
    # Test i moved to rank r (the others below it unchanged) gets max(prefix[r], (m - r) * best): prefix[r] is
    # the running Holm maximum of the r p-values sorted before it. O(m log m) for thousands of possible flips.
    prefix = np.concatenate([[0.0], np.maximum.accumulate((m - np.arange(m)) * s)])
    r = np.searchsorted(s, np.where(ok, best, 0.0), side="left")
    adjusted = np.minimum(1.0, np.maximum(prefix[r], (m - r) * np.where(ok, best, 1.0)))
    return [bool(ok[i] and adjusted[i] < alpha) for i in range(p.size)]


def bonferroni_confidence(alpha: float, m: int) -> float:
    """The confidence level of each of ``m`` intervals so that all ``m`` cover together with probability at
    least ``1 - alpha`` (Bonferroni: ``1 - alpha / m``; ``m < 1`` counts as 1).

    Example:
        >>> round(bonferroni_confidence(0.05, 10), 6)
        0.995
    """
    return 1.0 - float(alpha) / max(1, int(m))
