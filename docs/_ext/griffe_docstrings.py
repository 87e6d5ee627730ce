"""A Griffe extension for the API reference (mkdocs.yml): the docstrings head their doctests ``Example:`` (or
``Example (a custom training loop):``), which the Google-style parser reads as a plain admonition whose ``>>>``
lines would render as nested quotes; renamed ``Examples:`` here, they render as code. Sphinx roles
(``:class:`X```) become plain code spans, which Markdown would otherwise print with the role. The docstrings
themselves stay as they are (tests/test_docstrings.py runs them)."""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

_EXAMPLE_HEADER = re.compile(r"^(\s*)Examples? ?(?:\([^)\n]*\))?:\s*$", flags=re.M)
_SPHINX_ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj):`~?([^`]+)`")


class DocstringMarkup(Extension):
    """Renames each docstring's example section header to ``Examples:`` and drops Sphinx roles, as objects are
    loaded."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            value = _EXAMPLE_HEADER.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = _SPHINX_ROLE.sub(r"`\1`", value)
