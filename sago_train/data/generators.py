"""Seeded, deterministic variant generators (SPEC "Data").

They turn *plain examples* into a :class:`~sago_train.data.groups.VariantSet`: each example becomes one group
whose variant 0 is the original (kind ``"canonical"``) followed by one variant per generator, so the kinds line
up across groups and per-kind analysis works.

A plain example is a dict::

    {"id": "cap-1",                      # optional; derived from the content when absent
     "prompt": "What is the capital of France?",   # free text; or build the prompt from parts:
     "question": "...",                  # rendered as the field "Question"
     "fields": {"Context": "...", "Question": "...", "Answer": ""},  # "Name: value" lines; a last
                                         #   empty-valued field is the answer cue ("Answer:")
     "choices": ["Paris", "Lyon"], "answer": 0,   # multiple choice, rendered "A. Paris" ... + "Answer:"
     "instruction": "Answer briefly.",   # put before the body
     "reference": " Paris",              # passed through to the group
     "meta": {...}}                      # passed through to the group

``prompt`` is exclusive with ``question``/``fields``. The canonical rendering of a structured example is::

    {instruction}\\n\\n{Field}: {value}\\n...\\nA. {choice}\\nB. {choice}\\n...\\nAnswer:

Generators (registry :data:`GENERATORS`, factory :func:`make_generator`):

=================== =========================================================================================
``template``        rewrite with a random prompt template (``{prompt}``, ``{body}``, ``{choices}``, fields ...)
``format``          FormatSpread-style: separators, field-name casing and aliases, joiners, option labels
``typo``            character noise: swaps, drops, duplications, QWERTY-neighbour substitutions
``casing``          lower / upper / title / swap / random casing of the content
``whitespace``      extra spaces, newlines or tabs between words
``option_shuffle``  permute the choices; the variant's answer index is remapped
``instruction``     an alternative instruction (replacing or prepending)
``callable``        a user function ``(text, rng) -> str`` on the full prompt
=================== =========================================================================================

Text noise (typo, casing, whitespace) touches the *content* only - the free-text prompt, the field values and
the instruction - never the scaffolding (field names, separators, option labels, the answer cue) nor the
option texts, because those are what the answer/reference are read against. The scaffolding is the ``format``
generator's job.

Determinism: every draw uses a :class:`random.Random` seeded from a SHA-256 of ``(seed, example id, kind,
attempt)``, so a variant does not depend on the order of the examples, on the other generators, or on
``PYTHONHASHSEED``.

Example:
    >>> vs = build_variant_set(
    ...     [{"id": "q1", "question": "What is 2+2?", "choices": ["3", "4", "5"], "answer": 1}],
    ...     ["option_shuffle", TypoGenerator(rate=0.1)], name="demo", seed=0)
    >>> vs[0].kinds
    ['canonical', 'option_shuffle', 'typo']
    >>> print(vs[0].variants[0])
    Question: What is 2+2?
    A. 3
    B. 4
    C. 5
    Answer:
    >>> g = vs[0]
    >>> all(g.choices[g.meta["generation"]["choice_orders"][k][g.answer[k]]] == "4" for k in range(g.k))
    True
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import string
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SagoInputError, did_you_mean, unknown_name_error
from ..limits import read_bounded_text
from .groups import VariantGroup, VariantSet, read_jsonl, type_name, validate_set_name

__all__ = [
    "CANONICAL_KIND",
    "CallableGenerator",
    "CasingGenerator",
    "Draft",
    "Example",
    "FormatGenerator",
    "GENERATORS",
    "GeneratedVariant",
    "InstructionGenerator",
    "OptionShuffleGenerator",
    "PromptFormat",
    "TemplateGenerator",
    "TypoGenerator",
    "VariantGenerator",
    "WhitespaceGenerator",
    "build_variant_set",
    "load_examples",
    "load_text_list",
    "make_generator",
    "unchanged_counts",
]

CANONICAL_KIND = "canonical"
EXAMPLE_KEYS = ("id", "prompt", "question", "fields", "choices", "answer", "instruction", "reference", "meta")
# Group meta key under which generation details are stored (seed, unchanged kinds, per-variant option orders).
META_KEY = "generation"
MAX_CHOICES = 26  # letter labels A..Z


# --------------------------------------------------------------------------------------------------------------
# Plain examples
# --------------------------------------------------------------------------------------------------------------


def _content_id(record: Mapping[str, Any]) -> str:
    # Derived from the content (not the position) so that generation does not depend on example order.
    payload = json.dumps({k: v for k, v in record.items() if k != "id"}, sort_keys=True, ensure_ascii=True)
    return "ex-" + hashlib.sha256(payload.encode("utf-8")).hexdigest()[:10]


@dataclass(frozen=True)
class Example:
    """A validated plain example (see the module docstring for the dict form).

    Example:
        >>> ex = Example.from_dict({"id": "a", "fields": {"Context": "Sky.", "Question": "Colour?"}})
        >>> print(ex.render())
        Context: Sky.
        Question: Colour?
    """

    id: str
    prompt: str | None = None
    # Ordered (name, value) pairs; ``question`` is stored here as the last field "Question".
    fields: tuple[tuple[str, str], ...] = ()
    choices: tuple[str, ...] | None = None
    answer: int | None = None
    instruction: str | None = None
    reference: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(
        cls, record: Any, *, index: int = 0, source: str | None = None, line: int | None = None
    ) -> Example:
        """Validate a plain-example dict, raising a :class:`SagoInputError` that names the example and field."""
        if isinstance(record, Example):
            return record
        where: dict[str, Any] = {"source": source, "line": line}
        if not isinstance(record, Mapping):
            raise SagoInputError(f"example {index}: expected an object, got {type_name(record)}", **where)
        raw_id = record.get("id")
        if raw_id is not None and (isinstance(raw_id, bool) or not isinstance(raw_id, (str, int))):
            raise SagoInputError(
                f"example {index}: expected a string or integer id, got {type_name(raw_id)}",
                key="id",
                **where,
            )
        label = f"example {index}" + (f" (id '{raw_id}')" if raw_id is not None else "")

        def fail(message: str, key: str | None = None, hint: str | None = None) -> SagoInputError:
            return SagoInputError(f"{label}: {message}", key=key, hint=hint, **where)

        for key in record:
            if key not in EXAMPLE_KEYS:
                raise fail(
                    f"unknown key '{key}'.{did_you_mean(str(key), EXAMPLE_KEYS)} Valid keys: {', '.join(EXAMPLE_KEYS)}",
                    hint="put extra fields under 'meta'",
                )

        def text(key: str) -> str | None:
            value = record.get(key)
            if value is None:
                return None
            if not isinstance(value, str):
                raise fail(f"expected a string, got {type_name(value)}", key=key)
            if not value.strip():
                raise fail(f"'{key}' is empty", key=key)
            return value

        prompt, question = text("prompt"), text("question")
        instruction, reference = text("instruction"), text("reference")

        fields: list[tuple[str, str]] = []
        raw_fields = record.get("fields")
        if raw_fields is not None:
            if not isinstance(raw_fields, Mapping) or not raw_fields:
                raise fail("expected a non-empty object of field name -> text", key="fields")
            for name, value in raw_fields.items():
                if not isinstance(name, str) or not name.strip():
                    raise fail(f"field names must be non-empty strings, got {name!r}", key="fields")
                if not isinstance(value, str):
                    raise fail(f"field '{name}': expected a string, got {type_name(value)}", key="fields")
                fields.append((name, value))
            for i, (name, value) in enumerate(fields):
                # An empty value is the answer cue ("Answer:"), which only makes sense last.
                if not value.strip() and i != len(fields) - 1:
                    raise fail(
                        f"field '{name}' is empty",
                        key="fields",
                        hint="only the last field may be empty (it is rendered as the answer cue, e.g. 'Answer:')",
                    )
            if not any(v.strip() for _, v in fields):
                raise fail("every field is empty", key="fields")
        if question is not None:
            names = {n.lower() for n, _ in fields}
            if "question" in names:
                raise fail("'question' is given twice (as a key and in 'fields')", key="question")
            # Keep a trailing cue field last.
            if fields and not fields[-1][1].strip():
                fields.insert(len(fields) - 1, ("Question", question))
            else:
                fields.append(("Question", question))
        if prompt is not None and fields:
            raise fail(
                "give either 'prompt' (free text) or 'question'/'fields' (parts to render), not both",
                key="prompt",
            )
        if prompt is None and not fields:
            raise fail(
                "missing 'prompt'",
                key="prompt",
                hint="give 'prompt', or 'question'/'fields' to build it from",
            )

        choices: tuple[str, ...] | None = None
        raw_choices = record.get("choices")
        if raw_choices is not None:
            if not isinstance(raw_choices, list) or not raw_choices:
                raise fail("choices are empty: expected a list of at least 2 option strings", key="choices")
            for j, c in enumerate(raw_choices):
                if not isinstance(c, str) or not c.strip():
                    raise fail(f"choice {j}: expected a non-empty string, got {c!r}", key="choices")
            if len(raw_choices) < 2:
                raise fail(f"expected at least 2 choices, got {len(raw_choices)}", key="choices")
            if len(raw_choices) > MAX_CHOICES:
                raise fail(
                    f"at most {MAX_CHOICES} choices are supported, got {len(raw_choices)}", key="choices"
                )
            choices = tuple(raw_choices)
        answer = record.get("answer")
        if answer is not None:
            if choices is None:
                raise fail("'answer' needs 'choices'", key="answer")
            if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
                raise fail(
                    f"answer out of range: expected a choice index in [0, {len(choices) - 1}], got {answer!r}",
                    key="answer",
                )
        meta = record.get("meta")
        if meta is None:
            meta = {}
        if not isinstance(meta, Mapping):
            raise fail(f"expected an object, got {type_name(meta)}", key="meta")
        if META_KEY in meta:
            raise fail(f"meta key '{META_KEY}' is reserved for generation details", key="meta")
        gid = str(raw_id) if raw_id is not None else _content_id(record)
        return cls(
            id=gid,
            prompt=prompt,
            fields=tuple(fields),
            choices=choices,
            answer=answer,
            instruction=instruction,
            reference=reference,
            meta=dict(meta),
        )

    @property
    def structured(self) -> bool:
        """True when the prompt is rendered from parts (fields or choices), so its format can vary."""
        return bool(self.fields) or self.choices is not None

    def draft(self) -> Draft:
        """A mutable copy in the canonical format, for generators to modify."""
        return Draft(
            instruction=self.instruction,
            fields=list(self.fields),
            prompt=self.prompt,
            choices=list(self.choices) if self.choices is not None else None,
            order=list(range(len(self.choices or ()))),
            fmt=PromptFormat(),
        )

    def render(self) -> str:
        """The canonical prompt."""
        return self.draft().render()


# --------------------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------------------

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

    def answer_position(self, answer: int | None) -> int | None:
        """Where the originally-indexed ``answer`` is shown in this draft."""
        return None if answer is None else self.order.index(answer)

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


# --------------------------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------------------------


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise SagoInputError(f"a generator name must be a non-empty string, got {name!r}", key="name")
    if name == CANONICAL_KIND:
        raise SagoInputError(f"'{CANONICAL_KIND}' is reserved for the original variant", key="name")
    return name


def _str_options(value: Any, what: str, allowed: Sequence[str] | None = None) -> tuple[str, ...]:
    """Validate a non-empty sequence of strings (a single string is one option)."""
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not items or not all(isinstance(x, str) for x in items):
        raise SagoInputError(f"expected a non-empty list of strings, got {value!r}", key=what)
    if allowed is not None:
        for x in items:
            if x not in allowed:
                raise unknown_name_error(what.rstrip("s"), x, allowed, key=what)
    return tuple(items)


class VariantGenerator:
    """Base class: a named, deterministic-given-``rng`` rewrite of an example.

    Subclasses implement :meth:`transform` (modify a :class:`Draft`) or override :meth:`generate`.
    :meth:`check` rejects examples the generator cannot apply to, before anything is generated.
    """

    name: str = "generator"

    def check(self, example: Example) -> None:
        """Raise :class:`SagoInputError` when this generator cannot rewrite ``example``."""

    def transform(self, draft: Draft, rng: random.Random) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement transform() or generate()")

    def generate(self, example: Example, rng: random.Random) -> GeneratedVariant:
        d = example.draft()
        self.transform(d, rng)
        return GeneratedVariant.from_draft(d)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class _ContentGenerator(VariantGenerator, ABC):
    """Applies :meth:`perturb` to the content pieces (prompt, field values, instruction), not to scaffolding."""

    @abstractmethod
    def perturb(self, text: str, rng: random.Random) -> str: ...

    def transform(self, draft: Draft, rng: random.Random) -> None:
        if draft.instruction is not None:
            draft.instruction = self.perturb(draft.instruction, rng)
        # Cue fields (empty value) stay empty.
        draft.fields = [(n, self.perturb(v, rng) if v.strip() else v) for n, v in draft.fields]
        if draft.prompt is not None:
            draft.prompt = self.perturb(draft.prompt, rng)


def _reference_is_label(example: Example) -> bool:
    if example.reference is None or example.answer is None:
        return False
    ref = example.reference.strip()
    a = example.answer
    return ref in {
        c.format(x) for x in (chr(65 + a), chr(97 + a), str(a + 1)) for c in ("{}", "{}.", "({})", "{})")
    }


def _no_label_reference(example: Example, generator: str) -> None:
    # A reference like " B" would be wrong in every variant whose options or labels moved.
    if _reference_is_label(example):
        raise SagoInputError(
            f"reference {example.reference!r} is the answer's option label, which "
            f"'{generator}' changes per variant",
            key="reference",
            hint="drop 'reference' (choices + answer score multiple choice per variant) or use the option text",
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


DEFAULT_SEPARATORS = (": ", " - ", ":\n", " = ", " :: ", ":  ")
DEFAULT_JOINERS = ("\n", "\n\n", " ", " | ")
DEFAULT_INSTRUCTION_JOINERS = ("\n\n", "\n", " ")
DEFAULT_CHOICE_JOINERS = ("\n", " ", "; ")
DEFAULT_LABEL_TEMPLATES = ("{}. ", "({}) ", "{}) ", "[{}] ", "{}: ")
# Alternative names for common fields, keyed case-insensitively.
DEFAULT_FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "question": ("Q", "Query", "Problem"),
    "context": ("Passage", "Background", "Text"),
    "passage": ("Context", "Text"),
    "answer": ("Response", "Solution"),
    "input": ("Text", "Source"),
    "output": ("Response", "Target"),
    "premise": ("Sentence 1", "Statement"),
    "hypothesis": ("Sentence 2", "Claim"),
}


class FormatGenerator(VariantGenerator):
    """FormatSpread-style format perturbations of a structured example.

    One draw picks, uniformly and independently: the name/value separator, the field-name casing, an alias for
    each field name (or the name itself), the line joiner, the instruction joiner, the option label style
    (A/a/1), the label template (``A.``, ``(A)``, ...) and the option joiner. Content is unchanged.
    Needs ``fields``, ``choices`` or an ``instruction`` to reformat.

    Example:
        >>> ex = Example.from_dict({"id": "a", "fields": {"Context": "Sky.", "Question": "Colour?"}})
        >>> gen = FormatGenerator(separators=[" - "], name_casings=["upper"], aliases={}, joiners=["\\n"])
        >>> print(gen.generate(ex, random.Random(0)).text)
        CONTEXT - Sky.
        QUESTION - Colour?
    """

    name = "format"

    def __init__(
        self,
        *,
        separators: Sequence[str] = DEFAULT_SEPARATORS,
        name_casings: Sequence[str] = NAME_CASINGS,
        aliases: Mapping[str, Sequence[str]] | None = None,
        joiners: Sequence[str] = DEFAULT_JOINERS,
        instruction_joiners: Sequence[str] = DEFAULT_INSTRUCTION_JOINERS,
        label_styles: Sequence[str] = LABEL_STYLES,
        label_templates: Sequence[str] = DEFAULT_LABEL_TEMPLATES,
        choice_joiners: Sequence[str] = DEFAULT_CHOICE_JOINERS,
        name: str = "format",
    ) -> None:
        self.name = _check_name(name)
        self.separators = _str_options(separators, "separators")
        self.name_casings = _str_options(name_casings, "name_casings", NAME_CASINGS)
        self.joiners = _str_options(joiners, "joiners")
        self.instruction_joiners = _str_options(instruction_joiners, "instruction_joiners")
        self.label_styles = _str_options(label_styles, "label_styles", LABEL_STYLES)
        self.label_templates = _str_options(label_templates, "label_templates")
        for t in self.label_templates:
            if t.count("{}") != 1 or t.replace("{}", "").count("{") or t.replace("{}", "").count("}"):
                raise SagoInputError(
                    f"a label template needs exactly one '{{}}' for the label, got {t!r}",
                    key="label_templates",
                )
        self.choice_joiners = _str_options(choice_joiners, "choice_joiners")
        raw = DEFAULT_FIELD_ALIASES if aliases is None else aliases
        if not isinstance(raw, Mapping):
            raise SagoInputError(
                f"expected an object of field name -> alternative names, got {raw!r}", key="aliases"
            )
        self.aliases = {str(k).lower(): _str_options(v, "aliases") for k, v in raw.items()}

    def check(self, example: Example) -> None:
        if not example.structured and example.instruction is None:
            raise SagoInputError(
                "the example is free text only; format perturbations need 'fields', 'choices' "
                "or an 'instruction' to reformat",
                key="prompt",
                hint="use 'question'/'fields' instead of 'prompt', or a template/typo/casing generator",
            )
        if example.choices is not None:
            _no_label_reference(example, self.name)

    def transform(self, draft: Draft, rng: random.Random) -> None:
        names = {}
        for n, _ in draft.fields + ([("Answer", "")] if draft.choices is not None else []):
            names[n] = rng.choice((n, *self.aliases.get(n.lower(), ())))
        draft.fmt = PromptFormat(
            separator=rng.choice(self.separators),
            name_casing=rng.choice(self.name_casings),
            names=names,
            joiner=rng.choice(self.joiners),
            instruction_joiner=rng.choice(self.instruction_joiners),
            label_style=rng.choice(self.label_styles),
            label_template=rng.choice(self.label_templates),
            choice_joiner=rng.choice(self.choice_joiners),
        )


def _keyboard_neighbours() -> dict[str, str]:
    rows = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
    offsets = (0.0, 0.25, 0.75)  # the stagger of a physical QWERTY keyboard
    pos = {c: (r, col + offsets[r]) for r, row in enumerate(rows) for col, c in enumerate(row)}
    return {
        c: "".join(d for d, (r2, x2) in pos.items() if d != c and abs(r2 - r) <= 1 and abs(x2 - x) <= 1.0)
        for c, (r, x) in pos.items()
    }


KEYBOARD_NEIGHBOURS = _keyboard_neighbours()
TYPO_OPS = ("swap", "drop", "duplicate", "substitute")


class TypoGenerator(_ContentGenerator):
    """Character noise: each letter is edited with probability ``rate``.

    Edits are adjacent swaps, drops, duplications and QWERTY-neighbour substitutions (case kept). Only letters
    are edited - digits and punctuation carry meaning ("2+2") - at least one letter is edited when there is
    one, and a text never loses its last letter, so a variant is never empty.

    Example:
        >>> TypoGenerator(rate=0.2).perturb("The quick brown fox", random.Random(1)) != "The quick brown fox"
        True
    """

    name = "typo"

    def __init__(self, rate: float = 0.05, *, ops: Sequence[str] = TYPO_OPS, name: str = "typo") -> None:
        self.name = _check_name(name)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise SagoInputError(f"typo rate must be in (0, 1], got {rate!r}", key="rate")
        self.rate = float(rate)
        self.ops = _str_options(ops, "ops", TYPO_OPS)

    def perturb(self, text: str, rng: random.Random) -> str:
        letters = [i for i, c in enumerate(text) if c.isalpha()]
        if not letters:
            return text
        chosen = [i for i in letters if rng.random() < self.rate]
        if not chosen:
            chosen = [rng.choice(letters)]
        chars = list(text)
        out: list[str] = []
        n_letters = len(letters)
        todo = set(chosen)
        i = 0
        while i < len(chars):
            c = chars[i]
            if i not in todo:
                out.append(c)
                i += 1
                continue
            op = rng.choice(self.ops)
            nxt = chars[i + 1] if i + 1 < len(chars) else ""
            if op == "swap" and nxt.isalpha() and nxt != c:
                out += [nxt, c]
                i += 2  # the swapped partner is consumed
                continue
            if op == "drop" and n_letters > 1:
                n_letters -= 1
                i += 1
                continue
            low = c.lower()
            if op == "substitute" and low in KEYBOARD_NEIGHBOURS:
                s = rng.choice(KEYBOARD_NEIGHBOURS[low])
                out.append(s.upper() if c.isupper() else s)
                i += 1
                continue
            # duplicate, and the fallback when the drawn edit is impossible here (it always changes the text)
            out += [c, c]
            n_letters += 1
            i += 1
        result = "".join(out)
        if result == text:
            # Edits can cancel out (drop one "a" of "aa", duplicate the other); one more duplication cannot.
            j = rng.choice(letters)
            result = text[: j + 1] + text[j:]
        return result


CASING_MODES = ("lower", "upper", "title", "swap", "random")
_WORD = re.compile(r"[^\W\d_][\w'’]*")


def _title(text: str) -> str:
    # str.title() capitalises after apostrophes ("They'Re"); capitalise word starts only.
    return _WORD.sub(lambda m: m.group(0)[0].upper() + m.group(0)[1:].lower(), text)


class CasingGenerator(_ContentGenerator):
    """Change the casing of the content: ``lower``, ``upper``, ``title``, ``swap`` (swapcase) or ``random``
    (each letter upper or lower at random).

    Example:
        >>> CasingGenerator("title").perturb("what's the capital of france?", random.Random(0))
        "What's The Capital Of France?"
    """

    name = "casing"

    def __init__(self, mode: str = "lower", *, name: str = "casing") -> None:
        self.name = _check_name(name)
        if mode not in CASING_MODES:
            raise unknown_name_error("casing mode", str(mode), CASING_MODES, key="mode")
        self.mode = mode

    def perturb(self, text: str, rng: random.Random) -> str:
        if self.mode == "lower":
            return text.lower()
        if self.mode == "upper":
            return text.upper()
        if self.mode == "title":
            return _title(text)
        if self.mode == "swap":
            return text.swapcase()
        return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in text)


WHITESPACE_STYLES = {"space": "  ", "newline": "\n", "tab": "\t"}
# A single space between two non-space characters: leading/trailing whitespace is left alone because the
# end of the prompt is where the reference attaches.
_GAP = re.compile(r"(?<=\S) (?=\S)")


class WhitespaceGenerator(_ContentGenerator):
    """Replace a share ``rate`` of the single spaces between words with ``"  "`` (``space``), ``"\\n"``
    (``newline``) or ``"\\t"`` (``tab``); at least one when there is a gap.

    Example:
        >>> WhitespaceGenerator(rate=1.0, styles=["space"]).perturb("a b c", random.Random(0))
        'a  b  c'
    """

    name = "whitespace"

    def __init__(
        self, rate: float = 0.25, *, styles: Sequence[str] = ("space", "newline"), name: str = "whitespace"
    ) -> None:
        self.name = _check_name(name)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise SagoInputError(f"whitespace rate must be in (0, 1], got {rate!r}", key="rate")
        self.rate = float(rate)
        self.styles = _str_options(styles, "styles", tuple(WHITESPACE_STYLES))

    def perturb(self, text: str, rng: random.Random) -> str:
        gaps = [m.start() for m in _GAP.finditer(text)]
        if not gaps:
            return text
        chosen = {g for g in gaps if rng.random() < self.rate} or {rng.choice(gaps)}
        return "".join(
            WHITESPACE_STYLES[rng.choice(self.styles)] if i in chosen else c for i, c in enumerate(text)
        )


class OptionShuffleGenerator(VariantGenerator):
    """Permute the multiple-choice options (never the identity); the variant's answer index is remapped.

    Example:
        >>> ex = Example.from_dict({"id": "a", "question": "2+2?", "choices": ["3", "4"], "answer": 1})
        >>> v = OptionShuffleGenerator().generate(ex, random.Random(0))
        >>> v.order, ex.choices[v.order[0]]
        ((1, 0), '4')
    """

    name = "option_shuffle"

    def __init__(self, *, name: str = "option_shuffle") -> None:
        self.name = _check_name(name)

    def check(self, example: Example) -> None:
        if example.choices is None:
            raise SagoInputError(
                "the example has no 'choices' to shuffle",
                key="choices",
                hint="option shuffling applies to multiple-choice examples (question + choices + answer)",
            )
        _no_label_reference(example, self.name)

    def transform(self, draft: Draft, rng: random.Random) -> None:
        identity = list(range(len(draft.order)))
        order = identity[:]
        # Rejection keeps the draw uniform over non-identity permutations; P(identity) <= 1/2, so this ends fast.
        while order == identity:
            rng.shuffle(order)
        draft.order = order


class InstructionGenerator(VariantGenerator):
    """Use an alternative instruction: it replaces the example's instruction, or is prepended when there is
    none. The draw avoids the example's own instruction.

    Example:
        >>> ex = Example.from_dict({"id": "a", "prompt": "2+2=", "instruction": "Compute."})
        >>> InstructionGenerator(["Calculate.", "Compute."]).generate(ex, random.Random(0)).text
        'Calculate.\\n\\n2+2='
    """

    name = "instruction"

    def __init__(self, instructions: Sequence[str], *, name: str = "instruction") -> None:
        self.name = _check_name(name)
        if isinstance(instructions, str) or not isinstance(instructions, Sequence) or not instructions:
            raise SagoInputError("expected a non-empty list of instruction strings", key="instructions")
        for i, s in enumerate(instructions):
            if not isinstance(s, str) or not s.strip():
                raise SagoInputError(f"instruction {i} is empty or not a string: {s!r}", key="instructions")
        self.instructions = tuple(instructions)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, name: str = "instruction") -> InstructionGenerator:
        """Instructions from a JSON/YAML list or a text file (see :func:`load_text_list`)."""
        return cls(load_text_list(path, what="instructions"), name=name)

    def transform(self, draft: Draft, rng: random.Random) -> None:
        options = [s for s in self.instructions if s != draft.instruction] or list(self.instructions)
        draft.instruction = rng.choice(options)


class CallableGenerator(VariantGenerator):
    """A user function ``fn(text, rng) -> str`` applied to the full canonical prompt.

    ``rng`` is a seeded :class:`random.Random`; use it (not global randomness) to stay deterministic.

    Example:
        >>> gen = CallableGenerator(lambda text, rng: text.replace("capital", "main city"), name="synonym")
        >>> gen.generate(Example.from_dict({"id": "a", "prompt": "The capital of France is"}),
        ...              random.Random(0)).text
        'The main city of France is'
    """

    name = "callable"

    def __init__(self, fn: Callable[[str, random.Random], str], name: str = "callable") -> None:
        if not callable(fn):
            raise SagoInputError(f"expected a function (text, rng) -> str, got {type(fn).__name__}", key="fn")
        self.fn = fn
        self.name = _check_name(name)

    def generate(self, example: Example, rng: random.Random) -> GeneratedVariant:
        canonical = GeneratedVariant.from_draft(example.draft())
        text = self.fn(canonical.text, rng)
        if not isinstance(text, str):
            raise SagoInputError(
                f"generator '{self.name}' returned {type_name(text)} for example '{example.id}', expected a string"
            )
        return GeneratedVariant(text, canonical.order, canonical.labels)


GENERATORS: dict[str, type[VariantGenerator]] = {
    "template": TemplateGenerator,
    "format": FormatGenerator,
    "typo": TypoGenerator,
    "casing": CasingGenerator,
    "whitespace": WhitespaceGenerator,
    "option_shuffle": OptionShuffleGenerator,
    "instruction": InstructionGenerator,
    "callable": CallableGenerator,
}


def make_generator(name: str, **kwargs: Any) -> VariantGenerator:
    """Build a generator by registry name.

    Example:
        >>> make_generator("typo", rate=0.1).rate
        0.1
        >>> make_generator("typos")
        Traceback (most recent call last):
        ...
        sago_train.errors.SagoInputError: unknown generator 'typos'. Did you mean 'typo'? Valid: ...
    """
    cls = GENERATORS.get(name)
    if cls is None:
        raise unknown_name_error("generator", str(name), GENERATORS)
    try:
        return cls(**kwargs)
    except TypeError as err:
        import inspect

        params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        raise SagoInputError(
            f"bad arguments for generator '{name}': {err}. Accepted: {', '.join(params)}"
        ) from None


# --------------------------------------------------------------------------------------------------------------
# Building sets
# --------------------------------------------------------------------------------------------------------------


def _rng(seed: int, example_id: str, kind: str, attempt: int) -> random.Random:
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
                v = g.generate(ex, _rng(seed, ex.id, kind, attempt))
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
                reference=ex.reference,
                choices=list(ex.choices) if ex.choices is not None else None,
                answer=answer,
                meta={**ex.meta, META_KEY: info},
            )
        )
    return VariantSet(name, groups)


def unchanged_counts(variant_set: VariantSet) -> dict[str, int]:
    """Per kind, how many groups kept a variant identical to the original (see :func:`build_variant_set`).

    Example:
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


