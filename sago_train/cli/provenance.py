"""What a run was trained with, recorded beside it and compared on ``sago-train run --resume``.

A resume that changes what the results depend on (another model or LoRA shape, other training data, another
learning rate) would go on silently and give a run that is neither the old one nor a new one. Each run records
``recipe.provenance.json`` beside its ``recipe.yaml``: the model, its LoRA shape, a SHA-256 of each data file, the
stability settings and the training numbers that change results (not ``max_steps`` or ``num_train_epochs``,
which a resume is there to extend, nor cadences such as ``save_steps``). A resume whose recipe differs is refused
in one line naming what changed, unless asked for (``--allow-recipe-change``, or ``--new-baseline``); the
recorded recipe and provenance are then kept beside the new ones (``recipe.yaml.<time>.old``), never replaced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from ..errors import SagoInputError, short_repr
from ..io import atomic_write_text, set_aside
from ..limits import MAX_TRAIN_FILE_BYTES
from ..results.layout import RESOLVED_RECIPE

PROVENANCE = "recipe.provenance.json"
#: Training arguments whose value changes the trained weights (the rest: cadences, logging, output).
RESULT_KEYS = (
    "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "optim",
    "optim_args", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio",
    "per_device_train_batch_size", "gradient_accumulation_steps", "seed", "data_seed", "label_smoothing_factor",
    "bf16", "fp16", "tf32", "max_length", "max_seq_length", "packing", "completion_only_loss",
    "assistant_only_loss", "neftune_noise_alpha", "group_by_length",
)


def file_fingerprint(path: str) -> dict[str, Any]:
    """``{"path", "sha256", "bytes"}`` of a data file (read in 1 MiB blocks), or ``{"path"}`` for a name that is
    not a file (a datasets hub id)."""
    p = Path(path)
    if not p.is_file():
        return {"path": path}
    digest, size = hashlib.sha256(), 0
    with open(p, "rb") as f:
        while size <= MAX_TRAIN_FILE_BYTES and (block := f.read(1 << 20)):
            digest.update(block)
            size += len(block)
    return {"path": path, "sha256": digest.hexdigest(), "bytes": size}


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def recipe_provenance(recipe: Any) -> dict[str, Any]:
    """What the results of a recipe's run depend on (see the module doc), as plain JSON."""
    model = recipe.model
    return _plain({
        "trainer": recipe.trainer,
        "model": {"path": model.path, "dtype": model.dtype,
                  "lora": dataclasses.asdict(model.lora) if model.lora is not None else None},
        "data": {"train": file_fingerprint(recipe.resolve_path(recipe.data.train)),
                 "eval": file_fingerprint(recipe.resolve_path(recipe.data.eval)) if recipe.data.eval else None,
                 "format": recipe.data.format, "limit": recipe.data.limit or None,
                 "max_length": recipe.data.max_length},
        "stability": dataclasses.asdict(recipe.stability) if recipe.stability is not None else None,
        "training": {k: recipe.training[k] for k in RESULT_KEYS if k in recipe.training},
    })


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): value}


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for each dotted key whose value differs (a ``path`` alone is not a change when the
    file's SHA-256 is the same: a run moved with its data).

    Example:
        >>> differences({"training": {"learning_rate": 5e-05}}, {"training": {"learning_rate": 0.001}})
        ['training.learning_rate: 5e-05 -> 0.001']
    """
    old, new = _flat(recorded), _flat(current)
    out = []
    for key in sorted(set(old) | set(new), key=lambda k: (k.split(".")[0], k)):
        if key.endswith(".path") and old.get(key[:-4] + "sha256") is not None and \
                old.get(key[:-4] + "sha256") == new.get(key[:-4] + "sha256"):
            continue
        if old.get(key) != new.get(key):
            shown = ("(unset)" if k not in d else short_repr(d[k], 24) for d, k in ((old, key), (new, key)))
            out.append(f"{key}: {' -> '.join(shown)}")
    return out


def read_provenance(output_dir: str | Path) -> dict[str, Any] | None:
    """The run's recorded provenance, None when it has none (a run of an earlier version); a file that is not
    a JSON object is refused naming it."""
    path = Path(output_dir) / PROVENANCE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8")[: 1 << 20])
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise SagoInputError(f"cannot read the run's recorded recipe provenance ({type(err).__name__})",
                             source=str(path), hint="restore it, or remove it to resume unchecked") from None
    if not isinstance(data, dict):
        raise SagoInputError("expected an object (the run's recorded provenance)", source=str(path),
                             hint="restore it, or remove it to resume unchecked")
    return data


def check_resume_recipe(output_dir: str | Path, current: dict[str, Any], *, allowed: bool) -> list[str]:
    """The changes between the run's recorded provenance and ``current``; refused unless ``allowed``."""
    recorded = read_provenance(output_dir)
    if recorded is None:
        return []
    changed = differences(recorded, current)
    if changed and not allowed:
        more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
        raise SagoInputError(
            f"cannot resume: the recipe differs from the one this run was trained with "
            f"({Path(output_dir) / PROVENANCE}): {'; '.join(changed[:3])}{more}",
            hint="restore the recipe, start a new run (another --output-dir), or pass --allow-recipe-change to "
                 "resume with it (the recorded recipe.yaml and provenance are kept as .<time>.old)")
    return changed


def keep_recipe(output_dir: str | Path, recipe_text: str, current: dict[str, Any]) -> list[Path]:
    """Write ``recipe.yaml`` and ``recipe.provenance.json``; an earlier one that differs is set aside first
    (``<name>.<time>.old``, never replaced). Returns the files set aside."""
    out = Path(output_dir)
    kept = []
    for name, text in ((RESOLVED_RECIPE, recipe_text),
                       (PROVENANCE, json.dumps(current, indent=2, sort_keys=True) + "\n")):
        path = out / name
        if path.is_file() and not path.is_symlink() and path.read_text(encoding="utf-8", errors="replace") != text:
            kept.append(set_aside(path))
        atomic_write_text(path, text)
    return kept


def save_resolved(recipe: Any, data: dict[str, Any], output_dir: str) -> list[Path]:
    """Keep the recipe as it ran (after overrides) and its provenance beside the outputs (:func:`keep_recipe`);
    returns the earlier files set aside."""
    import yaml

    plain = json.loads(json.dumps(data, default=str))
    return keep_recipe(output_dir, yaml.safe_dump(plain, sort_keys=False), recipe_provenance(recipe))
