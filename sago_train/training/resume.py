"""The consistency mode's state in checkpoints: what a resumed run needs besides the model and the optimizer.

Two pieces of it live outside the model: an EMA teacher's averaged parameters (``Teacher.shadow``) and the fresh
drawer's per-group draw counts (``FreshVariants.consumed``, which make each epoch's variants new). Without them a
resumed run would restart the average from the current weights and repeat the first epoch's draws. They are
saved beside each checkpoint: the average once (process 0; every process holds the same one), the draw counts
per process (each counts the groups it collated). The trainer loads them before ``Trainer.train`` resumes.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..errors import SagoInputError, type_name
from ..io import atomic_write_bytes

STATE_FILE = "sago_consistency_state-rank{rank}.pt"
TEACHER_FILE = "sago_ema_teacher.pt"


def has_state(teacher: Any, drawer: Any) -> bool:
    """Whether a run with this teacher and drawer has anything to save (an EMA teacher or fresh variants)."""
    return (teacher is not None and bool(teacher.shadow)) or drawer is not None


class ConsistencyStateCallback(TrainerCallback):
    """Writes the EMA teacher's average (process 0) and this process's fresh draw counts into each checkpoint
    directory (``on_save``, after the Trainer wrote it). ``teacher`` or ``drawer`` may be None."""

    def __init__(self, teacher: Any, drawer: Any) -> None:
        self.teacher = teacher
        self.drawer = drawer

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        folder.mkdir(parents=True, exist_ok=True)
        if self.drawer is not None:
            save_atomic({"draws": dict(self.drawer.consumed)}, folder / STATE_FILE.format(rank=args.process_index))
        if self.teacher is not None and self.teacher.shadow and args.process_index == 0:
            save_atomic({"shadow": [s.detach().cpu().clone() for s in self.teacher.shadow]}, folder / TEACHER_FILE)


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save`` into memory, then one atomic write (temporary file, fsync, rename): a crash or a full disk
    while saving leaves no truncated state file in the checkpoint (the previous file, or none)."""
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def read_state(path: Path, key: str, what: str) -> Any:
    """``torch.load(path, weights_only=True)[key]``, with a truncated or foreign file, or one without ``key``,
    refused naming the file (not a pickle or zip traceback after the model loaded)."""
    fix = "resume from another checkpoint, or remove the file to restart that state"
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - truncated zip, foreign pickle, unreadable file: all one answer
        raise SagoInputError(f"cannot read the {what} ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
                             if str(err) else f"cannot read the {what} ({type(err).__name__})", source=str(path),
                             hint=fix) from None
    if not isinstance(data, dict) or key not in data:
        raise SagoInputError(f"expected the {what}: an object with '{key}', got {type_name(data)}", source=str(path),
                             hint=fix)
    return data[key]


def check_shadow(path: Path, shadow: Any, teacher: Any) -> list[torch.Tensor]:
    """The saved EMA average, each tensor checked against the teacher's: a list of as many tensors, each of the
    parameter's shape and dtype and finite (a tampered state of NaN values or another dtype loaded silently)."""
    want = [(tuple(s.shape), s.dtype) for s in teacher.shadow]
    if not isinstance(shadow, list) or not all(isinstance(s, torch.Tensor) for s in shadow):
        raise SagoInputError(f"expected a list of tensors, got {type_name(shadow)}", source=str(path), key="shadow",
                             hint="resume from another checkpoint")
    got = [(tuple(s.shape), s.dtype) for s in shadow]
    if got != want:
        i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise SagoInputError(
            f"the saved EMA teacher does not fit this model: {len(got)} tensors saved for {len(want)} trainable "
            f"parameters; the first difference is at tensor {i} (saved {_shown(got, want, i)}, expected "
            f"{_shown(want, got, i)})",
            source=str(path), key="teacher",
            hint="resume with the model, adapter and trainable parameters the checkpoint was trained with")
    bad = next((i for i, s in enumerate(shadow) if s.is_floating_point() and not bool(torch.isfinite(s).all())), None)
    if bad is not None:
        raise SagoInputError(f"tensor {bad} of the saved EMA teacher holds NaN or infinite values", source=str(path),
                             key="shadow", hint="resume from another checkpoint")
    return shadow


def _shown(items: list[Any], others: list[Any], i: int) -> str:
    """Tensor ``i``'s shape, and its dtype where the shapes agree (the dtype is then the difference)."""
    if i >= len(items):
        return "none"
    shape, dtype = items[i]
    same_shape = i < len(others) and others[i][0] == shape
    return f"{shape} {str(dtype).replace('torch.', '')}" if same_shape else str(shape)


def _missing(checkpoint: str | Path, name: str, what: str) -> None:
    warnings.warn(f"{checkpoint}: no {name} (a checkpoint written without it, e.g. by an earlier version or with "
                  f"another stability setting), so {what}", stacklevel=5)


def load_state(checkpoint: str | Path, teacher: Any, drawer: Any, rank: int) -> bool:
    """Restore what :class:`ConsistencyStateCallback` saved in ``checkpoint``; False (with a warning) for each
    piece the checkpoint lacks."""
    ok = True
    if teacher is not None and teacher.shadow:
        path = Path(checkpoint) / TEACHER_FILE
        if not path.is_file():
            _missing(checkpoint, path.name, "the EMA teacher restarts from the checkpoint's weights")
            ok = False
        else:
            shadow = check_shadow(path, read_state(path, "shadow", "saved EMA teacher"), teacher)
            with torch.no_grad():
                for s, v in zip(teacher.shadow, shadow):
                    s.copy_(v.to(device=s.device, dtype=s.dtype))
    if drawer is not None:
        path = Path(checkpoint) / STATE_FILE.format(rank=rank)
        if not path.is_file():
            _missing(checkpoint, path.name, "fresh variants start again from their first draw")
            ok = False
        else:
            draws = read_state(path, "draws", "saved fresh-variant draw counts")
            if not isinstance(draws, dict) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in draws.values()):
                raise SagoInputError(f"expected an object of group -> draw count, got {type_name(draws)}",
                                     source=str(path), key="draws", hint="resume from another checkpoint")
            drawer.restore(draws)
    return ok


def restore(resume_from_checkpoint: str | bool, args: Any, teacher: Any, drawer: Any,
            dataset: Any = None) -> None:
    """Before ``Trainer.train(resume_from_checkpoint)``: load this process's saved state, if the run has any
    (``True`` means the last checkpoint in ``args.output_dir``, as for the Trainer; none found is the Trainer's
    error to raise). Where the draws cannot continue exactly (dataloader workers count on copies of the drawer; an
    iterable dataset's skipped batches are collated again), it says so."""
    if not has_state(teacher, drawer):
        return
    checkpoint = resume_from_checkpoint
    if checkpoint is True:
        from transformers.trainer_utils import get_last_checkpoint

        checkpoint = get_last_checkpoint(args.output_dir)
    if not checkpoint:
        return
    load_state(checkpoint, teacher, drawer, args.process_index)
    if drawer is not None:
        from torch.utils.data import IterableDataset

        why = ("dataloader_num_workers > 0 (each worker draws on its own copy of the counts)"
               if getattr(args, "dataloader_num_workers", 0) else
               "an iterable dataset (the batches skipped on resume are collated again, and count)"
               if isinstance(dataset, IterableDataset) else None)
        if why:
            warnings.warn(f"resuming with fresh variants and {why}: the variants drawn from here differ from an "
                          "uninterrupted run's (still seeded and new each epoch)", stacklevel=3)