# --------------------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------------------


def load_text_list(path: str | os.PathLike[str], *, what: str = "templates") -> list[str]:
    """Read a list of strings (templates, instructions) from a file.

    ``.json``: a list of strings or ``{"<what>": [...]}``; ``.yaml``/``.yml``: the same in YAML; any other
    extension is text: blocks separated by lines of ``---`` when there are any (for multi-line entries),
    otherwise one entry per non-blank line.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "t.txt"
        >>> _ = p.write_text("Q: {prompt}\\n---\\nPlease answer:\\n{prompt}\\n")
        >>> load_text_list(p)
        ['Q: {prompt}', 'Please answer:\\n{prompt}']
    """
    p = Path(path)
    src = str(p)
    if not p.exists():  # a FIFO or device exists and is refused by read_bounded_text, without blocking
        raise SagoInputError(f"file not found: {p}", key=what, hint="check the path")
    text = read_bounded_text(p, what="text file")  # bounded: never a FIFO or device, at most MAX_SET_FILE_BYTES
    suffix = p.suffix.lower()
    if suffix in (".json", ".yaml", ".yml"):
        try:
            if suffix == ".json":
                data = json.loads(text)
            else:
                import yaml

                data = yaml.safe_load(text)
        except Exception as err:  # noqa: BLE001 - report any parse error as a located input error
            raise SagoInputError(f"cannot parse {suffix[1:].upper()}: {err}", source=src) from None
        if isinstance(data, Mapping) and what in data:
            data = data[what]
        if not isinstance(data, list):
            raise SagoInputError(
                f"expected a list of strings (or an object with key '{what}'), got {type_name(data)}",
                source=src,
            )
        for i, x in enumerate(data):
            if not isinstance(x, str) or not x.strip():
                raise SagoInputError(
                    f"entry {i}: expected a non-empty string, got {x!r}", source=src, key=what
                )
        items = list(data)
    else:
        lines = text.splitlines()
        if any(line.strip() == "---" for line in lines):
            items, block = [], []
            for line in [*lines, "---"]:
                if line.strip() == "---":
                    entry = "\n".join(block).strip("\n")
                    if entry.strip():
                        items.append(entry)
                    block = []
                else:
                    block.append(line)
        else:
            items = [line for line in lines if line.strip()]
    if not items:
        raise SagoInputError(f"no {what} in file (it is empty)", source=src)
    return items


def load_examples(path: str | os.PathLike[str]) -> list[Example]:
    """Read plain examples from JSONL (one object per line) or a JSON list, with file:line errors.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "ex.jsonl"
        >>> _ = p.write_text('{"id": "a", "prompt": "2+2="}\\n')
        >>> [e.id for e in load_examples(p)]
        ['a']
    """
    p = Path(path)
    if p.suffix.lower() == ".json":
        if not p.exists():
            raise SagoInputError(f"file not found: {p}", hint="check the path")
        try:
            data = json.loads(read_bounded_text(p, what="examples file"))
        except json.JSONDecodeError as err:
            raise SagoInputError(f"cannot parse JSON: {err}", source=str(p)) from None
        if not isinstance(data, list):
            raise SagoInputError(f"expected a list of examples, got {type_name(data)}", source=str(p))
        out = [Example.from_dict(r, index=i, source=str(p)) for i, r in enumerate(data)]
    else:
        out = [Example.from_dict(r, index=i, source=str(p), line=n) for i, (n, r) in enumerate(read_jsonl(p))]
    if not out:
        raise SagoInputError("no examples in file (it is empty)", source=str(p))
    return out
