"""Variant groups and variant sets (SPEC "Data").

A *variant group* is one example written K >= 2 ways; a *variant set* is a named collection of groups.
Everything that reads user data validates it here and raises :class:`~sago_train.errors.SagoInputError`
naming the file, line and field.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SagoInputError, did_you_mean, short_repr, unknown_name_error
from ..limits import (
    MAX_LINE_BYTES,
    MAX_SET_FILE_BYTES,
    MAX_VARIANT_CHARS,
    MAX_VARIANTS_PER_GROUP,
    human_bytes,
    open_regular_file,
)

Message = dict[str, str]
Variant = str | list[Message]

GROUP_KEYS = ("id", "variants", "kinds", "canonical", "reference", "choices", "answer", "meta")
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")
# Set names become file names (<out>/<set>.jsonl); restricting them keeps outputs inside the output dir.
_SET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")


def validate_set_name(name: str, **where: Any) -> str:
    """Check that ``name`` is safe as a file name component and return it."""
    if not isinstance(name, str) or not _SET_NAME.match(name) or ".." in name:
        raise SagoInputError(
            f"invalid set name {short_repr(name)}: expected letters, digits, '_', '-' or '.', starting with a "
            "letter or digit",
            hint="set names become file names, so they cannot contain '/' or '..'",
            **where,
        )
    return name


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "object"}.get(
        type(value), type(value).__name__
    )


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

    Example:
        >>> g = VariantGroup(id="capital-017", variants=["What is the capital of France?", "Name France's capital."],
        ...                  reference=" Paris")
        >>> g.k
        2
    """

    id: str
    variants: list[Variant]
    kinds: list[str] | None = None
    canonical: int = 0
    reference: str | None = None
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
        orders = self.meta.get("generation", {}).get("choice_orders") if isinstance(self.meta, dict) else None
        if isinstance(orders, list) and k < len(orders) and isinstance(orders[k], list):
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


def _check_message_list(value: list[Any], i: int) -> None:
    if not value:
        raise SagoInputError(f"variant {i} is an empty message list", key="variants")
    for j, msg in enumerate(value):
        if not isinstance(msg, Mapping):
            raise SagoInputError(
                f"variant {i}, message {j}: expected an object with 'role' and 'content', got {type_name(msg)}",
                key="variants",
            )
        role, content = msg.get("role"), msg.get("content")
        if role not in CHAT_ROLES:
            raise SagoInputError(
                f"variant {i}, message {j}: role {short_repr(role)} is not one of {', '.join(CHAT_ROLES)}."
                + (did_you_mean(role, CHAT_ROLES) if isinstance(role, str) else ""),
                key="variants",
            )
        if not isinstance(content, str):
            raise SagoInputError(
                f"variant {i}, message {j}: expected string 'content', got {type_name(content)}", key="variants"
            )


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
            _check_message_list(x, i)
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
    if isinstance(g.canonical, bool) or not isinstance(g.canonical, int) or not 0 <= g.canonical < len(v):
        raise SagoInputError(
            f"expected a variant index in [0, {len(v) - 1}], got {short_repr(g.canonical)}", key="canonical"
        )
    if g.reference is not None:
        if not isinstance(g.reference, str):
            raise SagoInputError(f"expected a string, got {type_name(g.reference)}", key="reference")
        if not g.reference.strip():
            raise SagoInputError("reference is empty", key="reference", hint="omit it to use the greedy output")
    if g.choices is not None:
        if (
            not isinstance(g.choices, list)
            or len(g.choices) < 2
            or not all(isinstance(c, str) and c.strip() for c in g.choices)
        ):
            raise SagoInputError("expected a list of at least 2 non-empty strings", key="choices")
    if g.answer is not None:
        if g.choices is None:
            raise SagoInputError("'answer' needs 'choices'", key="answer")
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


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON number")


