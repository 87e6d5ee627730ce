"""Run a recipe: load the model (and LoRA), the data, the monitoring sets, build the trainer with its
callbacks, and train. The CLI's ``sago-train run`` is a thin wrapper around :func:`run_recipe`."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import torch

from ..data.groups import VariantSet, too_long_variant
from ..data.sources import bundled_sets, is_bundled_spec
from ..errors import SagoInputError, type_name
from ..eval.config import SAGOConfig
from ..integrations.callback import SAGOCallback
from ..integrations.early_stopping import SAGOEarlyStoppingCallback
from ..integrations.options import MonitorOptions
from ..io import read_jsonl, validate_set_name
from ..limits import MAX_TRAIN_FILE_BYTES, MAX_VARIANT_CHARS
from ..model.layers import num_decoder_layers, resolve_layers
from ..model.loading import load_model_and_tokenizer, others_deprecations
from ..results.layout import SAGO_DIR, history_path
from ..results.store import read_history
from ..threads import configure_torch_threads
from ..training.collator import VariantGroupCollator, group_of
from ..training.config import StabilityConfig
from ..training.trainer import StabilitySFTTrainer, StabilityTrainer, rendering_rule
from .recipe import Recipe
from .runner_env import wandb_dir_default, wandb_mode_default

logger = logging.getLogger(__name__)


def load_records(recipe: Recipe, value: str, what: str) -> list[dict[str, Any]]:
    return load_located_records(recipe, value, what)[0]


def load_located_records(recipe: Recipe, value: str, what: str) -> tuple[list[dict[str, Any]], list[int] | None]:
    """The records and, for a local JSONL file, the line of each (None for a hub dataset)."""
    path = recipe.resolve_path(value)
    if Path(path).exists():
        pairs = list(read_jsonl(path, max_file_bytes=MAX_TRAIN_FILE_BYTES, what="training data file"))
        return [rec for _, rec in pairs], [n for n, _ in pairs]
    try:
        import datasets

        return list(datasets.load_dataset(path, split="train")), None
    except Exception as err:  # noqa: BLE001 - becomes a clear user error
        raise SagoInputError(f"{what}: '{value}' is not a local file and could not be loaded as a dataset: "
                             f"{str(err).splitlines()[0] if str(err) else type(err).__name__}",
                             key=f"data.{what}", source=recipe.source) from err


def detect_format(records: list[dict[str, Any]], declared: str, source: str) -> str:
    if not records:
        raise SagoInputError("no training records", source=source)
    if declared != "auto":
        return declared
    first = records[0]
    if not isinstance(first, dict):
        raise SagoInputError("expected JSON objects as training records", source=source, line=1)
    if "variants" in first:
        return "groups"
    if "prompt" in first and "completion" in first or "text" in first or "messages" in first:
        return "sft"
    raise SagoInputError(f"cannot tell the data format from keys {sorted(first)}", source=source,
                         hint="records are {prompt, completion}, {text} or {variants, target}")


def validate_groups(
    records: list[Any], source: str, *, lines: list[int] | None = None, batch_size: int = 1,
    allow_unlabeled: bool = False,
) -> None:
    """Check every training group (``{variants, target}``) up front, naming the file and line, so that a bad
    record fails before the model loads instead of in the collator in the middle of training. With
    ``batch_size > 1`` groups are batched together, so they must all have the same number of variants. With
    ``allow_unlabeled`` (a stability mode that trains on prompts without targets) a group may have no target."""
    first: tuple[int, int | None] | None = None  # (K, line) of the first group
    for i, rec in enumerate(records):
        line = lines[i] if lines is not None else None
        where = f"training group {i}" if line is None else "training group"
        if not isinstance(rec, dict):
            raise SagoInputError(f"{where}: expected a JSON object with 'variants' and 'target', got "
                                 f"{type(rec).__name__}", source=source, line=line)
        if "id" in rec:
            where += f" '{rec['id']}'"
        try:
            group, target = group_of(rec, i, label=where, allow_unlabeled=allow_unlabeled)
        except SagoInputError as err:
            raise SagoInputError(err.message, source=source, line=line, key=err.key, hint=err.hint) from None
        long_variant = too_long_variant(group)
        if long_variant is not None or len(target or "") > MAX_VARIANT_CHARS:
            # The collator would tokenize it mid-training; megabytes of text can exhaust memory there.
            what = f"variant {long_variant}" if long_variant is not None else "the target"
            raise SagoInputError(f"{where}: {what} is longer than {MAX_VARIANT_CHARS:,} characters "
                                 "(MAX_VARIANT_CHARS)", source=source, line=line,
                                 key="variants" if long_variant is not None else "target",
                                 hint="shorten it or drop the group")
        if first is None:
            first = (group.k, line)
        elif batch_size > 1 and group.k != first[0]:
            other = f"the group on line {first[1]}" if first[1] is not None else "group 0"
            raise SagoInputError(
                f"{where} has {group.k} variants but {other} has {first[0]}: groups batched together "
                f"(per_device_train_batch_size={batch_size}) must have the same number of variants",
                source=source, line=line, key="variants",
                hint="give every group the same K, or set training.per_device_train_batch_size: 1",
            )


def _check_sft_lengths(records: list[Any], source: str, lines: list[int] | None) -> None:
    """Text fields longer than ``MAX_VARIANT_CHARS`` are refused before anything tokenizes them (tokenizing
    tens of megabytes at once can exhaust memory); ``data.max_length`` truncates tokens, not characters."""
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):  # a stray `5` line: a TypeError inside tokenizing, after the model loaded
            raise SagoInputError(f"expected a training record (an object with prompt and completion, text or "
                                 f"messages), got {type_name(rec)}", source=source,
                                 line=lines[i] if lines is not None else i + 1, hint="remove or fix the line")
        for key in ("prompt", "completion", "text"):
            value = rec.get(key)
            if isinstance(value, str) and len(value) > MAX_VARIANT_CHARS:
                raise SagoInputError(f"'{key}' is longer than {MAX_VARIANT_CHARS:,} characters (MAX_VARIANT_CHARS)",
                                     source=source, line=lines[i] if lines is not None else i + 1, key=key,
                                     hint="split the record into smaller ones")


def tokenize_sft(records: list[dict[str, Any]], tokenizer: Any, max_length: int | None, source: str) -> list[dict]:
    """``{prompt, completion}`` -> input_ids with labels on the completion (and EOS) only; ``{text}`` -> all."""
    eos = tokenizer.eos_token_id
    out = []
    for i, r in enumerate(records):
        if "prompt" in r and "completion" in r:
            if not isinstance(r["prompt"], str) or not isinstance(r["completion"], str):
                raise SagoInputError("'prompt' and 'completion' must be strings", source=source, line=i + 1)
            p = list(tokenizer(r["prompt"])["input_ids"])
            c = list(tokenizer(r["completion"], add_special_tokens=False)["input_ids"]) + ([eos] if eos is not None else [])
            ids, labels = p + c, [-100] * len(p) + c
        elif "text" in r and isinstance(r["text"], str):
            ids = list(tokenizer(r["text"])["input_ids"])
            labels = list(ids)
        else:
            raise SagoInputError(f"expected {{prompt, completion}} or {{text}}, got keys {sorted(r)}", source=source,
                                 line=i + 1)
        if max_length:
            ids, labels = ids[:max_length], labels[:max_length]
        out.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels})
    return out


def build_model(recipe: Recipe) -> tuple[Any, Any]:
    configure_torch_threads()
    m = recipe.model
    try:
        model, tokenizer = load_model_and_tokenizer(recipe.resolve_path(m.path), dtype=m.dtype, device="cpu",
                                                    trust_remote_code=m.trust_remote_code)
    except SagoInputError as err:
        if err.source is not None:
            raise
        raise recipe.error(err.message, f"model.{err.key}" if err.key and err.key != "model" else "model.path",
                           hint=err.hint) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if m.lora is not None:
        try:
            import peft
        except ImportError as err:
            raise SagoInputError("model.lora needs peft", hint="pip install peft (a sago_train dependency)") from err
        _check_lora_rank(recipe, model)
        config = peft.LoraConfig(r=m.lora.r, lora_alpha=m.lora.alpha, lora_dropout=m.lora.dropout,
                                 target_modules=m.lora.target_modules, task_type="CAUSAL_LM")
        try:
            with others_deprecations():
                model = peft.get_peft_model(model, config)
        except (ValueError, TypeError) as err:  # e.g. target modules the model does not have
            first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
            raise recipe.error(f"LoRA cannot be applied to this model: {first}", "model.lora.target_modules",
                               hint="name modules the model has, e.g. [q_proj, v_proj], or 'all-linear'") from None
    return model, tokenizer


def _check_lora_rank(recipe: Recipe, model: Any) -> None:
    """A LoRA rank above the model's width adds no capacity (a rank-r update of a d-wide matrix has rank at most d)
    but costs r x d parameters per adapted matrix: ``r: 100000000`` had PEFT allocate tens of GB. Refused here,
    naming the recipe line, before PEFT allocates anything."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    width = getattr(text, "hidden_size", None)
    r = recipe.model.lora.r if recipe.model.lora is not None else None
    if isinstance(width, int) and r is not None and r > width:
        raise recipe.error(f"LoRA rank {r:,} is larger than the model's width ({width:,}, hidden_size)", "model.lora.r",
                           hint=f"use a rank in 1..{width} (8 to 64 is usual)")


