"""Variant groups, sets and generators."""

from ..io import read_jsonl, validate_set_name
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
from .groups import VariantGroup, VariantSet
from .sources import bundled_set_paths, bundled_sets, resolve_sets

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
