"""Recipes: a whole monitored fine-tune described in one YAML file (``sago-train run RECIPE.yaml``).

Each section is a dataclass whose fields are documented once (``recipe_sections``). YAML supplies the
values, ``--section.key value`` on the command line overrides them, and an unknown or misspelled key is an
error naming the file, line and key with the closest valid name. YAML is read with ``yaml.safe_load``
semantics only, and ``trust_remote_code`` stays off unless the recipe says so.

Paths are relative to the recipe file; ``sago://...`` names files shipped in the package
(``sago://tiny-llama`` is the shipped tiny model, ``sago://demo/train.jsonl`` its demo data,
``sago://smollm2-135m-instruct`` the real model of :mod:`sago_train.model.real`).
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

from ..errors import SagoInputError, did_you_mean, short_repr, type_name
from ..eval.config import SAGOConfig
from ..integrations.early_stopping import SAGOEarlyStoppingCallback, check_target
from ..io import validate_set_name
from ..model.real import real_model_for
from ..training.config import StabilityConfig
from ..version import __version__
from .recipe_sections import (
    SECTIONS,
    TRAINERS,
    DataSection,
    EarlyStoppingSection,
    LoraSection,
    ModelSection,
    MonitorSection,
    check_deepspeed,
    check_ranges,
    validate_run_name,
)
from .recipe_yaml import SCHEME, apply_overrides, load_yaml, parse_overrides, with_lines

__all__ = ["DataSection", "EarlyStoppingSection", "LoraSection", "ModelSection", "MonitorSection", "Recipe",
           "apply_overrides", "load_recipe", "load_yaml", "parse_overrides", "parse_recipe", "validate_run_name"]

ASSETS = Path(__file__).resolve().parent.parent / "assets"


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
    # Line of each dotted key in the recipe file ("stability.layers" -> 12), for errors found after parsing.
    lines: dict[str, int] = field(default_factory=dict)

    def error(self, message: str, key: str, hint: str | None = None) -> SagoInputError:
        """An error about ``key`` of this recipe, naming the file and, when known, the line."""
        parts = key.split(".")
        line = next((self.lines[".".join(parts[:n])] for n in range(len(parts), 0, -1)
                     if ".".join(parts[:n]) in self.lines), None)
        return SagoInputError(message, source=self.source, line=line, key=key, hint=hint)

    @property
    def root(self) -> Path:
        return Path(self.source).resolve().parent if self.source else Path.cwd()

    def resolve_path(self, value: str) -> str:
        """``sago://x`` -> a package asset; a relative path -> relative to the recipe file."""
        if value.startswith(SCHEME):
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
                (f"unknown key {short_repr(key)} in section '{section}'." if section
                 else f"unknown section {short_repr(key)}.")
                + did_you_mean(key[:100], allowed),
                source=source,
                line=lines.get(key),
                key=f"{section}.{key[:100]}" if section else key[:100],
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
                f"expected {expected}, got {_type_name(value)} {short_repr(value)}",
                source=source,
                line=lines.get(key),
                key=f"{section}.{key}",
            )


_SCIENTIFIC = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _type_name(value: Any) -> str:
    return type_name(value)


def _build(cls: type, section: str, data: Any, source: str | None) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SagoInputError(f"expected a mapping for section '{section}', got {type(data).__name__}",
                             source=source, key=section)
    names = [f.name for f in dataclasses.fields(cls)]
    _check_keys(section, data, names, source)
    if cls in (ModelSection, LoraSection, DataSection, MonitorSection, EarlyStoppingSection):
        # the recipe's own sections; StabilityConfig etc. validate themselves
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


def _line(data: Any, section: str, key: str) -> int | None:
    """The line of ``section.key`` in the recipe, else of ``section``."""
    sec = data.get(section) if isinstance(data, dict) else None
    return getattr(sec, "lines", {}).get(key) or getattr(data, "lines", {}).get(section)


