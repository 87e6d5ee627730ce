"""Seeded, deterministic variant generators (docs/definitions.md#data).

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
    >>> from sago_train.data import TypoGenerator, build_variant_set
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

import inspect
from typing import Any

from ...errors import SagoInputError, unknown_name_error
from ..examples import CANONICAL_KIND, Example
from ..render import Draft, GeneratedVariant, PromptFormat
from .base import VariantGenerator, _ContentGenerator
from .format import FormatGenerator
from .noise import CasingGenerator, TypoGenerator, WhitespaceGenerator
from .structure import CallableGenerator, InstructionGenerator, OptionShuffleGenerator
from .template import TemplateGenerator

__all__ = [
    "CANONICAL_KIND",
    "CallableGenerator",
    "CasingGenerator",
    "Draft",
    "Example",
    "FormatGenerator",
    "FREE_TEXT_KINDS",
    "GENERATORS",
    "GeneratedVariant",
    "InstructionGenerator",
    "OptionShuffleGenerator",
    "PromptFormat",
    "TemplateGenerator",
    "TypoGenerator",
    "VariantGenerator",
    "WhitespaceGenerator",
    "make_generator",
]


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

# The kinds that rewrite a bare free-text prompt with their default settings (text noise on the content): the
# ones a trainer can draw afresh from any group's canonical prompt (StabilityConfig.fresh_kinds).
FREE_TEXT_KINDS: tuple[str, ...] = tuple(n for n, c in GENERATORS.items() if issubclass(c, _ContentGenerator))


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
        params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        raise SagoInputError(
            f"bad arguments for generator '{name}': {err}. Accepted: {', '.join(params)}"
        ) from None

