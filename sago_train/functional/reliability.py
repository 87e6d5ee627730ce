"""*Instability is not noise* (docs/findings.md): split-half reliability of the per-group values of an axis.

Each group's variants are split into two fixed, seeded, disjoint halves (:func:`split_halves`, K >= 4); the axis
is computed on each half; Spearman across groups between the halves, Spearman-Brown corrected, with a
permutation p-value (:func:`split_half_reliability`); the tests one command prints are corrected together
(:func:`reliability_family`: Holm, ``activation_rel`` counted with ``activation``). Import these from
:mod:`sago_train.functional.findings` as well.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from scipy import stats as _st

from .multiplicity import NOT_ENOUGH_TO_TEST, holm, holm_reachable
from .stats import ALPHA, _JsonMixin, _quiet

__all__ = ["MIN_K_SPLIT", "SAME_FINDING", "Reliability", "rank_pearson", "reliability_family",
           "split_half_reliability", "split_halves"]

MIN_K_SPLIT = 4  # two halves of >= 2 variants each: a pairwise axis needs two variants
# On a half, activation_rel is activation's within-group dispersion over the set's between-group dispersion,
# per layer: a constant of the set, so both rank the groups alike and their reliabilities are one finding. The
# first is tested (its half values depend on that half's variants alone), the second reported as the same.
SAME_FINDING = ("activation", "activation_rel")
_NAN = float("nan")
K = TypeVar("K", bound=Hashable)


# ------------------------------------------------------------------------------------------------ reliability
def split_halves(k: int, group_id: str, seed: int = 0, *, kinds: Sequence[str] | None = None
                 ) -> tuple[list[int], list[int]] | None:
    """A fixed, seeded split of a group's ``k`` variant indices into two disjoint halves (sizes ``k // 2``
    and ``k - k // 2``, each sorted); None when ``k < 4``.

    Without ``kinds`` the split is seeded by the group id. With ``kinds`` (one per variant) it depends on the
    kinds alone: every group with the same kinds puts the same kinds in each half, whatever their order. Where
    one kind moves an axis most (the real sets' ``format`` variants), an id-seeded split puts
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
    than when one half is shuffled across groups), ``n`` groups used, and a ``note`` when not computed.

    ``p_min`` is the smallest p-value the permutation test can give with these groups; ``p_holm``, ``family``
    and ``reachable`` come from :func:`reliability_family` (Holm over the claims one command prints; until then
    the test is a family of one); ``same_as`` names the axis whose test stands for this one."""

    r: float
    reliability: float
    p_value: float
    n: int
    note: str = ""
    p_min: float = _NAN
    p_holm: float = _NAN
    family: int = 1
    reachable: bool | None = None
    same_as: str = ""

    @property
    def corrected(self) -> float | None:
        """The Spearman-Brown value to show, ``None`` when ``r <= 0``: the correction extrapolates a positive
        half-test agreement to the full test; applied to ``r < 0`` it only magnifies disagreement (r = -0.6
        gives -3.0), a number with no reading as a reliability. ``reliability`` keeps the formula's value (NaN
        when not computed, shown as such)."""
        return None if math.isfinite(self.r) and self.r <= 0 else self.reliability

    @property
    def adjusted(self) -> float:
        """The p-value the verdict reads: Holm-adjusted over the family, the raw one for a family of one."""
        return self.p_holm if math.isfinite(self.p_holm) else self.p_value

    def verdict(self, alpha: float = ALPHA) -> str:
        """``"not noise"`` when the family-adjusted p < ``alpha`` (the groups' order reproduces across disjoint
        halves of their variants); ``"not enough groups to test"`` when no data on these groups could reach it;
        ``"not shown"`` otherwise; ``"same finding as <axis>"``; ``"not computed"`` with a note."""
        if self.note or not math.isfinite(self.p_value):
            return "not computed"
        if self.same_as:
            return f"same finding as {self.same_as}"
        if self.adjusted < alpha:
            return "not noise"
        reachable = self.reachable if self.reachable is not None else self.p_min < alpha
        return "not shown" if reachable else NOT_ENOUGH_TO_TEST

    def numbers(self) -> str:
        """The numbers behind the verdict, in words."""
        sb = f"{self.corrected:.2f}" if self.corrected is not None else "n/a (r <= 0)"
        holm_p = f", Holm p={self.adjusted:.2g} over {self.family} tests" if self.family > 1 else ""
        return (f"split-half Spearman r={self.r:.2f}, Spearman-Brown {sb}, permutation p={self.p_value:.2g}"
                f"{holm_p}, n={self.n} groups")

    def sentence(self, set_name: str, axis: str, alpha: float = ALPHA) -> str:
        """The claim in words, with the numbers behind it."""
        verdict = self.verdict(alpha)
        if verdict == "not computed":
            return f"{set_name}/{axis}: split-half reliability not computed ({self.note or 'undefined'})"
        if self.same_as:
            return (f"{set_name}/{axis}: the same finding as {self.same_as} (on a half they differ by a per-layer "
                    f"constant of the set; {self.numbers()})")
        if verdict == "not noise":
            return f"{set_name}/{axis}: per-group instability is not noise ({self.numbers()})"
        if verdict == NOT_ENOUGH_TO_TEST:
            return (f"{set_name}/{axis}: {NOT_ENOUGH_TO_TEST} whether per-group instability is noise (the smallest "
                    f"p {self.n} groups can give, {self.p_min:.2g}, cannot pass alpha {alpha:g} after the "
                    f"correction; {self.numbers()})")
        return f"{set_name}/{axis}: per-group instability not shown to differ from noise ({self.numbers()})"


def rank_pearson(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Pearson correlation along ``axis``; on rank-transformed data this is Spearman's rho."""
    xc = x - x.mean(axis=axis, keepdims=True)
    yc = y - y.mean(axis=axis, keepdims=True)
    num = (xc * yc).sum(axis=axis)
    den = np.sqrt((xc * xc).sum(axis=axis) * (yc * yc).sum(axis=axis))
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den


