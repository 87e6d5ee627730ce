"""Every axis of one group, on all its variants and on each half of them (for split-half reliability,
docs/definitions.md#findings)."""

from __future__ import annotations

from typing import Any

from ..functional.axes import Axis, AxisValue, GroupInputs, add_partials


def subset_inputs(g: GroupInputs, idx: list[int]) -> GroupInputs:
    """The same group restricted to the variants ``idx`` (the split halves of a finding)."""
    return GroupInputs(
        prompts=[g.prompts[i] for i in idx],
        reference=g.reference,
        outputs=[g.outputs[i] for i in idx] if g.outputs is not None else None,
        hidden=g.hidden[idx] if g.hidden is not None else None,
        layers=g.layers,
        logprobs=g.logprobs[idx] if g.logprobs is not None else None,
        response_logprobs=g.response_logprobs[idx][:, idx] if g.response_logprobs is not None else None,
        answer_logprobs=g.answer_logprobs[idx] if g.answer_logprobs is not None else None,
        similarity=g.similarity,
    )


def axis_values(
    inputs: GroupInputs, split: tuple[list[int], list[int]] | None, totals: dict[str, Any],
    axes: list[Axis],
) -> tuple[dict[str, float], dict[str, list[float]], dict[str, float], dict[str, list[float]], dict[str, Any]]:
    """Every axis on one group, and on each half of its variants (for split-half reliability, docs/definitions.md#findings
    "Findings"). A set-level axis adds the group's statistics to ``totals`` (the halves' do not: a half is
    measured against the whole set) and leaves its values pending."""
    values: dict[str, float] = {}
    per_variant: dict[str, list[float]] = {}
    extra: dict[str, float] = {}
    halves: dict[str, list[float]] = {}
    pending: dict[str, Any] = {}
    subsets = [subset_inputs(inputs, idx) for idx in split] if split is not None else []
    for axis in axes:
        value = axis.fn(inputs)
        half_values = [axis.fn(sub) for sub in subsets]
        if axis.set_level is not None:
            totals[axis.name] = add_partials(totals.get(axis.name), value.partial)
            pending[axis.name] = (AxisValue(value.value, value.per_variant, pending=value.pending),
                                  [AxisValue(h.value, h.per_variant, pending=h.pending) for h in half_values])
        values[axis.name] = value.value
        per_variant[axis.name] = value.per_variant
        extra.update({f"{axis.name}_{k}": v for k, v in value.extra.items()})
        if half_values:
            halves[axis.name] = [h.value for h in half_values]
    return values, per_variant, extra, halves, pending
