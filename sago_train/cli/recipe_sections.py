"""The sections of a recipe (``sago-train run``): each a dataclass whose fields are documented once, here
(``metadata["help"]``), and which checks its own values so that an error names the recipe line."""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SagoInputError, did_you_mean, short_repr
from ..errors import type_name as _type_name
from ..integrations.options import EarlyStoppingOptions, MonitorOptions
from ..io import is_safe_name
from ..limits import (
    MAX_BATCH_SIZE,
    MAX_BOOTSTRAP,
    MAX_FRESH_VARIANTS,
    MAX_LOSS_WEIGHT,
    MAX_NEW_TOKENS,
    MAX_SEED,
    MAX_TRAINING_STEPS,
    MAX_VARIANT_TOKENS,
    NumberRange,
)
from ..model.loading import DTYPES


@dataclass
class LoraSection:
    r: int = field(default=8, metadata={"help": "LoRA rank."})
    alpha: int = field(default=16, metadata={"help": "LoRA alpha (scaling = alpha / r)."})
    dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    target_modules: Any = field(
        default="all-linear", metadata={"help": "Modules to adapt: a list of names, or 'all-linear'."}
    )

    def __post_init__(self) -> None:
        # Checked here so that a bad value fails at --dry-run parsing with the recipe line, not inside peft.
        if self.r < 1:
            raise SagoInputError(f"expected a LoRA rank >= 1, got {self.r}", key="r")
        if self.alpha <= 0:
            raise SagoInputError(f"expected a LoRA alpha > 0, got {self.alpha}", key="alpha")
        if not 0.0 <= self.dropout < 1.0:
            raise SagoInputError(f"expected a dropout in [0, 1), got {self.dropout}", key="dropout")
        names = self.target_modules
        ok = (isinstance(names, str) and names.strip()) or (
            isinstance(names, list) and names and all(isinstance(n, str) and n.strip() for n in names))
        if not ok:
            raise SagoInputError(
                f"expected a non-empty list of module names or 'all-linear', got {_type_name(names)} "
                f"{short_repr(names)}", key="target_modules", hint="e.g. target_modules: [q_proj, v_proj]")


@dataclass
class ModelSection:
    path: str = field(default="sago://tiny-llama", metadata={"help": "Model folder or hub id (sago://tiny-llama "
                                                                      "is the shipped tiny model, "
                                                                      "sago://smollm2-135m-instruct a real instruct "
                                                                      "model converted once into the cache)."})
    dtype: str | None = field(default=None, metadata={"help": "float32, bfloat16 or float16 (default: the model's)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow custom model code (off by default)."})
    lora: LoraSection | None = field(default=None, metadata={"help": "LoRA settings (PEFT); omit for full fine-tuning."})

    def __post_init__(self) -> None:
        if self.dtype is not None:
            if self.dtype != "auto" and self.dtype not in DTYPES:
                raise SagoInputError(f"unknown dtype {short_repr(self.dtype)}.{did_you_mean(self.dtype[:50], DTYPES)} "
                                     f"Valid: auto, {', '.join(DTYPES)}", key="dtype")


@dataclass
class DataSection:
    train: str = field(default="", metadata={"help": "Training data: a JSONL file (or a datasets hub id). Records "
                                                     "are {prompt, completion} or {text} (plain SFT), or "
                                                     "{variants, target} groups (for the stability loss)."})
    format: str = field(default="auto", metadata={"help": "sft, groups, or auto (from the first record's keys)."})
    eval: str | None = field(default=None, metadata={"help": "Optional evaluation data in the same format."})
    max_length: int | None = field(default=None, metadata={"help": "Truncate sequences to this many tokens."})
    limit: int | None = field(default=None, metadata={"help": "Use only the first N training records (0 or null: "
                                                              "all of them)."})

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 0:
            raise SagoInputError(f"expected a number of records >= 0, got {self.limit}", key="limit",
                                 hint="0 or null uses every record")


@dataclass
class MonitorSection(MonitorOptions):
    """The callback's options (:class:`~sago_train.integrations.options.MonitorOptions`) plus what it watches."""

    sets: dict[str, str] = field(default_factory=dict, metadata={"help": "Held-out variant sets: name -> JSONL."})
    options: dict[str, Any] = field(default_factory=dict, metadata={"help": "Evaluation options (SAGOConfig "
                                                                            "fields: axes, max_groups, ...)."})


#: The early-stopping callback's options, as they are.
EarlyStoppingSection = EarlyStoppingOptions


