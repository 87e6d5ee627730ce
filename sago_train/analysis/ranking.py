"""Rank evaluations per set and find rank reversals between sets (docs/definitions.md#findings, finding 3).

:func:`compare_evaluations` ranks :class:`~sago_train.analysis.compare.Evaluation` objects per set on each axis (lower
= more stable; accuracy: higher is better) with :func:`sago_train.functional.relations.rank_reversal`, every entry
scored on the groups common to all of them (:mod:`sago_train.analysis.common_groups`), and marks a flip *robust*
when the paired tests on both sets (:func:`paired_flip_test`) show the reversal with family-wise control over
every pair x set pair x axis tested (docs/findings.md). :func:`reversal_headline` words the result. Import these
from :mod:`sago_train.analysis.compare` as well; this module imports nothing from it (no import cycle).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from ..errors import SagoInputError, unknown_name_error
from ..functional import findings, relations, stats, verdict_rule
from ..functional.axes.registry import higher_is_better
from ..functional.multiplicity import NOT_ENOUGH_TO_TEST, holm, holm_reachable
from ..results.compare import Change
from ..results.evaluation import ACCURACY, BETWEEN, INSTABILITY, Evaluation, ordered_union
from .accuracy_beside import accuracy_beside
from .common_groups import SetScope, scores, set_scope

__all__ = ["ACCURACY", "ALPHA", "BETWEEN", "INSTABILITY", "available_axes", "compare_evaluations", "ordered_union",
           "paired_flip_test", "reversal_headline"]

ALPHA = stats.ALPHA  # the family-wise error rate of the robust flips one command prints
#: Flips are corrected together over these families: every axis, and apart ``instability`` (a mean of the other
#: axes, so its flips repeat theirs: reported on their own line, never in the headline).
AXES_FAMILY, INSTABILITY_FAMILY = "axes", INSTABILITY


def available_axes(evals: Sequence[Evaluation]) -> list[str]:
    """Axes recorded by any evaluation (first-seen order), then ``instability`` when recorded."""
    axes = ordered_union(s.axes for e in evals for s in e.sets.values())
    if any(s.instability is not None for e in evals for s in e.sets.values()):
        axes.append(INSTABILITY)
    return axes


def paired_flip_test(a: Evaluation, b: Evaluation, set_name: str, axis: str, *, alpha: float = ALPHA,
                     seed: int = 0, ids: Sequence[str] | None = None) -> dict[str, Any] | None:
    """``b`` against ``a`` on one set by the one verdict rule (groups paired by id; only ``ids`` when given): the
    :meth:`~sago_train.results.compare.Change.to_dict` of the change (``"verdict"`` "better": b is better,
    ``"mean_diff"`` b - a, ``"p_worse"``, ``"p_better"``, ...) with ``"significant"``, or None without per-group
    records of both."""
    va, vb = a.group_values(set_name, axis), b.group_values(set_name, axis)
    if va is None or vb is None:
        return None
    # The CI's resamples: the fewer of the two evaluations' own (2000 unless they were made with fewer).
    n_resamples = min(a.sets[set_name].n_bootstrap, b.sets[set_name].n_bootstrap)
    v = verdict_rule.paired_verdict_by_id(va, vb, ids=ids, higher_is_better=higher_is_better(axis), alpha=alpha,
                                   n_resamples=n_resamples, seed=seed)
    if v is None or v.n == 0:
        return None
    change = Change.of(v, axis, set_name, a.step)
    return {**change.to_dict(), "significant": change.significant}


def _competition_ranks(means: dict[str, float], higher_is_better: bool) -> dict[str, int]:
    """1 + the number of strictly better entries, so tied entries share a rank (1, 1, 3)."""
    sign = -1.0 if higher_is_better else 1.0
    return {m: 1 + sum(sign * other < sign * v for other in means.values()) for m, v in means.items()}


def _ranks(per_entry: dict[str, Any], higher_is_better: bool) -> dict[str, int]:
    return _competition_ranks({m: v.mean for m, v in per_entry.items()}, higher_is_better)


def _flip_p(flip: dict[str, Any], tests: dict[str, dict[str, Any] | None]) -> float | None:
    """The p-value of "the order reverses": the larger of the two one-sided p-values, each in the direction of
    its set's order (an intersection-union test: the reversal needs both); None when a side is untested."""
    m2 = flip["models"][1]
    if any(t is None for t in tests.values()):
        return None
    return max(t["p_better"] if flip["order"][s][0] == m2 else t["p_worse"] for s, t in tests.items())  # type: ignore[index]


