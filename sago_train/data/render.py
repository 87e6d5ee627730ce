"""How a prompt is rendered from a plain example: the format (separators, casings, labels), the mutable
draft a generator edits, and the variant it produces."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_WORD = re.compile(r"[^\W\d_][\w'’]*")


def _title(text: str) -> str:
    # str.title() capitalises after apostrophes ("They'Re"); capitalise word starts only.
    return _WORD.sub(lambda m: m.group(0)[0].upper() + m.group(0)[1:].lower(), text)


NAME_CASINGS = ("as_is", "title", "upper", "lower")
LABEL_STYLES = ("upper", "lower", "number")


@dataclass(frozen=True)
class PromptFormat:
    """How a structured example is laid out; the defaults are the canonical format.

    Example:
        >>> PromptFormat(separator=" - ", name_casing="upper").field_line("Question", "Why?")
        'QUESTION - Why?'
    """

    separator: str = ": "  # between a field name and its value
    name_casing: str = "as_is"  # as_is | title | upper | lower
    names: Mapping[str, str] = field(default_factory=dict)  # field renames (aliases), before casing
    joiner: str = "\n"  # between field lines, the options block and the answer cue
    instruction_joiner: str = "\n\n"
    label_style: str = "upper"  # upper (A) | lower (a) | number (1)
    label_template: str = "{}. "  # how a label is written before its option
    choice_joiner: str = "\n"

    def field_name(self, name: str) -> str:
        name = self.names.get(name, name)
        if self.name_casing == "title":
            return _title(name)
        if self.name_casing == "upper":
            return name.upper()
        if self.name_casing == "lower":
            return name.lower()
        return name

    def field_line(self, name: str, value: str) -> str:
        return f"{self.field_name(name)}{self.separator}{value}"

    def cue(self, name: str) -> str:
        # The prompt ends at the cue; stripping trailing whitespace keeps the boundary with the reference
        # (" Paris") the same in every format.
        return f"{self.field_name(name)}{self.separator.rstrip()}"

    def label(self, i: int) -> str:
        """The bare label of option ``i`` (``"A"``, ``"a"`` or ``"1"``)."""
        if self.label_style == "lower":
            return chr(ord("a") + i)
        if self.label_style == "number":
            return str(i + 1)
        return chr(ord("A") + i)


@dataclass
class Draft:
    """A mutable, renderable copy of an example that generators modify.

    ``order[j]`` is the index into the example's original ``choices`` of the option shown at position ``j``.
    """

    instruction: str | None
    fields: list[tuple[str, str]]
    prompt: str | None
    choices: list[str] | None
    order: list[int]
    fmt: PromptFormat

    def cue_name(self) -> str | None:
        if self.fields and not self.fields[-1][1].strip():
            return self.fields[-1][0]
        return "Answer" if self.choices is not None else None

    def body(self) -> str:
        """The free-text prompt or the field lines (no instruction, options or cue)."""
        fields = self.fields[:-1] if self.fields and not self.fields[-1][1].strip() else self.fields
        lines = [self.fmt.field_line(n, v) for n, v in fields]
        if self.prompt is not None:
            lines.append(self.prompt)
        return self.fmt.joiner.join(lines)

    def choices_block(self) -> str:
        if self.choices is None:
            return ""
        return self.fmt.choice_joiner.join(
            self.fmt.label_template.format(self.fmt.label(j)) + self.choices[i]
            for j, i in enumerate(self.order)
        )

    def render(self) -> str:
        blocks = [self.body()]
        if self.choices is not None:
            blocks.append(self.choices_block())
        cue = self.cue_name()
        if cue is not None:
            blocks.append(self.fmt.cue(cue))
        text = self.fmt.joiner.join(b for b in blocks if b)
        if self.instruction is not None:
            text = self.instruction + self.fmt.instruction_joiner + text
        return text


@dataclass(frozen=True)
class GeneratedVariant:
    """One generated prompt plus the option order and labels it shows (None without choices)."""

    text: str
    order: tuple[int, ...] | None = None
    labels: tuple[str, ...] | None = None

    @classmethod
    def from_draft(cls, d: Draft) -> GeneratedVariant:
        if d.choices is None:
            return cls(d.render())
        return cls(d.render(), tuple(d.order), tuple(d.fmt.label(j) for j in range(len(d.order))))