# A JSON escape of a UTF-16 surrogate: only lines containing one can decode to a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def find_lone_surrogate(value: Any, path: str = "") -> tuple[str, str] | None:
    """``(where, char)`` of the first lone UTF-16 surrogate in a parsed JSON value, else None. JSON's
    ``"\\ud800"`` decodes to one; it is not valid Unicode, so no tokenizer or UTF-8 writer accepts it."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            found = _LONE_SURROGATE.search(item)
            if found:
                return where, found.group()
        elif isinstance(item, Mapping):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in reversed(list(item.items())))
            stack.extend((where, k) for k in item)
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(item))))
    return None


def read_jsonl(
    path: str | os.PathLike[str],
    *,
    max_file_bytes: int = MAX_SET_FILE_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
    what: str = "JSONL file",
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, parsed_object)`` for each non-blank line, with located errors.

    The file is streamed one line at a time: a non-regular file (FIFO, device) or one larger than
    ``max_file_bytes`` is refused before reading, and a line longer than ``max_line_bytes`` is refused
    without being held whole."""
    p = Path(path)
    limit_name = "MAX_SET_FILE_BYTES" if max_file_bytes == MAX_SET_FILE_BYTES else ""
    with open_regular_file(p, max_bytes=max_file_bytes, what=what, limit_name=limit_name) as f:
        total = 0
        lineno = 0
        while True:
            raw = f.readline(max_line_bytes + 1)
            if not raw:
                return
            lineno += 1
            total += len(raw)
            if len(raw) > max_line_bytes:
                raise SagoInputError(
                    f"line longer than the limit of {human_bytes(max_line_bytes)} (MAX_LINE_BYTES)",
                    source=str(p), line=lineno, hint="each line must be one JSON object of reasonable size",
                )
            if total > max_file_bytes:  # the file grew while it was read
                raise SagoInputError(f"file longer than the limit of {human_bytes(max_file_bytes)}",
                                     source=str(p), line=lineno, hint="split it into smaller files")
            if lineno == 1:
                if raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]  # a UTF-8 byte-order mark is harmless; accept it
                elif raw.startswith((b"\xff\xfe", b"\xfe\xff")):
                    raise SagoInputError(
                        "not valid UTF-8: the file is UTF-16 (it starts with a UTF-16 byte-order mark)",
                        source=str(p), line=1, hint="save the file as UTF-8",
                    )
            if not raw.strip():
                continue
            yield lineno, _parse_line(raw[:-1] if raw.endswith(b"\n") else raw, str(p), lineno)


