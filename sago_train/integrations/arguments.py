"""``SAGOArguments``: every setting of the SAGO callbacks and of the stability loss as one dataclass for
``transformers.HfArgumentParser`` and ``trl.TrlParser``, so a ``trl sft``-style script adds the ``--sago_*`` flags
(and the same keys in a ``--config`` YAML) with one entry in its parser's tuple.

The fields are generated from the declarations that own them, with their help and their one default:
:class:`~sago_train.integrations.options.MonitorOptions` (``--sago_<name>``), :class:`~sago_train.SAGOConfig`
(``--sago_<name>``), :class:`~sago_train.integrations.options.EarlyStoppingOptions`
(``--sago_early_stopping_<name>``) and :class:`~sago_train.StabilityConfig` (``--sago_stability_<name>``). The
prefix keeps them apart from ``TrainingArguments`` / ``SFTConfig`` / ``ModelConfig`` / ``ScriptArguments`` fields
(``eval_steps``, ``log_level``, ``seed``... exist there too, and ``HfArgumentParser`` refuses a flag declared
twice). Only ``--sago_sets`` is declared here: it is the command-line form of the callback's ``sets`` argument.

Example:
    >>> from transformers import HfArgumentParser, TrainingArguments
    >>> parser = HfArgumentParser((TrainingArguments, SAGOArguments))
    >>> _, sago = parser.parse_args_into_dataclasses(["--output_dir", "out", "--sago_max_groups", "16"])
    >>> sago.sago_config().max_groups
    16
"""

from __future__ import annotations

import contextlib
import dataclasses
import typing
from collections.abc import Iterator
from typing import Any

from ..data.groups import VariantSet
from ..data.sources import sets_from_specs
from ..errors import SagoInputError
from ..eval.config import SAGOConfig
from ..fields import declared_fields, help_text
from ..io import read_escapes
from ..training.config import StabilityConfig
from .options import EarlyStoppingOptions, MonitorOptions

#: Where each field comes from: (group, declaring dataclass, flag prefix). The group names the accessor.
SOURCES: tuple[tuple[str, type, str], ...] = (
    ("monitor", MonitorOptions, "sago_"),
    ("eval", SAGOConfig, "sago_"),
    ("early_stopping", EarlyStoppingOptions, "sago_early_stopping_"),
    ("stability", StabilityConfig, "sago_stability_"),
)
SETS_FIELD = "sago_sets"
_SETS_HELP = ("Held-out variant sets to monitor: NAME=FILE (JSONL), a JSONL path, or a bundled collection ('tiny' "
              "for the shipped tiny model, 'real' for instruct models); several separated by spaces. Without it no "
              "SAGOCallback can be built.")


def _generated_field(f: dataclasses.Field) -> dataclasses.Field:
    # Only argparse keywords go into the metadata: HfArgumentParser passes it to add_argument as it is.
    meta = {"help": help_text(f)}
    if "choices" in f.metadata:
        meta["choices"] = f.metadata["choices"]
    if f.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=f.default_factory, metadata=meta)
    return dataclasses.field(default=f.default, metadata=meta)


def flag_names() -> dict[str, dict[str, str]]:
    """``{group: {source field: flag field}}`` for every generated field."""
    return {group: {f.name: prefix + f.name for f, _ in declared_fields(cls)} for group, cls, prefix in SOURCES}


@contextlib.contextmanager
def _errors_name_flags(names: dict[str | None, str]) -> Iterator[None]:
    """Re-raise a :class:`SagoInputError` about a source field as one about its flag (``--sago_max_groups``)."""
    try:
        yield
    except SagoInputError as err:
        if err.key not in names:
            raise
        raise SagoInputError(err.message, source=err.source, line=err.line, key=f"--{names[err.key]}",
                             hint=err.hint) from None