def _n_testable(per_set: dict[str, dict[str, Any]], axis: str, have_set: dict[str, list[Evaluation]],
                scopes: dict[str, SetScope]) -> int:
    """The flips that could have been claimed on this axis: every entry pair x set pair where both entries have
    per-group records on both sets. Pairs whose means do not flip count too: they were chances for a claim, so
    the correction covers them (counting only the flips seen would let the correction shrink with the data)."""
    ok = {s: {e.label for e in have_set[s] if e.label in per and e.group_values(s, axis) is not None}
          for s, per in per_set.items()}
    labels = sorted(set().union(*ok.values())) if ok else []
    sets = list(per_set)
    return sum(all(m in ok[s] for m in pair for s in sp)
               for pair in itertools.combinations(labels, 2) for sp in itertools.combinations(sets, 2))


def _correct_flips(flips: list[dict[str, Any]], m: int, alpha: float = ALPHA) -> dict[str, Any]:
    """Holm over the ``m`` flips that could have been claimed (those seen, and p = 1 for the rest), in place:
    each flip gets ``p_holm``, ``robust`` (True when ``p_holm < alpha`` and the one verdict rule calls each side
    in the direction of its set's order; None untested) and ``verdict`` ("robust", "not robust", "not enough
    groups to test", "untested")."""
    seen = [f for f in flips if f["p_flip"] is not None]
    p = [f["p_flip"] for f in seen] + [1.0] * max(0, m - len(seen))
    p_min = [max(0.5 ** t["n"] for t in f["tests"].values()) for f in seen] + [1.0] * (len(p) - len(seen))
    adjusted, reachable = holm(p), holm_reachable(p, p_min, alpha)
    for f in flips:
        f["p_holm"], f["robust"], f["verdict"] = None, None, "untested"
    for f, ph, ok in zip(seen, adjusted, reachable):
        m2 = f["models"][1]
        directed = all(t["verdict"] == (stats.BETTER if f["order"][s][0] == m2 else stats.WORSE)
                       for s, t in f["tests"].items())
        f["p_holm"], f["robust"] = ph, bool(ph < alpha and directed)
        f["verdict"] = "robust" if f["robust"] else ("not robust" if ok else NOT_ENOUGH_TO_TEST)
    return {"tested": m, "alpha": alpha, "robust": sum(f["robust"] is True for f in flips)}


