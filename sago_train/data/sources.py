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


def resolve_sets(sets: SetsLike, *, max_groups: int | None = None, seed: int = 0) -> dict[str, VariantSet]:
    """Normalize the many ways of naming sets into ``{name: VariantSet}``.

    Accepts a :class:`VariantSet`, a path, a ``"NAME=PATH"`` string, a mapping name -> set or path, or a
    list of any of these. Files are read whole, or with ``max_groups`` only the groups an evaluation with that
    cap and ``seed`` runs (see :meth:`VariantSet.from_jsonl`).

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
            add(VariantSet.from_jsonl(path, name=validate_set_name(name), max_groups=max_groups, seed=seed))
        else:
            add(VariantSet.from_jsonl(text, max_groups=max_groups, seed=seed))
    elif isinstance(sets, Mapping):
        for name, value in sets.items():
            if isinstance(value, VariantSet):
                add(value if value.name == name else VariantSet(validate_set_name(name), value.groups, value.source))
            else:
                add(VariantSet.from_jsonl(value, name=validate_set_name(name), max_groups=max_groups, seed=seed))
    elif isinstance(sets, Sequence):
        for item in sets:
            for vs in resolve_sets(item, max_groups=max_groups, seed=seed).values():
                add(vs)
    else:
        raise SagoInputError(
            f"expected a VariantSet, a path, or a mapping of names to sets, got {type(sets).__name__}"
        )
    if not out:
        raise SagoInputError("no variant sets given")
    return out


#: Collections of bundled sets: ``tiny`` probes the shipped tiny model (``assets/sets/*.jsonl``), ``real``
#: the real models ``sago://smollm2-135m-instruct`` and ``sago://gemma-3-270m`` (``assets/sets/real/*.jsonl``,
#: built by ``scripts/build_real_sets.py``: questions with short references, in forms an instruct and a base
#: model both answer). ``COLLECTION/SET`` names one set of a collection (``real/capitals``).
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
    """Load the example sets shipped with the package: a collection (``tiny`` or ``real``), or one set of
    it (``real/capitals``).

    Example:
        >>> list(bundled_sets("real/capitals"))
        ['capitals']
    """
    name, _, one = collection.partition("/")
    paths = bundled_set_paths(name)
    if one:
        if one not in paths:
            raise unknown_name_error("bundled set", collection, [f"{name}/{n}" for n in paths], key="set")
        paths = {one: paths[one]}
    return {n: VariantSet.from_jsonl(path, name=n) for n, path in paths.items()}


def is_bundled_spec(spec: str) -> bool:
    """Whether ``spec`` names bundled sets (``tiny``, ``real``, ``real/capitals``) rather than a file: a file
    of that name, where one exists, wins."""
    return spec.partition("/")[0] in BUNDLED_COLLECTIONS and "=" not in spec and not os.path.exists(spec)


def sets_from_specs(specs: Sequence[str], *, key: str = "set", max_groups: int | None = None,
                    seed: int = 0) -> dict[str, VariantSet]:
    """Sets named on a command line (``sago-train eval --set``, ``--sago_sets``): each ``NAME=FILE``, a JSONL
    path, a bundled collection (:data:`BUNDLED_COLLECTIONS`) or one of its sets (``real/capitals``) when no
    file of that name exists. ``key`` names the flag in errors; ``max_groups`` and ``seed`` as in
    :func:`resolve_sets`."""
    out: dict[str, VariantSet] = {}
    for spec in specs:
        try:
            part = bundled_sets(spec) if is_bundled_spec(spec) else resolve_sets(spec, max_groups=max_groups,
                                                                                  seed=seed)
        except SagoInputError as err:
            if err.source is not None:  # an error inside a set file names that file
                raise
            raise SagoInputError(err.message, key=key, hint=err.hint) from None
        for name, vs in part.items():
            if name in out:
                raise SagoInputError(f"two variant sets are named '{name}'", key=key,
                                     hint="give each set a unique name with NAME=FILE")
            out[name] = vs
    if not out:
        raise SagoInputError("no variant sets given", key=key,
                             hint="e.g. paraphrase=sets/paraphrase.jsonl, tiny, real or real/capitals")
    return out
