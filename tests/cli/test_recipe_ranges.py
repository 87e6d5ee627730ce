"""Round 4 (issue 34): the recipe's RANGES table bounds every numeric field a recipe sets (``training``,
``stability``, ``monitor`` and ``monitor.options``), and a non-finite number is refused at parsing."""

from __future__ import annotations

import dataclasses
import math
import re
import typing

import pytest

from sago_train.cli.recipe import parse_recipe
from sago_train.cli.recipe_sections import RANGES
from sago_train.errors import SagoInputError
from sago_train.eval.config import SAGOConfig
from sago_train.integrations.options import MonitorOptions
from sago_train.training.config import StabilityConfig

LAUNCHER_SET = {"local_rank"}  # set by torchrun / accelerate, not by a recipe


def _numeric(cls: type) -> list[str]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        args = set(typing.get_args(hints[f.name])) | {hints[f.name]}
        if (int in args or float in args) and bool not in args:
            out.append(f.name)
    return out


@pytest.mark.parametrize("section, cls", [("training", "TrainingArguments"), ("stability", StabilityConfig),
                                          ("monitor", MonitorOptions), ("monitor.options", SAGOConfig)])
def test_every_numeric_field_has_a_range(section: str, cls: type | str) -> None:
    if isinstance(cls, str):
        from transformers import TrainingArguments as cls  # noqa: N813
    missing = [n for n in _numeric(cls) if f"{section}.{n}" not in RANGES and n not in LAUNCHER_SET]
    assert not missing, f"{section}: no range for {missing}"


def _recipe(**sections: dict) -> dict:
    base = {"sago_train_version": "0.1.0", "model": {"path": "sago://tiny-llama"},
            "data": {"train": "sago://demo/groups.jsonl"}, "training": {"max_steps": 2}}
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v}
    return base


@pytest.mark.parametrize("dotted", sorted(k for k in RANGES if k.split(".")[0] in ("training", "stability")))
def test_nan_and_a_huge_value_are_refused_for_every_ranged_key(dotted: str) -> None:
    section, key = dotted.split(".", 1)
    extra: dict = {}
    if section == "training":
        from transformers import TrainingArguments
        from trl import SFTConfig

        if key not in {f.name for f in dataclasses.fields(TrainingArguments)}:
            if key not in {f.name for f in dataclasses.fields(SFTConfig)}:
                pytest.skip(f"{key} is not a training argument of this transformers / TRL version")
            extra = {"trainer": "sft", "data": {"train": "sago://demo/train.jsonl"}}
    values = [math.nan, math.inf] + ([1e30] if RANGES[dotted].hi != math.inf else [])
    for value in values:
        with pytest.raises(SagoInputError, match=rf"field '{re.escape(dotted)}': expected"):
            parse_recipe({**_recipe(**{section: {key: value}}), **extra}, source="r.yaml")


def test_monitor_options_numbers_name_the_option() -> None:
    with pytest.raises(SagoInputError, match=r"field 'monitor.options.max_new_tokens': expected .* got 1e\+30"):
        parse_recipe(_recipe(monitor={"options": {"max_new_tokens": 1e30}}), source="r.yaml")


def test_an_unranged_training_float_is_still_refused_when_not_finite() -> None:
    from sago_train.cli.recipe_sections import check_ranges

    with pytest.raises(SagoInputError, match=r"field 'training.some_new_float': expected a finite number, got nan"):
        check_ranges("training", {"some_new_float": math.nan}, "r.yaml")

