"""Statistics over per-group axis values (docs/definitions.md#statistics).

Pure numpy/scipy: no torch, no I/O. Every function takes per-group values (one float per variant group, NaN where
an axis is undefined for a group), drops the NaNs and reports in ``n`` how many values it used. Random resampling
uses ``numpy.random.default_rng(seed)``, so every result is deterministic for a seed.

- :func:`bootstrap_ci` -- mean over groups with a percentile-bootstrap CI (:class:`Summary`).
- :func:`paired_comparison` -- two evaluations on the same groups: mean difference, paired-bootstrap CI and a
  one-sided Wilcoxon signed-rank p-value (:class:`PairedResult`).
- The rule for "better/worse" ("more/less stable") built on :func:`paired_comparison` is
  :mod:`sago_train.functional.verdict_rule`.
- :func:`crossed_paired_bootstrap` -- two evaluations on a groups x seeds grid: mean difference with a CI that
  resamples groups and seeds independently (training seeds are a second source of variation).
- :func:`kind_effect` -- per-kind means and a Friedman test across groups (:class:`KindEffect`).
- :func:`axis_correlation` -- Spearman correlation matrix of the axes (:class:`Correlation`).
- :func:`rank_reversal` -- rankings per set, Kendall's tau between sets, order flips (:class:`RankReversal`).
- :func:`to_jsonable` -- plain JSON-able dicts/lists (NaN -> None) from any of the above.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as _st

__all__ = [
    "ALPHA",
    "BETTER",
    "NOT_ENOUGH",
    "NO_DIFFERENCE",
    "WORSE",
    "Summary",
    "PairedResult",
    "bootstrap_ci",
    "paired_comparison",
    "crossed_paired_bootstrap",
    "to_jsonable",
]

#: The significance level of every verdict (report, compare, the callback's ``_vs_baseline``/``_vs_best``) unless a
#: caller is given its own (early stopping's ``alpha``).
ALPHA = 0.05
BETTER, WORSE = "better", "worse"
NO_DIFFERENCE = "no significant difference"
NOT_ENOUGH = "not enough groups"
NOT_WORSE = "not significantly worse"
#: A "better" stability verdict on a set whose outputs no longer depend on the question (one answer to most
#: prompts, or none): agreement that says nothing, never "more stable" and never the best.
DEGENERATE = "degenerate outputs"

_ALTERNATIVES = ("greater", "less", "two-sided")
# Upper bound on the number of resampled indices held in memory at once (rows of the bootstrap are drawn in chunks).
_CHUNK_ELEMENTS = 4_000_000
_NAN = float("nan")


# ----------------------------------------------------------------------------------------------------------------
# JSON conversion
# ----------------------------------------------------------------------------------------------------------------


def to_jsonable(obj: Any) -> Any:
    """Convert results (and numpy values) to plain JSON-able Python objects.

    Dataclasses become dicts, tuples and numpy arrays become lists, numpy scalars become ``int``/``float``/``bool``,
    mapping keys become strings, and non-finite floats (NaN, +-inf) become ``None`` so that ``json.dumps(...,
    allow_nan=False)`` succeeds.

    Example:
        >>> to_jsonable({"a": np.float64("nan"), "b": np.arange(2), "c": Summary(0.5, 0.25, 0.75, 4)})
        {'a': None, 'b': [0, 1], 'c': {'mean': 0.5, 'ci_low': 0.25, 'ci_high': 0.75, 'n': 4}}
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return [to_jsonable(v) for v in obj.tolist()]
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        return value if math.isfinite(value) else None
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


class _JsonMixin:
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of the fields (NaN -> None)."""
        return to_jsonable(self)


# ----------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------


def _as_1d(values: Any, name: str) -> np.ndarray:
    """float64 1-D copy of ``values`` (``None`` entries become NaN)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence of per-group values, got shape {arr.shape}")
    return arr


def _check_resampling(n_resamples: int, confidence: float) -> None:
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    if not (0.0 < float(confidence) < 1.0):
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")


