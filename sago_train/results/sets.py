"""One variant set's part of an evaluation (:class:`SetEvaluation`): per-axis summaries with their CIs,
``instability`` (absent when the evaluation left axes out), correctness, what was skipped, the set-level
numbers, and the group records (in memory, or read lazily from ``<set>.jsonl``), with the analyses computed
from them (kind effects, axis correlation, split-half reliability). Its two JSON forms, the ``summary.json``
entry and the ``history.jsonl`` entry, are written and read here side by side."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import SagoInputError, short_repr, type_name
from ..functional import findings, relations, stats
from ..functional.axes import correctness_summary
from ..functional.stats import Summary
from .group import (
    ACCURACY,
    ACCURACY_ALL,
    ACCURACY_WORST_KIND,
    BETWEEN,
    INSTABILITY,
    GroupRecord,
    check_recorded,
    is_number,
    to_float,
)

_NAN = float("nan")


def summary_from_dict(value: Any, *, source: str | None = None, line: int | None = None, key: str = "") -> Summary:
    """``{"mean", "ci_low", "ci_high", "n"}`` (numbers or null) as a :class:`Summary`; an error names the
    field.

    Example:
        >>> summary_from_dict({"mean": 0.5, "ci_low": None, "ci_high": None, "n": 3})
        Summary(mean=0.5, ci_low=nan, ci_high=nan, n=3)
    """
    if not isinstance(value, dict) or "mean" not in value:
        raise SagoInputError(f"expected an object with 'mean', 'ci_low', 'ci_high', 'n', got {short_repr(value)}",
                             source=source, line=line, key=key or None)
    for k in ("mean", "ci_low", "ci_high"):
        check_recorded(value.get(k), source=source, line=line, key=f"{key}.{k}")
    n = value.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise SagoInputError(f"expected a count (an integer >= 0) or null, got {short_repr(n)}", source=source,
                             line=line, key=f"{key}.n")
    return Summary(to_float(value["mean"]), to_float(value.get("ci_low")), to_float(value.get("ci_high")), n or 0)


#: A set's ``summary.json`` entry: the SHA-256 of its group ids, in order, one per line (checked on reading
#: against the ``<set>.jsonl`` beside it).
IDS_KEY = "ids_sha256"


def ids_digest(ids: Sequence[str]) -> str:
    """SHA-256 hex of ``ids`` joined by new lines.

    Example:
        >>> ids_digest(["a", "b"])[:12]
        '7e18f737311b'
    """
    import hashlib

    return hashlib.sha256("\n".join(ids).encode("utf-8", "surrogatepass")).hexdigest()


def _mean_summary(values: Sequence[float]) -> Summary:
    finite = [v for v in values if math.isfinite(v)]
    return Summary(float(np.mean(finite)) if finite else _NAN, _NAN, _NAN, len(finite))


@dataclass
class SetEvaluation:
    """One set of an evaluation.

    ``summaries[axis]`` is the mean over groups with its 95% bootstrap CI (:class:`~sago_train.functional.stats.Summary`);
    ``instability`` the same for the mean of the [0, 1] axes, or None when the evaluation left axes out
    (``skipped_axes``: a mean over fewer axes would not compare with a complete evaluation's); ``correctness``
    the correctness summary (``{}`` without references); ``skipped`` the groups not evaluated, by reason.

    Example:
        >>> g = [GroupRecord(f"g{i}", axes={"activation": 0.1 * i}) for i in range(4)]
        >>> s = SetEvaluation.from_groups("s", ["activation"], g, n_bootstrap=100)
        >>> round(s.summaries["activation"].mean, 6), s.n_groups, s.group_values("activation")["g2"]
        (0.15, 4, 0.2)
    """

    name: str
    axes: list[str]
    summaries: dict[str, Summary]
    instability: Summary | None = None
    correctness: dict[str, Any] = field(default_factory=dict)
    n_groups: int = 0
    kinds: list[str] | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_axes: list[str] = field(default_factory=list)
    # Set-level numbers of set-level axes, e.g. {"activation_rel": {"between_dispersion": {...}, "note": ...}}.
    set_level: dict[str, dict[str, Any]] = field(default_factory=dict)
    seed: int = 0
    n_bootstrap: int = 2000
    _groups: list[GroupRecord] | None = field(default=None, repr=False)
    _load: Callable[[], list[GroupRecord] | None] | None = field(default=None, repr=False)
    ids_sha256: str | None = field(default=None, repr=False, compare=False)  # read from summary.json, to check

    @classmethod
    def from_groups(cls, name: str, axes: Sequence[str], groups: Sequence[GroupRecord], kinds: list[str] | None = None,
                    skipped: dict[str, int] | None = None, *, seed: int = 0, n_bootstrap: int = 2000,
                    set_level: dict[str, dict[str, Any]] | None = None,
                    skipped_axes: Sequence[str] = ()) -> SetEvaluation:
        """The statistics of a set from its group records (an evaluation that left ``skipped_axes`` out has no
        ``instability``, on the set or on any group)."""
        groups = [g.without_instability() for g in groups] if skipped_axes else list(groups)
        out = cls(name, list(axes), {}, kinds=kinds, skipped=dict(skipped or {}), skipped_axes=list(skipped_axes),
                  set_level=dict(set_level or {}), seed=seed, n_bootstrap=n_bootstrap, n_groups=len(groups),
                  _groups=groups)
        out.summaries = {a: stats.bootstrap_ci(out.values(a), n_resamples=n_bootstrap, seed=seed) for a in out.axes}
        if not skipped_axes:
            out.instability = stats.bootstrap_ci(out.values(INSTABILITY), n_resamples=n_bootstrap, seed=seed)
        correct = [g.correct for g in groups if g.correct is not None]
        out.correctness = correctness_summary(correct, kinds, n_resamples=n_bootstrap, seed=seed) if correct else {}
        return out

    # ------------------------------------------------------------------ group records
    @property
    def groups(self) -> list[GroupRecord] | None:
        """The group records (read from ``<set>.jsonl`` on first use for an evaluation read from disk), or None
        when there are none."""
        if self._groups is None and self._load is not None:
            self._groups, self._load = self._load(), None
        return self._groups

    @property
    def has_records(self) -> bool:
        return self.groups is not None

    @property
    def worst_kind(self) -> str | None:
        """The kind with the lowest accuracy on this set (None without per-kind accuracy)."""
        per_kind = self.correctness.get("per_kind") or {}
        return min(per_kind, key=per_kind.get) if per_kind else None

    def values(self, name: str, *, worst_kind: str | None = None) -> np.ndarray:
        """Per-group values of an axis, ``instability``, an accuracy quantity or ``between_dispersion`` (NaN
        where undefined), in record order; empty without records. ``accuracy_worst_kind`` reads the variant of
        ``worst_kind`` (default: this set's :attr:`worst_kind`)."""
        kind = worst_kind or self.worst_kind
        return np.array([g.value(name, worst_kind=kind) for g in self.groups or []], dtype=float)

    def group_values(self, name: str, *, worst_kind: str | None = None) -> dict[str, float] | None:
        """``{group id: value}`` of :meth:`values`, or None without records."""
        groups = self.groups
        kind = worst_kind or self.worst_kind
        return None if groups is None else {g.id: g.value(name, worst_kind=kind) for g in groups}

    def half_values(self, axis: str) -> tuple[np.ndarray, np.ndarray]:
        """Per-group values of ``axis`` on the first and on the second half of the variants (NaN for groups with
        K < 4, which have no split)."""
        groups = self.groups or []
        return (np.array([g.half(axis, 0) for g in groups], dtype=float),
                np.array([g.half(axis, 1) for g in groups], dtype=float))

    # ------------------------------------------------------------------ numbers
    @property
    def accuracy(self) -> Summary | None:
        """Accuracy (right answers / variants) with its CI over groups, or None without correctness."""
        acc = self.correctness
        if not is_number(acc.get("accuracy")):
            return None
        return Summary(float(acc["accuracy"]), to_float(acc.get("accuracy_ci_low")),
                       to_float(acc.get("accuracy_ci_high")), int(acc.get("n") or 0))

    def score(self, name: str) -> Summary | None:
        """The summary of an axis, ``instability`` or an accuracy quantity; None when not recorded or undefined
        (``accuracy_all`` and ``accuracy_worst_kind`` from the correctness summary, without a CI)."""
        if name == ACCURACY:
            return self.accuracy
        if name in (ACCURACY_ALL, ACCURACY_WORST_KIND):
            value = self.correctness.get("all_right" if name == ACCURACY_ALL else "worst_variant_accuracy")
            return Summary(float(value), _NAN, _NAN, int(self.correctness.get("n") or 0)) if is_number(value) else None
        summary = self.instability if name == INSTABILITY else self.summaries.get(name)
        return summary if summary is not None and math.isfinite(summary.mean) else None

    def mean(self, name: str) -> float:
        """The mean of :meth:`score` (NaN when not recorded or undefined)."""
        summary = self.score(name)
        return _NAN if summary is None else summary.mean

    @property
    def quantities(self) -> list[str]:
        """The axes, then ``instability`` when recorded: what this set can be ranked and compared on."""
        return [*self.axes, *([INSTABILITY] if self.instability is not None else [])]

    @property
    def between_dispersion(self) -> float:
        """Mean over layers of the set's between-group activation dispersion (NaN unless ``activation_rel``
        was computed): it falls when a model pulls *all* representations together."""
        value = self.set_level.get("activation_rel", {}).get(BETWEEN, {}).get("mean")
        return _NAN if value is None else float(value)

    @property
    def notes(self) -> list[str]:
        """Why something was not computed on this set (e.g. ``activation_rel`` on a single group)."""
        return [f"{axis}: {info['note']}" for axis, info in self.set_level.items() if info.get("note")]

    # ------------------------------------------------------------------ analyses (from the group records)
    @cached_property
    def kind_effects(self) -> dict[str, relations.KindEffect]:
        """Per axis (and ``correct``), per-kind means and the Friedman test across groups, when kinds align."""
        groups = self.groups or []
        if self.kinds is None or not groups:
            return {}
        out = {a: relations.kind_effect(np.array([g.per_variant.get(a, [_NAN] * len(self.kinds)) for g in groups],
                                                 dtype=float), self.kinds) for a in self.axes}
        correct = [g.correct for g in groups if g.correct is not None]
        if correct and len(correct) == len(groups):
            out["correct"] = relations.kind_effect(np.array(correct, dtype=float), self.kinds, extreme="min")
        return out

    @cached_property
    def correlation(self) -> relations.Correlation:
        """Spearman correlation of the per-group axis values of this set."""
        return relations.axis_correlation({a: self.values(a) for a in self.axes})

    @cached_property
    def reliability(self) -> dict[str, findings.Reliability]:
        """Split-half reliability of each axis (the manual's "Findings": is per-group instability noise?)."""
        return {a: findings.split_half_reliability(*self.half_values(a), n_permutations=self.n_bootstrap,
                                                   seed=self.seed) for a in self.axes}

    # ------------------------------------------------------------------ the summary.json entry
    def to_summary(self) -> dict[str, Any]:
        """The set's entry in ``summary.json`` (statistics and analyses; the records go to ``<set>.jsonl``)."""
        return stats.to_jsonable({
            "n_groups": self.n_groups,
            "skipped": self.skipped,
            "skipped_axes": self.skipped_axes,
            "axes": {a: s.to_dict() for a, s in self.summaries.items()},
            INSTABILITY: None if self.instability is None else self.instability.to_dict(),
            "correctness": self.correctness,
            "kinds": {a: k.to_dict() for a, k in self.kind_effects.items()},
            "axis_correlation": self.correlation.to_dict(),
            "reliability": {a: r.to_dict() for a, r in self.reliability.items()},
            "set_level": self.set_level,
            "notes": self.notes,
            **({IDS_KEY: ids_digest([g.id for g in self._groups])} if self._groups is not None else {}),
        })

    @classmethod
    def from_summary(cls, name: str, entry: Any, *, source: str,
                     load: Callable[[], list[GroupRecord] | None] | None = None) -> SetEvaluation:
        """Read a set's ``summary.json`` entry back (the records from ``load``, on first use)."""
        key = f"sets.{name}"
        if not isinstance(entry, dict):
            raise SagoInputError(f"expected an object, got {type_name(entry)}", source=source, key=key)
        axes = entry.get("axes", {})
        if not isinstance(axes, dict):
            raise SagoInputError(f"expected an object of axis -> summary, got {type_name(axes)}", source=source,
                                 key=f"{key}.axes")
        summaries = {a: summary_from_dict(v, source=source, key=f"{key}.axes.{a}") for a, v in axes.items()}
        inst = entry.get(INSTABILITY)
        ids = entry.get(IDS_KEY)
        out = cls(name, list(summaries), summaries,
                   instability=None if inst is None else summary_from_dict(inst, source=source, key=f"{key}.{INSTABILITY}"),
                   correctness=_correctness(entry.get("correctness"), source, None, f"{key}.correctness"),
                   n_groups=int(entry["n_groups"]) if is_number(entry.get("n_groups")) else _n_from(summaries),
                   skipped=_object(entry.get("skipped"), source, None, f"{key}.skipped"),
                   skipped_axes=_names(entry.get("skipped_axes"), source, None, f"{key}.skipped_axes"),
                   set_level=_object(entry.get("set_level"), source, None, f"{key}.set_level"), _load=load)
        out.ids_sha256 = ids if isinstance(ids, str) else None
        return out

    # ------------------------------------------------------------------ the history.jsonl entry
    def to_history(self) -> dict[str, Any]:
        """``{"<axis>": {"mean", "ci_low", "ci_high", "n"}}`` with ``instability`` when recorded: the set's part
        of a ``history.jsonl`` line's ``sets`` (its correctness, set-level numbers and skipped axes go under the
        line's ``correctness``, ``set_level`` and ``skipped_axes``)."""
        out = {a: s.to_dict() for a, s in self.summaries.items()}
        if self.instability is not None:
            out[INSTABILITY] = self.instability.to_dict()
        return stats.to_jsonable(out)

    @classmethod
    def from_history(cls, name: str, line: dict[str, Any], *, source: str, lineno: int | None,
                     load: Callable[[], list[GroupRecord] | None] | None = None) -> SetEvaluation:
        """Read a set's part of a ``history.jsonl`` line back (validated: an error names the file, line and key)."""
        per_axis = line["sets"][name]
        key = f"sets.{name}"
        if not isinstance(per_axis, dict):
            raise SagoInputError(f"expected an object of axis -> summary, got {type_name(per_axis)}", source=source,
                                 line=lineno, key=key)
        summaries = {a: summary_from_dict(v, source=source, line=lineno, key=f"{key}.{a}") for a, v in per_axis.items()}
        inst = summaries.pop(INSTABILITY, None)

        def part(field_name: str) -> Any:
            group = line.get(field_name)
            return group.get(name) if isinstance(group, dict) else None

        return cls(name, list(summaries), summaries, instability=inst,
                   correctness=_correctness(part("correctness"), source, lineno, f"correctness.{name}"),
                   n_groups=_n_from(summaries), skipped_axes=_names(part("skipped_axes"), source, lineno,
                                                                    f"skipped_axes.{name}"),
                   set_level=_object(part("set_level"), source, lineno, f"set_level.{name}"), _load=load)


#: The numbers of a set's correctness summary (functional.axes.correctness_summary), checked when read back.
_CORRECTNESS_NUMBERS = ("accuracy", "accuracy_ci_low", "accuracy_ci_high", "all_right", "all_wrong", "consistent",
                        "spread", "worst_variant_accuracy")


def _correctness(value: Any, source: str, line: int | None, key: str) -> dict[str, Any]:
    """A correctness summary read back: an object whose numbers are numbers (or null), ``n`` a count and
    ``per_kind`` an object of numbers; an error names the file, line and key."""
    out = _object(value, source, line, key)
    for name in _CORRECTNESS_NUMBERS:
        check_recorded(out.get(name), source=source, line=line, key=f"{key}.{name}")
    n = out.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise SagoInputError(f"expected a count (an integer >= 0) or null, got {short_repr(n)}", source=source,
                             line=line, key=f"{key}.n")
    per_kind = _object(out.get("per_kind"), source, line, f"{key}.per_kind")
    for kind, v in per_kind.items():
        check_recorded(v, source=source, line=line, key=f"{key}.per_kind.{str(kind)[:100]}")
    return out


def paired_worst_kind(before: SetEvaluation | None, after: SetEvaluation) -> str | None:
    """The kind that ``accuracy_worst_kind`` compares in a paired change of ``after`` against ``before``: the
    kind answered worst over both evaluations together (the lowest sum of its accuracy in each), or ``after``'s
    worst kind when ``before`` has no per-kind accuracy of the same kinds.

    Chosen on both, never on ``after`` alone: the kind that is worst now is partly worst by chance, so its
    paired change leans towards "less accurate" even when nothing changed (six equally hard kinds, 20 groups,
    nothing changed: "worse" in 11% of 300 simulated pairs, against 2.7% for this choice and for a kind fixed
    in advance; ``tests/results/test_monitor.py``). A choice that is the same with the two evaluations
    swapped leaves the paired test its level.

    Example:
        >>> def ev(correct):
        ...     groups = [GroupRecord(f"g{i}", kinds=["a", "b"], correct=c) for i, c in enumerate(correct)]
        ...     return SetEvaluation.from_groups("s", [], groups, kinds=["a", "b"], n_bootstrap=10)
        >>> before, after = ev([[True, False]] * 4), ev([[False, True]] * 3 + [[True, True]])
        >>> after.worst_kind, paired_worst_kind(before, after)
        ('a', 'b')
    """
    now = after.correctness.get("per_kind") or {}
    then = (before.correctness.get("per_kind") or {}) if before is not None else {}
    shared = [k for k in now if k in then and is_number(now[k]) and is_number(then[k])]
    if not shared:
        return after.worst_kind
    return min(shared, key=lambda k: float(now[k]) + float(then[k]))


def paired_group_values(before: SetEvaluation | None, after: SetEvaluation, quantity: str
                        ) -> tuple[dict[str, float], dict[str, float]] | None:
    """``({group id: value} of before, the same of after)`` for a paired change in ``quantity`` (an axis,
    ``instability``, an accuracy quantity or ``between_dispersion``); ``accuracy_worst_kind`` reads the kind of
    :func:`paired_worst_kind` in both. None without the records of both.

    Example:
        >>> a = SetEvaluation.from_groups("s", ["activation"], [GroupRecord("g0", axes={"activation": 0.2})])
        >>> b = SetEvaluation.from_groups("s", ["activation"], [GroupRecord("g0", axes={"activation": 0.5})])
        >>> paired_group_values(a, b, "activation")
        ({'g0': 0.2}, {'g0': 0.5})
    """
    kind = paired_worst_kind(before, after) if quantity == ACCURACY_WORST_KIND else None
    then = None if before is None else before.group_values(quantity, worst_kind=kind)
    now = after.group_values(quantity, worst_kind=kind)
    return None if then is None or now is None else (then, now)


def _object(value: Any, source: str, line: int | None, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SagoInputError(f"expected an object, got {type_name(value)}", source=source, line=line, key=key)
    return dict(value)


def _names(value: Any, source: str, line: int | None, key: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SagoInputError(f"expected a list of axis names, got {short_repr(value)}", source=source, line=line,
                             key=key)
    return list(value)


def _n_from(summaries: dict[str, Summary]) -> int:
    return max((s.n for s in summaries.values()), default=0)
