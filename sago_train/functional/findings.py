"""The tests behind the three findings (docs/findings.md): what the tool may claim, and on what evidence.

Pure numpy/scipy on per-group values, so the CLI, ``sago-train report`` and the demo scripts call the same
functions. Each claim holds its error rate for the family of claims one command prints
(:mod:`.multiplicity`):

- :func:`split_halves` / :func:`split_half_reliability` / :func:`reliability_family` -- *instability is not
  noise*: each group's variants are split into two fixed, seeded, disjoint halves; the axis computed on each
  half; Spearman across groups between the halves, Spearman-Brown corrected, with a permutation p-value (needs
  K >= 4); Holm over every (set, axis) a command prints, ``activation_rel`` counted with ``activation``.
- :func:`axis_relations` -- *axes are distinct*: Spearman per set (never pooled over sets); ``distinct`` only
  when ``|rho| < 0.5`` across a bootstrap CI that holds simultaneously for every pair printed (Bonferroni),
  ``related`` when the Holm-corrected p < alpha, ``inconclusive`` otherwise.
- :func:`reversal_counts` -- *rankings reverse*: pairs of models/checkpoints whose order differs between two
  sets, and separately the robust ones (tested in :mod:`sago_train.analysis.ranking`); headlines use robust
  flips.

A mean whose CI excludes 0 is never evidence of anything here: every axis is >= 0 by construction.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as _st

from .multiplicity import NOT_ENOUGH_TO_TEST, bonferroni_confidence, holm, holm_reachable
from .reliability import (
    MIN_K_SPLIT,
    Reliability,
    rank_pearson,
    reliability_family,
    split_half_reliability,
    split_halves,
)
from .stats import _CHUNK_ELEMENTS, ALPHA, _JsonMixin, _quiet

__all__ = [
    "ALPHA",
    "DISTINCT_BOUND",
    "MIN_K_SPLIT",
    "NOT_ENOUGH_TO_TEST",
    "Relation",
    "Reliability",
    "axis_relations",
    "distinct_reachable",
    "holm",
    "reliability_family",
    "reversal_counts",
    "spearman_bootstrap",
    "split_half_reliability",
    "split_halves",
]

DISTINCT_BOUND = 0.5  # "distinct" only when every |rho| in the CI is below this
# Up to this many groups the Spearman p-value is exact (all n! pairings): scipy's t approximation is far off
# there (rho = 1 on 4 groups gives p = 0, where the exact two-sided p is 2/24).
EXACT_SPEARMAN_MAX_N = 8
_RHO_CLIP = 1.0 - 1e-6  # atanh(+-1) is infinite: a resample with a perfect order counts as this
# Pairs defined from one another: their correlation is a construction, not a finding.
DERIVED_PAIRS = frozenset({frozenset({"activation", "activation_rel"})})
_NAN = float("nan")


# ------------------------------------------------------------------------------------------------ distinct axes
def _midranks(v: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Midranks of each group within bootstrap resamples given as ``counts[r, j]`` (copies of group j in
    resample r): the rank ``rankdata`` gives every copy (ties, including tied values, share the mean rank)."""
    order = np.argsort(v, kind="stable")
    sv = v[order]
    new = np.r_[True, sv[1:] != sv[:-1]]
    per_value = np.add.reduceat(counts[:, order], np.flatnonzero(new), axis=1)
    mid = np.cumsum(per_value, axis=1) - (per_value - 1.0) / 2.0
    out = np.empty_like(counts)
    out[:, order] = mid[:, np.cumsum(new) - 1]
    return out


