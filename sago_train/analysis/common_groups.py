"""Which groups ``compare`` scores each set on: the groups common to every entry that evaluated it.

Means over different group subsets are not comparable (one model's extra groups may be the hard ones), so by
default every entry is scored on the groups all of them evaluated, recomputed from the per-group records, and
the output says so before anything else. Where the groups cannot be matched (an entry without per-group
records, or no group in common) ``compare`` refuses unless ``allow_different_groups`` is given; then each
entry keeps its own recorded scores and the first lines say that too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import SagoInputError
from ..functional import stats
from ..functional.axes import correctness_summary
from ..functional.stats import Summary
from ..results.evaluation import ACCURACY, Evaluation

#: The CLI flag (and the keyword of :func:`~sago_train.analysis.ranking.compare_evaluations`) that ranks on each
#: entry's own groups where the groups cannot be matched.
FLAG = "--allow-different-groups"
_SHOWN = 5  # dropped ids named per entry in the first line; the rest are counted (all are in the JSON)


@dataclass
class SetScope:
    """The groups a set is scored on: ``ids`` (common to every entry) or None (each entry its own groups)."""

    set: str
    ids: list[str] | None
    dropped: dict[str, list[str]] = field(default_factory=dict)  # label -> its groups left out
    line: str = ""

    @property
    def recompute(self) -> bool:
        """Scores must be recomputed from the records (some entry had groups the others lack)."""
        return self.ids is not None and any(self.dropped.values())

    def to_dict(self) -> dict[str, Any]:
        return {"common": self.ids is not None, "n_groups": None if self.ids is None else len(self.ids),
                "dropped": self.dropped, "line": self.line}


def _names(ids: list[str]) -> str:
    more = f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else ""
    return ", ".join(ids[:_SHOWN]) + more


def _n_groups(e: Evaluation, set_name: str, ids: list[str] | None) -> Any:
    """How many groups an entry scored: its records, else the ``n`` recorded with its first axis."""
    if ids is not None:
        return len(ids)
    s = e.sets.get(set_name)
    return s.n_groups if s is not None and s.n_groups else "?"


def set_scope(evals: Sequence[Evaluation], set_name: str, *, allow_different_groups: bool = False) -> SetScope:
    """The groups of ``set_name`` common to every entry in ``evals`` (order of the first entry).

    Raises:
        SagoInputError: the groups cannot be matched (an entry has no per-group records, or the entries share
            no group) and ``allow_different_groups`` is False.
    """
    ids = {}
    for e in evals:
        groups = e.groups(set_name)
        ids[e.label] = None if groups is None else [g.id for g in groups]
    sizes = ", ".join(f"{e.label}: {_n_groups(e, set_name, ids[e.label])}" for e in evals)
    missing = [lab for lab, v in ids.items() if v is None]
    problem = None
    if missing:
        problem = (f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no per-group records of set "
                   f"'{set_name}', so the groups cannot be matched across the entries")
    else:
        first = ids[evals[0].label] or []
        shared = set.intersection(*(set(v or []) for v in ids.values()))
        common = [g for g in first if g in shared]
        if not common:
            problem = f"the entries share no group of set '{set_name}' ({sizes or 'no groups'})"
    if problem is not None:
        if not allow_different_groups:
            raise SagoInputError(f"compare: {problem}; ranking them would compare means over different prompts",
                                 hint=f"pass {FLAG} to rank each entry on its own groups (said first in the output)")
        return SetScope(set_name, None, {}, f"set '{set_name}' NOT scored on common groups ({problem}): each entry on "
                                            f"its own groups ({sizes}) [{FLAG}]")
    dropped = {lab: [g for g in (v or []) if g not in shared] for lab, v in ids.items()}
    dropped = {lab: v for lab, v in dropped.items() if v}
    detail = ("dropped " + "; ".join(f"{_names(v)} of {lab}" for lab, v in dropped.items())) if dropped else \
        "every entry has the same groups"
    return SetScope(set_name, common, dropped, f"scored on {len(common)} common groups of set '{set_name}' ({detail})")


def _accuracy(e: Evaluation, set_name: str, ids: list[str]) -> Summary | None:
    """Accuracy over the variants of ``ids`` with its CI over groups: the correctness summary of those groups
    (:func:`~sago_train.functional.axes.correctness_summary`, the one definition of accuracy); a group without
    correctness is never counted."""
    by_id = {g.id: g for g in e.groups(set_name) or []}
    correct = [by_id[g].correct for g in ids if g in by_id and by_id[g].correct]
    if not correct:
        return None
    acc = correctness_summary(correct, None)
    return Summary(acc["accuracy"], acc["accuracy_ci_low"], acc["accuracy_ci_high"], acc["n"])


def _recorded(evals: Sequence[Evaluation], set_name: str, axis: str) -> dict[str, Summary]:
    return {e.label: sc for e in evals if (sc := e.score(set_name, axis)) is not None}


def scores(evals: Sequence[Evaluation], scope: SetScope, axis: str, *, seed: int = 0) -> tuple[dict[str, Summary], str | None]:
    """Per entry the :class:`~sago_train.functional.stats.Summary` of ``axis`` on the scope's groups, and a note when the
    axis is undefined on some common groups for some entry (those groups are left out for every entry).

    Where every entry has the same groups (and the axis is defined on the same ones) the recorded summaries are
    already over the same groups and are returned as they are; otherwise the mean and a percentile-bootstrap CI
    (seeded) are recomputed from the per-group values on the groups every entry has a value for."""
    ids = scope.ids
    if ids is None:
        return _recorded(evals, scope.set, axis), None
    if axis == ACCURACY:
        if not scope.recompute:
            return _recorded(evals, scope.set, axis), None
        return {e.label: sc for e in evals if (sc := _accuracy(e, scope.set, ids)) is not None}, None
    # An entry that did not compute the axis at all (e.g. an evaluation without generation,
    # SAGOCallback(generation_every=N)) drops out of this axis; the others are compared on their common groups.
    pairs = [(e, e.group_values(scope.set, axis) or {}) for e in evals]
    present = [(e, v) for e, v in pairs if any(math.isfinite(v.get(g, math.nan)) for g in ids)]
    if not present:
        return {}, None  # undefined for every entry on every common group: nothing to rank, nothing to say
    absent = [e.label for e, _ in pairs if all(e is not p for p, _ in present)]
    keep = [g for g in ids if all(math.isfinite(v.get(g, math.nan)) for _, v in present)]
    notes = [f"set '{scope.set}', {axis}: not computed by {', '.join(absent)}"] if absent else []
    if not scope.recompute and len(keep) == len(ids):
        recorded = _recorded([e for e, _ in present], scope.set, axis)
        return recorded, "; ".join(notes) or None
    out = {e.label: stats.bootstrap_ci(np.array([v[g] for g in keep]), seed=seed) for e, v in present} if keep else {}
    if len(keep) < len(ids):
        notes.append(f"set '{scope.set}', {axis}: undefined on {len(ids) - len(keep)} of the {len(ids)} common groups "
                     f"for some entry; scored on the {len(keep)} where every entry has a value")
    note = "; ".join(notes) or None
    return out, note
