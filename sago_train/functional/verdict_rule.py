"""THE rule for "better / worse" ("more / less stable") between two evaluations of the same groups, used by report,
compare, the training callback and early stopping (docs/definitions.md#statistics): :func:`paired_verdict` on
per-group values, :func:`decide` on recorded numbers, :func:`worse_verdict` when only "worse?" is asked, and
:func:`min_groups`, the fewest pairs with which the test can reach its level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

from .stats import (
    _NAN,
    ALPHA,
    BETTER,
    NO_DIFFERENCE,
    NOT_ENOUGH,
    NOT_WORSE,
    WORSE,
    _as_1d,
    _JsonMixin,
    _quiet,
    _summary,
    paired_comparison,
)

__all__ = ["Verdict", "decide", "min_groups", "paired_verdict", "paired_verdict_by_id", "worse_verdict"]



def min_groups(alpha: float = ALPHA) -> int:
    """The fewest pairs with which a one-sided Wilcoxon signed-rank test can reach ``p < alpha``: with n pairs the
    smallest exact p is ``2**-n`` (every difference on one side), so fewer pairs can never show a difference.

    Example:
        >>> min_groups(0.05), min_groups(0.01)
        (5, 7)
    """
    n = 1
    while 0.5**n >= alpha:
        n += 1
    return n


@dataclass(frozen=True)
class Verdict(_JsonMixin):
    """The paired comparison of ``after`` against ``before`` and what may be said about it (see :func:`decide`).

    ``mean_diff`` = mean of ``after - before`` in the axis' own units with its ``1 - alpha`` paired-bootstrap CI;
    ``p_worse`` / ``p_better`` are the one-sided Wilcoxon signed-rank p-values that ``after`` is worse / better
    (the direction from ``higher_is_better``); ``n`` = pairs used.
    """

    verdict: str
    mean_diff: float
    ci_low: float
    ci_high: float
    p_worse: float
    p_better: float
    n: int
    alpha: float
    min_delta: float
    higher_is_better: bool

    @property
    def significant(self) -> bool:
        """``verdict`` is ``"better"`` or ``"worse"``."""
        return self.verdict in (BETTER, WORSE)

    def words(self, better: str = "more stable", worse: str = "less stable") -> str:
        """The verdict in words: ``better`` / ``worse`` for a significant change, else the verdict itself (with
        the number of groups needed when there were too few)."""
        if self.verdict == BETTER:
            return better
        if self.verdict == WORSE:
            return worse
        if self.verdict == NOT_ENOUGH:
            return f"{NOT_ENOUGH} ({self.n}; a paired test at alpha {self.alpha:g} needs >= {min_groups(self.alpha)})"
        return self.verdict


def decide(mean_diff: float, ci_low: float, ci_high: float, p_worse: float, p_better: float, n: int, *,
           higher_is_better: bool = False, alpha: float = ALPHA, min_delta: float = 0.0) -> str:
    """THE rule, from the numbers of a paired comparison (``after - before``; see :func:`paired_verdict`).

    - ``"not enough groups"`` when ``n < min_groups(alpha)``: no paired test could reach ``alpha``;
    - ``"worse"`` when ``p_worse < alpha`` AND the CI excludes 0 on the worse side AND the change in the worse
      direction is at least ``min_delta``; ``"better"`` likewise on the other side;
    - else ``"no significant difference"`` (a NaN p-value or bound never counts as significant).

    Both conditions, because each can pass alone: the rank test can reject while one large opposite difference
    keeps the mean's CI around 0, and a CI can exclude 0 by a resampling fluke. The CI is the one displayed beside
    the verdict (two-sided, ``1 - alpha``), so a verdict never sits beside an interval that spans 0; it also
    makes one rule serve a direction chosen in advance (early stopping asks "worse?") and an undirected
    comparison (report, compare), which therefore never disagree on the same numbers.

    Example:
        >>> decide(0.005, -0.11, 0.07, 0.017, 0.98, 12)  # Wilcoxon alone would say "worse"
        'no significant difference'
        >>> decide(0.1, 0.05, 0.15, 0.001, 0.999, 12), decide(0.1, 0.05, 0.15, 0.001, 0.999, 4)
        ('worse', 'not enough groups')
    """
    if n < min_groups(alpha):
        return NOT_ENOUGH
    sign = -1.0 if higher_is_better else 1.0  # sign * difference > 0 means worse
    worse_side = ci_low > 0 if sign > 0 else ci_high < 0
    better_side = ci_high < 0 if sign > 0 else ci_low > 0
    if p_worse < alpha and worse_side and sign * mean_diff >= min_delta:
        return WORSE
    if p_better < alpha and better_side and -sign * mean_diff >= min_delta:
        return BETTER
    return NO_DIFFERENCE


def paired_verdict_by_id(
    before: Mapping[str, float],
    after: Mapping[str, float],
    *,
    ids: Sequence[str] | None = None,
    higher_is_better: bool = False,
    alpha: float = ALPHA,
    min_delta: float = 0.0,
    n_resamples: int = 2000,
    seed: int = 0,
) -> Verdict | None:
    """:func:`paired_verdict` of two ``{group id: value}`` maps on the ids both have (only ``ids`` when given,
    in ``after``'s order); None when they share no id.

    Example:
        >>> paired_verdict_by_id({"a": 0.1, "b": 0.2}, {"c": 0.3}) is None
        True
    """
    allowed = None if ids is None else set(ids)
    common = [g for g in after if g in before and (allowed is None or g in allowed)]
    if not common:
        return None
    return paired_verdict(np.array([before[g] for g in common], float), np.array([after[g] for g in common], float),
                          higher_is_better=higher_is_better, alpha=alpha, min_delta=min_delta,
                          n_resamples=n_resamples, seed=seed)


def paired_verdict(
    before: Sequence[float] | np.ndarray,
    after: Sequence[float] | np.ndarray,
    *,
    higher_is_better: bool = False,
    alpha: float = ALPHA,
    min_delta: float = 0.0,
    n_resamples: int = 2000,
    seed: int = 0,
) -> Verdict:
    """Compare ``after`` with ``before`` on the same groups (index i of both = the same group; pairs with a NaN
    are dropped) and apply :func:`decide`. The direction comes from the caller (the axis registry's
    ``higher_is_better``: instabilities are lower-is-better, so "better" = "more stable").

    Raises:
        ValueError: the inputs differ in length, ``alpha`` is not in (0, 1), or ``min_delta`` is negative.

    Example:
        >>> v = paired_verdict([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.3, 0.5, 0.4, 0.6, 0.7, 0.8])
        >>> v.verdict, v.words(), round(v.p_worse, 6)
        ('worse', 'less stable', 0.015625)
    """
    if not (0.0 < float(alpha) < 1.0):
        raise ValueError(f"alpha must be strictly between 0 and 1, got {alpha!r}")
    if not (math.isfinite(float(min_delta)) and min_delta >= 0):
        raise ValueError(f"min_delta must be a finite number >= 0, got {min_delta!r}")
    worse_alt, better_alt = ("less", "greater") if higher_is_better else ("greater", "less")
    res = paired_comparison(before, after, alternative=worse_alt, n_resamples=n_resamples,
                            confidence=1.0 - float(alpha), seed=seed)
    if res.n == 0:
        p_better = _NAN
    elif res.p_value == 1.0 and res.ci_low == res.ci_high == 0.0:
        p_better = 1.0  # every difference is 0
    else:
        a, b = _as_1d(after, "after"), _as_1d(before, "before")
        d = (a - b)[~(np.isnan(a) | np.isnan(b))]
        p_better = float(_quiet(_st.wilcoxon, d, alternative=better_alt).pvalue)
    verdict = decide(res.mean_diff, res.ci_low, res.ci_high, res.p_value, p_better, res.n,
                     higher_is_better=higher_is_better, alpha=alpha, min_delta=min_delta)
    return Verdict(verdict, res.mean_diff, res.ci_low, res.ci_high, res.p_value, p_better, res.n, float(alpha),
                   float(min_delta), bool(higher_is_better))


def worse_verdict(
    before: Sequence[float] | np.ndarray,
    after: Sequence[float] | np.ndarray,
    *,
    higher_is_better: bool = False,
    alpha: float = ALPHA,
    min_delta: float = 0.0,
    n_resamples: int = 2000,
    seed: int = 0,
) -> Verdict:
    """:func:`paired_verdict` asked one question chosen in advance, "is ``after`` worse?" (early stopping's): the
    same rule (:func:`decide`) on the same numbers, so ``verdict == "worse"`` exactly when :func:`paired_verdict`
    says so. Only what that answer needs is computed: the bootstrap CI only once the mean is worse by at least
    ``min_delta`` and ``p_worse < alpha`` (else the bounds are NaN), and ``p_better`` never (NaN). Any other
    answer is ``"not significantly worse"`` (it may be better) or ``"not enough groups"``.

    Example:
        >>> v = worse_verdict([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.3, 0.5, 0.4, 0.6, 0.7, 0.8])
        >>> v.verdict, round(v.p_worse, 6), v.ci_low > 0
        ('worse', 0.015625, True)
        >>> worse_verdict([0.3, 0.5, 0.4, 0.6, 0.7, 0.8], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]).verdict
        'not significantly worse'
    """
    if not (0.0 < float(alpha) < 1.0):
        raise ValueError(f"alpha must be strictly between 0 and 1, got {alpha!r}")
    if not (math.isfinite(float(min_delta)) and min_delta >= 0):
        raise ValueError(f"min_delta must be a finite number >= 0, got {min_delta!r}")
    b, a = _as_1d(before, "before"), _as_1d(after, "after")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"worse_verdict needs the same groups in both: before has {b.shape[0]} values, after has "
                         f"{a.shape[0]}")
    d = (a - b)[~(np.isnan(a) | np.isnan(b))]
    n = int(d.shape[0])
    mean = float(d.mean()) if n else _NAN
    sign = -1.0 if higher_is_better else 1.0
    p_worse, low, high = _NAN, _NAN, _NAN
    if n >= min_groups(alpha) and sign * mean >= min_delta and sign * mean > 0:
        # Both sides of the rule are needed only when the cheaper ones already point to "worse".
        p_worse = float(_quiet(_st.wilcoxon, d, alternative="less" if higher_is_better else "greater").pvalue)
        if p_worse < alpha:
            ci = _summary(d, int(n_resamples), 1.0 - float(alpha), seed)
            low, high = ci.ci_low, ci.ci_high
    verdict = decide(mean, low, high, p_worse, _NAN, n, higher_is_better=higher_is_better, alpha=alpha,
                     min_delta=min_delta)
    return Verdict(NOT_WORSE if verdict == NO_DIFFERENCE else verdict, mean, low, high, p_worse, _NAN, n,
                   float(alpha), float(min_delta), bool(higher_is_better))