def _bootstrap_rhos(columns: Sequence[np.ndarray], pairs: Sequence[tuple[int, int]], n_resamples: int,
                    seed: int) -> np.ndarray:
    """Spearman's rho of ``columns[a]`` and ``columns[b]`` for each pair on each of ``n_resamples`` resamples of
    the groups (``[n_resamples, len(pairs)]``; the same resamples for every pair, drawn as
    :func:`~sago_train.functional.stats.bootstrap_ci` draws them). Each equals ``spearmanr(x[row], y[row])`` but
    costs O(n) per resample: a resample is the groups with multiplicities, so rho is a count-weighted Pearson of
    midranks, and each column's midranks serve every pair it is in."""
    n = int(columns[0].size)
    rng = np.random.default_rng(seed)
    step = max(1, _CHUNK_ELEMENTS // n)
    out = np.empty((n_resamples, len(pairs)), dtype=np.float64)
    for start in range(0, n_resamples, step):
        stop = min(start + step, n_resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        counts = np.bincount((idx + n * np.arange(stop - start)[:, None]).ravel(), minlength=(stop - start) * n)
        counts = counts.reshape(stop - start, n).astype(np.float64)
        centred = []
        for col in columns:
            r = _midranks(col, counts)
            centred.append(r - (counts * r).sum(axis=1, keepdims=True) / n)
        ss = [(counts * d * d).sum(axis=1) for d in centred]
        with np.errstate(invalid="ignore", divide="ignore"):
            for j, (a, b) in enumerate(pairs):
                out[start:stop, j] = (counts * centred[a] * centred[b]).sum(axis=1) / np.sqrt(ss[a] * ss[b])
    return out


def _spearman_p_min(n: int) -> float:
    """The smallest two-sided Spearman p-value on ``n`` groups: exact (``2/n!``) up to EXACT_SPEARMAN_MAX_N,
    0 beyond (scipy's t approximation reaches 0 at rho = 1)."""
    return 2.0 / math.factorial(n) if n <= EXACT_SPEARMAN_MAX_N else 0.0


def distinct_reachable(n: int, confidence: float) -> bool:
    """Whether ``n`` groups can show ``|rho| < 0.5`` across a ``confidence`` CI at all: the approximate CI of a
    sample with rho = 0 (Fisher's z, standard error ``sqrt(1.06 / (n - 3))`` for Spearman) must fit inside.

    Example:
        >>> distinct_reachable(24, 0.95), distinct_reachable(24, 1 - 0.05 / 27), distinct_reachable(60, 1 - 0.05 / 27)
        (True, False, True)
    """
    if n <= 3:
        return False
    z = float(_st.norm.ppf(0.5 + confidence / 2.0))
    return math.tanh(z * math.sqrt(1.06 / (n - 3))) < DISTINCT_BOUND


def _spearman_point(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray
                    ) -> tuple[float, float, int, np.ndarray, np.ndarray]:
    """``(rho, two-sided p, n, x, y)`` on the groups without a NaN (NaN rho and p when undefined)."""
    xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = ~(np.isnan(xa) | np.isnan(ya))
    xa, ya = xa[keep], ya[keep]
    n = int(xa.size)
    if n < 3 or bool(np.all(xa == xa[0]) or np.all(ya == ya[0])):
        return _NAN, _NAN, n, xa, ya
    res = _quiet(_st.spearmanr, xa, ya)
    p_value = float(res.pvalue)
    if n <= EXACT_SPEARMAN_MAX_N:
        rx, ry = _st.rankdata(xa), _st.rankdata(ya)
        exact = _quiet(_st.permutation_test, (rx,), lambda v, axis=-1: rank_pearson(v, ry, axis=axis),
                       permutation_type="pairings", vectorized=True, n_resamples=math.factorial(n),
                       alternative="two-sided")
        p_value = float(exact.pvalue)
    return float(res.statistic), p_value, n, xa, ya


def _fisher_ci(rho: float, rho_b: np.ndarray, confidence: float) -> tuple[float, float]:
    """``tanh(atanh(rho) +- z * se)``: ``se`` the standard deviation of ``atanh`` over the bootstrap rhos
    (constant resamples, NaN, dropped; |rho| clipped below 1), ``z`` the normal quantile of ``confidence``. On
    Fisher's scale rho's sampling distribution is near normal, so the interval needs only the bootstrap's
    standard error, not its far tails: it holds at the Bonferroni levels of many pairs (99.8% for 27) where a
    percentile interval would rest on a handful of resamples."""
    rho_b = rho_b[np.isfinite(rho_b)]
    if rho_b.size < 2:
        return _NAN, _NAN
    se = float(np.std(np.arctanh(np.clip(rho_b, -_RHO_CLIP, _RHO_CLIP)), ddof=1))
    z = float(_st.norm.ppf(0.5 + confidence / 2.0))
    centre = math.atanh(max(-_RHO_CLIP, min(_RHO_CLIP, rho)))
    return math.tanh(centre - z * se), math.tanh(centre + z * se)


def spearman_bootstrap(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float, float, int]:
    """Spearman ``rho`` and its two-sided p-value with a bootstrap CI over groups (pairs resampled with
    replacement; resamples with a constant side are dropped): ``tanh(atanh(rho) +- z se)``, ``se`` the bootstrap
    standard deviation of ``atanh(rho)``, and ``n``. The p-value is exact (every
    pairing of the groups) up to ``EXACT_SPEARMAN_MAX_N`` groups, else ``scipy.stats.spearmanr``'s.
    Returns ``(rho, p_value, ci_low, ci_high, n)``; NaN where undefined (fewer than 3 groups, a constant axis).

    Example:
        >>> rho, p, lo, hi, n = spearman_bootstrap([1, 2, 3, 4, 5, 6], [2, 1, 4, 3, 6, 5], n_resamples=200)
        >>> round(rho, 3), round(p, 3), lo <= rho <= hi, n
        (0.829, 0.058, True, 6)
    """
    rho, p_value, n, xa, ya = _spearman_point(x, y)
    if not math.isfinite(rho):
        return _NAN, _NAN, _NAN, _NAN, n
    lo, hi = _fisher_ci(rho, _bootstrap_rhos([xa, ya], [(0, 1)], n_resamples, seed)[:, 0], confidence)
    return rho, p_value, lo, hi, n


def _pct(confidence: float) -> str:
    """95%, 99.8%: three significant digits."""
    return f"{100 * confidence:.3g}%"


@dataclass(frozen=True)
class Relation(_JsonMixin):
    """Spearman relation of two axes on one set, with its verdict (see :func:`axis_relations`): the CI holds at
    ``confidence`` for each pair, so that the ``family`` pairs printed hold together at 95%."""

    set: str
    axes: tuple[str, str]
    rho: float
    ci_low: float
    ci_high: float
    p_value: float
    p_holm: float
    n: int
    verdict: str  # "distinct", "related", "inconclusive", "not enough groups to test" or "undefined"
    confidence: float = 0.95
    family: int = 1

    def sentence(self) -> str:
        """The claim in words, with the numbers behind it."""
        a, b = self.axes
        nums = (f"rho={self.rho:.2f}, simultaneous {_pct(self.confidence)} CI [{self.ci_low:.2f}, {self.ci_high:.2f}] "
                f"over {self.family} pair(s), Holm p={self.p_holm:.2g}, n={self.n}")
        if self.verdict == "distinct":
            extra = "; weakly related" if self.p_holm < ALPHA else ""
            return f"{self.set}: '{a}' and '{b}' are distinct (|rho| < {DISTINCT_BOUND} across the CI{extra}; {nums})"
        if self.verdict == "related":
            return f"{self.set}: '{a}' and '{b}' are related ({nums})"
        if self.verdict == "inconclusive":
            return f"{self.set}: '{a}' and '{b}': inconclusive, neither distinct nor related ({nums})"
        if self.verdict == NOT_ENOUGH_TO_TEST:
            return (f"{self.set}: '{a}' and '{b}': {NOT_ENOUGH_TO_TEST} (with {self.n} groups neither 'distinct' nor "
                    f"'related' can pass at this family's error rate; {nums})")
        return f"{self.set}: '{a}' and '{b}': undefined (a constant axis or fewer than 3 groups; n={self.n})"


def axis_relations(
    per_set: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    alpha: float = ALPHA,
    n_resamples: int = 2000,
    seed: int = 0,
) -> list[Relation]:
    """Spearman between every pair of axes within each set (``per_set[set][axis]`` = per-group values, same
    groups and order for every axis of a set), never pooled across sets. One family: every (set, pair) with a
    defined rho (``m`` of them).

    ``related`` when the Holm-corrected p < ``alpha``; ``distinct`` when both bounds of a Bonferroni
    simultaneous CI (each at ``1 - alpha / m``; :func:`spearman_bootstrap`'s interval) have ``|rho| < 0.5`` (no strong correlation is compatible with the data; if also significant, weakly
    related); else ``inconclusive``, or ``not enough groups to test`` where the groups could give neither
    verdict; ``undefined`` for a constant axis. Pairs defined from one another (``activation``/
    ``activation_rel``) are left out.

    Example:
        >>> v = [0.1, 0.4, 0.2, 0.8, 0.5, 0.3, 0.9, 0.7]
        >>> [r.verdict for r in axis_relations({"s": {"a": v, "b": v[::-1], "c": v}}, n_resamples=200)]
        ['inconclusive', 'related', 'inconclusive']
    """
    rows: list[tuple[str, str, str, np.ndarray, np.ndarray]] = []
    for set_name, axes in per_set.items():
        for a, b in itertools.combinations(list(axes), 2):
            if frozenset({a, b}) not in DERIVED_PAIRS:
                rows.append((set_name, a, b, np.asarray(axes[a], float), np.asarray(axes[b], float)))
    point = [_spearman_point(x, y) for *_, x, y in rows]
    defined = [math.isfinite(pt[0]) for pt in point]
    m = sum(defined)
    confidence = bonferroni_confidence(alpha, m)
    p = [pt[1] if ok else _NAN for pt, ok in zip(point, defined)]
    adjusted = holm(p)
    related_ok = holm_reachable(p, [_spearman_p_min(pt[2]) for pt in point], alpha)
    ci = _joint_cis(rows, [pt[0] for pt in point], defined, n_resamples, confidence, seed)
    out = []
    for i, ((set_name, a, b, _, _), (rho, pv, n, _, _)) in enumerate(zip(rows, point)):
        lo, hi = ci.get(i, (_NAN, _NAN))
        if not defined[i]:
            verdict = "undefined"
        elif max(abs(lo), abs(hi)) < DISTINCT_BOUND:
            verdict = "distinct"
        elif adjusted[i] < alpha:
            verdict = "related"
        elif related_ok[i] or distinct_reachable(n, confidence):
            verdict = "inconclusive"
        else:
            verdict = NOT_ENOUGH_TO_TEST
        out.append(Relation(set_name, (a, b), rho, lo, hi, pv, adjusted[i], n, verdict, confidence, m))
    return out


def _joint_cis(rows: Sequence[tuple[str, str, str, np.ndarray, np.ndarray]], rhos: Sequence[float],
               defined: Sequence[bool], n_resamples: int, confidence: float, seed: int
               ) -> dict[int, tuple[float, float]]:
    """The bootstrap CI of each defined row (index -> bounds): rows of one set on the same groups (no NaN in
    either axis, the usual case) share their resamples and each axis' ranks; each CI equals
    :func:`spearman_bootstrap`'s for that pair alone."""
    batches: dict[tuple[str, bytes], list[int]] = {}
    for i, (set_name, _, _, x, y) in enumerate(rows):
        if defined[i]:
            keep = ~(np.isnan(x) | np.isnan(y))
            batches.setdefault((set_name, keep.tobytes()), []).append(i)
    out = {}
    for (_, mask), members in batches.items():
        keep = np.frombuffer(mask, dtype=bool)
        names: dict[str, int] = {}
        columns: list[np.ndarray] = []
        pairs = []
        for i in members:
            _, a, b, x, y = rows[i]
            for name, col in ((a, x), (b, y)):
                if name not in names:
                    names[name] = len(columns)
                    columns.append(col[keep])
            pairs.append((names[a], names[b]))
        rho_b = _bootstrap_rhos(columns, pairs, n_resamples, seed)
        for j, i in enumerate(members):
            out[i] = _fisher_ci(rhos[i], rho_b[:, j], confidence)
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
