"""Plain examples, the input of the variant generators (:mod:`sago_train.data.generators`): their schema,
validation, and the files they are read from (examples JSONL, template and instruction lists)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import SagoInputError, did_you_mean, type_name
from ..io import read_jsonl
from ..limits import read_bounded_text
from .group_checks import CANONICAL_KIND  # noqa: F401 - re-exported (its home before)
from .groups import ANSWER_HINT, ANSWER_NEEDS_CHOICES, check_reference
from .render import Draft, PromptFormat

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
    reference: str | tuple[str, ...] | None = None  # a list of aliases is kept as a tuple (the example is frozen)
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
        instruction = text("instruction")
        reference = record.get("reference")
        try:
            check_reference(reference)
        except SagoInputError as err:
            raise fail(err.message, key="reference", hint=err.hint) from None
        if isinstance(reference, list):
            reference = tuple(reference)

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
                raise fail(ANSWER_NEEDS_CHOICES, key="answer", hint=ANSWER_HINT)
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
