"""Reading a recipe's YAML (and ``--section.key value`` overrides): safe constructors only, line numbers kept for error messages, and bounded input
(a regular file of at most ``MAX_RECIPE_BYTES``, whose size with every alias expanded is at most
``MAX_RECIPE_EXPANDED``, so a "billion laughs" recipe is refused instead of expanded)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from ..errors import SagoInputError, short_repr
from ..limits import MAX_RECIPE_BYTES, MAX_RECIPE_EXPANDED, open_regular_file

SCHEME = "sago://"  # sago://tiny-llama names a file shipped in the package


class _LineDict(dict):
    """A dict that remembers the line of each key (1-based) for error messages."""

    lines: dict[str, int]


class _SafeLineLoader(yaml.SafeLoader):
    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """PyYAML's merge (``<<: *base``), keeping one entry per merged key: the one that wins (YAML: the first
        mapping listed, then later entries of one mapping), so merges of merges stay the size of their keys
        instead of doubling at each level. Records how many leading entries came from merges: an explicit key
        after them overrides (YAML's rule), a key written twice is a mistake."""
        explicit = sum(1 for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge")
        had_merge = explicit < len(node.value)
        super().flatten_mapping(node)
        if not had_merge:
            return
        merged, rest = node.value[: len(node.value) - explicit], node.value[len(node.value) - explicit:]
        last: dict[Any, int] = {}
        for i, (k, _) in enumerate(merged):  # constructing in order, the last entry of a key wins
            last[k.value if isinstance(k, yaml.ScalarNode) else id(k)] = i
        keep = sorted(last.values())
        node.value = [merged[i] for i in keep] + rest
        node.merged = len(keep)  # type: ignore[attr-defined]


def _construct_mapping(loader: _SafeLineLoader, node: yaml.MappingNode) -> _LineDict:
    loader.flatten_mapping(node)
    merged = getattr(node, "merged", 0)
    out = _LineDict()
    out.lines = {}
    explicit: set[str] = set()
    for i, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise SagoInputError(f"keys must be strings, got {short_repr(key)}", line=key_node.start_mark.line + 1)
        if i >= merged:
            if key in explicit:
                raise SagoInputError(f"duplicate key {short_repr(key)}", line=key_node.start_mark.line + 1, key=key)
            explicit.add(key)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


_SafeLineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def expanded_size(value: Any, limit: int = MAX_RECIPE_EXPANDED) -> int:
    """Values plus characters of strings in ``value`` with every shared (aliased) part counted as often as it
    is used; stops counting past ``limit``. YAML aliases make a small file a DAG whose expansion (printing it,
    copying it into TrainingArguments, saving the resolved recipe) is exponential: this measures it in time
    linear in the number of distinct nodes."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    # Iterative post-order over distinct containers; a container's size is computed once and reused.
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, children_done = stack.pop()
        if not isinstance(item, (dict, list)) or id(item) in sizes:
            continue
        children = list(item.items()) if isinstance(item, dict) else list(enumerate(item))
        if not children_done:
            if id(item) in visiting:  # a recursive alias (&a [*a]): its expansion is infinite
                return limit + 1
            visiting.add(id(item))
            stack.append((item, True))
            stack.extend((child, False) for _, child in children if isinstance(child, (dict, list)))
            continue
        total = 1
        for key, child in children:
            total += _leaf_size(key) if isinstance(item, dict) else 0
            total += sizes.get(id(child), 0) if isinstance(child, (dict, list)) else _leaf_size(child)
            if total > limit:
                break
        sizes[id(item)] = min(total, limit + 1)
    return sizes.get(id(value), _leaf_size(value))


def _leaf_size(value: Any) -> int:
    return 1 + (len(value) if isinstance(value, str) else 0)


#: Nesting deeper than this is refused before the parser recurses (PyYAML composes recursively: 20,000 levels
#: end in a RecursionError); no recipe value nests more than a few levels.
MAX_YAML_DEPTH = 100
_OPENERS = frozenset("[{")


def _too_deep(text: str) -> bool:
    """Whether flow brackets (``[[[...`` or ``{{{...``) nest past :data:`MAX_YAML_DEPTH`, counted without parsing
    (quoted text is counted too: erring on refusal only for absurd values). Block nesting is bounded by the
    indentation a 1 MiB file can hold and is caught as a RecursionError."""
    depth = 0
    for ch in text:
        if ch in _OPENERS:
            depth += 1
            if depth > MAX_YAML_DEPTH:
                return True
        elif ch in "]}" and depth:
            depth -= 1
    return False


def parse_yaml(text: str, *, source: str | None = None, what: str = "recipe", key: str | None = None,
               lenient: bool = False) -> Any:
    """YAML text through the one safe, line-keeping loader and the recipe's limits: nesting (``MAX_YAML_DEPTH``)
    and the size with every alias expanded (``MAX_RECIPE_EXPANDED``). Used for the recipe file and for every
    ``--section.key value`` override alike, so a "billion laughs" or a deep nesting is refused on the command
    line as in the file. ``lenient``: text that is not YAML is returned as it is (an override's plain text)."""
    if _too_deep(text):
        raise SagoInputError(f"invalid YAML: nested too deeply (more than {MAX_YAML_DEPTH} levels, MAX_YAML_DEPTH)",
                             source=source, key=key)
    try:
        data = yaml.load(text, Loader=_SafeLineLoader)  # noqa: S506 - a SafeLoader
    except RecursionError:
        raise SagoInputError("invalid YAML: nested too deeply", source=source, key=key) from None
    except yaml.YAMLError as err:
        if lenient:
            return text
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        raise SagoInputError(f"invalid YAML: {problem[:200]}", source=source, key=key,
                             line=mark.line + 1 if mark is not None and source else None) from None
    except SagoInputError as err:
        raise SagoInputError(err.message, source=source, line=err.line if source else None,
                             key=err.key if key is None else key) from None
    if expanded_size(data) > MAX_RECIPE_EXPANDED:
        raise SagoInputError(
            f"the {what} expands to more than {MAX_RECIPE_EXPANDED:,} values and characters (MAX_RECIPE_EXPANDED)",
            source=source, key=key,
            hint="YAML aliases (*name) nested in each other multiply its size; write the values out instead",
        )
    return data


def load_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a recipe file into a mapping whose dicts remember the line of each key."""
    p = Path(path)
    with open_regular_file(p, max_bytes=MAX_RECIPE_BYTES, what="recipe", limit_name="MAX_RECIPE_BYTES") as f:
        raw = f.read(MAX_RECIPE_BYTES + 1)
    if len(raw) > MAX_RECIPE_BYTES:
        raise SagoInputError("recipe longer than the limit of 1 MiB (MAX_RECIPE_BYTES)", source=str(p))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SagoInputError("not valid UTF-8", source=str(p)) from None
    data = parse_yaml(text, source=str(p))
    if not isinstance(data, dict):
        raise SagoInputError("a recipe must be a YAML mapping of sections", source=str(p))
    return data


def with_lines(plain: dict[str, Any], original: Any) -> dict[str, Any]:
    """A copy of ``plain`` that keeps the key lines of ``original``."""
    out = _LineDict(plain)
    out.lines = dict(getattr(original, "lines", {}))
    return out


def new_section() -> dict[str, Any]:
    """An empty section created by a command-line override (no lines)."""
    out = _LineDict()
    out.lines = {}
    return out


def parse_overrides(tokens: list[str]) -> list[tuple[list[str], Any]]:
    """``["--training.max_steps", "10", "--stability.act_weight=0.5"]`` -> ``[(["training", "max_steps"], 10), ...]``.
    Values are read as YAML scalars (numbers, booleans, null, lists)."""
    out = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--") or len(tok) == 2:
            raise SagoInputError(f"expected an override '--section.key value', got {short_repr(tok)}")
        key, eq, value = tok[2:].partition("=")
        if not eq:
            if i + 1 >= len(tokens):
                raise SagoInputError(f"override {tok} has no value")
            value = tokens[i + 1]
            i += 1
        i += 1
        if len(value) > MAX_RECIPE_BYTES:
            raise SagoInputError(f"override {short_repr(tok, 60)}: value longer than the limit of 1 MiB "
                                 "(MAX_RECIPE_BYTES)")
        # The recipe's own loader and limits (depth, expanded size): a value is read as the file is; text that is
        # not YAML stays text. Its key lines are the value's own, not the recipe's: dropped.
        parsed = _without_lines(parse_yaml(value, what=f"override --{key[:60]}", key=f"--{key[:100]}",
                                           lenient=True)) if value != "" else ""
        parts = key.split(".")
        # Dashes are accepted for field names (--training.max-steps) but not in names the user chose
        # (--monitor.sets.my-set is the set "my-set").
        parts = [p if (i == 2 and parts[:2] == ["monitor", "sets"]) else p.replace("-", "_") for i, p in enumerate(parts)]
        out.append((parts, parsed))
    return out


def _without_lines(value: Any) -> Any:
    """``value`` with the key lines of its mappings cleared (each mapping once: aliases share them)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if not isinstance(item, (dict, list)) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, _LineDict):
            item.lines = {}
        stack.extend(item.values() if isinstance(item, dict) else item)
    return value


# Keys whose values are file paths: on the command line a relative path means relative to the current
# directory (as a shell user expects), while inside the recipe it is relative to the recipe file.
PATH_KEYS = (("model", "path"), ("data", "train"), ("data", "eval"))


def _cli_path(path: list[str], value: Any) -> Any:
    is_path_key = tuple(path) in PATH_KEYS or (len(path) == 3 and path[:2] == ["monitor", "sets"])
    if is_path_key and isinstance(value, str) and not value.startswith(SCHEME) and Path(value).exists():
        return str(Path(value).resolve())
    if path == ["monitor", "sets"] and isinstance(value, dict):
        return {k: _cli_path(["monitor", "sets", k], v) for k, v in value.items()}
    return value


def apply_overrides(data: dict[str, Any], overrides: list[tuple[list[str], Any]]) -> dict[str, Any]:
    """Set each dotted key in a copy of the recipe mapping (sections are created as needed)."""
    for path, value in overrides:
        value = _cli_path(path, value)
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = new_section()
                node[part] = child
            if not isinstance(child, dict):
                raise SagoInputError(f"cannot set '{'.'.join(path)}': '{part}' is not a section")
            node = child
        node[path[-1]] = value
    return data
