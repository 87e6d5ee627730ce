"""Variant groups and variant sets (docs/definitions.md#data).

A *variant group* is one example written K >= 2 ways; a *variant set* is a named collection of groups.
Everything that reads user data validates it here and raises :class:`~sago_train.errors.SagoInputError`
naming the file, line and field.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SagoInputError, did_you_mean, short_repr, type_name
from ..io import count_records, find_lone_surrogate, read_jsonl, validate_set_name
from ..limits import (
    MAX_VARIANT_CHARS,
    MAX_VARIANTS_PER_GROUP,
)
from .group_checks import (  # noqa: F401 - ANSWER_*, CHAT_ROLES, reference_aliases re-exported
    ANSWER_HINT,
    ANSWER_NEEDS_CHOICES,
    CHAT_ROLES,
    check_canonical_kind,
    check_choice_orders,
    check_messages,
    check_reference,
    reference_aliases,
)

Message = dict[str, str]
Variant = str | list[Message]

GROUP_KEYS = ("id", "variants", "kinds", "canonical", "reference", "choices", "answer", "meta")
# Set names become file names (<out>/<set>.jsonl); restricting them keeps outputs inside the output dir.


def subset_indices(n: int, max_groups: int | None, seed: int, name: str) -> list[int]:
    """The groups an evaluation runs out of ``n``: all (``max_groups`` None or 0), or a seeded subset that depends
    only on the seed, the set's name and ``n``, so it is the same at every evaluation, after a resume, and when
    only those lines of the file are read (:meth:`VariantSet.from_jsonl` with ``max_groups``).

    Example:
        >>> subset_indices(5, None, 0, "s"), len(subset_indices(1000, 3, 0, "s"))
        ([0, 1, 2, 3, 4], 3)
    """
    if not max_groups or max_groups >= n:
        return list(range(n))
    return sorted(random.Random(f"sago-subset:{seed}:{name}").sample(range(n), max_groups))


def variant_chars(variant: Any) -> int:
    """Characters in a variant: the string, or all message contents of a chat variant."""
    if isinstance(variant, str):
        return len(variant)
    return sum(len(m.get("content", "")) for m in variant if isinstance(m, Mapping))


def too_long_variant(group: VariantGroup, max_chars: int = MAX_VARIANT_CHARS) -> int | None:
    """The index of the first variant longer than ``max_chars`` characters, else None. Such a group is
    skipped and counted before anything tokenizes it (tokenizing megabytes can exhaust memory)."""
    for i, x in enumerate(group.variants):
        if variant_chars(x) > max_chars:
            return i
    return None


@dataclass
class VariantGroup:
    """One example written K >= 2 ways.

    ``reference`` is the expected continuation; given a list of aliases (``["Kyiv", "Kiev"]``), an answer naming
    any one of them is right (:attr:`references`), and the first one is *the* reference wherever one string is
    needed: the confidence axis scores it and training uses it as the target (:attr:`primary_reference`).

    Example:
        >>> g = VariantGroup(id="capital-017", variants=["What is the capital of France?", "Name France's capital."],
        ...                  reference=" Paris")
        >>> g.k
        2
        >>> VariantGroup(id="ua", variants=["Capital of Ukraine?", "Ukraine's capital?"],
        ...              reference=["Kyiv", "Kiev"]).primary_reference
        'Kyiv'
    """

    id: str
    variants: list[Variant]
    kinds: list[str] | None = None
    canonical: int = 0
    reference: str | list[str] | None = None
    choices: list[str] | None = None
    # The correct option: one index into ``choices`` for all variants, or one per variant when options were
    # shuffled; then ``answer[k]`` is the position in variant k's displayed order (see ``choices_for``).
    answer: int | list[int] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_group(self)

    @property
    def k(self) -> int:
        return len(self.variants)

    @property
    def references(self) -> list[str]:
        """Every accepted answer (one string, or the aliases of a list); empty without a reference."""
        return reference_aliases(self.reference)

    @property
    def primary_reference(self) -> str | None:
        """The first alias: the continuation the confidence axis scores (None without a reference)."""
        refs = self.references
        return refs[0] if refs else None

    def answer_for(self, k: int) -> int | None:
        """The correct choice index for variant ``k`` (None without choices)."""
        if self.answer is None:
            return None
        return self.answer[k] if isinstance(self.answer, list) else self.answer

    def choices_for(self, k: int) -> list[str] | None:
        """The options in the order variant ``k`` shows them.

        Generated sets with shuffled options record ``meta["generation"]["choice_orders"][k][j]`` = index
        into ``choices`` of the option shown at position j; without it the order is ``choices`` itself.
        """
        if self.choices is None:
            return None
        orders = (self.meta.get("generation") or {}).get("choice_orders")  # checked by validate_group
        if orders is not None:
            return [self.choices[j] for j in orders[k]]
        return list(self.choices)

    def is_chat(self, k: int) -> bool:
        return isinstance(self.variants[k], list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "variants": self.variants}
        for key in ("kinds", "reference", "choices", "answer"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.canonical:
            out["canonical"] = self.canonical
        if self.meta:
            out["meta"] = self.meta
        return out

    @classmethod
    def from_dict(
        cls, record: Any, *, index: int = 0, source: str | None = None, line: int | None = None
    ) -> VariantGroup:
        """Build a group from a JSON-like record, raising a located :class:`SagoInputError` when invalid."""
        where = {"source": source, "line": line}
        if not isinstance(record, Mapping):
            raise SagoInputError(f"expected a JSON object (a variant group), got {type_name(record)}", **where)
        for key in record:
            if key not in GROUP_KEYS:
                raise SagoInputError(
                    f"unknown key {short_repr(key)}.{did_you_mean(str(key)[:100], GROUP_KEYS)} "
                    f"Valid keys: {', '.join(GROUP_KEYS)}",
                    hint="put extra fields under 'meta'",
                    **where,
                )
        if "variants" not in record:
            raise SagoInputError("missing required field 'variants' (a list of at least 2 prompts)", **where)
        gid = record.get("id", f"#{index}")
        if isinstance(gid, bool) or not isinstance(gid, (str, int)):
            raise SagoInputError(f"expected a string or integer id, got {type_name(gid)}", key="id", **where)
        try:
            return cls(
                id=str(gid),
                variants=record["variants"],
                kinds=record.get("kinds"),
                canonical=record.get("canonical", 0),
                reference=record.get("reference"),
                choices=record.get("choices"),
                answer=record.get("answer"),
                meta=record.get("meta") if record.get("meta") is not None else {},
            )
        except SagoInputError as err:
            # Re-raise with the location that only the caller knows.
            raise SagoInputError(err.message, key=err.key, hint=err.hint, **where) from None


def validate_group(g: VariantGroup) -> None:
    """Validate a group in place (raises :class:`SagoInputError` without location; callers add it)."""
    v = g.variants
    if not isinstance(v, list):
        raise SagoInputError(f"expected a list of prompts, got {type_name(v)}", key="variants")
    if len(v) < 2:
        raise SagoInputError(
            f"a variant group needs at least 2 variants, got {len(v)}",
            key="variants",
            hint="stability is measured across variants of the same input",
        )
    if len(v) > MAX_VARIANTS_PER_GROUP:
        raise SagoInputError(
            f"a variant group has at most {MAX_VARIANTS_PER_GROUP} variants (MAX_VARIANTS_PER_GROUP), got {len(v)}",
            key="variants", hint="split it into several groups",
        )
    for i, x in enumerate(v):
        if isinstance(x, str):
            if not x.strip():
                raise SagoInputError(f"variant {i} is empty", key="variants")
        elif isinstance(x, list):
            check_messages(x, i)
        else:
            raise SagoInputError(
                f"variant {i}: expected a string or a list of chat messages, got {type_name(x)}", key="variants"
            )
        # Records from files were checked while reading; Python objects are checked here.
        found = find_lone_surrogate(x)
        if found is not None:
            raise SagoInputError(
                f"variant {i} contains a lone UTF-16 surrogate '{found[1].encode('unicode_escape').decode()}', "
                "which is not valid Unicode text", key="variants",
            )
    if g.kinds is not None:
        if not isinstance(g.kinds, list) or not all(isinstance(s, str) for s in g.kinds):
            raise SagoInputError(f"expected a list of strings, got {type_name(g.kinds)}", key="kinds")
        if len(g.kinds) != len(v):
            raise SagoInputError(
                f"expected one kind per variant ({len(v)}), got {len(g.kinds)}", key="kinds"
            )
        repeated = next((k for i, k in enumerate(g.kinds) if k in g.kinds[:i]), None)
        if repeated is not None:  # a kind names one variant: per-kind analysis has one column per kind
            raise SagoInputError(f"kind {short_repr(repeated)} is given to more than one variant", key="kinds",
                                 hint="give each variant of a group its own kind (e.g. paraphrase-1, paraphrase-2)")
    if isinstance(g.canonical, bool) or not isinstance(g.canonical, int) or not 0 <= g.canonical < len(v):
        raise SagoInputError(
            f"expected a variant index in [0, {len(v) - 1}], got {short_repr(g.canonical)}", key="canonical"
        )
    check_canonical_kind(g.kinds, g.canonical)
    check_reference(g.reference)
    if g.choices is not None:
        if (
            not isinstance(g.choices, list)
            or len(g.choices) < 2
            or not all(isinstance(c, str) and c.strip() for c in g.choices)
        ):
            raise SagoInputError("expected a list of at least 2 non-empty strings", key="choices")
    if g.answer is not None:
        if g.choices is None:
            raise SagoInputError(ANSWER_NEEDS_CHOICES, key="answer", hint=ANSWER_HINT)
        answers = g.answer if isinstance(g.answer, list) else [g.answer]
        if isinstance(g.answer, list) and len(g.answer) != len(v):
            raise SagoInputError(
                f"expected one answer index per variant ({len(v)}), got {len(g.answer)}", key="answer"
            )
        for a in answers:
            if isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < len(g.choices):
                raise SagoInputError(
                    f"expected a choice index in [0, {len(g.choices) - 1}], got {short_repr(a)}", key="answer"
                )
    if not isinstance(g.meta, dict):
        raise SagoInputError(f"expected an object, got {type_name(g.meta)}", key="meta")
    check_choice_orders(g.meta, g.choices, len(g.variants))


@dataclass
class VariantSet:
    """A named collection of variant groups.

    Example:
        >>> vs = VariantSet.from_records([{"id": "a", "variants": ["2+2=", "two plus two is"]}], name="math")
        >>> len(vs), vs.name
        (1, 'math')
    """

    name: str
    groups: list[VariantGroup]
    source: str | None = None

    def __post_init__(self) -> None:
        validate_set_name(self.name, source=self.source)
        if not self.groups:
            raise SagoInputError(f"variant set '{self.name}' has no groups", source=self.source)
        seen: dict[str, int] = {}
        for i, g in enumerate(self.groups):
            if g.id in seen:
                line = g.meta.get("_line") if isinstance(g.meta, dict) else None
                raise SagoInputError(
                    f"duplicate id {short_repr(g.id)} (first seen in group {seen[g.id]})",
                    source=self.source,
                    line=line,
                    key="id",
                    hint="ids must be unique within a set",
                )
            seen[g.id] = i

    def __len__(self) -> int:
        return len(self.groups)

    def __iter__(self) -> Iterator[VariantGroup]:
        return iter(self.groups)

    def __getitem__(self, i: int) -> VariantGroup:
        return self.groups[i]

    @property
    def kinds(self) -> list[str] | None:
        """The kinds shared by every group (per-kind analysis is possible), else None."""
        first = self.groups[0].kinds
        if first is None:
            return None
        return list(first) if all(g.kinds == first for g in self.groups) else None

    def subset(self, indices: Sequence[int]) -> VariantSet:
        return VariantSet(self.name, [self.groups[i] for i in indices], source=self.source)

    @classmethod
    def from_records(
        cls, records: Iterable[Any], name: str, *, source: str | None = None
    ) -> VariantSet:
        """Build a set from dicts (or :class:`VariantGroup` objects)."""
        groups = []
        for i, rec in enumerate(records):
            groups.append(rec if isinstance(rec, VariantGroup) else VariantGroup.from_dict(rec, index=i, source=source))
        return cls(name, groups, source=source)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str], name: str | None = None, *, max_groups: int | None = None,
                   seed: int = 0) -> VariantSet:
        """Read a JSONL file (one group per line); ``name`` defaults to the file's stem. With ``max_groups``
        only the groups an evaluation with that cap and ``seed`` runs (:func:`subset_indices`) are parsed and
        checked: a 127 MiB set evaluated on 2 groups is counted, not parsed whole."""
        p = Path(path)
        set_name = name if name is not None else re.sub(r"[^A-Za-z0-9_.\-]", "_", p.stem)
        keep = None
        if max_groups:
            keep = set(subset_indices(count_records(p, what="variant set"), max_groups, seed, set_name))
        order = sorted(keep) if keep is not None else None
        groups: list[VariantGroup] = []
        lines: dict[str, int] = {}
        for i, (lineno, rec) in enumerate(read_jsonl(p, what="variant set", keep=keep)):
            index = order[i] if order is not None else i  # the record's place in the file (default ids: #index)
            g = VariantGroup.from_dict(rec, index=index, source=str(p), line=lineno)
            if g.id in lines:
                raise SagoInputError(
                    f"duplicate id {short_repr(g.id)} (first on line {lines[g.id]})",
                    source=str(p),
                    line=lineno,
                    key="id",
                    hint="ids must be unique within a set",
                )
            lines[g.id] = lineno
            groups.append(g)
        if not groups:
            raise SagoInputError("no variant groups in file (it is empty)", source=str(p))
        return cls(set_name, groups, source=str(p))

    @classmethod
    def from_dataset(cls, dataset: Any, name: str) -> VariantSet:
        """Build a set from a ``datasets.Dataset`` whose rows follow the group schema (docs/definitions.md#variant-group)."""
        cols = set(getattr(dataset, "column_names", []) or [])
        # Datasets fill absent optional fields with None; drop those so defaults apply.
        records = ({k: v for k, v in row.items() if v is not None or k not in cols} for row in dataset)
        records = ({k: v for k, v in r.items() if v is not None} for r in records)
        return cls.from_records(records, name, source=f"<dataset {name}>")

    def to_jsonl(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for g in self.groups:
                f.write(json.dumps(g.to_dict(), ensure_ascii=False) + "\n")