def _parse_line(raw: bytes, source: str, lineno: int) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SagoInputError(
            f"not valid UTF-8 (byte {err.start})", source=source, line=lineno, hint="save the file as UTF-8"
        ) from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise SagoInputError(
            "malformed JSON: nested too deeply", source=source, line=lineno, hint="each line must be one JSON object"
        ) from None
    except (json.JSONDecodeError, ValueError) as err:
        msg = err.msg if isinstance(err, json.JSONDecodeError) else str(err)
        col = f" (column {err.colno})" if isinstance(err, json.JSONDecodeError) else ""
        raise SagoInputError(
            f"malformed JSON: {msg}{col}", source=source, line=lineno, hint="each line must be one JSON object"
        ) from None
    if _SURROGATE_ESCAPE.search(raw):
        found = find_lone_surrogate(value)
        if found is not None:
            where, char = found
            raise SagoInputError(
                f"a lone UTF-16 surrogate '{char.encode('unicode_escape').decode()}' is not valid Unicode text",
                source=source, line=lineno, key=where or None,
                hint="write the character itself, or a surrogate pair for characters outside the BMP",
            )
    return value


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
    def from_jsonl(cls, path: str | os.PathLike[str], name: str | None = None) -> VariantSet:
        """Read a SPEC JSONL file (one group per line); ``name`` defaults to the file's stem."""
        p = Path(path)
        groups: list[VariantGroup] = []
        lines: dict[str, int] = {}
        for i, (lineno, rec) in enumerate(read_jsonl(p, what="variant set")):
            g = VariantGroup.from_dict(rec, index=i, source=str(p), line=lineno)
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
        set_name = name if name is not None else re.sub(r"[^A-Za-z0-9_.\-]", "_", p.stem)
        return cls(set_name, groups, source=str(p))

    @classmethod
    def from_dataset(cls, dataset: Any, name: str) -> VariantSet:
        """Build a set from a ``datasets.Dataset`` whose rows follow the SPEC group schema."""
        cols = set(getattr(dataset, "column_names", []) or [])
        # Datasets fill absent optional fields with None; drop those so defaults apply.
        records = ({k: v for k, v in row.items() if v is not None or k not in cols} for row in dataset)
        records = ({k: v for k, v in r.items() if v is not None} for r in records)
        return cls.from_records(records, name, source=f"<dataset {name}>")

    def to_jsonl(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for g in self.groups:
                f.write(json.dumps(g.to_dict(), ensure_ascii=False) + "\n")


SetsLike = VariantSet | str | os.PathLike | Mapping[str, VariantSet | str | os.PathLike] | Sequence[Any]


def resolve_sets(sets: SetsLike) -> dict[str, VariantSet]:
    """Normalize the many ways of naming sets into ``{name: VariantSet}``.

    Accepts a :class:`VariantSet`, a path, a ``"NAME=PATH"`` string, a mapping name -> set or path, or a
    list of any of these.

    Example:
        >>> resolve_sets(VariantSet.from_records([{"variants": ["a", "b"]}], name="x"))["x"].name
        'x'
    """
    out: dict[str, VariantSet] = {}

    def add(vs: VariantSet) -> None:
        if vs.name in out:
            raise SagoInputError(f"two variant sets are named '{vs.name}'", hint="give each set a unique name")
        out[vs.name] = vs

    if isinstance(sets, VariantSet):
        add(sets)
    elif isinstance(sets, (str, os.PathLike)):
        text = os.fspath(sets)
        if "=" in text and not Path(text).exists():
            name, path = text.split("=", 1)
            add(VariantSet.from_jsonl(path, name=validate_set_name(name)))
        else:
            add(VariantSet.from_jsonl(text))
    elif isinstance(sets, Mapping):
        for name, value in sets.items():
            if isinstance(value, VariantSet):
                add(value if value.name == name else VariantSet(validate_set_name(name), value.groups, value.source))
            else:
                add(VariantSet.from_jsonl(value, name=validate_set_name(name)))
    elif isinstance(sets, Sequence):
        for item in sets:
            for vs in resolve_sets(item).values():
                add(vs)
    else:
        raise SagoInputError(
            f"expected a VariantSet, a path, or a mapping of names to sets, got {type(sets).__name__}"
        )
    if not out:
        raise SagoInputError("no variant sets given")
    return out


#: Collections of bundled sets: ``tiny`` probes the shipped tiny model (``assets/sets/*.jsonl``), ``real``
#: the real instruct model ``sago://smollm2-135m-instruct`` (``assets/sets/real/*.jsonl``: questions with
#: short references, kinds canonical/paraphrase/format/typo).
BUNDLED_COLLECTIONS = ("tiny", "real")


def bundled_set_paths(collection: str = "tiny") -> dict[str, Path]:
    """The example sets shipped with the package, by collection (:data:`BUNDLED_COLLECTIONS`)."""
    if collection not in BUNDLED_COLLECTIONS:
        raise unknown_name_error("bundled set collection", collection, BUNDLED_COLLECTIONS, key="set")
    root = Path(__file__).resolve().parent.parent / "assets" / "sets"
    if collection == "real":
        root = root / "real"
    return {p.stem: p for p in sorted(root.glob("*.jsonl"))}


def bundled_sets(collection: str = "tiny") -> dict[str, VariantSet]:
    """Load the example sets shipped with the package (``collection``: ``tiny`` or ``real``)."""
    return {name: VariantSet.from_jsonl(path, name=name) for name, path in bundled_set_paths(collection).items()}


def is_finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
