"""Rank evaluations per set and find rank reversals between sets (SPEC "Rank reversal", finding 3).

:func:`compare_evaluations` ranks :class:`~sago_train.analysis.compare.Evaluation` objects per set on each axis (lower
= more stable; accuracy: higher is better) with :func:`sago_train.functional.relations.rank_reversal`, every entry
scored on the groups common to all of them (:mod:`sago_train.analysis.common_groups`), and marks a flip *robust*
when the one verdict rule (:func:`sago_train.functional.stats.paired_verdict`) finds the two entries significantly
different on both sets, in the direction of each set's order (:func:`paired_flip_test`). Import these from
:mod:`sago_train.analysis.compare` as well; this module imports nothing from it (no import cycle).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import SagoInputError, unknown_name_error
from ..functional import findings, relations, stats
from ..functional.axes.registry import higher_is_better
from ..results.evaluation import ACCURACY, BETWEEN, INSTABILITY, Evaluation, ordered_union
from .accuracy_beside import accuracy_beside
from .common_groups import SetScope, scores, set_scope

__all__ = ["ACCURACY", "ALPHA", "BETWEEN", "INSTABILITY", "available_axes", "compare_evaluations", "ordered_union",
           "paired_flip_test"]

ALPHA = stats.ALPHA  # a rank flip is robust when the one verdict rule at ALPHA is significant on both sets


def available_axes(evals: Sequence[Evaluation]) -> list[str]:
    """Axes recorded by any evaluation (first-seen order), then ``instability`` when recorded."""
    axes = ordered_union(s.axes for e in evals for s in e.sets.values())
    if any(s.instability is not None for e in evals for s in e.sets.values()):
        axes.append(INSTABILITY)
    return axes


def paired_flip_test(a: Evaluation, b: Evaluation, set_name: str, axis: str, *, alpha: float = ALPHA,
                     seed: int = 0, ids: Sequence[str] | None = None) -> dict[str, Any] | None:
    """``b`` against ``a`` on one set by the one verdict rule (groups paired by id; only ``ids`` when given):
    ``{"verdict" ("better": b is better), "mean_diff" (b - a), "ci_low", "ci_high", "p_worse", "p_better",
    "p_value" (the smaller one-sided p, the direction the differences lean), "n", "significant"}``, or None
    without per-group records of both."""
    va, vb = a.group_values(set_name, axis), b.group_values(set_name, axis)
    if va is None or vb is None:
        return None
    v = stats.paired_verdict_by_id(va, vb, ids=ids, higher_is_better=higher_is_better(axis), alpha=alpha, seed=seed)
    if v is None or v.n == 0:
        return None
    return {"verdict": v.verdict, "mean_diff": v.mean_diff, "ci_low": v.ci_low, "ci_high": v.ci_high,
            "p_worse": v.p_worse, "p_better": v.p_better, "p_value": min(v.p_worse, v.p_better), "n": v.n,
            "significant": v.significant}


def _competition_ranks(means: dict[str, float], higher_is_better: bool) -> dict[str, int]:
    """1 + the number of strictly better entries, so tied entries share a rank (1, 1, 3)."""
    sign = -1.0 if higher_is_better else 1.0
    return {m: 1 + sum(sign * other < sign * v for other in means.values()) for m, v in means.items()}


def compare_evaluations(evals: Sequence[Evaluation], axes: Sequence[str] | None = None, *,
                        allow_different_groups: bool = False) -> dict[str, Any]:
    """Rank evaluations per set on each axis and find rank reversals between sets.

    Returns a JSON-able dict::

        {"entries": [{"label", "path", "kind", "step", "model"}],
         "sets": [...],
         "scope": [line, ...],                                     # what each set is scored on: say it first
         "groups": {SET: {"common", "n_groups", "dropped": {LABEL: [id, ...]}, "line"}},
         "axes": {AXIS: {"higher_is_better": bool,
                         "scores": {SET: {LABEL: {"mean", "ci_low", "ci_high", "n"}}},
                         "rankings": {SET: [LABEL, ...]},          # best first (ties by name)
                         "ranks": {SET: {LABEL: int}},              # 1 = best; ties share a rank
                         "tau": {SET: {SET: float | None}},         # Kendall's tau between sets
                         "flips": [{"models", "sets", "order", "robust", "tests"}],
                         "reversal": {"pairs", "flipped", "robust", "unknown"}}},
         "accuracy": {"scores", "checks", "notes"},                # beside every ranking (analysis.accuracy_beside)
         "notes": [...]}

    Every entry is scored on the groups of the set that all entries evaluated (recomputed from the per-group
    records when some entry had more; ``scope`` says so, one line per set). Where they cannot be matched (an entry
    without per-group records, or no group in common) it refuses, unless ``allow_different_groups`` ranks each
    entry on its own groups (also said in ``scope``).

    A flip is ``robust`` when, on both sets, the one verdict rule (:func:`paired_flip_test`: one-sided Wilcoxon
    p < 0.05 and the 95% paired-bootstrap CI on the same side, on the common groups paired by id) finds the two
    entries different in the direction of that set's order (None without per-group records; each flip's
    ``tests`` holds the verdicts); a non-robust flip may be noise.
    ``reversal`` counts model pairs (not pair x set-pair entries) that flip, and those that flip robustly:
    headlines quote the robust count. ``axes`` defaults to every recorded axis plus ``instability``;
    ``accuracy`` may be asked for (ranked higher = better; per group: the share of variants right).

    Sets that only one entry evaluated are left out (with a note).

    Raises:
        SagoInputError: fewer than 2 evaluations, no set shared by two of them, an axis that no evaluation
            recorded, or groups that cannot be matched (without ``allow_different_groups``).
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
    scope_lines: list[str] = []
    sets = []
    scopes: dict[str, SetScope] = {}
    have_set: dict[str, list[Evaluation]] = {}
    for s in all_sets:
        have = [e for e in evals if s in e.sets]
        if len(have) < 2:
            scope_lines.append(f"set '{s}' was evaluated by one entry only ({have[0].label}): left out")
            continue
        sets.append(s)
        have_set[s] = have
    if not sets:
        raise SagoInputError(
            "the entries share no variant set, so there is nothing to rank: "
            + "; ".join(f"{e.label}: {', '.join(e.sets)}" for e in evals)
        )
    for s in sets:  # every check before any score is computed
        scopes[s] = set_scope(have_set[s], s, allow_different_groups=allow_different_groups)
    scope_lines = [scopes[s].line for s in sets] + scope_lines
    if len(sets) < 2:
        notes.append("only one set: rankings are shown, but a rank reversal needs at least 2 sets")

    out_axes: dict[str, Any] = {}
    for axis in chosen:
        per_set: dict[str, dict[str, dict[str, Any]]] = {}
        for s in sets:
            per_entry, note = scores(have_set[s], scopes[s], axis)
            if note:
                notes.append(note)
            if per_entry:
                per_set[s] = per_entry
        if not per_set:
            notes.append(f"axis '{axis}' has no values on any set")
            continue
        higher = higher_is_better(axis)
        rr = relations.rank_reversal({s: {m: v.mean for m, v in per.items()} for s, per in per_set.items()},
                                     higher_is_better=higher)
        flips = []
        by_label = {e.label: e for e in evals}
        for flip in rr.flips:
            m1, m2 = flip["models"]
            tests = {s: paired_flip_test(by_label[m1], by_label[m2], s, axis, ids=scopes[s].ids) for s in flip["sets"]}
            # Robust (SPEC "Rank reversal"): the one rule calls m2 better where it ranks first and worse where
            # m1 does (a flip of the means that the per-group differences do not carry is noise).
            if any(t is None for t in tests.values()):
                robust = None
            else:
                robust = all(t["verdict"] == (stats.BETTER if flip["order"][s][0] == m2 else stats.WORSE)
                             for s, t in tests.items())
            flips.append({**flip, "robust": robust, "tests": tests})
        out_axes[axis] = {
            "higher_is_better": higher,
            "scores": per_set,
            "rankings": rr.rankings,
            "ranks": {s: _competition_ranks({m: v.mean for m, v in per.items()}, higher)
                      for s, per in per_set.items()},
            "tau": rr.tau,
            "flips": flips,
            "reversal": findings.reversal_counts(flips, len({m for per in per_set.values() for m in per})),
        }
    entries = [
        {"label": e.label, "path": str(e.path), "kind": e.source, "step": e.step, "model": e.model} for e in evals
    ]
    beside = accuracy_beside(evals, sets, scopes, out_axes, paired_flip_test)  # docs/accuracy.md
    return stats.to_jsonable({"entries": entries, "sets": sets, "scope": scope_lines,
                              "groups": {s: scopes[s].to_dict() for s in sets}, "axes": out_axes,
                              "accuracy": beside, "notes": notes})
