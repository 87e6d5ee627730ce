"""A Griffe extension for the API reference (mkdocs.yml): the docstrings head their doctests ``Example:`` (or
``Example (a custom training loop):``), which the Google-style parser reads as a plain admonition whose ``>>>``
lines would render as nested quotes; renamed ``Examples:`` here, they render as code. The docstrings themselves
stay as they are (tests/test_docstrings.py runs them)."""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

_EXAMPLE_HEADER = re.compile(r"^(\s*)Examples? ?(?:\([^)\n]*\))?:\s*$", flags=re.M)


class ExampleSections(Extension):
    """Renames each docstring's example section header to ``Examples:`` as objects are loaded."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE_HEADER.sub(r"\1Examples:", obj.docstring.value)
