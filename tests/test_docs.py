"""The manual pages under docs/: every ``sago-train`` line of a bash block parses with the CLI's own parser,
every ``make`` target and script it names exists, every Python block compiles and imports what exists."""

from __future__ import annotations

import ast
import importlib
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))


def fenced(page: Path, language: str) -> list[str]:
    blocks, current = [], None
    for line in page.read_text(encoding="utf-8").splitlines():
        if current is None and line.strip() == f"```{language}":
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    assert current is None, f"{page.name}: a fenced block is not closed"
    return blocks


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_shell_lines_name_what_exists(page):
    from sago_train.cli.main import build_parser

    makefile = (ROOT / "Makefile").read_text()
    for text in fenced(page, "bash"):
        for line in text.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if not words:
                continue
            if words[0] == "sago-train":
                _, extra = build_parser().parse_known_args(words[1:])  # SystemExit on an unknown flag
                assert not extra, words
            elif words[0] == "make":
                assert re.search(rf"^{re.escape(words[1])}:", makefile, flags=re.M), words
            elif words[0] == "python":
                assert (ROOT / words[1]).is_file(), words


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_python_blocks_compile_and_import_what_exists(page):
    for text in fenced(page, "python"):
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sago_train"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), (page.name, node.module, alias.name)


def test_real_models_page_names_every_real_model():
    from sago_train.model.real import REAL_MODELS

    text = (ROOT / "docs" / "real-models.md").read_text()
    for model in REAL_MODELS.values():
        assert model.uri in text and model.original in text and all(p in text for p in model.packages[:1])
    assert "Gemma terms of use" in text
