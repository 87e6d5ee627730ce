"""Where variant sets come from: the many ways of naming them (paths, ``NAME=PATH``, mappings, lists) and the
sets shipped with the package."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import SagoInputError, unknown_name_error
from ..io import validate_set_name
from .groups import VariantSet

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


def sets_from_specs(specs: Sequence[str], *, key: str = "set") -> dict[str, VariantSet]:
    """Sets named on a command line (``sago-train eval --set``, ``--sago_sets``): each ``NAME=FILE``, a JSONL
    path, or a bundled collection (:data:`BUNDLED_COLLECTIONS`) when no file of that name exists. ``key`` names
    the flag in errors."""
    out: dict[str, VariantSet] = {}
    for spec in specs:
        part = bundled_sets(spec) if spec in BUNDLED_COLLECTIONS and not os.path.exists(spec) else resolve_sets(spec)
        for name, vs in part.items():
            if name in out:
                raise SagoInputError(f"two variant sets are named '{name}'", key=key,
                                     hint="give each set a unique name with NAME=FILE")
            out[name] = vs
    if not out:
        raise SagoInputError("no variant sets given", key=key, hint="e.g. paraphrase=sets/paraphrase.jsonl, or tiny")
    return out
