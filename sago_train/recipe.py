"""Recipes: a whole monitored fine-tune described in one YAML file (``sago-train run RECIPE.yaml``).

Each section is a dataclass whose fields are documented once, here (``metadata["help"]``). YAML supplies the
values, ``--section.key value`` on the command line overrides them, and an unknown or misspelled key is an
error naming the file, line and key with the closest valid name. YAML is read with ``yaml.safe_load``
semantics only, and ``trust_remote_code`` stays off unless the recipe says so.

Paths are relative to the recipe file; ``sago://...`` names files shipped in the package
(``sago://tiny-llama`` is the shipped tiny model, ``sago://demo/train.jsonl`` its demo data,
``sago://smollm2-135m-instruct`` the real model of :mod:`sago_train.real_model`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import SagoInputError, did_you_mean
from .version import __version__

ASSETS = Path(__file__).resolve().parent / "assets"
SCHEME = "sago://"


# ------------------------------------------------------------------ YAML with line numbers
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
            raise SagoInputError(f"keys must be strings, got {key!r}", line=key_node.start_mark.line + 1)
        if key in out:
            raise SagoInputError(f"duplicate key '{key}'", line=key_node.start_mark.line + 1, key=key)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


_SafeLineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise SagoInputError(f"recipe not found: {p}")
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_SafeLineLoader)  # noqa: S506 - a SafeLoader
    except UnicodeDecodeError:
        raise SagoInputError("not valid UTF-8", source=str(p)) from None
    except RecursionError:
        raise SagoInputError("invalid YAML: nested too deeply", source=str(p)) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise SagoInputError(
            f"invalid YAML: {getattr(err, 'problem', None) or err}",
            source=str(p),
            line=mark.line + 1 if mark is not None else None,
        ) from None
    except SagoInputError as err:
        raise SagoInputError(err.message, source=str(p), line=err.line, key=err.key) from None
    if not isinstance(data, dict):
        raise SagoInputError("a recipe must be a YAML mapping of sections", source=str(p))
    return data


# ------------------------------------------------------------------ sections
@dataclass
class LoraSection:
    r: int = field(default=8, metadata={"help": "LoRA rank."})
    alpha: int = field(default=16, metadata={"help": "LoRA alpha (scaling = alpha / r)."})
    dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    target_modules: Any = field(
        default="all-linear", metadata={"help": "Modules to adapt: a list of names, or 'all-linear'."}
    )


@dataclass
class ModelSection:
    path: str = field(default="sago://tiny-llama", metadata={"help": "Model folder or hub id (sago://tiny-llama "
                                                                      "is the shipped tiny model, "
                                                                      "sago://smollm2-135m-instruct a real instruct "
                                                                      "model converted once into the cache)."})
    dtype: str | None = field(default=None, metadata={"help": "float32, bfloat16 or float16 (default: the model's)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow custom model code (off by default)."})
    lora: LoraSection | None = field(default=None, metadata={"help": "LoRA settings (PEFT); omit for full fine-tuning."})


@dataclass
class DataSection:
    train: str = field(default="", metadata={"help": "Training data: a JSONL file (or a datasets hub id). Records "
                                                     "are {prompt, completion} or {text} (plain SFT), or "
                                                     "{variants, target} groups (for the stability loss)."})
    format: str = field(default="auto", metadata={"help": "sft, groups, or auto (from the first record's keys)."})
    eval: str | None = field(default=None, metadata={"help": "Optional evaluation data in the same format."})
    max_length: int | None = field(default=None, metadata={"help": "Truncate sequences to this many tokens."})
    limit: int | None = field(default=None, metadata={"help": "Use only the first N training records."})


@dataclass
class MonitorSection:
    sets: dict[str, str] = field(default_factory=dict, metadata={"help": "Held-out variant sets: name -> JSONL."})
    eval_steps: int | None = field(default=None, metadata={"help": "Evaluate every N steps (default: automatic)."})
    baseline: bool = field(default=True, metadata={"help": "Evaluate before the first step."})
    overhead_budget: float = field(default=0.05, metadata={"help": "Automatic cadence: share of training time."})
    options: dict[str, Any] = field(default_factory=dict, metadata={"help": "Evaluation options (SAGOConfig "
                                                                            "fields: axes, max_groups, ...)."})


@dataclass
class EarlyStoppingSection:
    metric: str = field(default="", metadata={"help": "sago/<set>/<axis> to watch."})
    patience: int = field(default=3, metadata={"help": "Worse evaluations in a row before stopping."})
    alpha: float = field(default=0.05, metadata={"help": "Significance level of the paired test."})
    min_delta: float = field(default=0.0, metadata={"help": "Smallest mean increase that counts."})
    mode: str = field(default="paired", metadata={"help": "paired or threshold."})


SECTIONS = ("sago_train_version", "name", "description", "trainer", "model", "data", "monitor", "early_stopping",
            "stability", "training")
TRAINERS = ("trainer", "sft")


@dataclass
class Recipe:
    """A parsed, validated recipe."""

    sago_train_version: str
    name: str
    model: ModelSection
    data: DataSection
    monitor: MonitorSection
    training: dict[str, Any]
    stability: Any = None  # StabilityConfig or None
    early_stopping: EarlyStoppingSection | None = None
    trainer: str = "trainer"
    description: str = ""
    source: str | None = None

    @property
    def root(self) -> Path:
        return Path(self.source).resolve().parent if self.source else Path.cwd()

    def resolve_path(self, value: str) -> str:
        """``sago://x`` -> a package asset; a relative path -> relative to the recipe file."""
        if value.startswith(SCHEME):
            from .real_model import real_model_for

            # A real model (sago://smollm2-135m-instruct) is converted into the cache when it is loaded.
            return value if real_model_for(value) else str(ASSETS / value[len(SCHEME):])
        p = Path(os.path.expanduser(value))
        if p.is_absolute():
            return str(p)
        candidate = self.root / p
        # Hub ids (org/name) stay as they are when no such local file exists.
        return str(candidate) if candidate.exists() or value.startswith(".") or value.endswith(".jsonl") else value


