"""The tests behind the three findings (SPEC "Findings"): what the tool may claim, and on what evidence.

Pure numpy/scipy on per-group values, so the CLI, ``sago-train report`` and the demo scripts call the same
functions:

- :func:`split_halves` / :func:`split_half_reliability` -- *instability is not noise*: each group's variants
  are split into two fixed, seeded, disjoint halves (the same kinds in each half where groups carry kinds); the
  axis computed on each half; Spearman across groups between the halves, Spearman-Brown corrected, with a
  permutation p-value. Needs K >= 4.
- :func:`axis_relations` -- *axes are distinct*: Spearman per set (never pooled over sets), a bootstrap 95%
  CI over groups, Holm-corrected p-values, and a verdict: ``distinct`` only when the CI's largest ``|rho|``
  is below 0.5, ``related`` when the corrected p < alpha, ``inconclusive`` otherwise.
- :func:`reversal_counts` -- *rankings reverse*: pairs of models/checkpoints whose order differs between two
  sets, and separately the robust ones (paired test significant on both sets); headlines use robust flips.

A mean whose CI excludes 0 is never evidence of anything here: every axis is >= 0 by construction.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as _st

from .stats import ALPHA, _JsonMixin, _quiet

__all__ = [
    "ALPHA",
    "DISTINCT_BOUND",
    "MIN_K_SPLIT",
    "Relation",
    "Reliability",
    "axis_relations",
    "holm",
    "reversal_counts",
    "spearman_bootstrap",
    "split_half_reliability",
    "split_halves",
]

DISTINCT_BOUND = 0.5  # "distinct" only when every |rho| in the CI is below this
MIN_K_SPLIT = 4  # two halves of >= 2 variants each: a pairwise axis needs two variants
# Up to this many groups the Spearman p-value is exact (all n! pairings): scipy's t approximation is far off
# there (rho = 1 on 4 groups gives p = 0, where the exact two-sided p is 2/24).
EXACT_SPEARMAN_MAX_N = 8
# Pairs defined from one another: their correlation is a construction, not a finding.
DERIVED_PAIRS = frozenset({frozenset({"activation", "activation_rel"})})
_NAN = float("nan")


# ------------------------------------------------------------------------------------------------ reliability
def split_halves(k: int, group_id: str, seed: int = 0, *, kinds: Sequence[str] | None = None
                 ) -> tuple[list[int], list[int]] | None:
    """A fixed, seeded split of a group's ``k`` variant indices into two disjoint halves (sizes ``k // 2``
    and ``k - k // 2``, each sorted); None when ``k < 4``.

    Without ``kinds`` the split is seeded by the group id. With ``kinds`` (one per variant) it depends on the
    kinds alone: every group with the same kinds puts the same kinds in each half, whatever their order. Where
    one kind moves an axis most (the real sets' ``format`` variants, docs/study.md), an id-seeded split puts
    that kind in half A of some groups and half B of others, so the halves disagree by construction (a strongly
    negative r: the test cannot show reliability however consistent the groups are); a kind-aligned split
    shifts the same half in every group, which Spearman across groups ignores.

    Example:
        >>> split_halves(4, "g1") == split_halves(4, "g1")
        True
        >>> split_halves(3, "g1") is None
        True
        >>> kinds = ["canonical", "paraphrase", "format", "typo"]
        >>> a, _ = split_halves(4, "g1", kinds=kinds)
        >>> b, _ = split_halves(4, "g2", kinds=kinds[::-1])  # another group, its variants in another order
        >>> {kinds[i] for i in a} == {kinds[::-1][i] for i in b}  # the same kinds in half A
        True
    """
    if k < MIN_K_SPLIT:
        return None
    if kinds is None:
        order = list(range(k))
        random.Random(f"sago-split:{seed}:{group_id}").shuffle(order)
    else:
        if len(kinds) != k:
            raise ValueError(f"expected one kind per variant ({k}), got {len(kinds)}")
        names = sorted(set(kinds))
        random.Random(f"sago-split:{seed}:kinds:" + "\x1f".join(names)).shuffle(names)
        rank = {name: i for i, name in enumerate(names)}
        # Variants ordered by their kind's seeded rank (a repeated kind by position), then cut in two.
        order = sorted(range(k), key=lambda i: (rank[kinds[i]], i))
    return sorted(order[: k // 2]), sorted(order[k // 2:])


@dataclass(frozen=True)
class Reliability(_JsonMixin):
    """Split-half reliability of one axis on one set: Spearman ``r`` between the halves across groups, the
    Spearman-Brown corrected ``reliability = 2r / (1 + r)``, a one-sided permutation p-value (is ``r`` larger
    than when one half is shuffled across groups), ``n`` groups used, and a ``note`` when not computed."""

    r: float
    reliability: float
    p_value: float
    n: int
    note: str = ""

    @property
    def corrected(self) -> float | None:
        """The Spearman-Brown value to show, ``None`` when ``r <= 0``: the correction extrapolates a positive
        half-test agreement to the full test; applied to ``r < 0`` it only magnifies disagreement (r = -0.6
        gives -3.0), a number with no reading as a reliability. ``reliability`` keeps the formula's value (NaN
        when not computed, shown as such)."""
        return None if math.isfinite(self.r) and self.r <= 0 else self.reliability

    def verdict(self, alpha: float = ALPHA) -> str:
        """``"not noise"`` when the permutation p < ``alpha`` (the groups' order reproduces across disjoint
        halves of their variants), ``"not shown"`` otherwise, ``"not computed"`` with a note."""
        if self.note or not math.isfinite(self.p_value):
            return "not computed"
        return "not noise" if self.p_value < alpha else "not shown"

    def sentence(self, set_name: str, axis: str, alpha: float = ALPHA) -> str:
        """The claim in words, with the numbers behind it."""
        if self.verdict(alpha) == "not computed":
            return f"{set_name}/{axis}: split-half reliability not computed ({self.note or 'undefined'})"
        sb = f"{self.corrected:.2f}" if self.corrected is not None else "n/a (r <= 0)"
        nums = (f"split-half Spearman r={self.r:.2f}, Spearman-Brown {sb}, permutation "
                f"p={self.p_value:.2g}, n={self.n} groups")
        if self.verdict(alpha) == "not noise":
            return f"{set_name}/{axis}: per-group instability is not noise ({nums})"
        return f"{set_name}/{axis}: per-group instability not shown to differ from noise ({nums})"


def _rank_pearson(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Pearson correlation along ``axis``; on rank-transformed data this is Spearman's rho."""
    xc = x - x.mean(axis=axis, keepdims=True)
    yc = y - y.mean(axis=axis, keepdims=True)
    num = (xc * yc).sum(axis=axis)
    den = np.sqrt((xc * xc).sum(axis=axis) * (yc * yc).sum(axis=axis))
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den