_STEPS = NumberRange(1, MAX_TRAINING_STEPS, ratio=True, limit_name="MAX_TRAINING_STEPS")
_FINITE = NumberRange(0, math.inf, integer=False)
_UNIT_OPEN = NumberRange(0, 1, integer=False, below=True)
_WEIGHT = NumberRange(0, MAX_LOSS_WEIGHT, integer=False, limit_name="MAX_LOSS_WEIGHT")
#: The range of each number a recipe sets that sago_train uses or forwards to the Trainer, checked once the
#: section's types are (:func:`check_ranges`): out of range is one line naming the key, the range and the value,
#: before the model loads (instead of a ZeroDivisionError or a hang inside the Trainer).
RANGES: dict[str, NumberRange] = {
    "training.max_steps": NumberRange(1, MAX_TRAINING_STEPS, limit_name="MAX_TRAINING_STEPS",
                                      also=((-1, "num_train_epochs decides"),)),
    "training.num_train_epochs": NumberRange(0, MAX_TRAINING_STEPS, integer=False, limit_name="MAX_TRAINING_STEPS"),
    "training.per_device_train_batch_size": NumberRange(1, MAX_BATCH_SIZE, limit_name="MAX_BATCH_SIZE"),
    "training.per_device_eval_batch_size": NumberRange(1, MAX_BATCH_SIZE, limit_name="MAX_BATCH_SIZE"),
    "training.gradient_accumulation_steps": NumberRange(1, MAX_BATCH_SIZE, limit_name="MAX_BATCH_SIZE"),
    "training.logging_steps": _STEPS,
    "training.eval_steps": _STEPS,
    "training.save_steps": _STEPS,
    "training.warmup_steps": NumberRange(0, MAX_TRAINING_STEPS, ratio=True, limit_name="MAX_TRAINING_STEPS"),
    "training.learning_rate": NumberRange(0, math.inf, integer=False),
    "training.seed": NumberRange(0, MAX_SEED, limit_name="MAX_SEED"),
    "training.data_seed": NumberRange(0, MAX_SEED, limit_name="MAX_SEED"),
    # the optimizer's numbers: a NaN weight_decay trained an adapter of NaN weights (exit 0), a NaN adam_epsilon
    # failed inside the optimizer after the baseline evaluation
    "training.weight_decay": _FINITE,
    "training.adam_beta1": _UNIT_OPEN,
    "training.adam_beta2": _UNIT_OPEN,
    "training.adam_epsilon": _FINITE,
    "training.max_grad_norm": _FINITE,
    "training.warmup_ratio": NumberRange(0, 1, integer=False),
    "training.label_smoothing_factor": _UNIT_OPEN,
    "training.neftune_noise_alpha": _FINITE,
    "training.eval_delay": NumberRange(0, MAX_TRAINING_STEPS, integer=False, limit_name="MAX_TRAINING_STEPS"),
    "training.save_total_limit": NumberRange(1, MAX_TRAINING_STEPS, limit_name="MAX_TRAINING_STEPS"),
    "training.dataloader_num_workers": NumberRange(0, 1024),
    "training.dataloader_prefetch_factor": NumberRange(1, 1024),
    "training.torch_empty_cache_steps": NumberRange(1, MAX_TRAINING_STEPS, limit_name="MAX_TRAINING_STEPS"),
    "training.eval_accumulation_steps": NumberRange(1, MAX_TRAINING_STEPS, limit_name="MAX_TRAINING_STEPS"),
    "training.ddp_bucket_cap_mb": NumberRange(1, 2**20),
    "training.ddp_timeout": NumberRange(1, MAX_TRAINING_STEPS, limit_name="MAX_TRAINING_STEPS"),
    "training.max_length": NumberRange(1, MAX_VARIANT_TOKENS, limit_name="MAX_VARIANT_TOKENS"),
    "training.max_seq_length": NumberRange(1, MAX_VARIANT_TOKENS, limit_name="MAX_VARIANT_TOKENS"),
    "data.max_length": NumberRange(1, MAX_VARIANT_TOKENS, limit_name="MAX_VARIANT_TOKENS"),
    "monitor.eval_steps": NumberRange(1, MAX_TRAINING_STEPS, limit_name="MAX_TRAINING_STEPS"),
    "monitor.overhead_budget": NumberRange(0, 1, integer=False),
    "monitor.generation_every": NumberRange(1, MAX_TRAINING_STEPS, limit_name="MAX_TRAINING_STEPS"),
    "monitor.log_unstable_groups": NumberRange(0, MAX_BATCH_SIZE, limit_name="MAX_BATCH_SIZE"),
    "monitor.options.max_new_tokens": NumberRange(1, MAX_NEW_TOKENS, limit_name="MAX_NEW_TOKENS"),
    "monitor.options.batch_size": NumberRange(1, MAX_BATCH_SIZE, limit_name="MAX_BATCH_SIZE"),
    "monitor.options.n_bootstrap": NumberRange(1, MAX_BOOTSTRAP, limit_name="MAX_BOOTSTRAP"),
    "monitor.options.seed": NumberRange(0, MAX_SEED, limit_name="MAX_SEED"),
    "monitor.options.max_groups": NumberRange(0, MAX_TRAINING_STEPS, limit_name="MAX_TRAINING_STEPS"),
    "stability.act_weight": _WEIGHT,
    "stability.conf_weight": _WEIGHT,
    "stability.temperature": _WEIGHT,
    "stability.teacher_temperature": _WEIGHT,
    "stability.ema_decay": _UNIT_OPEN,
    "stability.confidence_threshold": _UNIT_OPEN,
    "stability.warmup_steps": NumberRange(0, MAX_TRAINING_STEPS, limit_name="MAX_TRAINING_STEPS"),
    "stability.fresh_variants": NumberRange(0, MAX_FRESH_VARIANTS, limit_name="MAX_FRESH_VARIANTS"),
    "stability.unlabeled_max_new_tokens": NumberRange(1, MAX_NEW_TOKENS, limit_name="MAX_NEW_TOKENS"),
}


