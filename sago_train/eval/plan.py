"""What an evaluation covers before any forward pass: which groups (the seeded subset of ``max_groups``) and,
for the Trainer callback's cheaper evaluations (``generation=False``), which axes can be computed without
greedy decoding and whether a set needs a decoding pass at all."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..data.groups import VariantGroup, VariantSet, subset_indices
from ..functional.axes import Axis


def select_groups(vs: VariantSet, max_groups: int | None, seed: int) -> list[int]:
    """Indices of the groups to evaluate: all (``max_groups`` None or 0), or a seeded subset that depends only
    on the seed, the set's name and its size (:func:`~sago_train.data.groups.subset_indices`), so it is the same
    at every evaluation and after a resume."""
    return subset_indices(len(vs), max_groups, seed, vs.name)


def encode_within(variants: list[Any], encode: Callable[[Any], list[int]], budget: int) -> list[list[int]] | int:
    """Each variant's prompt tokens, encoded one at a time, or, at the first one longer than ``budget`` tokens,
    its length: the group is skipped, so the variants after it are never tokenized (1024 variants of 60,000
    characters each were tokenized whole before the group was skipped).

    Example:
        >>> encode_within(["ab", "abcdef", "abc"], list, 4)
        6
        >>> encode_within(["ab", "abc"], list, 4)
        [['a', 'b'], ['a', 'b', 'c']]
    """
    out = []
    for v in variants:
        ids = encode(v)
        if len(ids) > budget:
            return len(ids)
        out.append(ids)
    return out


def needs_generation(needs: Iterable[str], groups: list[VariantGroup], generation: bool = True) -> bool:
    """Whether ``groups`` need a greedy decoding pass, given what the axes ``needs`` (``generation=False``:
    never)."""
    if not generation:
        return False
    needs = set(needs)
    if "generations" in needs:
        return True
    if "logprobs" in needs and any(g.reference is None for g in groups):
        return True  # r falls back to the canonical variant's greedy output
    return has_correctness(groups)


def has_correctness(groups: Iterable[VariantGroup]) -> bool:
    """Whether accuracy is scored on ``groups``: some group has a reference or choices (at a complete
    evaluation, with generation)."""
    return any(g.reference is not None or g.choices is not None for g in groups)


def axes_computed(axes: list[Axis], groups: list[VariantGroup], generation: bool = True) -> list[Axis]:
    """The axes computed on ``groups``: all of them, or with ``generation=False`` those that need no greedy
    output: generation and mirroring are left out, and confidence too when a group has no reference (its
    r is then the canonical variant's greedy output)."""
    if generation:
        return axes
    no_ref = any(g.reference is None for g in groups)
    return [a for a in axes if "generations" not in a.needs and not ("logprobs" in a.needs and no_ref)]


def variant_text(variant: Any) -> str:
    """A variant as text: a string as is, chat messages' contents joined by newlines (for word-level axes)."""
    if isinstance(variant, str):
        return variant
    return "\n".join(m.get("content", "") for m in variant)
