"""Variant groups, sets and generators."""

from .build import build_variant_set, unchanged_counts
from .examples import load_examples, load_text_list
from .generators import (
    GENERATORS,
    CallableGenerator,
    CasingGenerator,
    FormatGenerator,
    InstructionGenerator,
    OptionShuffleGenerator,
    TemplateGenerator,
    TypoGenerator,
    VariantGenerator,
    WhitespaceGenerator,
    make_generator,
)
from .groups import (
    VariantGroup,
    VariantSet,
    bundled_set_paths,
    bundled_sets,
    read_jsonl,
    resolve_sets,
    validate_set_name,
)

__all__ = [
    "GENERATORS",
    "CallableGenerator",
    "CasingGenerator",
    "FormatGenerator",
    "InstructionGenerator",
    "OptionShuffleGenerator",
    "TemplateGenerator",
    "TypoGenerator",
    "VariantGenerator",
    "WhitespaceGenerator",
    "build_variant_set",
    "load_examples",
    "load_text_list",
    "make_generator",
    "unchanged_counts",
    "VariantGroup",
    "VariantSet",
    "bundled_set_paths",
    "bundled_sets",
    "read_jsonl",
    "resolve_sets",
    "validate_set_name",
]
