"""Worker for the 2-process DDP test: ``torchrun --nproc_per_node 2 tests/ddp_stability_worker.py OUT_DIR``.

Trains StabilityTrainer for a few steps on CPU (gloo) and writes ``rank<r>.json`` with the logs, the number
of rows of every micro-batch this rank saw, and a checksum of the final weights (equal on both ranks when
DDP kept them in sync).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainingArguments

from sago_train.training.loss import StabilityConfig
from sago_train.training.trainer import StabilityTrainer
from tests._helpers.tiny import (
    SPECIALS_FIRST,
    TAGGED_TEMPLATE,
    make_byte_tokenizer,
    make_tiny_model,
    tiny_groups,
)


class Recorder(TrainerCallback):
    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


class RowCountingTrainer(StabilityTrainer):
    rows: list[int] = []

    def compute_loss(self, model, inputs, *args, **kwargs):
        self.rows.append(int(inputs["input_ids"].shape[0]))
        return super().compute_loss(model, inputs, *args, **kwargs)


def consistency_run(args: TrainingArguments) -> dict:
    """The consistency mode in the same processes (no second launch): an EMA teacher, fresh variants, and an
    unlabeled prompt answered by the teacher on each rank."""
    data = tiny_groups(8)
    for item in data[::2]:
        item["target"] = None
    recorder = Recorder()
    trainer = StabilityTrainer(
        model=make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False),
        args=args,
        train_dataset=data,
        processing_class=make_byte_tokenizer(TAGGED_TEMPLATE, SPECIALS_FIRST),
        stability_config=StabilityConfig(mode="consistency", act_weight=0.1, conf_weight=1.0, teacher="ema",
                                         ema_decay=0.5, fresh_variants=1, unlabeled_max_new_tokens=4),
        callbacks=[recorder],
    )
    trainer.train()
    return {
        "logs": recorder.logs,
        "checksum": float(sum(p.detach().double().sum() for p in trainer.model.parameters())),
        "ema_checksum": float(sum(s.double().sum() for s in trainer._sago_teacher.shadow)),
    }


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=2,
        max_steps=3,
        logging_steps=1,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    recorder = Recorder()
    trainer = RowCountingTrainer(
        model=make_tiny_model("llama", layers=4, ids=SPECIALS_FIRST, eval_mode=False),
        args=args,
        train_dataset=tiny_groups(8),
        processing_class=make_byte_tokenizer(TAGGED_TEMPLATE, SPECIALS_FIRST),
        stability_config=StabilityConfig(act_weight=1.0, conf_weight=1.0),
        callbacks=[recorder],
    )
    trainer.train()
    checksum = float(sum(p.detach().double().sum() for p in trainer.model.parameters()))
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    record = {"logs": recorder.logs, "batch_rows": trainer.rows, "checksum": checksum, "world_size": world,
              "consistency": consistency_run(args)}
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    if dist.is_initialized():
        dist.barrier()  # both ranks have written their result; no collective is left
        # gloo's shutdown (destroy_process_group or its threads at interpreter exit) can hang or abort one rank
        # now and then on a loaded machine; the work is done and on disk, so leave without the teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
