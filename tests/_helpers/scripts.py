"""Importing the repository's scripts (benchmarks/, scripts/), which are files, not package modules."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def script_module(relpath: str) -> Iterator[ModuleType]:
    """The script at ``ROOT/relpath`` as a module, registered in ``sys.modules`` under its stem while the block runs
    (a dataclass in it looks its module up there) and removed after."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
