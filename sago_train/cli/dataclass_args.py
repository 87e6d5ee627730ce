"""Command-line flags generated from a dataclass (as ``HfArgumentParser`` does): one flag per field, its help
from the field's ``metadata["help"]``, its choices from ``metadata["choices"]``, and no default of its own
(an absent flag leaves the dataclass default, so each setting has one default: the field's)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

from ..fields import deprecated_alias_of, help_text

_INT_LIST = ("list[int]", "list[int] | None", "Optional[list[int]]")


def _kind(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    text = text.replace("typing.", "")
    if text in _INT_LIST:
        return "int_list"
    if text.startswith(("list[str]", "Optional[list[str]]")):
        return "str_list"
    if text == "bool":
        return "bool"
    if text.startswith(("int", "Optional[int]")):
        return "int"
    return "str"


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, *,
                            flags: dict[str, str] | None = None) -> None:
    """Add ``--field-name`` for every field of ``cls`` (``flags`` renames some, e.g. ``{"stop_strings":
    "--stop"}``). Lists of strings are given by repeating the flag; lists of integers comma-separated; a
    deprecated field (help ``"Deprecated name of <new>."``) says so in its help."""
    flags = flags or {}
    for f in dataclasses.fields(cls):
        meta = f.metadata
        alias_of = deprecated_alias_of(f)
        text = help_text(f, cli=True)
        if alias_of is not None:  # metadata holds argparse keywords only (HfArgumentParser passes them on)
            text = "deprecated: use --" + alias_of.replace("_", "-")
        elif f.default is not dataclasses.MISSING and f.default is not None and not isinstance(f.default, bool):
            text += f" (default {f.default})"
        flag = flags.get(f.name, "--" + f.name.replace("_", "-"))
        kind = _kind(f.type)
        kwargs: dict[str, Any] = {"dest": f.name, "help": text, "default": None}
        if kind == "bool":
            kwargs.update(action="store_true")
        elif kind == "str_list":
            kwargs.update(action="append", metavar="STRING")
        elif kind == "int":
            kwargs.update(type=int)
        if "choices" in meta and kind == "str":
            kwargs.update(choices=meta["choices"])
        parser.add_argument(flag, **kwargs)


def dataclass_options(args: argparse.Namespace, cls: type, *,
                      convert: dict[str, Callable[[Any], Any]] | None = None) -> dict[str, Any]:
    """The options given on the command line for the fields of ``cls`` (absent flags left out), each passed
    through ``convert[name]`` when given."""
    convert = convert or {}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, f.name, None)
        if value is None or value is False:
            continue
        out[f.name] = convert[f.name](value) if f.name in convert else value
    return out