def _check_keys(section: str, data: dict[str, Any], allowed: list[str], source: str | None) -> None:
    lines = getattr(data, "lines", {})
    for key in data:
        if key not in allowed:
            raise SagoInputError(
                (f"unknown key '{key}' in section '{section}'." if section else f"unknown section '{key}'.")
                + did_you_mean(key, allowed),
                source=source,
                line=lines.get(key),
                key=f"{section}.{key}" if section else key,
                hint=f"valid keys: {', '.join(allowed)}" if len(allowed) <= 15 else None,
            )


_SIMPLE_TYPES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
                 dict: "a mapping"}


def _expected_type(value: Any, annotation: Any) -> str | None:
    """What ``annotation`` expects when ``value`` does not fit it, else None. Only plain types (bool, int,
    float, str, list, dict, None and unions of them) are checked; any other annotation accepts anything."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = typing.get_args(annotation)
    else:
        members = (annotation,)
    wanted = []
    for member in members:
        base = typing.get_origin(member) or member
        if member is type(None):
            if value is None:
                return None
            continue
        if base not in _SIMPLE_TYPES:
            return None  # e.g. Any, an enum: not checked here
        if base is bool:
            ok = isinstance(value, bool)
        elif base is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif base is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, base)
        if ok:
            return None
        wanted.append(_SIMPLE_TYPES[base])
    if type(None) in members:
        wanted.append("null")
    return " or ".join(wanted) if wanted else None


def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - unresolvable annotations are simply not checked
        return {}


def _read_scientific(cls: type, data: dict[str, Any]) -> None:
    """YAML 1.1 reads ``1e-3`` as a string; where a field takes a float, such a string becomes that number."""
    hints = _type_hints(cls)
    for key, value in list(data.items()):
        annotation = hints.get(key)
        members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
            else (annotation,)
        if isinstance(value, str) and float in members and _SCIENTIFIC.match(value.strip()):
            data[key] = float(value)


def _check_types(cls: type, section: str, data: dict[str, Any], source: str | None) -> None:
    """A located error for a value of the wrong type (e.g. ``max_steps: ten``) before anything uses it."""
    _read_scientific(cls, data)
    hints = _type_hints(cls)
    lines = getattr(data, "lines", {})
    for key, value in data.items():
        expected = _expected_type(value, hints.get(key, Any))
        if expected is not None:
            raise SagoInputError(
                f"expected {expected}, got {_type_name(value)} {value!r}",
                source=source,
                line=lines.get(key),
                key=f"{section}.{key}",
            )


_SCIENTIFIC = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _type_name(value: Any) -> str:
    from .data.groups import type_name

    return type_name(value)


def _build(cls: type, section: str, data: Any, source: str | None) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SagoInputError(f"expected a mapping for section '{section}', got {type(data).__name__}",
                             source=source, key=section)
    names = [f.name for f in dataclasses.fields(cls)]
    _check_keys(section, data, names, source)
    if cls.__module__ == __name__:  # the recipe's own sections; StabilityConfig etc. validate themselves
        _check_types(cls, section, data, source)
    else:
        _read_scientific(cls, data)
    try:
        return cls(**dict(data))
    except SagoInputError as err:
        raise SagoInputError(err.message, source=source, line=getattr(data, "lines", {}).get(err.key or ""),
                             key=f"{section}.{err.key}" if err.key else section, hint=err.hint) from None
    except TypeError as err:
        raise SagoInputError(str(err), source=source, key=section) from None


def _training_class(trainer: str) -> type:
    if trainer == "sft":
        from trl import SFTConfig

        return SFTConfig
    from transformers import TrainingArguments

    return TrainingArguments


def _training_fields(trainer: str) -> list[str]:
    return [f.name for f in dataclasses.fields(_training_class(trainer))]


def parse_recipe(data: dict[str, Any], source: str | None = None) -> Recipe:
    """Validate a recipe mapping (every section and key) and build a :class:`Recipe`."""
    from .config import SAGOConfig
    from .loss import StabilityConfig

    _check_keys("", data, list(SECTIONS), source)
    lines = getattr(data, "lines", {})
    version = data.get("sago_train_version")
    if version is None:
        raise SagoInputError("missing 'sago_train_version' (the version the recipe was written for)", source=source,
                             hint=f"add: sago_train_version: \"{__version__}\"")
    if str(version).split(".")[0] != __version__.split(".")[0]:
        raise SagoInputError(f"recipe written for sago_train {version}, this is {__version__}", source=source,
                             line=lines.get("sago_train_version"), key="sago_train_version")
    trainer = data.get("trainer", "trainer")
    if trainer not in TRAINERS:
        raise SagoInputError(f"unknown trainer '{trainer}'.{did_you_mean(str(trainer), TRAINERS)}", source=source,
                             line=lines.get("trainer"), key="trainer")
    if data.get("model") is not None and not isinstance(data.get("model"), dict):
        raise SagoInputError(f"expected a mapping for section 'model', got {_type_name(data.get('model'))}",
                             source=source, line=lines.get("model"), key="model",
                             hint="e.g. model: {path: sago://tiny-llama}")
    model_data = dict(data.get("model") or {})
    lora = model_data.pop("lora", None)
    model = _build(ModelSection, "model", _with_lines(model_data, data.get("model")), source)
    if lora is not None:
        model.lora = _build(LoraSection, "model.lora", lora, source)
    data_section = _build(DataSection, "data", data.get("data"), source)
    if not data_section.train:
        raise SagoInputError("missing 'data.train' (the training data)", source=source, key="data.train")
    if data_section.format not in ("auto", "sft", "groups"):
        raise SagoInputError(f"unknown data format '{data_section.format}'."
                             f"{did_you_mean(data_section.format, ['auto', 'sft', 'groups'])}", source=source,
                             key="data.format")
    monitor = _build(MonitorSection, "monitor", data.get("monitor"), source)
    try:
        monitor_config = SAGOConfig.from_kwargs(**monitor.options)
    except SagoInputError as err:
        raise SagoInputError(err.message, source=source, key=f"monitor.options.{err.key}", hint=err.hint) from None
    if not isinstance(monitor.sets, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in monitor.sets.items()
    ):
        raise SagoInputError("expected a mapping of set names to JSONL paths", source=source, key="monitor.sets",
                             line=getattr(data.get("monitor"), "lines", {}).get("sets"))
    stability = None
    if data.get("stability") is not None:
        stability = _build(StabilityConfig, "stability", data.get("stability"), source)
    early = None
    if data.get("early_stopping") is not None:
        early = _build(EarlyStoppingSection, "early_stopping", data.get("early_stopping"), source)
        from .early_stopping import SAGOEarlyStoppingCallback

        try:
            SAGOEarlyStoppingCallback(**dataclasses.asdict(early))
        except SagoInputError as err:
            raise SagoInputError(err.message, source=source, key=f"early_stopping.{err.key}",
                                 line=getattr(data.get("early_stopping"), "lines", {}).get(err.key or "")) from None
        # Early stopping acts on SAGO evaluations: what it watches must be monitored and computed.
        stopper = SAGOEarlyStoppingCallback(**dataclasses.asdict(early))
        es_line = getattr(data.get("early_stopping"), "lines", {}).get("metric")
        if stopper.set_name not in monitor.sets:
            raise SagoInputError(
                f"early stopping watches set '{stopper.set_name}', which is not in monitor.sets "
                f"({', '.join(monitor.sets) or 'none'}){did_you_mean(stopper.set_name, list(monitor.sets))}",
                source=source, key="early_stopping.metric", line=es_line)
        if stopper.axis not in [*monitor_config.axes, "instability"]:
            raise SagoInputError(
                f"early stopping watches axis '{stopper.axis}', which is not computed (axes: "
                f"{', '.join(monitor_config.axes)}, instability)", source=source, key="early_stopping.metric",
                line=es_line)
    training = data.get("training") or {}
    if not isinstance(training, dict):
        raise SagoInputError("expected a mapping for section 'training'", source=source, key="training")
    _check_keys("training", training, _training_fields(trainer), source)
    _check_types(_training_class(trainer), "training", training, source)
    name = str(data.get("name") or (Path(source).stem if source else "run"))
    return Recipe(
        sago_train_version=str(version),
        name=name,
        model=model,
        data=data_section,
        monitor=monitor,
        training=dict(training),
        stability=stability,
        early_stopping=early,
        trainer=trainer,
        description=str(data.get("description") or ""),
        source=source,
    )


def _with_lines(plain: dict[str, Any], original: Any) -> dict[str, Any]:
    out = _LineDict(plain)
    out.lines = dict(getattr(original, "lines", {}))
    return out


def parse_overrides(tokens: list[str]) -> list[tuple[list[str], Any]]:
    """``["--training.max_steps", "10", "--stability.act_weight=0.5"]`` -> ``[(["training", "max_steps"], 10), ...]``.
    Values are read as YAML scalars (numbers, booleans, null, lists)."""
    out = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--") or len(tok) == 2:
            raise SagoInputError(f"expected an override '--section.key value', got {tok!r}")
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
                child = _LineDict()
                child.lines = {}
                node[part] = child
            if not isinstance(child, dict):
                raise SagoInputError(f"cannot set '{'.'.join(path)}': '{part}' is not a section")
            node = child
        node[path[-1]] = value
    return data


def load_recipe(path: str | os.PathLike[str], overrides: list[str] | None = None) -> Recipe:
    """Load, override and validate a recipe file.

    Example:
        >>> r = load_recipe("recipes/demo.yaml", ["--training.max_steps", "5"])  # doctest: +SKIP
        >>> r.training["max_steps"]  # doctest: +SKIP
        5
    """
    data = load_yaml(path)
    data = apply_overrides(data, parse_overrides(list(overrides or [])))
    return parse_recipe(data, source=str(path))
