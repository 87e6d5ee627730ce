"""The package's layers (README "Development"): each folder imports only from the layers below it."""

from __future__ import annotations

import re
from pathlib import Path

import sago_train

ROOT = Path(sago_train.__file__).resolve().parent
# Lower number = lower layer. errors, limits and version are the base every layer may use.
RANK = {"errors": -1, "limits": -1, "version": -1, "functional": 0, "formatting": 1, "runlock": 1, "io": 1, "distributed": 1, "threads": 1, "fields": 1,
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


IMPORT_ANY = re.compile(r"^\s*(?:from (\.+[\w.]*|sago_train[\w.]*) import (\([^)]*\)|[^#\n]+)|import (sago_train[\w.]*))",
                        re.M)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package modules it imports, at module level, inside functions and under TYPE_CHECKING alike:
    a function-local import is still a dependency, and two modules importing each other are one concept split
    in two."""
    modules = {".".join(p.relative_to(root).with_suffix("").parts): p for p in root.rglob("*.py")}
    modules = {k.removesuffix(".__init__") if k != "__init__" else "": v for k, v in modules.items()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        package = name.split(".") if is_pkg else name.split(".")[:-1]
        deps: set[str] = set()
        for m in IMPORT_ANY.finditer(path.read_text(encoding="utf-8")):
            target, names, plain = m.group(1), m.group(2), m.group(3)
            if plain:
                base = plain.removeprefix("sago_train").lstrip(".")
                candidates = [base]
            elif target.startswith("."):
                up = len(target) - len(target.lstrip("."))
                base = ".".join([*package[: len(package) - (up - 1)], *[x for x in target.lstrip(".").split(".") if x]])
                candidates = [base] + [f"{base}.{n.strip()}" if base else n.strip()
                                       for n in re.sub(r"[()\n]", " ", names).split(",") if n.strip()]
            else:
                base = target.removeprefix("sago_train").lstrip(".")
                candidates = [base]
            for c in candidates:
                c = c.split(" as ")[0].strip()
                if c in modules and c != name:
                    deps.add(c)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles (each once, as a list of modules), by depth-first search; the package root's lazy
    re-exports (``sago_train/__init__.py``) and packages' own ``__init__`` imports of their modules are left out."""
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if dep == "" or dep.startswith(f"{node}.") or node.startswith(f"{dep}.") and dep in graph and \
                    (ROOT / dep.replace(".", "/") / "__init__.py").exists():
                continue  # a package and its own modules
            if state.get(dep) == 1:
                found.append(stack[stack.index(dep):] + [dep])
            elif state.get(dep) is None:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node and state.get(node) is None:
            visit(node)
    return found


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_checker_sees_a_function_local_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "eval").mkdir(parents=True)
    (pkg / "eval" / "__init__.py").write_text("")
    (pkg / "eval" / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "eval" / "b.py").write_text("from .a import f\n")
    assert cycles(import_graph(pkg)) == [["eval.a", "eval.b", "eval.a"]]
