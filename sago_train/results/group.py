"""One group's record: everything measured for one variant group (its variants, outputs, every axis, the
per-variant values, log-probabilities, correctness, each axis on each half of the variants), the same type in
memory and in a ``<set>.jsonl`` file (see the manual's "Results on disk")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import SagoInputError, short_repr, type_name
from ..functional.axes import (
    ACCURACY,
    ACCURACY_ALL,
    ACCURACY_WORST_KIND,
    BETWEEN,
    INSTABILITY,
    in_instability,
)
from ..functional.stats import to_jsonable
from ..limits import MAX_RECORDED_VALUE

_BETWEEN_EXTRA = "activation_rel_between"


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_recorded(value: Any, **where: Any) -> None:
    """A number read back from a results file: a JSON number within ``MAX_RECORDED_VALUE`` or null, else a
    :class:`SagoInputError` naming ``where`` (source, line, key). A hand-edited ``1.7e308`` or a list where a number
    goes is refused at reading, not by matplotlib or numpy after the work.

    Example:
        >>> check_recorded(0.25); check_recorded(None)
        >>> check_recorded(1.7e308, key="mean")
        Traceback (most recent call last):
        ...
        sago_train.errors.SagoInputError: field 'mean': expected a number or null of size at most 1e+09 (MAX_RECORDED_VALUE), got 1.7e+308
    """
    if value is None or (is_number(value) and (not math.isfinite(value) or abs(value) <= MAX_RECORDED_VALUE)):
        return
    size = f" of size at most {MAX_RECORDED_VALUE:g} (MAX_RECORDED_VALUE)" if is_number(value) else ""
    raise SagoInputError(f"expected a number or null{size}, got {short_repr(value)}", **where)


def to_float(x: Any) -> float:
    """A JSON number or null (NaN is written as null) as a float, NaN for null."""
    return float(x) if is_number(x) else math.nan


def mean_instability(axes: dict[str, float]) -> float:
    """The ``instability`` of one group: the mean of its axes on the [0, 1] scale (``activation_rel``, a ratio,
    is left out), NaN when none is defined.

    Example:
        >>> mean_instability({"activation": 0.2, "confidence": 0.4, "activation_rel": 3.0})
        0.30000000000000004
    """
    vals = [v for a, v in axes.items() if in_instability(a) and not math.isnan(v)]
    return float(np.mean(vals)) if vals else math.nan


@dataclass
class GroupRecord:
    """Everything measured for one group. ``instability`` is NaN where it is not defined: no axis, or an
    evaluation that left axes out (``SAGOCallback(generation_every=...)``), whose mean over fewer axes would
    not compare with a complete evaluation's.

    Example:
        >>> g = GroupRecord("g1", axes={"activation": 0.2, "confidence": 0.4}, correct=[True, False])
        >>> round(g.instability, 6), g.accuracy
        (0.3, 0.5)
    """

    id: str
    variants: list[Any] = field(default_factory=list)
    kinds: list[str] | None = None
    outputs: list[str] | None = None
    reference: Any = None
    scored_reference: str | None = None  # r: the reference, or the canonical variant's greedy output
    axes: dict[str, float] = field(default_factory=dict)
    per_variant: dict[str, list[float]] = field(default_factory=dict)
    logprobs: list[float] | None = None
    # The confidence axis's scoring (docs/definitions.md#confidence): the model's own lead-in to the reference
    # ("" none found: the bare reference) and the reference's mean log-probability per token after it.
    answer_lead: str | None = None
    answer_logprobs: list[float] | None = None
    correct: list[bool] | None = None
    extra: dict[str, float] = field(default_factory=dict)
    # Split-half reliability (the manual's "Findings"): the variant indices of each half, each axis on each half.
    split: list[list[int]] | None = None
    halves: dict[str, list[float]] = field(default_factory=dict)
    # None: the mean of the [0, 1] axes (computed here); NaN: undefined (an evaluation that left axes out).
    instability: float | None = None

    def __post_init__(self) -> None:
        if self.instability is None:
            self.instability = mean_instability(self.axes)

    @property
    def accuracy(self) -> float:
        """The share of the group's variants answered right (NaN without correctness)."""
        return sum(map(bool, self.correct)) / len(self.correct) if self.correct else math.nan

    def value(self, name: str, *, worst_kind: str | None = None) -> float:
        """An axis, ``instability``, ``accuracy``, ``accuracy_all`` (1 when every variant is right),
        ``accuracy_worst_kind`` (whether the variant of kind ``worst_kind`` is right) or ``between_dispersion``
        of this group (NaN where undefined)."""
        if name == INSTABILITY:
            return math.nan if self.instability is None else float(self.instability)
        if name == ACCURACY:
            return self.accuracy
        if name == ACCURACY_ALL:
            return float(all(self.correct)) if self.correct else math.nan
        if name == ACCURACY_WORST_KIND:
            if not self.correct or not self.kinds or worst_kind not in self.kinds:
                return math.nan
            return float(self.correct[self.kinds.index(worst_kind)])
        if name == BETWEEN:
            return to_float(self.extra.get(_BETWEEN_EXTRA))
        return to_float(self.axes.get(name))

    def half(self, axis: str, i: int) -> float:
        """``axis`` on half ``i`` (0 or 1) of the variants, NaN without a split."""
        pair = self.halves.get(axis)
        return to_float(pair[i]) if isinstance(pair, list) and len(pair) == 2 else math.nan

    def without_instability(self) -> GroupRecord:
        """The same record with ``instability`` undefined (an evaluation that left axes out)."""
        out = replace(self)
        out.instability = math.nan
        return out

    def slim(self) -> GroupRecord:
        """What paired comparisons need (id, axes, instability, correctness, extras), without the variants and
        outputs: what a training run keeps in memory for its baseline and best evaluations."""
        return GroupRecord(self.id, kinds=self.kinds, axes=dict(self.axes), correct=self.correct,
                           extra=dict(self.extra), instability=self.instability)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of one ``<set>.jsonl`` line (NaN written as null)."""
        return to_jsonable({
            "id": self.id, "variants": self.variants, "kinds": self.kinds, "outputs": self.outputs,
            "reference": self.reference, "scored_reference": self.scored_reference, "axes": self.axes,
            INSTABILITY: self.instability, "per_variant": self.per_variant, "logprobs": self.logprobs,
            "answer_lead": self.answer_lead, "answer_logprobs": self.answer_logprobs, "correct": self.correct, "extra": self.extra, "split": self.split, "halves": self.halves,
        })

    @classmethod
    def from_dict(cls, rec: Any, *, source: str = "", line: int | None = None) -> GroupRecord:
        """Read one ``<set>.jsonl`` line back, every field's type checked (an error names the file, line and
        field). Unknown fields are ignored (a record written by a later version)."""

        def fail(message: str, key: str | None = None) -> SagoInputError:
            return SagoInputError(message, source=source or None, line=line, key=key)

        if not isinstance(rec, dict):
            raise fail(f"expected a group record (an object), got {type_name(rec)}")
        gid = rec.get("id")
        if isinstance(gid, bool) or not isinstance(gid, (str, int)):
            raise fail(f"expected a string id, got {short_repr(gid)}", "id")
        axes = rec.get("axes")
        if not isinstance(axes, dict):
            raise fail(f"expected an object of axis -> value, got {type_name(axes)}", "axes")
        for axis, value in axes.items():
            check_recorded(value, source=source or None, line=line, key=f"axes.{axis}")
        check_recorded(rec.get(INSTABILITY), source=source or None, line=line, key=INSTABILITY)
        correct = rec.get("correct")
        if correct is not None and not (isinstance(correct, list) and all(isinstance(c, bool) for c in correct)):
            raise fail(f"expected a list of true/false or null, got {short_repr(correct)}", "correct")
        for key in ("per_variant", "extra", "halves"):
            if rec.get(key) is not None and not isinstance(rec[key], dict):
                raise fail(f"expected an object or null, got {type_name(rec[key])}", key)
        for key in ("variants", "outputs", "logprobs", "answer_logprobs", "split", "kinds"):
            if rec.get(key) is not None and not isinstance(rec[key], list):
                raise fail(f"expected a list or null, got {type_name(rec[key])}", key)
        # A record written with a null instability (an evaluation that left axes out) keeps it undefined; one
        # without the key gets the mean of its axes.
        instability = to_float(rec[INSTABILITY]) if INSTABILITY in rec else None
        return cls(
            id=str(gid), variants=list(rec.get("variants") or []), kinds=rec.get("kinds"), outputs=rec.get("outputs"),
            reference=rec.get("reference"), scored_reference=rec.get("scored_reference"),
            axes={str(a): to_float(v) for a, v in axes.items()}, per_variant=dict(rec.get("per_variant") or {}),
            logprobs=rec.get("logprobs"), answer_lead=rec.get("answer_lead") if isinstance(rec.get("answer_lead"), str)
            else None, answer_logprobs=rec.get("answer_logprobs"), correct=correct, extra=dict(rec.get("extra") or {}),
            split=rec.get("split"), halves=dict(rec.get("halves") or {}), instability=instability,
        )