def compare_evaluations(evals: Sequence[Evaluation], axes: Sequence[str] | None = None, *,
                        allow_different_groups: bool = False) -> dict[str, Any]:
    """Rank evaluations per set on each axis and find rank reversals between sets.

    Returns a JSON-able dict::

        {"entries": [{"label", "path", "kind", "step", "model"}],
         "sets": [...],
         "scope": [line, ...],                                     # what each set is scored on: say it first
         "groups": {SET: {"common", "n_groups", "dropped": {LABEL: [id, ...]}, "line"}},
         "axes": {AXIS: {"higher_is_better": bool,
                         "family": "axes" | "instability",          # which correction covers its flips
                         "scores": {SET: {LABEL: {"mean", "ci_low", "ci_high", "n"}}},
                         "rankings": {SET: [LABEL, ...]},          # best first (ties by name)
                         "ranks": {SET: {LABEL: int}},              # 1 = best; ties share a rank
                         "tau": {SET: {SET: float | None}},         # Kendall's tau between sets
                         "flips": [{"models", "sets", "order", "tests", "p_flip", "p_holm", "robust",
                                    "verdict", "top_change", "family"}],
                         "reversal": {"pairs", "flipped", "robust", "unknown"}}},
         "families": {"axes" | "instability": {"tested", "alpha", "robust"}},
         "accuracy": {"scores", "checks", "notes"},                # beside every ranking (analysis.accuracy_beside)
         "notes": [...]}

    Every entry is scored on the groups of the set that all entries evaluated (recomputed from the per-group
    records when some entry had more; ``scope`` says so, one line per set). Where they cannot be matched (an entry
    without per-group records, or no group in common) it refuses, unless ``allow_different_groups`` ranks each
    entry on its own groups (also said in ``scope``).

    A flip's p-value ``p_flip`` is the larger of its two one-sided paired Wilcoxon p-values (:func:`paired_flip_test`,
    on the common groups paired by id), each in the direction of its set's order: the reversal needs both. It is
    ``robust`` when that p, Holm-corrected over every entry pair x set pair x axis that could have flipped
    (``families[...]["tested"]``; flips not seen count with p = 1), is below alpha and the one verdict rule
    (p < 0.05 and the 95% paired-bootstrap CI on the same side) calls each side in its set's direction; so the
    chance that a comparison prints any robust flip when no two entries truly differ is at most alpha (None
    without per-group records; ``verdict`` also says "not enough groups to test" where the groups could not
    pass). ``instability``, a mean of the other axes, is corrected on its own and kept out of the headline.
    ``top_change``: the flip's two entries are each first on their set. ``reversal`` counts model pairs (not
    pair x set-pair entries) that flip, and those that flip robustly; :func:`reversal_headline` words it. ``axes`` defaults to every recorded axis plus ``instability``;
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
    by_label = {e.label: e for e in evals}
    cache: dict[tuple[str, str, str, str], dict[str, Any] | None] = {}
    tested: dict[str, int] = {}

    def test(m1: str, m2: str, s: str, axis: str) -> dict[str, Any] | None:
        """Each (pair, set, axis) once, however many set pairs it flips in."""
        if (m1, m2, s, axis) not in cache:
            cache[(m1, m2, s, axis)] = paired_flip_test(by_label[m1], by_label[m2], s, axis, ids=scopes[s].ids)
        return cache[(m1, m2, s, axis)]

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
        family = INSTABILITY_FAMILY if axis == INSTABILITY else AXES_FAMILY
        flips = []
        for flip in rr.flips:
            m1, m2 = flip["models"]
            tests = {s: test(m1, m2, s, axis) for s in flip["sets"]}
            flips.append({**flip, "tests": tests, "family": family, "p_flip": _flip_p(flip, tests),
                          "top_change": all(_ranks(per_set[s], higher)[flip["order"][s][0]] == 1 for s in flip["sets"])})
        tested[family] = tested.get(family, 0) + _n_testable(per_set, axis, have_set, scopes)
        out_axes[axis] = {
            "higher_is_better": higher,
            "family": family,
            "scores": per_set,
            "rankings": rr.rankings,
            "ranks": {s: _ranks(per, higher) for s, per in per_set.items()},
            "tau": rr.tau,
            "flips": flips,
        }
    families = {name: _correct_flips([f for r in out_axes.values() if r["family"] == name for f in r["flips"]], m)
                for name, m in tested.items()}
    for r in out_axes.values():
        r["reversal"] = findings.reversal_counts(r["flips"], len({m for per in r["scores"].values() for m in per}))
    entries = [
        {"label": e.label, "path": str(e.path), "kind": e.source, "step": e.step, "model": e.model} for e in evals
    ]
    beside = accuracy_beside(evals, sets, scopes, out_axes, paired_flip_test)  # docs/accuracy.md
    return stats.to_jsonable({"entries": entries, "sets": sets, "scope": scope_lines,
                              "groups": {s: scopes[s].to_dict() for s in sets}, "axes": out_axes,
                              "families": families, "accuracy": beside, "notes": notes})


def _flip_text(axis: str, f: dict[str, Any]) -> str:
    s1, s2 = f["sets"]
    return f"{f['order'][s1][0]} beats {f['order'][s1][1]} on '{s1}', the reverse on '{s2}' ({axis})"


def reversal_headline(result: dict[str, Any]) -> list[str]:
    """The claims of :func:`compare_evaluations` about rank reversals, in words, headline first: "the best entry
    depends on the set" only when the top entry changes robustly (the entries first on two sets flip robustly),
    else "the order of A and B reverses" for a robust flip; then one line per axis that flips, and
    ``instability`` apart. Empty with fewer than 2 sets or no flip.

    Example:
        >>> reversal_headline({"sets": ["x"], "axes": {}, "families": {}})
        []
    """
    if len(result["sets"]) < 2:
        return []
    families = result.get("families", {})
    flips = [(axis, f) for axis, r in result["axes"].items() if r.get("family", AXES_FAMILY) == AXES_FAMILY
             for f in r["flips"]]
    lines = []
    if flips:
        m = families.get(AXES_FAMILY, {}).get("tested", 0)
        robust = [(a, f) for a, f in flips if f["robust"] is True]
        counted = f"{len(flips)} rank flip(s) in the means"
        how = f"paired tests on both sets, Holm-corrected over the {m} flips that could occur"
        top = [(a, f) for a, f in robust if f.get("top_change")]
        if top:
            axis, f = top[0]
            s1, s2 = f["sets"]
            lines.append(f"{counted}, {len(robust)} robust ({how}): the best entry depends on the set: "
                         f"{f['order'][s1][0]} is first on '{s1}', {f['order'][s2][0]} on '{s2}' ({axis}).")
        elif robust:
            axis, f = robust[0]
            more = f"; {len(robust) - 1} more robust flip(s) below" if len(robust) > 1 else ""
            lines.append(f"{counted}, {len(robust)} robust ({how}): the order of {f['models'][0]} and "
                         f"{f['models'][1]} reverses between '{f['sets'][0]}' and '{f['sets'][1]}' ({axis}){more}; "
                         "the top entry does not change robustly.")
        elif any(f["robust"] is None for _, f in flips):
            untested = sum(f["robust"] is None for _, f in flips)
            lines.append(f"{counted}, {untested} untested (no per-group records): whether the order of the entries "
                         "depends on the variant set is not shown.")
        elif all(f["verdict"] == NOT_ENOUGH_TO_TEST for _, f in flips):
            lines.append(f"{counted}: {NOT_ENOUGH_TO_TEST} whether any is robust (the smallest paired p-values these "
                         f"groups can give cannot pass alpha {ALPHA:g} after the Holm correction over {m} flips).")
        else:
            lines.append(f"{counted}, none robust: no evidence that the order of the entries depends on the variant "
                         f"set (no flip passes the {how}).")
        for axis, r in result["axes"].items():
            c = r.get("reversal") or {}
            if r.get("family", AXES_FAMILY) == AXES_FAMILY and c.get("flipped"):
                lines.append(f"  {axis}: {c['robust']} of {c['pairs']} entry pair(s) flip robustly; {c['flipped']} "
                             "pair(s) flip in their means")
    inst = result["axes"].get(INSTABILITY)
    if inst is not None and inst["flips"]:
        fam = families.get(INSTABILITY_FAMILY, {})
        robust = [f for f in inst["flips"] if f["robust"] is True]
        example = f": {_flip_text(INSTABILITY, robust[0])}" if robust else ""
        lines.append(f"instability (the mean of the other axes, so corrected on its own and not in the headline): "
                     f"{len(inst['flips'])} flip(s) in the means, {len(robust)} robust (Holm over "
                     f"{fam.get('tested', 0)}){example}")
    return lines
