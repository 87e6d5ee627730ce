"""Run a recipe: load the model (and LoRA), the data, the monitoring sets, build the trainer with its
callbacks, and train. The CLI's ``sago-train run`` is a thin wrapper around :func:`run_recipe`."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

import yaml

from .data.groups import VariantSet, read_jsonl
from .errors import SagoInputError
from .recipe import Recipe

logger = logging.getLogger(__name__)


def wandb_mode_default() -> None:
    """W&B runs offline unless the user has logged in (an API key in the environment or ~/.netrc)."""
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return
    netrc = Path.home() / ".netrc"
    if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return
    os.environ["WANDB_MODE"] = "offline"


def load_records(recipe: Recipe, value: str, what: str) -> list[dict[str, Any]]:
    return load_located_records(recipe, value, what)[0]


def load_located_records(recipe: Recipe, value: str, what: str) -> tuple[list[dict[str, Any]], list[int] | None]:
    """The records and, for a local JSONL file, the line of each (None for a hub dataset)."""
    path = recipe.resolve_path(value)
    if Path(path).exists():
        pairs = list(read_jsonl(path))
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
    records: list[Any], source: str, *, lines: list[int] | None = None, batch_size: int = 1
) -> None:
    """Check every training group (``{variants, target}``) up front, naming the file and line, so that a bad
    record fails before the model loads instead of in the collator in the middle of training. With
    ``batch_size > 1`` groups are batched together, so they must all have the same number of variants."""
    from .collator import _group_of

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
            group, _ = _group_of(rec, i, label=where)
        except SagoInputError as err:
            raise SagoInputError(err.message, source=source, line=line, key=err.key, hint=err.hint) from None
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
    from .modeling import load_model_and_tokenizer
    from .threads import configure_torch_threads

    configure_torch_threads()
    m = recipe.model
    model, tokenizer = load_model_and_tokenizer(recipe.resolve_path(m.path), dtype=m.dtype, device="cpu",
                                                trust_remote_code=m.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if m.lora is not None:
        try:
            import peft
        except ImportError as err:
            raise SagoInputError("model.lora needs peft", hint="pip install 'sago_train[peft]'") from err
        config = peft.LoraConfig(r=m.lora.r, lora_alpha=m.lora.alpha, lora_dropout=m.lora.dropout,
                                 target_modules=m.lora.target_modules, task_type="CAUSAL_LM")
        model = peft.get_peft_model(model, config)
    return model, tokenizer


def build_trainer(recipe: Recipe, *, output_dir: str | None = None) -> Any:
    """Everything but ``train()``: model, data, callbacks and the right trainer class."""
    from .callback import SAGOCallback
    from .config import SAGOConfig
    from .early_stopping import SAGOEarlyStoppingCallback
    from .loss import StabilityConfig

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
    if fmt == "groups" and recipe.trainer != "sft":
        training.setdefault("remove_unused_columns", False)
    try:
        if recipe.trainer == "sft":
            from trl import SFTConfig

            args = SFTConfig(**training)
        else:
            from transformers import TrainingArguments

            args = TrainingArguments(**training)
    except (TypeError, ValueError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SagoInputError(f"invalid training arguments: {first_line}", source=recipe.source,
                             key="training") from None
    if fmt == "groups":
        validate_groups(records, src, lines=lines, batch_size=args.per_device_train_batch_size)
        if eval_records is not None:
            validate_groups(eval_records, recipe.resolve_path(recipe.data.eval or ""), lines=eval_lines,
                            batch_size=args.per_device_eval_batch_size)

    callbacks: list[Any] = []
    if recipe.monitor.sets:
        sets = {name: _load_set(recipe, name, p) for name, p in recipe.monitor.sets.items()}
        try:
            callbacks.append(SAGOCallback(sets, eval_steps=recipe.monitor.eval_steps, baseline=recipe.monitor.baseline,
                                          overhead_budget=recipe.monitor.overhead_budget,
                                          config=SAGOConfig.from_kwargs(**recipe.monitor.options)))
        except SagoInputError as err:
            raise SagoInputError(err.message, source=recipe.source, key=f"monitor.{err.key}" if err.key else "monitor",
                                 hint=err.hint) from None
    if recipe.early_stopping is not None:
        callbacks.append(SAGOEarlyStoppingCallback(**dataclasses.asdict(recipe.early_stopping)))

    stability = recipe.stability
    if fmt == "groups" and stability is None:
        stability = StabilityConfig(act_weight=0.0, conf_weight=0.0)  # groups without the extra terms
    if stability is not None and stability.enabled and fmt != "groups":
        raise SagoInputError("the stability loss needs training data of variant groups ({variants, target})",
                             source=recipe.source, key="data.train")

    # Seed before the model is built: LoRA adapters are initialized randomly and torch's default seed differs
    # from process to process, so without this the same recipe and seed would train different adapters.
    from transformers import set_seed

    set_seed(int(recipe.training.get("seed", 42)))
    model, tokenizer = build_model(recipe)
    if recipe.trainer == "sft":
        if fmt == "groups":
            from .stability_trainer import StabilitySFTTrainer

            args.remove_unused_columns = False
            return StabilitySFTTrainer(model=model, args=args, train_dataset=_dataset(records),
                                       eval_dataset=_dataset(eval_records), processing_class=tokenizer,
                                       callbacks=callbacks, stability_config=stability)
        from trl import SFTTrainer

        return SFTTrainer(model=model, args=args, train_dataset=_dataset(records), eval_dataset=_dataset(eval_records),
                          processing_class=tokenizer, callbacks=callbacks)

    from transformers import DataCollatorForSeq2Seq, Trainer

    if fmt == "groups":
        from .collator import VariantGroupCollator
        from .stability_trainer import StabilityTrainer

        return StabilityTrainer(model=model, args=args, train_dataset=records, eval_dataset=eval_records,
                                data_collator=VariantGroupCollator(tokenizer, max_length=recipe.data.max_length),
                                processing_class=tokenizer, callbacks=callbacks, stability_config=stability)
    train = tokenize_sft(records, tokenizer, recipe.data.max_length, src)
    evals = tokenize_sft(eval_records, tokenizer, recipe.data.max_length, src) if eval_records else None
    return Trainer(model=model, args=args, train_dataset=train, eval_dataset=evals, processing_class=tokenizer,
                   data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100),
                   callbacks=callbacks)


def _load_set(recipe: Recipe, name: str, value: str) -> VariantSet:
    try:
        return VariantSet.from_jsonl(recipe.resolve_path(value), name=name)
    except SagoInputError as err:
        if err.source is not None:  # an error inside the set file names that file already
            raise
        raise SagoInputError(err.message, source=recipe.source, key=f"monitor.sets.{name}", hint=err.hint) from None


def _dataset(records: list[dict[str, Any]] | None) -> Any:
    if records is None:
        return None
    import datasets

    return datasets.Dataset.from_list(records)


def dry_run(trainer: Any) -> float:
    """One batch through the loss (no optimizer step, no SAGO evaluation): checks data, model and trainer fit."""
    import torch

    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, batch)
    value = float(loss.detach())
    if value != value:  # NaN
        raise SagoInputError("dry run: the loss is NaN")
    return value


def save_resolved(recipe: Recipe, data: dict[str, Any], output_dir: str) -> None:
    """Keep the recipe as it ran (after overrides) beside the outputs, for provenance."""
    from .io import atomic_write_text

    plain = json.loads(json.dumps(data, default=str))
    atomic_write_text(Path(output_dir) / "recipe.yaml", yaml.safe_dump(plain, sort_keys=False))