def build_trainer(recipe: Recipe, *, output_dir: str | None = None, overwrite: bool = False,
                  new_baseline: bool = False, resume_step: int | None = None) -> Any:
    """Everything but ``train()``: model, data, callbacks and the right trainer class. ``overwrite`` lets a
    fresh run replace another run's SAGO history in the output directory, ``new_baseline`` a resumed run whose
    monitored sets changed start a new one (see :class:`SAGOCallback`); with ``resume_step`` such a resume is
    refused here, before the model loads."""
    # Everything the user wrote (data, training arguments, sets, callbacks) is checked before the model loads,
    # so that a bad input fails fast with one clear line.
    src = recipe.resolve_path(recipe.data.train)
    records, lines = load_located_records(recipe, recipe.data.train, "train")
    if recipe.data.limit:
        records = records[: recipe.data.limit]
        lines = lines[: recipe.data.limit] if lines is not None else None
    fmt = detect_format(records, recipe.data.format, src)
    eval_records, eval_lines = (load_located_records(recipe, recipe.data.eval, "eval") if recipe.data.eval
                                else (None, None))

    training = dict(recipe.training)
    training.setdefault("output_dir", str(Path("runs") / recipe.name))
    if output_dir:
        training["output_dir"] = output_dir
    if "wandb" in (training.get("report_to") or []):
        wandb_mode_default()
        wandb_dir_default(training["output_dir"])
    if fmt == "groups" and recipe.trainer != "sft":
        training.setdefault("remove_unused_columns", False)
    try:
        if recipe.trainer == "sft":
            from trl import SFTConfig

            with others_deprecations():
                args = SFTConfig(**training)
        else:
            from transformers import TrainingArguments

            args = TrainingArguments(**training)
    except (TypeError, ValueError, ImportError) as err:  # ImportError: e.g. deepspeed asked for, not installed
        first_line = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise SagoInputError(f"invalid training arguments: {first_line}", source=recipe.source,
                             key="training") from None
    if fmt == "sft":
        _check_sft_lengths(records, src, lines)
    if fmt == "groups":
        # A mode that trains on unlabeled prompts (consistency) takes items without a target in the training file.
        unlabeled = recipe.stability is not None and recipe.stability.stability_mode.unlabeled
        validate_groups(records, src, lines=lines, batch_size=args.per_device_train_batch_size,
                        allow_unlabeled=unlabeled)
        if eval_records is not None:
            validate_groups(eval_records, recipe.resolve_path(recipe.data.eval or ""), lines=eval_lines,
                            batch_size=args.per_device_eval_batch_size)

    callbacks: list[Any] = []
    if recipe.monitor.sets:
        try:
            config = SAGOConfig.from_kwargs(**recipe.monitor.options).in_training()
        except SagoInputError as err:
            raise SagoInputError(err.message, source=recipe.source, key=f"monitor.options.{err.key}" if err.key else
                                 "monitor.options", hint=err.hint) from None
        sets = {name: _load_set(recipe, name, p, config) for name, p in recipe.monitor.sets.items()}
        try:
            options = MonitorOptions(**{f.name: getattr(recipe.monitor, f.name) for f in dataclasses.fields(MonitorOptions)})
            callbacks.append(SAGOCallback(sets, options, overwrite=overwrite or options.overwrite,
                                          new_baseline=new_baseline or options.new_baseline, config=config))
            callbacks[-1].remedy_style = "recipe"  # its warnings name the recipe's keys
        except SagoInputError as err:
            raise SagoInputError(err.message, source=recipe.source, key=f"monitor.{err.key}" if err.key else "monitor",
                                 hint=err.hint) from None
    if resume_step is not None:
        _check_resume(callbacks, Path(args.output_dir) / SAGO_DIR, resume_step)
    if recipe.early_stopping is not None:
        callbacks.append(SAGOEarlyStoppingCallback(**dataclasses.asdict(recipe.early_stopping)))

    stability = recipe.stability
    if fmt == "groups" and stability is None:
        stability = StabilityConfig()  # StabilityConfig's defaults, as StabilityTrainer without stability_config
    if stability is not None and stability.enabled and fmt != "groups":
        raise SagoInputError("the stability loss needs training data of variant groups ({variants, target})",
                             source=recipe.source, key="data.train")

    # Seed before the model is built: LoRA adapters are initialized randomly and torch's default seed differs
    # from process to process, so without this the same recipe and seed would train different adapters.
    from transformers import set_seed

    set_seed(int(recipe.training.get("seed", 42)))
    model, tokenizer = build_model(recipe)
    _check_layers(recipe, callbacks, model)
    try:
        trainer = _make_trainer(recipe, fmt, args, model, tokenizer, records, eval_records, callbacks, stability, src)
        for cb in callbacks:
            if isinstance(cb, SAGOCallback) and cb.trainer is None:
                cb.attach(trainer)  # log through the Trainer to report_to, feed early stopping
        return trainer
    except SagoInputError as err:
        if err.source is not None:
            raise
        # Raised by the stability loss at construction (e.g. an out-of-range layer): name the recipe line.
        raise recipe.error(err.message, f"stability.{err.key}" if err.key else "stability", hint=err.hint) from None


