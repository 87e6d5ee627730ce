"""Variant groups, sets and generators."""

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
    "VariantGroup",
    "VariantSet",
    "bundled_set_paths",
    "bundled_sets",
    "read_jsonl",
    "resolve_sets",
    "validate_set_name",
]
