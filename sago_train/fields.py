"""Reading the one declaration of each setting (a dataclass field with ``metadata={"help": ...}``), for the
two things generated from it: the ``sago-train`` command's flags (:mod:`sago_train.cli.dataclass_args`) and
the ``--sago_*`` fields of :class:`~sago_train.SAGOArguments` for ``HfArgumentParser`` / ``TrlParser``. A
deprecated alias is a field whose help starts with "Deprecated name of <new>.": it is read here, once."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

DEPRECATED = "Deprecated name of "
#: Part of a help text that describes only the ``sago-train`` command's own spelling of a flag (``--stop``).
CLI_ONLY = " On the command line:"


def deprecated_alias_of(f: dataclasses.Field) -> str | None:
    """The field a deprecated alias stands for, or None for a current field.

    Example:
        >>> from sago_train.eval.config import SAGOConfig
        >>> {f.name: deprecated_alias_of(f) for f in dataclasses.fields(SAGOConfig)}["pooling"]
        'prompt_pooling'
    """
    text = f.metadata.get("help", "")
    return text[len(DEPRECATED):].strip().rstrip(".") if text.startswith(DEPRECATED) else None


def declared_fields(cls: type, *, aliases: bool = False) -> list[tuple[dataclasses.Field, Any]]:
    """The init fields of ``cls`` with their resolved types (``HfArgumentParser`` needs real types), without
    deprecated aliases unless ``aliases``."""
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)
            if f.init and (aliases or deprecated_alias_of(f) is None)]


def help_text(f: dataclasses.Field, *, cli: bool = False) -> str:
    """The field's help; outside the ``sago-train`` command without the part about its own flag spelling."""
    text = f.metadata.get("help", "")
    return text if cli else text.split(CLI_ONLY)[0]


def default_of(f: dataclasses.Field) -> Any:
    """The field's default value (a fresh one from its factory)."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