def _check_resume(callbacks: list[Any], sago_dir: Path, step: int) -> None:
    """A resume whose monitored sets changed since the history measured them fails now, not after the model
    loaded (the callback checks again at train start, for the Trainer API)."""
    if not history_path(sago_dir).is_file():
        return
    kept = [h for h in read_history(sago_dir, allow_empty=True).entries if int(h["step"]) <= step]
    for cb in callbacks:
        if isinstance(cb, SAGOCallback):
            cb.check_resume(kept, history_path(sago_dir))


def _check_layers(recipe: Recipe, callbacks: list[Any], model: Any) -> None:
    """Monitoring layers out of range fail now (at --dry-run too), like ``stability.layers``, not at the first
    evaluation in the middle of training."""
    for cb in callbacks:
        if isinstance(cb, SAGOCallback) and cb.config.layers is not None:
            try:
                resolve_layers(cb.config.layers, num_decoder_layers(model))
            except SagoInputError as err:
                raise recipe.error(err.message, "monitor.options.layers", hint=err.hint) from None


def _make_trainer(recipe: Recipe, fmt: str, args: Any, model: Any, tokenizer: Any, records: list[Any],
                  eval_records: list[Any] | None, callbacks: list[Any], stability: Any, src: str) -> Any:
    if recipe.trainer == "sft":
        if fmt == "groups":
            args.remove_unused_columns = False
            return StabilitySFTTrainer(model=model, args=args, train_dataset=_dataset(records),
                                       eval_dataset=_dataset(eval_records), processing_class=tokenizer,
                                       callbacks=callbacks, stability_config=stability)
        from trl import SFTTrainer

        return SFTTrainer(model=model, args=args, train_dataset=_dataset(records), eval_dataset=_dataset(eval_records),
                          processing_class=tokenizer, callbacks=callbacks)

    from transformers import DataCollatorForSeq2Seq, Trainer

    if fmt == "groups":
        rule, stops = rendering_rule(callbacks, None, None)  # the monitor's rule: trained as it is evaluated
        collator = VariantGroupCollator(tokenizer, max_length=recipe.data.max_length, chat_template=rule,
                                        stop_strings=stops)
        return StabilityTrainer(model=model, args=args, train_dataset=records, eval_dataset=eval_records,
                                data_collator=collator, processing_class=tokenizer, callbacks=callbacks,
                                stability_config=stability)
    train = tokenize_sft(records, tokenizer, recipe.data.max_length, src)
    evals = tokenize_sft(eval_records, tokenizer, recipe.data.max_length, src) if eval_records else None
    return Trainer(model=model, args=args, train_dataset=train, eval_dataset=evals, processing_class=tokenizer,
                   data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100),
                   callbacks=callbacks)


