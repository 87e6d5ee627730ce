"""Comparing two evaluations of the same groups, owned here once: what a set is compared on
(:func:`quantities`), what early stopping may watch (:func:`watchable`), one paired change (:class:`Change`),
the changes of one evaluation against its references (:class:`Comparison`, the history line's ``compare``
block) and every number of both (:func:`numbers`); the best evaluation so far is :mod:`.best`'s. The monitor, the reporters, ``report``, ``compare``,
``ranking`` and early stopping read a :class:`Change`; none builds its own dict of one.

Every change is judged by the one verdict rule (:mod:`sago_train.functional.verdict_rule`) in the axis
registry's direction: ``mean_diff`` = mean of (current - reference), ``p_worse`` / ``p_better`` the one-sided
Wilcoxon p-values that the current evaluation is worse / better. A history written before this module named
``p_worse`` ``p_value``; :meth:`Change.from_dict` reads both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import SagoInputError, short_repr, type_name
from ..functional import stats, verdict_rule
from ..functional.axes import ACCURACY, ACCURACY_ALL, ACCURACY_WORST_KIND, BETWEEN, INSTABILITY
from ..functional.axes.registry import display_order, higher_is_better
from .evaluation import Evaluation
from .sets import SetEvaluation, paired_group_values, paired_worst_kind

#: Correctness quantities compared beside the axes (higher is better).
ACCURACIES = (ACCURACY, ACCURACY_ALL, ACCURACY_WORST_KIND)
#: What the accuracy of a set may be watched as by early stopping (``accuracy_worst_kind`` is a different kind
#: at different evaluations, ``accuracy_all`` a step function of the same answers).
WATCHABLE_ACCURACIES = (ACCURACY,)
#: The references an evaluation is compared with during training, as the history names them.
VS_BASELINE, VS_BEST = "vs_baseline", "vs_best"
LABELS = (VS_BASELINE, VS_BEST)


# ---------------------------------------------------------------------------------------------- the quantities
def set_quantities(s: SetEvaluation) -> list[str]:
    """What a set can be compared on: its axes, ``instability`` when recorded, the accuracy quantities when it
    has correctness, ``between_dispersion`` with ``activation_rel``.

    Example:
        >>> from sago_train.results.group import GroupRecord
        >>> s = SetEvaluation.from_groups("s", ["activation"], [GroupRecord("g", axes={"activation": 0.1})])
        >>> set_quantities(s)
        ['activation', 'instability']
    """
    out = list(s.quantities)
    if s.accuracy is not None:
        out += [ACCURACY, ACCURACY_ALL] + ([ACCURACY_WORST_KIND] if s.worst_kind is not None else [])
    if "activation_rel" in s.set_level:
        out.append(BETWEEN)
    return out


def line_quantities(s: SetEvaluation) -> list[str]:
    """The quantities a console line or a summary row shows, in display order: :func:`set_quantities` but
    ``between_dispersion`` (read beside ``activation_rel``, never a line of its own)."""
    return display_order(q for q in set_quantities(s) if q != BETWEEN)


def quantities(ev: Evaluation, set_name: str) -> list[str]:
    """:func:`set_quantities` of ``set_name`` of ``ev``."""
    return set_quantities(ev.sets[set_name])


def watchable(axes: Iterable[str], correctness: bool = True) -> list[str]:
    """What early stopping may watch on a set evaluated on ``axes``: each axis, ``instability`` and, when the
    set has references (``correctness``), ``accuracy``. The one answer the callback, the ``--sago_*`` flags, a
    recipe and the stopper itself check against.

    Example:
        >>> watchable(["activation_rel", "confidence"], correctness=False)
        ['activation_rel', 'confidence', 'instability']
    """
    return [*axes, INSTABILITY, *(WATCHABLE_ACCURACIES if correctness else ())]


def watchable_in(s: SetEvaluation) -> list[str]:
    """:func:`watchable` of one recorded set (``instability`` only where it was recorded)."""
    return [*s.quantities, *(WATCHABLE_ACCURACIES if s.accuracy is not None else ())]


# ---------------------------------------------------------------------------------------------- one change
@dataclass(frozen=True)
class Change:
    """One paired change of ``quantity`` on set ``set_name``, against the evaluation at ``reference_step``.

    ``mean_diff`` = mean of (current - reference) over the ``n`` shared groups with its CI; ``p_worse`` /
    ``p_better`` the one-sided p-values; ``verdict`` the one rule's word (``degenerate outputs`` for a "better"
    stability whose outputs no longer depend on the question); ``kind`` the kind ``accuracy_worst_kind``
    compared.

    Example:
        >>> v = verdict_rule.paired_verdict([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.3, 0.5, 0.4, 0.6, 0.7, 0.8])
        >>> c = Change.of(v, "activation", "s", 0)
        >>> c.verdict, round(c.p, 6), round(c.worse_by, 3), Change.from_dict(c.to_dict(), "activation", "s") == c
        ('worse', 0.015625, 0.2, True)
    """

    quantity: str
    set_name: str
    reference_step: int | None
    verdict: str
    mean_diff: float
    ci_low: float
    ci_high: float
    p_worse: float
    p_better: float
    n: int
    kind: str | None = None

    @classmethod
    def of(cls, verdict: verdict_rule.Verdict, quantity: str, set_name: str, reference_step: int | None,
           kind: str | None = None) -> Change:
        """The change a :class:`~sago_train.functional.verdict_rule.Verdict` says."""
        return cls(quantity, set_name, reference_step, verdict.verdict, float(verdict.mean_diff),
                   float(verdict.ci_low), float(verdict.ci_high), float(verdict.p_worse), float(verdict.p_better),
                   int(verdict.n), kind)

    @property
    def higher_is_better(self) -> bool:
        return higher_is_better(self.quantity)

    @property
    def worse_by(self) -> float:
        """How much worse the current evaluation is, in the quantity's units (> 0: worse, whatever its
        direction)."""
        return -self.mean_diff if self.higher_is_better else self.mean_diff

    @property
    def p(self) -> float:
        """The p-value of the verdict's side: ``p_better`` for "better" (and degenerate outputs), else
        ``p_worse``."""
        return self.p_better if self.verdict in (stats.BETTER, stats.DEGENERATE) else self.p_worse

    @property
    def significant(self) -> bool:
        return self.verdict in (stats.BETTER, stats.WORSE, stats.DEGENERATE)

    def to_dict(self) -> dict[str, Any]:
        """The history's form: ``{"mean_diff", "ci_low", "ci_high", "p_worse", "p_better", "n", "verdict",
        "step"}`` (with ``kind`` for ``accuracy_worst_kind``); NaN as null."""
        out = {"mean_diff": self.mean_diff, "ci_low": self.ci_low, "ci_high": self.ci_high, "p_worse": self.p_worse,
               "p_better": self.p_better, "n": self.n, "verdict": self.verdict, "step": self.reference_step}
        return stats.to_jsonable({**out, **({"kind": self.kind} if self.kind is not None else {})})

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any], quantity: str, set_name: str) -> Change:
        """A change read back from a history line: ``p_worse`` (or ``p_value``, its name before #31); a missing
        ``p_better`` is NaN (never "better"); a missing verdict is the one rule's on the recorded numbers."""
        if not isinstance(entry, Mapping):
            raise SagoInputError(f"expected a paired change (an object), got {type_name(entry)}",
                                 key=f"compare.{set_name}.{quantity}")

        def num(name: str) -> float:
            v = entry.get(name)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan

        p_worse = num("p_worse") if "p_worse" in entry else num("p_value")
        n = entry.get("n")
        n = int(n) if isinstance(n, (int, float)) and not isinstance(n, bool) and math.isfinite(n) else 0
        step = entry.get("step")
        verdict = entry.get("verdict")
        if not isinstance(verdict, str):
            verdict = verdict_rule.decide(num("mean_diff"), num("ci_low"), num("ci_high"), p_worse, num("p_better"),
                                          n, higher_is_better=higher_is_better(quantity))
        kind = entry.get("kind")
        return cls(quantity, set_name, int(step) if isinstance(step, int) else None, verdict, num("mean_diff"),
                   num("ci_low"), num("ci_high"), p_worse, num("p_better"), n, kind if isinstance(kind, str) else None)


def axis_verdict(quantity: str, reference: Mapping[str, float], current: Mapping[str, float], *,
                 alpha: float = stats.ALPHA, min_delta: float = 0.0, seed: int = 0) -> verdict_rule.Verdict | None:
    """``current`` against ``reference`` (``{group id: value}``, paired by id) by the one verdict rule in the
    axis registry's direction; None when no group is shared."""
    return verdict_rule.paired_verdict_by_id(reference, current, higher_is_better=higher_is_better(quantity),
                                             alpha=alpha, min_delta=min_delta, seed=seed)


def paired_change(reference: Evaluation, current: Evaluation, set_name: str, quantity: str, *,
                  alpha: float = stats.ALPHA, min_delta: float = 0.0, seed: int = 0) -> Change | None:
    """``current`` against ``reference`` on one set and quantity, paired by group id; ``accuracy_worst_kind``
    reads the kind answered worst over both (:func:`~sago_train.results.sets.paired_worst_kind`) in both. None
    without records of both or a shared group."""
    before = reference.sets.get(set_name)
    values = paired_group_values(before, current.sets[set_name], quantity)
    if values is None:
        return None
    verdict = axis_verdict(quantity, *values, alpha=alpha, min_delta=min_delta, seed=seed)
    if verdict is None:
        return None
    kind = paired_worst_kind(before, current.sets[set_name]) if quantity == ACCURACY_WORST_KIND else None
    return Change.of(verdict, quantity, set_name, reference.step, kind)


# ---------------------------------------------------------------------------------------------- one evaluation
@dataclass
class Comparison:
    """The changes of one evaluation (at ``step``) against its references: ``changes[set][quantity][label]``
    with ``label`` ``vs_baseline`` or ``vs_best``. :meth:`to_dict` is the history line's ``compare`` block.

    Example:
        >>> c = Comparison.from_dict({"s": {"activation": {"vs_baseline": {"mean_diff": 0.1, "p_value": 0.01,
        ...                                                               "n": 3, "verdict": "worse", "step": 0}}}})
        >>> c.get("s", "activation").p_worse, c.get("s", "activation", VS_BEST), len(c)
        (0.01, None, 1)
    """

    changes: dict[str, dict[str, dict[str, Change]]] = field(default_factory=dict)
    step: int | None = None

    def get(self, set_name: str, quantity: str, label: str = VS_BASELINE) -> Change | None:
        return self.changes.get(set_name, {}).get(quantity, {}).get(label)

    def of_set(self, set_name: str) -> dict[str, dict[str, Change]]:
        """``{quantity: {label: Change}}`` of one set (empty when none was compared)."""
        return self.changes.get(set_name, {})

    def verdicts(self, set_name: str, label: str = VS_BASELINE) -> dict[str, str]:
        """``{quantity: verdict}`` of one set against one reference."""
        return {q: e[label].verdict for q, e in self.of_set(set_name).items() if label in e}

    def add(self, change: Change, label: str) -> None:
        self.changes.setdefault(change.set_name, {}).setdefault(change.quantity, {})[label] = change

    def __iter__(self) -> Iterator[tuple[str, Change]]:
        """``(label, change)`` for every change, by set, quantity and label."""
        for per_q in self.changes.values():
            for entry in per_q.values():
                yield from entry.items()

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:
        return bool(self.changes)

    def to_dict(self) -> dict[str, dict[str, dict[str, Any]]]:
        return {s: {q: {label: c.to_dict() for label, c in e.items()} for q, e in per_q.items()}
                for s, per_q in self.changes.items()}

    @classmethod
    def from_dict(cls, block: Any, step: int | None = None) -> Comparison:
        """A history line's ``compare`` block read back (each change by :meth:`Change.from_dict`)."""
        out = cls(step=step)
        if block is None:
            return out
        if not isinstance(block, Mapping):
            raise SagoInputError(f"expected an object of set -> quantity -> change, got {short_repr(block)}",
                                 key="compare")
        for s, per_q in block.items():
            for q, entry in _mapping(per_q, f"compare.{s}").items():
                for label, change in _mapping(entry, f"compare.{s}.{q}").items():
                    if change:
                        out.add(Change.from_dict(change, q, s), label)
        return out


def _mapping(value: Any, key: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SagoInputError(f"expected an object, got {type_name(value)}", key=key)
    return value


def compare(ev: Evaluation, references: Mapping[str, Any], *, degenerate: Iterable[str] = (),
            seed: int = 0) -> Comparison:
    """The changes of ``ev`` against each reference (``{label: an Evaluation, or a function (set, quantity) ->
    Evaluation or None}``, e.g. the baseline and :meth:`Best.evaluation <sago_train.results.best.Best.evaluation>`),
    per set and quantity; a reference at ``ev``'s own step, or without the set, is left out. On a set in
    ``degenerate`` (its outputs no longer depend on the question), a "better" stability verdict is
    ``degenerate outputs``."""
    out = Comparison(step=ev.step)
    degenerate = set(degenerate)
    for name in ev.sets:
        for quantity in quantities(ev, name):
            for label, ref in references.items():
                if callable(ref):
                    ref = ref(name, quantity)
                if ref is None or ref.step == ev.step or name not in ref.sets:
                    continue
                change = paired_change(ref, ev, name, quantity, seed=seed)
                if change is None or not change.n:
                    continue
                if name in degenerate and quantity not in ACCURACIES and change.verdict == stats.BETTER:
                    change = replace(change, verdict=stats.DEGENERATE)
                out.add(change, label)
    return out


def numbers(ev: Evaluation, changes: Comparison) -> dict[tuple[str, str, str], float]:
    """Every finite number of one evaluation and its changes, by ``(set, quantity, suffix)``: per set the mean
    of each quantity it is compared on (:func:`set_quantities`, in display order) with the CI bounds (suffixes
    ``_ci_low``, ``_ci_high``) of the axes and accuracy; each change's ``mean_diff`` (suffix ``_<label>``) and
    p of "worse" (``_<label>_p``); the overall instability as ``("", "instability", "")``. An evaluation that
    left axes out has no ``instability`` (absent, never a mean over fewer axes).

    Example:
        >>> from sago_train.results.group import GroupRecord
        >>> ev = Evaluation.from_records(0, {"s": [{"id": "g", "axes": {"activation": 0.5}}]})
        >>> numbers(ev, Comparison())[("s", "activation", "")]
        0.5
    """
    out: dict[tuple[str, str, str], float] = {}
    for name, s in ev.sets.items():
        for q in display_order(set_quantities(s)):
            if q == BETWEEN:
                out[(name, q, "")] = s.between_dispersion
                continue
            sm = s.score(q)
            if sm is None:
                continue
            out[(name, q, "")] = sm.mean
            if q in s.axes or q == ACCURACY:
                out[(name, q, "_ci_low")], out[(name, q, "_ci_high")] = sm.ci_low, sm.ci_high
    for label, change in changes:
        out[(change.set_name, change.quantity, f"_{label}")] = change.mean_diff
        out[(change.set_name, change.quantity, f"_{label}_p")] = change.p_worse
    overall = ev.overall_instability()
    if overall is not None:
        out[("", INSTABILITY, "")] = overall.mean
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}
