"""Building a :class:`~sago_train.data.groups.VariantSet` from plain examples and generators (the pipeline)."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import SagoInputError
from ..io import validate_set_name
from .examples import CANONICAL_KIND, META_KEY, Example
from .generators import VariantGenerator, make_generator
from .groups import VariantGroup, VariantSet
from .render import GeneratedVariant


def draw_rng(seed: int, example_id: str, kind: str, attempt: int) -> random.Random:
    """The seeded random source of one variant draw: the same for the same (seed, example, kind, attempt).

    Example:
        >>> draw_rng(0, "ex-1", "typo", 0).random() == draw_rng(0, "ex-1", "typo", 0).random()
        True
    """
    # A stable hash (not the salted built-in hash()) so draws survive PYTHONHASHSEED and reordering.
    key = json.dumps([seed, example_id, kind, attempt], ensure_ascii=True)
    return random.Random(int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big"))


def _unique_kinds(names: Iterable[str]) -> list[str]:
    """``["typo", "typo"]`` -> ``["typo", "typo-2"]``: kinds must be unique for per-kind analysis."""
    names = list(names)
    seen: dict[str, int] = {}
    out: list[str] = []
    taken = set(names)
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        kind = n
        if seen[n] > 1:
            j = seen[n]
            while f"{n}-{j}" in taken or f"{n}-{j}" in out:
                j += 1
            kind = f"{n}-{j}"
        out.append(kind)
    return out


def build_variant_set(
    examples: Iterable[Mapping[str, Any] | Example],
    generators: Sequence[VariantGenerator | str],
    *,
    name: str,
    seed: int = 0,
    include_original: bool = True,
    max_attempts: int = 10,
) -> VariantSet:
    """Build a :class:`VariantSet` with one group per example.

    Each group is ``[original, one variant per generator]`` with kinds ``["canonical", <generator names>]``
    (repeated names get ``-2``, ``-3``... so kinds stay unique and aligned across groups). A generator given
    as a string is built with :func:`make_generator` defaults. ``reference`` and ``meta`` pass through;
    multiple-choice groups keep the original ``choices`` and get a per-variant ``answer`` list whose entry
    ``k`` is the answer's *position as shown in variant k*.

    Group ``meta["generation"]`` records ``seed``, ``unchanged`` (kinds whose variant still equals the
    original after ``max_attempts`` draws - e.g. ``lower`` casing of lowercase text - kept, not dropped) and,
    for multiple choice, ``choice_orders`` (``choice_orders[k][j]`` = index into ``choices`` of the option
    shown at position ``j`` of variant ``k``) and ``choice_labels`` (the labels variant ``k`` shows). Use
    :func:`unchanged_counts` for the per-kind totals.

    With ``include_original=False`` the original is left out (at least 2 generators are then needed) and
    ``canonical`` is 0, the first generated variant.

    Example:
        >>> from sago_train.data import CasingGenerator
        >>> vs = build_variant_set([{"id": "a", "prompt": "the capital of France is"}],
        ...                        [CasingGenerator("lower"), CasingGenerator("upper")], name="caps")
        >>> vs[0].variants
        ['the capital of France is', 'the capital of france is', 'THE CAPITAL OF FRANCE IS']
        >>> vs[0].kinds
        ['canonical', 'casing', 'casing-2']
    """
    validate_set_name(name)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SagoInputError(f"expected an integer seed, got {seed!r}", key="seed")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise SagoInputError(f"expected max_attempts >= 1, got {max_attempts!r}", key="max_attempts")
    if isinstance(generators, (str, VariantGenerator)) or not isinstance(generators, Sequence):
        raise SagoInputError("expected a list of generators", key="generators")
    gens = [make_generator(g) if isinstance(g, str) else g for g in generators]
    for g in gens:
        if not isinstance(g, VariantGenerator):
            raise SagoInputError(
                f"expected a generator or a generator name, got {type(g).__name__}",
                key="generators",
                hint="wrap a function with CallableGenerator(fn, name=...)",
            )
    if len(gens) + int(include_original) < 2:
        raise SagoInputError(
            f"a variant group needs at least 2 variants; got {len(gens)} generator(s)"
            + (" and include_original=False" if not include_original else ""),
            key="generators",
        )
    kinds = _unique_kinds([g.name for g in gens])

    exs = [Example.from_dict(r, index=i) for i, r in enumerate(examples)]
    if not exs:
        raise SagoInputError(f"no examples to build variant set '{name}' from")
    first: dict[str, int] = {}
    for i, ex in enumerate(exs):
        if ex.id in first:
            raise SagoInputError(
                f"example {i}: duplicate id '{ex.id}' (first seen in example {first[ex.id]})",
                key="id",
                hint="ids must be unique within a set",
            )
        first[ex.id] = i
    # Check applicability up front so no work is wasted and the error names the first bad example.
    for i, ex in enumerate(exs):
        for g in gens:
            try:
                g.check(ex)
            except SagoInputError as err:
                raise SagoInputError(
                    f"example {i} (id '{ex.id}'): generator '{g.name}': {err.message}",
                    key=err.key,
                    hint=err.hint,
                ) from None

    groups = []
    for i, ex in enumerate(exs):
        original = GeneratedVariant.from_draft(ex.draft())
        produced: list[GeneratedVariant] = [original] if include_original else []
        unchanged: list[str] = []
        for g, kind in zip(gens, kinds):
            v = original
            for attempt in range(max_attempts):
                v = g.generate(ex, draw_rng(seed, ex.id, kind, attempt))
                if v.text != original.text:
                    break
            else:
                unchanged.append(kind)
            if not v.text.strip():
                raise SagoInputError(
                    f"example {i} (id '{ex.id}'): generator '{g.name}' produced an empty variant",
                    key="variants",
                )
            produced.append(v)
        info: dict[str, Any] = {"seed": seed, "unchanged": unchanged}
        answer: list[int] | None = None
        if ex.choices is not None:
            orders = [list(v.order or range(len(ex.choices))) for v in produced]
            info["choice_orders"] = orders
            info["choice_labels"] = [list(v.labels or original.labels or ()) for v in produced]
            if ex.answer is not None:
                answer = [o.index(ex.answer) for o in orders]
        groups.append(
            VariantGroup(
                id=ex.id,
                variants=[v.text for v in produced],
                kinds=([CANONICAL_KIND] if include_original else []) + kinds,
                reference=list(ex.reference) if isinstance(ex.reference, tuple) else ex.reference,
                choices=list(ex.choices) if ex.choices is not None else None,
                answer=answer,
                meta={**ex.meta, META_KEY: info},
            )
        )
    return VariantSet(name, groups)


def unchanged_counts(variant_set: VariantSet) -> dict[str, int]:
    """Per kind, how many groups kept a variant identical to the original (see :func:`build_variant_set`).

    Example:
        >>> from sago_train.data import CasingGenerator
        >>> vs = build_variant_set([{"id": "a", "prompt": "already lower"}], [CasingGenerator("lower")], name="s")
        >>> unchanged_counts(vs)
        {'casing': 1}
    """
    counts: dict[str, int] = {}
    kinds = variant_set.kinds or []
    for k in kinds:
        if k != CANONICAL_KIND:
            counts[k] = 0
    for g in variant_set:
        for k in g.meta.get(META_KEY, {}).get("unchanged", []):
            counts[k] = counts.get(k, 0) + 1
    return counts
