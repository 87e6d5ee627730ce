"""Every docstring example in the package runs (DEVELOPERS: docstrings on the public API carry a short
example that a test runs): one test per module, through doctest."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import sago_train

MODULES = sorted(m.name for m in pkgutil.walk_packages(sago_train.__path__, "sago_train."))


def test_the_examples_are_found():
    finder = doctest.DocTestFinder()
    examples = sum(len(t.examples) for name in MODULES for t in finder.find(importlib.import_module(name)))
    assert examples >= 100, examples  # 137 when this test was written; a drop means examples stopped being found


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
