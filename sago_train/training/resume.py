"""The consistency mode's state in checkpoints: what a resumed run needs besides the model and the optimizer.

Two pieces of it live outside the model: an EMA teacher's averaged parameters (``Teacher.shadow``) and the fresh
drawer's per-group draw counts (``FreshVariants.draws``, which make each epoch's variants new). Without them a
resumed run would restart the average from the current weights and repeat the first epoch's draws. They are
saved beside each checkpoint, one file per process (each process counts the draws of the groups it collated),
and loaded by the trainer before ``Trainer.train`` resumes.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..errors import SagoInputError

STATE_FILE = "sago_consistency_state-rank{rank}.pt"


def _state(teacher: Any, drawer: Any) -> dict[str, Any]:
    return {
        "shadow": [s.detach().cpu().clone() for s in teacher.shadow] if teacher is not None and teacher.shadow else None,
        "draws": dict(drawer.consumed) if drawer is not None else None,
    }


def has_state(teacher: Any, drawer: Any) -> bool:
    """Whether a run with this teacher and drawer has anything to save (an EMA teacher or fresh variants)."""
    return (teacher is not None and bool(teacher.shadow)) or drawer is not None


class ConsistencyStateCallback(TrainerCallback):
    """Writes the EMA teacher's average and the fresh draw counts into each checkpoint directory (``on_save``, after
    the Trainer wrote it). ``teacher`` or ``drawer`` may be None."""

    def __init__(self, teacher: Any, drawer: Any) -> None:
        self.teacher = teacher
        self.drawer = drawer

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(_state(self.teacher, self.drawer), folder / STATE_FILE.format(rank=args.process_index))


def load_state(checkpoint: str | Path, teacher: Any, drawer: Any, rank: int) -> bool:
    """Restore what :class:`ConsistencyStateCallback` saved in ``checkpoint``; False (with a warning) when the
    checkpoint has no such file (written without the consistency mode's state, e.g. by an earlier version)."""
    path = Path(checkpoint) / STATE_FILE.format(rank=rank)
    if not path.is_file():
        warnings.warn(f"{checkpoint}: no {path.name}, so the EMA teacher restarts from the checkpoint's weights and "
                      "fresh variants from their first draw", stacklevel=3)
        return False
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if teacher is not None and teacher.shadow:
        shadow = saved.get("shadow")
        shapes = [tuple(s.shape) for s in teacher.shadow]
        if shadow is None or [tuple(s.shape) for s in shadow] != shapes:
            got = None if shadow is None else len(shadow)
            raise SagoInputError(
                f"{path}: the saved EMA teacher does not fit this model ({got} tensors saved, {len(shapes)} "
                "trainable parameters expected, or their shapes differ)",
                key="teacher", hint="resume with the model and adapter configuration the checkpoint was trained with")
        with torch.no_grad():
            for s, v in zip(teacher.shadow, shadow):
                s.copy_(v.to(device=s.device, dtype=s.dtype))
    if drawer is not None and saved.get("draws") is not None:
        drawer.restore(saved["draws"])
    return True


def restore(resume_from_checkpoint: str | bool, args: Any, teacher: Any, drawer: Any) -> None:
    """Before ``Trainer.train(resume_from_checkpoint)``: load this process's saved state, if the run has any
    (``True`` means the last checkpoint in ``args.output_dir``, as for the Trainer; none found is the Trainer's
    error to raise)."""
    if not has_state(teacher, drawer):
        return
    checkpoint = resume_from_checkpoint
    if checkpoint is True:
        from transformers.trainer_utils import get_last_checkpoint

        checkpoint = get_last_checkpoint(args.output_dir)
    if checkpoint:
        load_state(checkpoint, teacher, drawer, args.process_index)
