"""``format``: FormatSpread-style changes of the scaffolding (separators, field names, joiners, option labels)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from ...errors import SagoInputError
from ..examples import (
    Example,
)
from ..render import LABEL_STYLES, NAME_CASINGS, Draft, PromptFormat
from .base import (
    VariantGenerator,
    _check_name,
    _no_label_reference,
    _str_options,
)

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
