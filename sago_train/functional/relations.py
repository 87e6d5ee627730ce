"""How axes, kinds and sets relate (docs/definitions.md#findings): the effect of the variant kind on instability, the
correlation between axes, and rank reversals between sets. Pure numpy/scipy, like :mod:`.stats`."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from scipy import stats as _st

from .multiplicity import holm, holm_reachable
from .stats import _NAN, ALPHA, _as_1d, _JsonMixin, _quiet

K = TypeVar("K", bound=Hashable)

# ----------------------------------------------------------------------------------------------------------------
# Variant-kind effect
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KindEffect(_JsonMixin):
    """Per-kind means over groups and a test of whether the kind matters (``test``: "friedman", or "none" with
    a ``note`` saying why not).

    ``extreme`` is the kind with the highest mean (the lowest with ``extreme="min"`` in :func:`kind_effect`),
    ``p_posthoc`` its raw post-hoc p-value against each other kind (two-sided Wilcoxon signed-rank across groups,
    1 where the signed ranks lean the other way) and ``p_extreme`` the largest of them Holm-adjusted (over the
    other kinds; over every comparison of the family after :func:`kind_family`): it is named only when that is below alpha too. ``p_min`` is the
    smallest Friedman p-value ``n`` groups can give; ``p_holm``, ``family`` and ``reachable`` come from
    :func:`kind_family` (Holm over the kind tests one command prints; until then a family of one)."""

    kinds: list[str]
    means: dict[str, float]
    statistic: float
    p_value: float
    test: str
    n: int
    note: str = ""
    extreme: str = ""
    p_posthoc: dict[str, float] = dataclasses.field(default_factory=dict)
    p_extreme: float = _NAN
    p_min: float = _NAN
    p_holm: float = _NAN
    family: int = 1
    reachable: bool | None = None

    @property
    def adjusted(self) -> float:
        """The omnibus p-value the claim reads: Holm-adjusted over the family, the raw one for a family of one."""
        return self.p_holm if math.isfinite(self.p_holm) else self.p_value

    def verdict(self, alpha: float = ALPHA) -> str:
        """``"<kind> moves most"`` (the omnibus test and the post-hoc tests all significant), ``"depends on the
        kind"`` (the omnibus test only), ``"not shown"``, ``"not enough groups to test"`` (no data on these groups
        could pass), or ``"not tested"`` (K = 2, or too few groups for any test).

        Example:
            >>> kind_effect([[0.1, 0.2, 0.9]] * 8, ["a", "b", "c"]).verdict()
            'c moves most'
        """
        if self.test != "friedman" or not math.isfinite(self.p_value):
            return "not tested"
        if self.adjusted < alpha:
            return f"{self.extreme} moves most" if self.p_extreme < alpha else "depends on the kind"
        reachable = self.reachable if self.reachable is not None else self.p_min < alpha
        return "not shown" if reachable else "not enough groups to test"


KIND_TEST_K2 = ("not tested with K = 2: a pairwise axis gives both variants of a group the same per-variant "
                "value by construction, so any difference is float noise")


def _posthoc(x: np.ndarray, top: int, extreme: str, kinds: list[str]) -> dict[str, float]:
    """The paired Wilcoxon p that column ``top`` exceeds (``extreme="max"``) or falls below (``"min"``) each
    other column, groups paired by row. Two-sided, because ``top`` was picked by the data (the highest mean): a
    one-sided test in the direction the data chose errs twice as often; signed ranks leaning the other way give
    p = 1."""
    sign = 1.0 if extreme == "max" else -1.0
    out = {}
    for j, kind in enumerate(kinds):
        if j == top:
            continue
        d = sign * (x[:, top] - x[:, j])
        d = d[d != 0]
        if not d.size or float(np.sum(_st.rankdata(np.abs(d)) * np.sign(d))) <= 0:
            out[kind] = 1.0
        else:
            # Exact without ties (up to 50 groups); the normal approximation with its tie correction otherwise
            # (scipy's "auto" runs a permutation test on few tied differences, e.g. right/wrong answers: slow).
            exact = d.size <= 50 and np.unique(np.abs(d)).size == d.size
            out[kind] = float(_quiet(_st.wilcoxon, d, method="exact" if exact else "approx").pvalue)
    return out


def kind_effect(per_variant: Sequence[Sequence[float]] | np.ndarray, kinds: list[str], *,
                extreme: str = "max") -> KindEffect:
    """Per-kind means and a Friedman test across groups, kinds as treatments, with the post-hoc tests of the
    kind with the highest mean (``extreme="max"``: moves most) or the lowest (``"min"``: e.g. accuracy).

    ``per_variant`` is ``[G, K]``: one value per group and variant, column k = kind ``kinds[k]`` in every group.
    Rows with any NaN are dropped (``n`` = rows used). With K >= 3 the test is
    ``scipy.stats.friedmanchisquare`` over the columns (``test="friedman"``). With K == 2 there is no test
    (``test="none"``, NaN statistic and p-value, a ``note``): the manual skips it (docs/definitions.md#statistics) because a pairwise axis gives
    both variants the same value by construction. Fewer than 2 usable groups gives NaN statistic and
    p-value; data with no variation within any group gives statistic 0 and p-value 1.

    Post hoc, ``extreme`` names that kind, ``p_posthoc`` holds its two-sided Wilcoxon p-values against each other
    kind (1 where the signed ranks lean the other way) and ``p_extreme`` the largest of them after Holm over the
    K - 1; ``p_min`` is the Friedman p-value of the most extreme
    data on ``n`` groups (every group ranking the kinds alike: statistic ``n (K - 1)``).

    Raises:
        ValueError: ``per_variant`` is not 2-D, ``kinds`` does not have one unique label per column, K < 2, or
            ``extreme`` is not "max" or "min".

    Example:
        >>> e = kind_effect([[0.1, 0.2, 0.5], [0.2, 0.3, 0.6], [0.0, 0.1, 0.4]], ["canonical", "paraphrase", "typo"])
        >>> e.test, e.n, round(e.means["typo"], 6), round(e.statistic, 6)
        ('friedman', 3, 0.5, 6.0)
    """
    x = np.asarray(per_variant, dtype=np.float64)
    kinds = [str(k) for k in kinds]
    if x.ndim != 2:
        if x.size == 0 and x.ndim == 1:
            x = x.reshape(0, len(kinds))
        else:
            raise ValueError(f"per_variant: expected a [groups, kinds] array, got shape {x.shape}")
    if len(kinds) != x.shape[1]:
        raise ValueError(f"kinds has {len(kinds)} labels but per_variant has {x.shape[1]} columns")
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"kinds must be unique, got {kinds}")
    if len(kinds) < 2:
        raise ValueError(f"a kind effect needs at least 2 kinds, got {len(kinds)}")
    if extreme not in ("max", "min"):
        raise ValueError(f"extreme must be 'max' or 'min', got {extreme!r}")
    x = x[~np.isnan(x).any(axis=1)]
    n = int(x.shape[0])
    means = {k: (float(x[:, i].mean()) if n else _NAN) for i, k in enumerate(kinds)}
    if len(kinds) == 2:
        return KindEffect(kinds, means, _NAN, _NAN, "none", n, KIND_TEST_K2)
    if n < 2:
        return KindEffect(kinds, means, _NAN, _NAN, "friedman", n)
    k = x.shape[1]
    p_min = float(_st.chi2.sf(n * (k - 1), k - 1))
    top = int(np.argmax(x.mean(axis=0)) if extreme == "max" else np.argmin(x.mean(axis=0)))
    if bool(np.all(x == x[:, :1])):
        return KindEffect(kinds, means, 0.0, 1.0, "friedman", n, extreme=kinds[top],
                          p_posthoc={k: 1.0 for i, k in enumerate(kinds) if i != top}, p_extreme=1.0, p_min=p_min)
    res = _quiet(_st.friedmanchisquare, *(x[:, i] for i in range(k)))
    return KindEffect(kinds, means, float(res.statistic), float(res.pvalue), "friedman", n, extreme=kinds[top],
                      p_posthoc=(post := _posthoc(x, top, extreme, kinds)), p_extreme=max(holm(list(post.values()))),
                      p_min=p_min)


def kind_family(effects: Mapping[K, KindEffect], *, alpha: float = ALPHA) -> dict[K, KindEffect]:
    """The kind tests one command prints, corrected together: Holm over every Friedman test run (each with its
    adjusted p, the family size and whether its groups could pass ``alpha`` at all), and Holm over every
    post-hoc comparison of them, so that naming a kind holds the family's rate too (``p_extreme`` = the largest
    adjusted p of that kind's comparisons).

    Example:
        >>> e = kind_effect([[0.1, 0.2, 0.9]] * 8, ["a", "b", "c"])
        >>> fam = kind_family({("s", "activation"): e, ("s", "confidence"): e})
        >>> fam[("s", "activation")].family, round(fam[("s", "activation")].p_holm / e.p_value, 6)
        (2, 2.0)
    """
    tested = [k for k, e in effects.items() if e.test == "friedman" and math.isfinite(e.p_value)]
    p = [effects[k].p_value for k in tested]
    out = dict(effects)
    comparisons = [(k, kind) for k in tested for kind in effects[k].p_posthoc]
    post = dict(zip(comparisons, holm([effects[k].p_posthoc[kind] for k, kind in comparisons])))
    for k, ph, ok in zip(tested, holm(p), holm_reachable(p, [effects[k].p_min for k in tested], alpha)):
        p_extreme = max((post[(k, kind)] for kind in effects[k].p_posthoc), default=_NAN)
        out[k] = dataclasses.replace(effects[k], p_holm=ph, family=len(tested), reachable=ok, p_extreme=p_extreme)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Axis independence
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Correlation(_JsonMixin):
    """Spearman correlation matrix ``rho[i][j]`` (and p-values) between axes ``axes[i]`` and ``axes[j]``."""

    axes: list[str]
    rho: list[list[float]]
    p_value: list[list[float]]
    n: int


def axis_correlation(per_group: Mapping[str, Sequence[float]]) -> Correlation:
    """Spearman correlation matrix of per-group axis values, with p-values.

    ``per_group[axis]`` lists one value per group (same groups, same order for every axis). Groups with a NaN in
    any axis are dropped (``n`` = groups used). Entry (i, j) is ``scipy.stats.spearmanr(axis_i, axis_j)``; the
    diagonal is rho 1, p 0; a constant axis (or fewer than 2 groups) gives NaN off-diagonal entries.

    Raises:
        ValueError: the axes have different lengths.

    Example:
        >>> c = axis_correlation({"activation": [0.1, 0.2, 0.3, 0.4], "generation": [0.4, 0.3, 0.2, 0.1]})
        >>> c.axes, round(c.rho[0][1], 6), c.n
        (['activation', 'generation'], -1.0, 4)
    """
    axes = [str(a) for a in per_group]
    cols = [_as_1d(per_group[a], a) for a in per_group]
    lengths = {a: c.shape[0] for a, c in zip(axes, cols)}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"every axis needs one value per group; lengths differ: {lengths}")
    k = len(axes)
    if k == 0:
        return Correlation([], [], [], 0)
    x = np.stack(cols, axis=1)
    x = x[~np.isnan(x).any(axis=1)]
    n = int(x.shape[0])
    rho = [[1.0 if i == j else _NAN for j in range(k)] for i in range(k)]
    pv = [[0.0 if i == j else _NAN for j in range(k)] for i in range(k)]
    constant = [n < 2 or bool(np.all(x[:, i] == x[0, i])) for i in range(k)]
    for i, j in itertools.combinations(range(k), 2):
        if constant[i] or constant[j]:
            continue
        res = _quiet(_st.spearmanr, x[:, i], x[:, j])
        rho[i][j] = rho[j][i] = float(res.statistic)
        pv[i][j] = pv[j][i] = float(res.pvalue)
    return Correlation(axes, rho, pv, n)


# ----------------------------------------------------------------------------------------------------------------
# Rank reversal
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankReversal(_JsonMixin):
    """Rankings of models per set, Kendall's tau between sets, and the model pairs whose order flips."""

    rankings: dict[str, list[str]]
    tau: dict[str, dict[str, float]]
    flips: list[dict]


def rank_reversal(
    scores: Mapping[str, Mapping[str, float]], *, higher_is_better: bool = False
) -> RankReversal:
    """Rank models on each set and find pairs of models whose order differs between sets.

    ``scores[set][model]`` is the model's mean on that set for one axis (NaN/None = missing). Lower is better by
    default (axes are instabilities); pass ``higher_is_better=True`` for e.g. accuracy.

    - ``rankings[set]``: models best first, ties broken by model name.
    - ``tau[a][b]``: ``scipy.stats.kendalltau`` of the two sets' scores over the models both have (NaN with fewer
      than 2 shared models or constant scores); symmetric, diagonal included.
    - ``flips``: one entry per pair of models ``[a, b]`` (a < b by name) and pair of sets ``[s1, s2]`` (in the
      order of ``scores``) where the strict order is reversed (a tie on either set is not a flip):
      ``{"models": [a, b], "sets": [s1, s2], "order": {s1: [better, worse], s2: [better, worse]}}``, listed by
      model pair, then set pair.

    Example:
        >>> r = rank_reversal({"paraphrase": {"m1": 0.1, "m2": 0.2}, "typo": {"m1": 0.3, "m2": 0.2}})
        >>> r.rankings["typo"], r.flips[0]["order"]
        (['m2', 'm1'], {'paraphrase': ['m1', 'm2'], 'typo': ['m2', 'm1']})
    """
    sets = [str(s) for s in scores]
    table: dict[str, dict[str, float]] = {}
    for s, per_model in zip(sets, scores.values()):
        clean: dict[str, float] = {}
        for model, value in per_model.items():
            v = _NAN if value is None else float(value)
            if not math.isnan(v):
                clean[str(model)] = v
        table[s] = clean

    sign = -1.0 if higher_is_better else 1.0
    rankings = {s: sorted(table[s], key=lambda m, s=s: (sign * table[s][m], m)) for s in sets}

    tau: dict[str, dict[str, float]] = {s: {} for s in sets}
    for i, s1 in enumerate(sets):
        for s2 in sets[i:]:
            common = sorted(set(table[s1]) & set(table[s2]))
            value = _NAN
            if len(common) >= 2:
                a = np.array([table[s1][m] for m in common])
                b = np.array([table[s2][m] for m in common])
                if not (np.all(a == a[0]) or np.all(b == b[0])):
                    value = float(_quiet(_st.kendalltau, a, b).statistic)
            tau[s1][s2] = tau[s2][s1] = value

    def better_first(s: str, m1: str, m2: str) -> list[str] | None:
        d = table[s][m1] - table[s][m2]
        if d == 0:
            return None
        m1_better = (d > 0) if higher_is_better else (d < 0)
        return [m1, m2] if m1_better else [m2, m1]

    flips: list[dict] = []
    models = sorted(set().union(*(table[s].keys() for s in sets))) if sets else []
    for m1, m2 in itertools.combinations(models, 2):
        for s1, s2 in itertools.combinations(sets, 2):
            if not all(m in table[s] for m in (m1, m2) for s in (s1, s2)):
                continue
            o1, o2 = better_first(s1, m1, m2), better_first(s2, m1, m2)
            if o1 is not None and o2 is not None and o1 != o2:
                flips.append({"models": [m1, m2], "sets": [s1, s2], "order": {s1: o1, s2: o2}})
    return RankReversal(rankings, tau, flips)