def check_ranges(section: str, values: Any, source: str | None) -> None:
    """Each number of ``section`` (a mapping, or a section dataclass) that :data:`RANGES` bounds, against its
    range (a dotted key reaches into a mapping: ``monitor.options.seed``); None (the default) is not checked. In
    ``training`` a number that no range names is still refused when it is not finite (NaN, inf: passed on to
    the Trainer they train NaN weights or fail inside the optimizer). The error names the recipe line when
    ``values`` has lines."""
    for dotted, bounds in RANGES.items():
        prefix, _, rest = dotted.partition(".")
        if prefix != section:
            continue
        holder, *path = rest.split(".")
        value, lines = values, getattr(values, "lines", {})
        for key in [holder, *path]:
            line = lines.get(key)
            value = value.get(key) if isinstance(value, dict) else getattr(value, key, None)
            lines = getattr(value, "lines", {})
        if value is not None:
            bounds.check(value, key=dotted, source=source, line=line)
    if section == "training" and isinstance(values, dict):
        for key, value in values.items():
            if isinstance(value, float) and not math.isfinite(value) and f"training.{key}" not in RANGES:
                raise SagoInputError(f"expected a finite number, got {value!r}", key=f"training.{key}",
                                     source=source, line=getattr(values, "lines", {}).get(key))


SECTIONS = ("sago_train_version", "name", "description", "trainer", "model", "data", "monitor", "early_stopping",
            "stability", "training")
TRAINERS = ("trainer", "sft")


def validate_run_name(name: Any, **where: Any) -> str:
    """Check that ``name`` is a single safe path component (no '/', no '..') and return it."""
    # Run names become directory names (runs/<name>): one path component, so a run cannot write outside runs/.
    if not is_safe_name(name):
        raise SagoInputError(
            f"invalid run name {short_repr(name)}: expected letters, digits, '_', '-', '+' or '.', starting with a "
            "letter or digit (at most 100)",
            hint="the name becomes the folder runs/<name>, so it cannot contain '/' or '..'; "
                 "use --output-dir to write elsewhere",
            **where,
        )
    return name


def check_deepspeed(training: dict[str, Any], source: str | None, line: int | None, root: Path) -> None:
    """``training.deepspeed`` (a config file or an inline mapping) needs the file and the package: say so here,
    with the recipe line, instead of a PackageNotFoundError or FileNotFoundError from TrainingArguments."""
    value = training.get("deepspeed")
    if value is None:
        return
    if isinstance(value, str):
        path = Path(os.path.expanduser(value))
        if not path.is_file() and not (root / path).is_file():
            raise SagoInputError(f"DeepSpeed config file not found: {short_repr(value)[1:-1]}", source=source,
                                 line=line, key="training.deepspeed",
                                 hint="give the path of a DeepSpeed JSON config, or remove the key")

    if importlib.util.find_spec("deepspeed") is None:
        raise SagoInputError("training.deepspeed needs the deepspeed package, which is not installed",
                             source=source, line=line, key="training.deepspeed",
                             hint="pip install deepspeed, or remove the key")