def _load_set(recipe: Recipe, name: str, value: str, config: SAGOConfig) -> VariantSet:
    # The name is the recipe's: an invalid one is reported against the recipe line (parse_recipe checks it
    # too; a VariantSet built from a mapping in Python reaches here without that check).
    validate_set_name(name, source=recipe.source, key=f"monitor.sets.{name[:100]}",
                      line=recipe.lines.get(f"monitor.sets.{name}") or recipe.lines.get("monitor.sets"))
    try:
        path = recipe.resolve_path(value)
        if "/" in value and is_bundled_spec(value) and not os.path.exists(path):  # one bundled set: real/capitals
            (vs,) = bundled_sets(value).values()
            return VariantSet(name, vs.groups, vs.source)
        # Read lazily, as `sago-train eval --max-groups` does: only the groups the callback evaluates are parsed.
        return VariantSet.from_jsonl(path, name=name, max_groups=config.max_groups, seed=config.seed)
    except SagoInputError as err:
        if err.source is not None and err.line is not None:  # an error inside the set file names that file
            raise
        raise SagoInputError(f"{err.source + ': ' if err.source else ''}{err.message}", source=recipe.source,
                             line=recipe.lines.get(f"monitor.sets.{name}"), key=f"monitor.sets.{name}",
                             hint=err.hint) from None


def _dataset(records: list[dict[str, Any]] | None) -> Any:
    if records is None:
        return None
    import datasets

    return datasets.Dataset.from_list(records)


def dry_run(trainer: Any) -> float:
    """One batch through the loss (no optimizer step, no SAGO evaluation): checks data, model and trainer fit."""
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, batch)
    value = float(loss.detach())
    if value != value:  # NaN
        raise SagoInputError("dry run: the loss is NaN")
    return value