def parse_recipe(data: dict[str, Any], source: str | None = None) -> Recipe:
    """Validate a recipe mapping (every section and key) and build a :class:`Recipe`."""
    _check_keys("", data, list(SECTIONS), source)
    lines = getattr(data, "lines", {})
    version = data.get("sago_train_version")
    if version is None:
        raise SagoInputError("missing 'sago_train_version' (the version the recipe was written for)", source=source,
                             hint=f"add: sago_train_version: \"{__version__}\"")
    if not isinstance(version, (str, int, float)) or isinstance(version, bool):
        raise SagoInputError(f"expected a version string, got {_type_name(version)} {short_repr(version)}",
                             source=source, line=lines.get("sago_train_version"), key="sago_train_version")
    if str(version).split(".")[0] != __version__.split(".")[0]:
        raise SagoInputError(f"recipe written for sago_train {short_repr(str(version))[1:-1]}, this is "
                             f"{__version__}", source=source,
                             line=lines.get("sago_train_version"), key="sago_train_version")
    name = data.get("name")
    if name is None:  # from the file name: made a valid run name rather than refused
        name = re.sub(r"[^A-Za-z0-9_.\-]", "_", Path(source).stem if source else "run").lstrip("._-")[:100] or "run"
    else:
        validate_run_name(name, source=source, line=lines.get("name"), key="name")
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        raise SagoInputError(f"expected a string, got {_type_name(description)} {short_repr(description)}",
                             source=source, line=lines.get("description"), key="description")
    trainer = data.get("trainer", "trainer")
    if trainer not in TRAINERS:
        raise SagoInputError(f"unknown trainer {short_repr(trainer)}."
                             f"{did_you_mean(trainer[:50] if isinstance(trainer, str) else '', TRAINERS)}",
                             source=source,
                             line=lines.get("trainer"), key="trainer")
    if data.get("model") is not None and not isinstance(data.get("model"), dict):
        raise SagoInputError(f"expected a mapping for section 'model', got {_type_name(data.get('model'))}",
                             source=source, line=lines.get("model"), key="model",
                             hint="e.g. model: {path: sago://tiny-llama}")
    model_data = dict(data.get("model") or {})
    lora = model_data.pop("lora", None)
    model = _build(ModelSection, "model", with_lines(model_data, data.get("model")), source)
    if lora is not None:
        model.lora = _build(LoraSection, "model.lora", lora, source)
    data_section = _build(DataSection, "data", data.get("data"), source)
    check_ranges("data", with_lines(vars(data_section), data.get("data")), source)
    if not data_section.train:
        raise SagoInputError("missing 'data.train' (the training data)", source=source, key="data.train")
    if data_section.format not in ("auto", "sft", "groups"):
        raise SagoInputError(f"unknown data format {short_repr(data_section.format)}."
                             f"{did_you_mean(data_section.format[:50], ['auto', 'sft', 'groups'])}", source=source,
                             key="data.format", line=_line(data, "data", "format"))
    monitor = _build(MonitorSection, "monitor", data.get("monitor"), source)
    check_ranges("monitor", with_lines(vars(monitor), data.get("monitor")), source)
    try:
        monitor_config = SAGOConfig.from_kwargs(**monitor.options)
    except SagoInputError as err:
        raise SagoInputError(err.message, source=source, key=f"monitor.options.{err.key}", hint=err.hint) from None
    if not isinstance(monitor.sets, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in monitor.sets.items()
    ):
        raise SagoInputError("expected a mapping of set names to JSONL paths", source=source, key="monitor.sets",
                             line=getattr(data.get("monitor"), "lines", {}).get("sets"))

    sets_lines = getattr(getattr(data.get("monitor"), "get", lambda _: None)("sets"), "lines", {})
    for set_name in monitor.sets:
        # The name is the recipe's (it becomes a file name under the run's sago/ folder): report it here,
        # against the recipe line, not against the set's file.
        validate_set_name(set_name, source=source, key=f"monitor.sets.{set_name[:100]}",
                          line=sets_lines.get(set_name) or _line(data, "monitor", "sets"))
    stability = None
    if data.get("stability") is not None:
        stability = _build(StabilityConfig, "stability", data.get("stability"), source)
        check_ranges("stability", with_lines(vars(stability), data.get("stability")), source)
    early = None
    if data.get("early_stopping") is not None:
        early = _build(EarlyStoppingSection, "early_stopping", data.get("early_stopping"), source)

        try:
            SAGOEarlyStoppingCallback(**dataclasses.asdict(early))
        except SagoInputError as err:
            raise SagoInputError(err.message, source=source, key=f"early_stopping.{err.key}",
                                 line=getattr(data.get("early_stopping"), "lines", {}).get(err.key or "")) from None
        # Early stopping acts on SAGO evaluations: what it watches must be monitored and computed (accuracy, which
        # needs references the set file holds, is checked when training starts).
        stopper = SAGOEarlyStoppingCallback(**dataclasses.asdict(early))
        try:
            for w in getattr(stopper, "watchers", None) or [stopper]:  # several metrics: each one checked
                check_target(w.set_name, w.quantity, monitor.sets, monitor_config.axes, not_in="in monitor.sets")
        except SagoInputError as err:
            raise SagoInputError(err.message, source=source, key="early_stopping.metric",
                                 line=getattr(data.get("early_stopping"), "lines", {}).get("metric")) from None
    training = data.get("training") or {}
    if not isinstance(training, dict):
        raise SagoInputError("expected a mapping for section 'training'", source=source, key="training")
    check_deepspeed(training, source, getattr(training, "lines", {}).get("deepspeed"),
                    Path(source).resolve().parent if source else Path.cwd())
    _check_keys("training", training, _training_fields(trainer), source)
    _check_types(_training_class(trainer), "training", training, source)
    check_ranges("training", training, source)  # before the data loads: set_seed or the Trainer would fail later
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
        description=description or "",
        source=source,
        lines=_key_lines(data),
    )


def _key_lines(data: Any, prefix: str = "", depth: int = 3) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, line in getattr(data, "lines", {}).items():
        dotted = f"{prefix}{key}"
        out[dotted] = line
        if depth > 1 and isinstance(data.get(key), dict):
            out.update(_key_lines(data[key], f"{dotted}.", depth - 1))
    return out


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