def split_half_reliability(
    half_a: Sequence[float] | np.ndarray,
    half_b: Sequence[float] | np.ndarray,
    *,
    n_permutations: int = 2000,
    seed: int = 0,
) -> Reliability:
    """Spearman between two halves across groups (index i = group i in both), Spearman-Brown corrected, with
    ``scipy.stats.permutation_test`` (half A shuffled across groups against half B, one-sided ``greater``;
    exact when ``n!`` is at most ``n_permutations``). Groups with a NaN in either half are dropped.

    Example:
        >>> rel = split_half_reliability([0.1, 0.2, 0.3, 0.4, 0.5], [0.15, 0.1, 0.35, 0.3, 0.6])
        >>> round(rel.r, 3), round(rel.reliability, 3), round(rel.p_value, 4), rel.n
        (0.8, 0.889, 0.0667, 5)
    """
    a, b = np.asarray(half_a, dtype=np.float64), np.asarray(half_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"expected two 1-D sequences of per-group values of equal length, got {a.shape} and {b.shape}")
    keep = ~(np.isnan(a) | np.isnan(b))
    a, b = a[keep], b[keep]
    n = int(a.size)
    if n < 3:
        return Reliability(_NAN, _NAN, _NAN, n, f"needs at least 3 groups with K >= {MIN_K_SPLIT} variants, got {n}")
    if bool(np.all(a == a[0]) or np.all(b == b[0])):
        return Reliability(_NAN, _NAN, _NAN, n, "constant on a half: no ranking of groups to reproduce")
    ra, rb = _st.rankdata(a), _st.rankdata(b)
    r = float(_rank_pearson(ra, rb))

    def statistic(x: np.ndarray, axis: int = -1) -> np.ndarray:
        return _rank_pearson(x, rb, axis=axis)

    # One sample, "pairings": permutes half A's groups against a fixed half B (all n! orders when n! is at
    # most n_permutations, else a seeded random subset, p then counting the observed order too).
    res = _quiet(_st.permutation_test, (ra,), statistic, permutation_type="pairings", vectorized=True,
                 n_resamples=n_permutations, alternative="greater", rng=np.random.default_rng(seed))
    sb = 2.0 * r / (1.0 + r) if r > -1.0 else _NAN
    return Reliability(r, float(sb), float(res.pvalue), n)


# ------------------------------------------------------------------------------------------------ distinct axes
def spearman_bootstrap(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float, float, int]:
    """Spearman ``rho`` and its two-sided p-value with a percentile-bootstrap CI over groups (pairs resampled
    with replacement; resamples with a constant side are dropped), and ``n``. The p-value is exact (every
    pairing of the groups) up to ``EXACT_SPEARMAN_MAX_N`` groups, else ``scipy.stats.spearmanr``'s.
    Returns ``(rho, p_value, ci_low, ci_high, n)``; NaN where undefined (fewer than 3 groups, a constant axis).
    """
    xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = ~(np.isnan(xa) | np.isnan(ya))
    xa, ya = xa[keep], ya[keep]
    n = int(xa.size)
    if n < 3 or bool(np.all(xa == xa[0]) or np.all(ya == ya[0])):
        return _NAN, _NAN, _NAN, _NAN, n
    res = _quiet(_st.spearmanr, xa, ya)
    p_value = float(res.pvalue)
    if n <= EXACT_SPEARMAN_MAX_N:
        rx, ry = _st.rankdata(xa), _st.rankdata(ya)
        exact = _quiet(_st.permutation_test, (rx,), lambda v, axis=-1: _rank_pearson(v, ry, axis=axis),
                       permutation_type="pairings", vectorized=True, n_resamples=math.factorial(n),
                       alternative="two-sided")
        p_value = float(exact.pvalue)
    idx = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))
    rho_b = _rank_pearson(_st.rankdata(xa[idx], axis=1), _st.rankdata(ya[idx], axis=1), axis=1)
    rho_b = rho_b[np.isfinite(rho_b)]
    alpha = 1.0 - confidence
    lo, hi = (np.quantile(rho_b, [alpha / 2, 1 - alpha / 2]) if rho_b.size else (_NAN, _NAN))
    return float(res.statistic), p_value, float(lo), float(hi), n


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


