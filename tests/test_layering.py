"""The package's layers (README "Development"): each folder imports only from the layers below it."""

from __future__ import annotations

import re
from pathlib import Path

import sago_train

ROOT = Path(sago_train.__file__).resolve().parent
# Lower number = lower layer. errors, limits and version are the base every layer may use.
RANK = {"errors": -1, "limits": -1, "version": -1, "functional": 0, "io": 1, "distributed": 1, "threads": 1, "fields": 1,
        "data": 2, "model": 3, "results": 4, "eval": 5, "training": 6, "integrations": 7, "analysis": 8, "cli": 9}
IMPORT = re.compile(r"^\s*from (\.+)([\w.]*) import", re.M)


def upward_imports() -> list[tuple[str, str]]:
    bad = []
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        top = parts[0].removesuffix(".py")
        if top == "__init__":
            continue  # the public API re-exports every layer
        folder = list(parts[:-1])
        for m in IMPORT.finditer(path.read_text(encoding="utf-8")):
            up = len(m.group(1)) - 1
            target = (folder[: len(folder) - up] + [x for x in m.group(2).split(".") if x])[:1]
            if target and target[0] != top and RANK.get(target[0], 99) > RANK.get(top, 99):
                bad.append((str(path.relative_to(ROOT)), target[0]))
    return sorted(set(bad))


def test_every_top_level_module_has_a_layer():
    names = {p.name.removesuffix(".py") for p in ROOT.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert names - {"__init__"} - set(RANK) == set()


def test_no_layer_imports_from_a_layer_above_it():
    assert upward_imports() == []


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    (pkg / "functional").mkdir(parents=True)
    (pkg / "functional" / "x.py").write_text("from ..cli.main import main\nfrom .y import z\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", pkg)
    assert upward_imports() == [("functional/x.py", "cli")]
