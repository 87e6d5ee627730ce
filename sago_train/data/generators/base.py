"""The variant generator base classes and the checks of their options."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from ...errors import SagoInputError, unknown_name_error
from ..examples import (
    CANONICAL_KIND,
    Example,
)
from ..render import Draft, GeneratedVariant


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise SagoInputError(f"a generator name must be a non-empty string, got {name!r}", key="name")
    if name == CANONICAL_KIND:
        raise SagoInputError(f"'{CANONICAL_KIND}' is reserved for the original variant (variant 0 of a built group)",
                             key="name", hint="give the generator another name (its variants' kind)")
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
    a = example.answer
    labels = {c.format(x) for x in (chr(65 + a), chr(97 + a), str(a + 1)) for c in ("{}", "{}.", "({})", "{})")}
    aliases = [example.reference] if isinstance(example.reference, str) else example.reference
    return any(ref.strip() in labels for ref in aliases)


def _no_label_reference(example: Example, generator: str) -> None:
    # A reference like " B" would be wrong in every variant whose options or labels moved.
    if _reference_is_label(example):
        raise SagoInputError(
            f"reference {example.reference!r} is the answer's option label, which "
            f"'{generator}' changes per variant",
            key="reference",
            hint="drop 'reference' (choices + answer score multiple choice per variant) or use the option text",
        )