class _SAGOArgumentsMethods:
    """The behaviour of :class:`SAGOArguments` (its fields are generated, see the module doc)."""

    _argument_group_name = "SAGO (sago_train)"  # HfArgumentParser shows the flags under this heading in --help

    def __post_init__(self) -> None:
        # A TrlParser --config YAML sets values without argparse's conversion: one string for a list flag.
        for name in (SETS_FIELD, *self._list_fields()):
            if isinstance(getattr(self, name), str):
                setattr(self, name, [getattr(self, name)])
        # Validate everything now, before the script loads a model: each error names its flag.
        sago_config = self.sago_config()
        self.stability_config()
        stopping = self.early_stopping_kwargs() if self.sago_early_stopping_metric else None
        self._sets: dict[str, VariantSet] | None = None
        if getattr(self, SETS_FIELD):
            self._sets = self.variant_sets()
            names = flag_names()
            with _errors_name_flags({**names["monitor"], **names["eval"]}):
                from .callback import SAGOCallback  # torch and transformers: only once sets are given

                SAGOCallback(self._sets, self.monitor_options(), config=sago_config)
            if stopping is not None:
                from ..eval.plan import has_correctness
                from .early_stopping import check_target, parse_metric
                from .stopping_plan import split_metrics

                with _errors_name_flags({"metric": "sago_early_stopping_metric"}):
                    for metric in split_metrics(stopping["metric"]):  # accuracy where a set has references
                        set_name, axis = parse_metric(metric)
                        vs = self._sets.get(set_name)
                        scored = vs is not None and has_correctness(vs.groups)
                        check_target(set_name, axis, self._sets, sago_config.axes, correctness=scored)

    def _list_fields(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if typing.get_origin(_unwrap_optional(f.type)) is list]

    def _group(self, group: str) -> dict[str, Any]:
        return {source: getattr(self, flag) for source, flag in flag_names()[group].items()}

    def variant_sets(self) -> dict[str, VariantSet]:
        """The sets named by ``--sago_sets``, loaded (an error names the flag when there are none)."""
        if getattr(self, "_sets", None) is not None:
            return dict(self._sets)  # type: ignore[arg-type]
        config = self.sago_config().in_training()  # only the groups the callback evaluates are parsed
        with _errors_name_flags({None: SETS_FIELD}):  # a missing file: errors about a file's content keep their key
            return sets_from_specs(getattr(self, SETS_FIELD), key=f"--{SETS_FIELD}", max_groups=config.max_groups,
                                   seed=config.seed)

    def sago_config(self) -> SAGOConfig:
        """The evaluation options (``--sago_axes``, ``--sago_max_groups``...) as a :class:`SAGOConfig`."""
        options = self._group("eval")
        if isinstance(options["axes"], list):  # --sago_axes a b and --sago_axes a,b
            options["axes"] = ",".join(options["axes"])
        if options.get("stop_strings"):  # '\n' typed on a shell means a newline, as with sago-train eval --stop
            options["stop_strings"] = [read_escapes(v, key="--sago_stop_strings") if isinstance(v, str) else v
                                       for v in options["stop_strings"]]
        with _errors_name_flags(flag_names()["eval"]):
            return SAGOConfig(**options)

    def stability_config(self) -> StabilityConfig:
        """The stability loss settings (``--sago_stability_*``) as a :class:`StabilityConfig`."""
        with _errors_name_flags(flag_names()["stability"]):
            return StabilityConfig(**self._group("stability"))

    def monitor_options(self) -> MonitorOptions:
        """The callback's options (``--sago_eval_steps``, ``--sago_generation_every``...) as
        :class:`~sago_train.integrations.options.MonitorOptions`."""
        with _errors_name_flags(flag_names()["monitor"]):
            return MonitorOptions(**self._group("monitor"))

    def callback_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~sago_train.SAGOCallback` besides the sets: the monitor and callback
        options, and the evaluation options given a value other than their default (so that the callback's own
        in-training defaults apply to the others)."""
        defaults = SAGOConfig().to_dict()
        changed = {k: v for k, v in self.sago_config().to_dict().items() if v != defaults[k]}
        return {**dataclasses.asdict(self.monitor_options()), **changed}

    def early_stopping_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~sago_train.SAGOEarlyStoppingCallback` (``--sago_early_stopping_*``)."""
        options = self._group("early_stopping")
        if not options["metric"]:
            raise SagoInputError("early stopping needs the metric to watch", key="--sago_early_stopping_metric",
                                 hint="e.g. --sago_early_stopping_metric sago/paraphrase/accuracy")
        from .early_stopping import SAGOEarlyStoppingCallback

        with _errors_name_flags(flag_names()["early_stopping"]):
            SAGOEarlyStoppingCallback(**options)  # validates every option now
        return options


def _unwrap_optional(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if type(None) in typing.get_args(tp) and len(args) == 1 else tp


def _make_arguments_class() -> type:
    fields: list[tuple[str, Any, dataclasses.Field]] = [
        (SETS_FIELD, list[str], dataclasses.field(default_factory=list, metadata={"help": _SETS_HELP})),
    ]
    seen = {SETS_FIELD}
    for _, cls, prefix in SOURCES:
        for f, tp in declared_fields(cls):
            name = prefix + f.name
            if name in seen:  # two declarations under one flag: a bug here, not a user error
                raise TypeError(f"SAGOArguments: two fields named {name}")
            seen.add(name)
            fields.append((name, tp, _generated_field(f)))
    cls = dataclasses.make_dataclass("SAGOArguments", fields, bases=(_SAGOArgumentsMethods,))
    cls.__module__ = __name__  # for pickling and get_type_hints (make_dataclass's module= is Python >= 3.12)
    cls.__doc__ = (
        "The SAGO callbacks' and the stability loss's settings as flags for ``HfArgumentParser`` / ``TrlParser``: "
        "``--sago_sets`` and ``--sago_<option>`` (monitoring and evaluation), ``--sago_early_stopping_<option>``, "
        "``--sago_stability_<option>``; each with the help and default of the field it comes from. Build the "
        "objects with ``SAGOCallback.from_args(args, trainer=trainer)``, "
        "``SAGOEarlyStoppingCallback.from_args(args)`` and ``args.stability_config()``. Every value is checked "
        "on construction and an error names its flag."
    )
    return cls


SAGOArguments = _make_arguments_class()
