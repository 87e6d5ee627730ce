"""``template``: rewrite an example with a random prompt template."""

from __future__ import annotations

import os
import random
import string
from collections.abc import Sequence

from ...errors import SagoInputError, did_you_mean
from ..examples import (
    Example,
    load_text_list,
)
from ..render import GeneratedVariant
from .base import (
    VariantGenerator,
    _check_name,
)


class TemplateGenerator(VariantGenerator):
    """Rewrite the prompt with one of several templates, drawn at random.

    Placeholders: ``{prompt}`` (the full canonical prompt), ``{body}`` (the free-text prompt or the field lines,
    without instruction/options/cue), ``{choices}`` (the options block, ``A. ...``), ``{instruction}``, and
    every field by name, case-insensitively (``{question}``, ``{Context}``). Write literal braces as ``{{ }}``.
    Every template must be renderable for every example (an unknown placeholder is an error, never a skip).

    Example:
        >>> gen = TemplateGenerator(["Q: {prompt}\\nA:", "Please answer.\\n{prompt}"])
        >>> ex = Example.from_dict({"id": "a", "prompt": "What is 2+2?"})
        >>> gen.generate(ex, random.Random(0)).text in {"Q: What is 2+2?\\nA:", "Please answer.\\nWhat is 2+2?"}
        True
    """

    name = "template"

    def __init__(self, templates: Sequence[str], *, name: str = "template") -> None:
        self.name = _check_name(name)
        if isinstance(templates, str) or not isinstance(templates, Sequence) or not templates:
            raise SagoInputError(
                "expected a non-empty list of template strings",
                key="templates",
                hint="a single template still goes in a list; load a file with TemplateGenerator.from_file",
            )
        self.templates: tuple[str, ...] = tuple(templates)
        self.placeholders: list[set[str]] = []
        for i, t in enumerate(self.templates):
            if not isinstance(t, str) or not t.strip():
                raise SagoInputError(f"template {i} is empty or not a string: {t!r}", key="templates")
            try:
                parsed = list(string.Formatter().parse(t))
            except ValueError as err:
                raise SagoInputError(
                    f"template {i} is malformed ({err}): {t!r}",
                    key="templates",
                    hint="write literal braces as {{ }}",
                ) from None
            names: set[str] = set()
            for _, fname, _, _ in parsed:
                if fname is None:
                    continue
                if not fname or fname.isdigit() or "." in fname or "[" in fname:
                    raise SagoInputError(
                        f"template {i} has an invalid placeholder {{{fname}}}: {t!r}",
                        key="templates",
                        hint="use named placeholders such as {prompt}; write literal braces as {{ }}",
                    )
                names.add(fname)
            self.placeholders.append(names)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, name: str = "template") -> TemplateGenerator:
        """Templates from a JSON/YAML list or a text file (see :func:`load_text_list`)."""
        return cls(load_text_list(path, what="templates"), name=name)

    @staticmethod
    def values(example: Example) -> dict[str, str]:
        """The placeholder values for ``example`` (keys lower-cased)."""
        d = example.draft()
        values = {"prompt": d.render(), "body": d.body()}
        if d.choices is not None:
            values["choices"] = d.choices_block()
        if d.instruction is not None:
            values["instruction"] = d.instruction
        for n, v in d.fields:
            if v.strip():
                values.setdefault(n.lower(), v)
        return values

    def check(self, example: Example) -> None:
        available = self.values(example)
        for i, names in enumerate(self.placeholders):
            for n in sorted(names):
                if n.lower() not in available:
                    raise SagoInputError(
                        f"template {i} uses {{{n}}}, which this example does not have."
                        f"{did_you_mean(n.lower(), available)} Available: {', '.join(sorted(available))}",
                        key="templates",
                    )

    def generate(self, example: Example, rng: random.Random) -> GeneratedVariant:
        values = self.values(example)
        template = rng.choice(self.templates)
        text = template.format_map(_LowerKeys(values))
        canonical = GeneratedVariant.from_draft(example.draft())
        return GeneratedVariant(text, canonical.order, canonical.labels)


class _LowerKeys(dict):  # type: ignore[type-arg]
    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())