def _resampled(n: int, n_resamples: int, seed: int, statistic: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``statistic`` of ``n_resamples`` resamples (with replacement) of ``n`` groups: ``statistic`` maps a
    ``[rows, n]`` block of group indices to one value per row; rows are drawn in fixed-size chunks."""
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK_ELEMENTS // n)
    out = np.empty(n_resamples, dtype=np.float64)
    for start in range(0, n_resamples, rows):
        stop = min(start + rows, n_resamples)
        out[start:stop] = statistic(rng.integers(0, n, size=(stop - start, n)))
    return out


def _percentile_summary(point: float, resampled: np.ndarray, n: int, confidence: float) -> Summary:
    alpha = 1.0 - float(confidence)
    lo, hi = np.quantile(resampled, [alpha / 2.0, 1.0 - alpha / 2.0])
    # The percentile interval brackets the estimate except through Monte Carlo noise or rounding in degenerate
    # data; widen it to include the point estimate so that ci_low <= mean <= ci_high always holds.
    return Summary(point, float(min(lo, point)), float(max(hi, point)), n)


def _summary(x: np.ndarray, n_resamples: int, confidence: float, seed: int) -> Summary:
    n = int(x.shape[0])
    if n == 0:
        return Summary(_NAN, _NAN, _NAN, 0)
    mean = float(x.mean())
    if n == 1 or bool(np.all(x == x[0])):
        value = float(x[0]) if n == 1 else mean
        return Summary(value, value, value, n)
    return _percentile_summary(mean, _resampled(n, n_resamples, seed, lambda idx: x[idx].mean(axis=1)), n, confidence)


def _quiet(func: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a scipy test with its Runtime/User warnings silenced (edge cases are handled by the callers)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        for name in ("ConstantInputWarning", "NearConstantInputWarning", "DegenerateDataWarning"):
            category = getattr(_st, name, None)
            if category is not None:
                warnings.simplefilter("ignore", category)
        return func(*args, **kwargs)


# ----------------------------------------------------------------------------------------------------------------
# Mean and bootstrap CI
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary(_JsonMixin):
    """Mean over groups with a bootstrap confidence interval; ``n`` = number of (non-NaN) values used."""

    mean: float
    ci_low: float
    ci_high: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        """``{"mean", "ci_low", "ci_high", "n"}`` with NaN -> None.

        Example:
            >>> Summary(float("nan"), float("nan"), float("nan"), 0).to_dict()
            {'mean': None, 'ci_low': None, 'ci_high': None, 'n': 0}
        """
        return to_jsonable(self)


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Summary:
    """Mean over groups and a percentile-bootstrap CI of the mean (groups resampled with replacement).

    NaN values are dropped first. No values gives NaN mean/CI and ``n=0``; one value (or constant values) gives
    ``mean == ci_low == ci_high``. The interval is the (alpha/2, 1-alpha/2) quantiles (linear interpolation) of
    ``n_resamples`` resample means, widened if needed to contain the mean.

    Example:
        >>> s = bootstrap_ci([0.1, 0.2, 0.3, float("nan")], seed=0)
        >>> round(s.mean, 6), s.n, s.ci_low <= s.mean <= s.ci_high
        (0.2, 3, True)
    """
    _check_resampling(n_resamples, confidence)
    x = _as_1d(values, "values")
    x = x[~np.isnan(x)]
    return _summary(x, int(n_resamples), float(confidence), seed)


def bootstrap_ratio_ci(
    numerators: Sequence[float] | np.ndarray,
    denominators: Sequence[float] | np.ndarray,
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Summary:
    """``sum(numerators) / sum(denominators)`` with a percentile-bootstrap CI over groups (index i = group i;
    groups resampled with replacement, the ratio recomputed on each resample): accuracy over all variants when
    groups have different numbers of variants (right answers / variants), whose CI must resample whole groups.
    With equal denominators it is :func:`bootstrap_ci` of the per-group ratios (the same resamples).

    Example:
        >>> s = bootstrap_ratio_ci([3, 1, 2], [4, 2, 4], seed=0)
        >>> round(s.mean, 4), s.n, s.ci_low <= s.mean <= s.ci_high
        (0.6, 3, True)
    """
    _check_resampling(n_resamples, confidence)
    num, den = _as_1d(numerators, "numerators"), _as_1d(denominators, "denominators")
    if num.shape != den.shape:
        raise ValueError(f"expected numerators and denominators of equal length, got {num.shape} and {den.shape}")
    if np.any(den <= 0) or np.any(~np.isfinite(den)) or np.any(~np.isfinite(num)):
        raise ValueError("denominators must be finite and > 0 and numerators finite")
    n = int(num.shape[0])
    if n == 0:
        return Summary(_NAN, _NAN, _NAN, 0)
    ratio = float(num.sum() / den.sum())
    if n == 1 or bool(np.all(num / den == num[0] / den[0])):
        return Summary(ratio, ratio, ratio, n)
    resampled = _resampled(n, int(n_resamples), seed, lambda idx: num[idx].sum(axis=1) / den[idx].sum(axis=1))
    return _percentile_summary(ratio, resampled, n, confidence)


# ----------------------------------------------------------------------------------------------------------------
# Paired comparison
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairedResult(_JsonMixin):
    """``after - before`` on the same groups: mean difference, paired-bootstrap CI, Wilcoxon p-value."""

    mean_diff: float
    ci_low: float
    ci_high: float
    p_value: float
    n: int
    alternative: str


def paired_comparison(
    before: Sequence[float] | np.ndarray,
    after: Sequence[float] | np.ndarray,
    *,
    alternative: str = "greater",
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedResult:
    """Compare two evaluations of the same groups (index i of both = the same group).

    ``d = after - before`` (pairs where either value is NaN are dropped); ``mean_diff = mean(d)``; the CI is the
    percentile bootstrap of ``mean(d)`` resampling groups (pairs) with replacement; ``p_value`` is
    ``scipy.stats.wilcoxon(d, alternative=alternative).pvalue``. ``"greater"`` tests that ``after`` is larger,
    i.e. MORE unstable; ``"less"`` the opposite; ``"two-sided"`` either. All-zero differences give
    ``p_value = 1.0``; no usable pair gives NaN everywhere and ``n = 0``.

    Raises:
        ValueError: the two inputs differ in length, or ``alternative`` is unknown.

    Example:
        >>> r = paired_comparison([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.3, 0.5, 0.4, 0.6, 0.7, 0.8])
        >>> round(r.mean_diff, 6), r.n, round(r.p_value, 6)
        (0.2, 6, 0.015625)
    """
    if alternative not in _ALTERNATIVES:
        raise ValueError(f"alternative must be one of {', '.join(_ALTERNATIVES)}; got {alternative!r}")
    _check_resampling(n_resamples, confidence)
    b = _as_1d(before, "before")
    a = _as_1d(after, "after")
    if a.shape[0] != b.shape[0]:
        raise ValueError(
            f"paired_comparison needs the same groups in both evaluations: before has {b.shape[0]} values, "
            f"after has {a.shape[0]}"
        )
    keep = ~(np.isnan(a) | np.isnan(b))
    d = a[keep] - b[keep]
    summary = _summary(d, int(n_resamples), float(confidence), seed)
    if d.shape[0] == 0:
        p = _NAN
    elif bool(np.all(d == 0)):
        p = 1.0
    else:
        p = float(_quiet(_st.wilcoxon, d, alternative=alternative).pvalue)
    return PairedResult(summary.mean, summary.ci_low, summary.ci_high, p, summary.n, alternative)


def crossed_paired_bootstrap(
    before: Sequence[Sequence[float]] | np.ndarray,
    after: Sequence[Sequence[float]] | np.ndarray,
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Summary:
    """``after - before`` on a ``[groups, seeds]`` grid (row i = the same group, column j = the same training
    seed in both): the mean difference and a percentile CI from a crossed bootstrap, which draws groups and
    seeds independently with replacement and averages the difference over every (drawn group, drawn seed)
    cell. With one seed it is the groups bootstrap of :func:`paired_comparison`; with several it also carries
    the variation between training runs, which a per-group mean over seeds would hide.

    Raises:
        ValueError: the grids differ in shape, are not 2-D, or hold a NaN (a missing cell has no pair).

    Example:
        >>> s = crossed_paired_bootstrap([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], [[0.1, 0.3], [0.2, 0.2], [0.3, 0.1]])
        >>> round(s.mean, 6), s.n, s.ci_low <= s.mean <= s.ci_high
        (0.2, 6, True)
    """
    _check_resampling(n_resamples, confidence)
    b = np.asarray(before, dtype=np.float64)
    a = np.asarray(after, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"crossed_paired_bootstrap needs two [groups, seeds] grids of one shape; got {b.shape} "
                         f"and {a.shape}")
    d = a - b
    if np.isnan(d).any():
        raise ValueError("crossed_paired_bootstrap: a cell is NaN; drop the groups (or seeds) that lack a value first")
    n_g, n_s = d.shape
    if d.size == 0:
        return Summary(_NAN, _NAN, _NAN, 0)
    mean = float(d.mean())
    if d.size == 1 or bool(np.all(d == d.flat[0])):
        return Summary(mean, mean, mean, int(d.size))
    rng = np.random.default_rng(seed)
    # A resample's mean over the drawn cells is w_g . d . w_s / (n_g n_s), w = how often each index was drawn.
    w_g = np.stack([np.bincount(rng.integers(0, n_g, n_g), minlength=n_g) for _ in range(n_resamples)])
    w_s = np.stack([np.bincount(rng.integers(0, n_s, n_s), minlength=n_s) for _ in range(n_resamples)])
    resampled = np.einsum("rg,gs,rs->r", w_g, d, w_s) / (n_g * n_s)
    return _percentile_summary(mean, resampled, int(d.size), confidence)
