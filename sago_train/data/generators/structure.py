"""Changes of the question's structure: ``option_shuffle``, ``instruction`` and a user ``callable``."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence

from ...errors import SagoInputError, type_name
from ..examples import (
    Example,
    load_text_list,
)
from ..render import Draft, GeneratedVariant
from .base import (
    VariantGenerator,
    _check_name,
    _no_label_reference,
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