@dataclass(frozen=True)
class Relation(_JsonMixin):
    """Spearman relation of two axes on one set, with its verdict (see :func:`axis_relations`)."""

    set: str
    axes: tuple[str, str]
    rho: float
    ci_low: float
    ci_high: float
    p_value: float
    p_holm: float
    n: int
    verdict: str  # "distinct", "related", "inconclusive" or "undefined"

    def sentence(self) -> str:
        """The claim in words, with the numbers behind it."""
        a, b = self.axes
        nums = (f"rho={self.rho:.2f}, 95% CI [{self.ci_low:.2f}, {self.ci_high:.2f}], Holm p={self.p_holm:.2g}, "
                f"n={self.n}")
        if self.verdict == "distinct":
            extra = "; weakly related" if self.p_holm < ALPHA else ""
            return f"{self.set}: '{a}' and '{b}' are distinct (|rho| < {DISTINCT_BOUND} across the CI{extra}; {nums})"
        if self.verdict == "related":
            return f"{self.set}: '{a}' and '{b}' are related ({nums})"
        if self.verdict == "inconclusive":
            return f"{self.set}: '{a}' and '{b}': inconclusive, neither distinct nor related ({nums})"
        return f"{self.set}: '{a}' and '{b}': undefined (a constant axis or fewer than 3 groups; n={self.n})"


def axis_relations(
    per_set: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    alpha: float = ALPHA,
    n_resamples: int = 2000,
    seed: int = 0,
) -> list[Relation]:
    """Spearman between every pair of axes within each set (``per_set[set][axis]`` = per-group values, same
    groups and order for every axis of a set), never pooled across sets.

    The Holm correction runs over every (set, pair) tested. Verdict: ``distinct`` when both CI bounds have
    ``|rho| < 0.5`` (no strong correlation is compatible with the data; if also significant, weakly
    related), else ``related`` when the Holm p < ``alpha``, else ``inconclusive``; ``undefined`` for a
    constant axis. Pairs defined from one another (``activation``/``activation_rel``) are left out.
    """
    rows: list[tuple[str, str, str, tuple[float, float, float, float, int]]] = []
    for set_name, axes in per_set.items():
        for a, b in itertools.combinations(list(axes), 2):
            if frozenset({a, b}) in DERIVED_PAIRS:
                continue
            rows.append((set_name, a, b, spearman_bootstrap(axes[a], axes[b], n_resamples=n_resamples, seed=seed)))
    adjusted = holm([r[3][1] for r in rows])
    out = []
    for (set_name, a, b, (rho, p, lo, hi, n)), ph in zip(rows, adjusted):
        if not math.isfinite(rho):
            verdict = "undefined"
        elif max(abs(lo), abs(hi)) < DISTINCT_BOUND:
            verdict = "distinct"
        elif ph < alpha:
            verdict = "related"
        else:
            verdict = "inconclusive"
        out.append(Relation(set_name, (a, b), rho, lo, hi, p, ph, n, verdict))
    return out


# ------------------------------------------------------------------------------------------------ rank reversal
def reversal_counts(flips: Sequence[Mapping[str, Any]], n_models: int) -> dict[str, Any]:
    """Count model/checkpoint pairs (not pair x set-pair entries) whose order differs between two sets, and
    separately those with a robust flip (``flip["robust"]`` True: the paired test was significant on both
    sets). ``unknown`` counts pairs whose flips could not be tested (no per-group records).

    Example:
        >>> f = [{"models": ["a", "b"], "sets": ["x", "y"], "robust": True},
        ...      {"models": ["a", "b"], "sets": ["x", "z"], "robust": False},
        ...      {"models": ["a", "c"], "sets": ["x", "y"], "robust": False}]
        >>> reversal_counts(f, 3)
        {'pairs': 3, 'flipped': 2, 'robust': 1, 'unknown': 0}
    """
    flipped: dict[tuple[str, str], list[Any]] = {}
    for flip in flips:
        flipped.setdefault(tuple(sorted(flip["models"])), []).append(flip.get("robust"))
    robust = sum(any(r is True for r in rs) for rs in flipped.values())
    unknown = sum(not any(r is True for r in rs) and any(r is None for r in rs) for rs in flipped.values())
    return {"pairs": n_models * (n_models - 1) // 2, "flipped": len(flipped), "robust": robust, "unknown": unknown}