def _permutation_p_min(n: int, n_permutations: int) -> float:
    """The smallest p-value of scipy's one-sample "pairings" permutation test on ``n`` groups: ``1/n!`` when it
    enumerates every order (``n!`` at most ``n_permutations``), else ``1/(n_permutations + 1)`` (the observed
    order counts)."""
    exact = n <= 12 and math.factorial(n) <= n_permutations
    return 1.0 / math.factorial(n) if exact else 1.0 / (n_permutations + 1)


def split_half_reliability(
    half_a: Sequence[float] | np.ndarray,
    half_b: Sequence[float] | np.ndarray,
    *,
    n_permutations: int = 2000,
    seed: int = 0,
) -> Reliability:
    """Spearman between two halves across groups (index i = group i in both), Spearman-Brown corrected, with
    ``scipy.stats.permutation_test`` (half A shuffled across groups against half B, one-sided ``greater``;
    exact when ``n!`` is at most ``n_permutations``). Groups with a NaN in either half are dropped. One test:
    :func:`reliability_family` corrects a command's tests together.

    Example:
        >>> rel = split_half_reliability([0.1, 0.2, 0.3, 0.4, 0.5], [0.15, 0.1, 0.35, 0.3, 0.6])
        >>> round(rel.r, 3), round(rel.reliability, 3), round(rel.p_value, 4), rel.n, round(rel.p_min, 4)
        (0.8, 0.889, 0.0667, 5, 0.0083)
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
    r = float(rank_pearson(ra, rb))

    def statistic(x: np.ndarray, axis: int = -1) -> np.ndarray:
        return rank_pearson(x, rb, axis=axis)

    # One sample, "pairings": permutes half A's groups against a fixed half B (all n! orders when n! is at
    # most n_permutations, else a seeded random subset, p then counting the observed order too).
    res = _quiet(_st.permutation_test, (ra,), statistic, permutation_type="pairings", vectorized=True,
                 n_resamples=n_permutations, alternative="greater", rng=np.random.default_rng(seed))
    sb = 2.0 * r / (1.0 + r) if r > -1.0 else _NAN
    return Reliability(r, float(sb), float(res.pvalue), n, p_min=_permutation_p_min(n, n_permutations))


def reliability_family(rels: Mapping[K, Reliability], *, alpha: float = ALPHA) -> dict[K, Reliability]:
    """The reliabilities one command prints, corrected together: Holm over every computed test, each with its
    adjusted p, the family size and whether its groups could reach ``alpha`` at all.

    Keys are tuples whose last element is the axis (``(set, axis)``, ``(run, set, axis)``); within one scope
    (the key without the axis) ``activation_rel`` is the same finding as ``activation`` (on a half they differ
    by a per-layer constant of the set): ``activation`` is tested, ``activation_rel`` reported with
    ``same_as="activation"`` and left out of the family (``activation_rel`` is tested when ``activation`` was not
    computed).

    Example:
        >>> r = Reliability(0.9, 0.95, 0.001, 30, p_min=0.0005)
        >>> fam = reliability_family({("s", "activation"): r, ("s", "activation_rel"): r,
        ...                           ("s", "confidence"): Reliability(0.1, 0.18, 0.3, 30, p_min=0.0005)})
        >>> [(k[1], v.verdict(), v.p_holm) for k, v in fam.items()]
        [('activation', 'not noise', 0.002), ('activation_rel', 'same finding as activation', nan), ('confidence', 'not shown', 0.3)]
    """
    out = dict(rels)
    computed = {k for k, v in rels.items() if not v.note and math.isfinite(v.p_value)}
    first, second = SAME_FINDING
    for k in computed:
        stand_in = (*k[:-1], first)  # type: ignore[index]
        if k[-1] == second and stand_in in computed:  # type: ignore[index]
            out[k] = dataclasses.replace(rels[k], same_as=first)
    family = [k for k in computed if not out[k].same_as]
    family.sort(key=list(rels).index)
    p = [rels[k].p_value for k in family]
    adjusted = holm(p)
    reachable = holm_reachable(p, [rels[k].p_min for k in family], alpha)
    for k, ph, ok in zip(family, adjusted, reachable):
        out[k] = dataclasses.replace(rels[k], p_holm=ph, family=len(family), reachable=ok)
    for k in computed - set(family):
        out[k] = dataclasses.replace(out[k], family=len(family))
    return out
