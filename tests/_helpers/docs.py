"""The README and the manual's pages as the doc tests read them: the files, and their fenced code blocks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: Every Markdown file a reader sees: the README, the manual's pages, and the two root files the manual includes.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "BENCHMARKS.md", ROOT / "RELIABILITY.md"]

#: Pages that other branches are writing at the time this was written: a link to one that does not exist yet is
#: accepted, and the site is built with an empty stand-in for it (in a copy, never in the repository). Once a page
#: exists it is checked like any other; drop it from here and add its nav line to mkdocs.yml.
PENDING_PAGES: dict[str, str] = {}

_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[ \t]*$")


def page_name(page: Path) -> str:
    """The page's path relative to the repository, as the test ids and the block registry spell it."""
    return page.relative_to(ROOT).as_posix()


def fenced_blocks(page: Path, language: str | None = None) -> list[tuple[str, str]]:
    """``(language, body)`` of each fenced block of ``page`` (language lowercased, "" when untagged), from a
    line-by-line parse; only those tagged ``language`` when it is given."""
    blocks: list[tuple[str, str]] = []
    current: list[str] | None = None
    lang = ""
    for line in page.read_text(encoding="utf-8").splitlines():
        m = _FENCE.match(line)
        if current is None and m:
            lang, current = m.group(1).lower(), []
        elif current is not None and m and not m.group(1):
            blocks.append((lang, "\n".join(current) + "\n"))
            current = None
        elif current is not None:
            current.append(line)
    assert current is None, f"{page_name(page)}: a fenced block is not closed"
    return [(lang, body) for lang, body in blocks if language is None or lang == language]


def prose(page: Path, *, code_spans: bool = False) -> str:
    """The page's text without its fenced blocks (where its links and headings are), and without its inline code
    spans unless ``code_spans``."""
    out, inside = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            out.append(line if code_spans else re.sub(r"(`+)(?:(?!\1).)+?\1", "", line))
    return "\n".join(out)
