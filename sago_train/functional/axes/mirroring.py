"""Mirroring axis: outputs that echo the surface form of their own phrasing (docs/definitions.md#mirroring)."""

from __future__ import annotations

from collections.abc import Sequence

from ..text import words
from .registry import AxisValue, GroupInputs, register_axis


def mirroring_instability(
    prompts: list[str], outputs: list[str], reference: str | Sequence[str] | None = None
) -> AxisValue:
    """``M = mean_k m_k``: ``m_k`` is the share of ``y_k``'s words (with multiplicity) that occur only in
    ``x_k`` — in no other variant and not in the reference (in none of its aliases, for a list). An empty
    output scores 0."""
    prompt_words = [set(words(p)) for p in prompts]
    aliases = [reference] if isinstance(reference, str) else list(reference or [])
    ref_words = {w for alias in aliases for w in words(alias)}
    per_variant = []
    for k, y in enumerate(outputs):
        others = set().union(*(w for j, w in enumerate(prompt_words) if j != k))
        unique = prompt_words[k] - others - ref_words
        yw = words(y)
        per_variant.append(sum(w in unique for w in yw) / len(yw) if yw else 0.0)
    return AxisValue(sum(per_variant) / len(per_variant), per_variant)


@register_axis("mirroring", needs=["generations"], description="share of output words echoing the variant's own wording")
def _mirroring(g: GroupInputs) -> AxisValue:
    if g.outputs is None:
        raise RuntimeError("the mirroring axis needs outputs")
    return mirroring_instability(g.prompts, g.outputs, g.reference)
