"""Rank evaluations per set and find rank reversals between sets (SPEC "Rank reversal", finding 3).

:func:`compare_evaluations` ranks :class:`~sago_train.compare.Evaluation` objects per set on each axis (lower
= more stable; accuracy: higher is better) with :func:`sago_train.stats.rank_reversal`, and marks a flip
*robust* when a paired test between the two entries is significant on both sets
(:func:`paired_flip_test`). Import these from :mod:`sago_train.compare` as well; this module imports
nothing from it (no import cycle).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from . import findings, stats
from .errors import SagoInputError, unknown_name_error

if TYPE_CHECKING:
    from .compare import Evaluation

__all__ = ["ACCURACY", "ALPHA", "BETWEEN", "INSTABILITY", "available_axes", "compare_evaluations", "ordered_union",
           "paired_flip_test"]

INSTABILITY = "instability"  # the per-group mean of the axes (a convenience scalar, ranked like an axis)
ACCURACY = "accuracy"  # from the correctness summary; higher is better, never folded into stability
# Per group: its mean cosine distance to the other groups' variants (recorded with activation_rel). Not an
# instability: lower means representations pulled together (a collapse), so it is compared, never ranked.
BETWEEN = "between_dispersion"
ALPHA = 0.05  # a rank flip is robust when the two-sided paired test has p < ALPHA on both sets


def ordered_union(lists: Iterable[Iterable[str]]) -> list[str]:
    out: list[str] = []
    for names in lists:
        for n in names:
            if n not in out:
                out.append(n)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Ranking and rank reversal
# ----------------------------------------------------------------------------------------------------------------


def available_axes(evals: Sequence[Evaluation]) -> list[str]:
    """Axes recorded by any evaluation (first-seen order), then ``instability`` when recorded."""
    axes = ordered_union(e.axes[s] for e in evals for s in e.sets)
    if any(INSTABILITY in per_axis for e in evals for per_axis in e.summaries.values()):
        axes.append(INSTABILITY)
    return axes


def paired_flip_test(a: Evaluation, b: Evaluation, set_name: str, axis: str, *, alpha: float = ALPHA,
                     seed: int = 0) -> dict[str, Any] | None:
    """Two-sided paired test of ``a`` vs ``b`` on one set (groups paired by id, Wilcoxon signed-rank):
    ``{"p_value", "mean_diff" (b - a), "n", "significant"}``, or None without per-group records of both."""
    va, vb = a.group_values(set_name, axis), b.group_values(set_name, axis)
    if va is None or vb is None:
        return None
    common = [g for g in va if g in vb]
    if not common:
        return None
    res = stats.paired_comparison([va[g] for g in common], [vb[g] for g in common], alternative="two-sided",
                                  seed=seed, n_resamples=200)
    if res.n == 0:
        return None
    return {"p_value": res.p_value, "mean_diff": res.mean_diff, "n": res.n,
            "significant": bool(res.p_value < alpha)}


def _competition_ranks(means: dict[str, float], higher_is_better: bool) -> dict[str, int]:
    """1 + the number of strictly better entries, so tied entries share a rank (1, 1, 3)."""
    sign = -1.0 if higher_is_better else 1.0
    return {m: 1 + sum(sign * other < sign * v for other in means.values()) for m, v in means.items()}


def compare_evaluations(evals: Sequence[Evaluation], axes: Sequence[str] | None = None) -> dict[str, Any]:
    """Rank evaluations per set on each axis and find rank reversals between sets.

    Returns a JSON-able dict::

        {"entries": [{"label", "path", "kind", "step", "model"}],
         "sets": [...],
         "axes": {AXIS: {"higher_is_better": bool,
                         "scores": {SET: {LABEL: {"mean", "ci_low", "ci_high", "n"}}},
                         "rankings": {SET: [LABEL, ...]},          # best first (ties by name)
                         "ranks": {SET: {LABEL: int}},              # 1 = best; ties share a rank
                         "tau": {SET: {SET: float | None}},         # Kendall's tau between sets
                         "flips": [{"models", "sets", "order", "robust", "tests"}],
                         "reversal": {"pairs", "flipped", "robust", "unknown"}}},
         "notes": [...]}

    A flip is ``robust`` when, on both sets, a two-sided paired Wilcoxon test of the two entries on the
    groups both evaluated (paired by id) has p < 0.05 in the direction of that set's order (None without
    per-group records; each flip's ``tests`` holds the p-values); a non-robust flip may be noise.
    ``reversal`` counts model pairs (not pair x set-pair entries) that flip, and those that flip robustly:
    headlines quote the robust count. ``axes`` defaults to every recorded axis plus ``instability``;
    ``accuracy`` may be asked for (ranked higher = better; per group: the share of variants right).

    Sets that only one entry evaluated are left out (with a note).

    Raises:
        SagoInputError: fewer than 2 evaluations, no set shared by two of them, or an axis that no evaluation
            recorded.
    """
    if len(evals) < 2:
        raise SagoInputError(f"compare needs at least 2 evaluation or run directories, got {len(evals)}")
    labels = [e.label for e in evals]
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must be unique, got {labels} (use load_sources)")
    known = available_axes(evals)
    if axes:
        for a in axes:
            if a not in known and a != ACCURACY:
                raise unknown_name_error("axis", a, [*known, ACCURACY], key="axis")
        chosen = list(dict.fromkeys(axes))
    else:
        chosen = known
    all_sets = ordered_union(e.sets for e in evals)
    notes: list[str] = []
    sets = []
    for s in all_sets:
        have = [e for e in evals if s in e.summaries]
        if len(have) < 2:
            notes.append(f"set '{s}' was evaluated by one entry only ({have[0].label}): left out")
            continue
        sets.append(s)
        counts = {e.label: e.summaries[s].get(e.axes[s][0], {}).get("n") for e in have if e.axes[s]}
        if len({c for c in counts.values() if c is not None}) > 1:
            notes.append(
                f"set '{s}': entries were scored on different numbers of groups ("
                + ", ".join(f"{k}: {v}" for k, v in counts.items())
                + "); their means are not over the same groups"
            )
    if not sets:
        raise SagoInputError(
            "the entries share no variant set, so there is nothing to rank: "
            + "; ".join(f"{e.label}: {', '.join(e.sets)}" for e in evals)
        )
    if len(sets) < 2:
        notes.append("only one set: rankings are shown, but a rank reversal needs at least 2 sets")

    out_axes: dict[str, Any] = {}
    for axis in chosen:
        scores: dict[str, dict[str, dict[str, Any]]] = {}
        for s in sets:
            per_entry = {e.label: sc for e in evals if (sc := e.score(s, axis)) is not None}
            if per_entry:
                scores[s] = per_entry
        if not scores:
            notes.append(f"axis '{axis}' has no values on any set")
            continue
        higher = axis == ACCURACY
        rr = stats.rank_reversal({s: {m: v["mean"] for m, v in per.items()} for s, per in scores.items()},
                                 higher_is_better=higher)
        flips = []
        by_label = {e.label: e for e in evals}
        for flip in rr.flips:
            m1, m2 = flip["models"]
            tests = {s: paired_flip_test(by_label[m1], by_label[m2], s, axis) for s in flip["sets"]}
            # Robust (SPEC "Rank reversal"): the paired test is significant on both sets, in the direction
            # of each set's order (a flip of the means that the per-group differences do not carry is noise).
            if any(t is None for t in tests.values()):
                robust = None
            else:
                m2_better = {s: flip["order"][s][0] == m2 for s in tests}
                agrees = [((t["mean_diff"] < 0) == m2_better[s]) != higher for s, t in tests.items()]
                robust = all(t["significant"] for t in tests.values()) and all(agrees)
            flips.append({**flip, "robust": robust, "tests": tests})
        out_axes[axis] = {
            "higher_is_better": higher,
            "scores": scores,
            "rankings": rr.rankings,
            "ranks": {s: _competition_ranks({m: v["mean"] for m, v in per.items()}, higher)
                      for s, per in scores.items()},
            "tau": rr.tau,
            "flips": flips,
            "reversal": findings.reversal_counts(flips, len({m for per in scores.values() for m in per})),
        }
    entries = [
        {"label": e.label, "path": str(e.path), "kind": e.kind, "step": e.step, "model": e.model} for e in evals
    ]
    return stats.to_jsonable({"entries": entries, "sets": sets, "axes": out_axes, "notes": notes})
