"""Reading a recipe's YAML (and ``--section.key value`` overrides): safe constructors only, line numbers kept for error messages, and bounded input
(a regular file of at most ``MAX_RECIPE_BYTES``, whose size with every alias expanded is at most
``MAX_RECIPE_EXPANDED``, so a "billion laughs" recipe is refused instead of expanded)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from .errors import SagoInputError, short_repr
from .limits import MAX_RECIPE_BYTES, MAX_RECIPE_EXPANDED, open_regular_file

SCHEME = "sago://"  # sago://tiny-llama names a file shipped in the package


class _LineDict(dict):
    """A dict that remembers the line of each key (1-based) for error messages."""

    lines: dict[str, int]


class _SafeLineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _SafeLineLoader, node: yaml.MappingNode) -> _LineDict:
    loader.flatten_mapping(node)
    out = _LineDict()
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise SagoInputError(f"keys must be strings, got {short_repr(key)}", line=key_node.start_mark.line + 1)
        if key in out:
            raise SagoInputError(f"duplicate key {short_repr(key)}", line=key_node.start_mark.line + 1, key=key)
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


def load_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a recipe file into a mapping whose dicts remember the line of each key."""
    p = Path(path)
    with open_regular_file(p, max_bytes=MAX_RECIPE_BYTES, what="recipe", limit_name="MAX_RECIPE_BYTES") as f:
        raw = f.read(MAX_RECIPE_BYTES + 1)
    if len(raw) > MAX_RECIPE_BYTES:
        raise SagoInputError("recipe longer than the limit of 1 MiB (MAX_RECIPE_BYTES)", source=str(p))
    try:
        data = yaml.load(raw.decode("utf-8"), Loader=_SafeLineLoader)  # noqa: S506 - a SafeLoader
    except UnicodeDecodeError:
        raise SagoInputError("not valid UTF-8", source=str(p)) from None
    except RecursionError:
        raise SagoInputError("invalid YAML: nested too deeply", source=str(p)) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        raise SagoInputError(
            f"invalid YAML: {problem[:200]}",
            source=str(p),
            line=mark.line + 1 if mark is not None else None,
        ) from None
    except SagoInputError as err:
        raise SagoInputError(err.message, source=str(p), line=err.line, key=err.key) from None
    if expanded_size(data) > MAX_RECIPE_EXPANDED:
        raise SagoInputError(
            f"the recipe expands to more than {MAX_RECIPE_EXPANDED:,} values and characters (MAX_RECIPE_EXPANDED)",
            source=str(p),
            hint="YAML aliases (*name) nested in each other multiply its size; write the values out instead",
        )
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
        try:
            parsed = yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError:
            parsed = value
        parts = key.split(".")
        # Dashes are accepted for field names (--training.max-steps) but not in names the user chose
        # (--monitor.sets.my-set is the set "my-set").
        parts = [p if (i == 2 and parts[:2] == ["monitor", "sets"]) else p.replace("-", "_") for i, p in enumerate(parts)]
        out.append((parts, parsed))
    return out


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
