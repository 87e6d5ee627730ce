"""Builders for short, real Trainer runs on a tiny model (shared by the callback tests and workers)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback

from sago_train import SAGOCallback
from sago_train.data import VariantSet

from .tiny import make_byte_tokenizer, make_tiny_model

SEQ = 24


def train_dataset(tok, n: int = 64):
    from datasets import Dataset

    enc = []
    for i in range(n):
        ids = tok(f"The number {i} is {i}.")["input_ids"][:SEQ]
        enc.append(ids + [258] * (SEQ - len(ids)))
    mask = [[1 if t != 258 else 0 for t in e] for e in enc]
    labels = [[t if t != 258 else -100 for t in e] for e in enc]
    return Dataset.from_dict({"input_ids": enc, "labels": labels, "attention_mask": mask})


def variant_set(name: str = "num", n: int = 8) -> VariantSet:
    recs = [{"id": f"g{i}", "variants": [f"The number {i} is", f"number {i}:", f"Tell me {i}"],
             "kinds": ["canonical", "terse", "question"], "reference": f" {i}"} for i in range(n)]
    return VariantSet.from_records(recs, name=name)


def make_trainer(output_dir, *, callbacks=(), bind: bool = True, lora: bool = False, max_steps: int = 10, seed: int = 0,
                 eval_dataset: bool = False, report_to: Any = (), **args: Any):
    from transformers import Trainer, TrainingArguments

    tok = make_byte_tokenizer()
    model = make_tiny_model("llama", seed=seed)
    if lora:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                           lora_dropout=0.0))
    defaults = dict(output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=8,
                    report_to=list(report_to), logging_steps=5, save_strategy="no", use_cpu=True, disable_tqdm=True,
                    learning_rate=1e-3, seed=seed, data_seed=seed)
    defaults.update(args)
    ds = train_dataset(tok)
    targs = TrainingArguments(**defaults)
    tr = Trainer(model=model, args=targs, train_dataset=ds, eval_dataset=ds.select(range(8)) if eval_dataset else None,
                 processing_class=tok, callbacks=list(callbacks))
    if bind:  # SAGOCallback logs through the Trainer once bound (see its docs)
        for cb in callbacks:
            if hasattr(cb, "attach"):
                cb.attach(tr)
    return tr


class Drift(TrainerCallback):
    """A crafted regression: a hook on block 0 adds a vector shared by every input, which makes the variants'
    hidden states similar; it shrinks at every step (no training), so activation instability rises."""

    def __init__(self, model, shrink_per_step: float):
        self.weight = 1.0
        self.shrink = shrink_per_step
        torch.manual_seed(123)
        self.common = 20.0 * torch.randn(32)
        model.model.layers[0].register_forward_hook(self._hook)

    def _hook(self, module, inputs, output):
        h = output[0] if isinstance(output, tuple) else output
        h = h + self.weight * self.common
        return (h, *output[1:]) if isinstance(output, tuple) else h

    def on_step_end(self, args, state, control, **kw):
        self.weight = max(0.0, 1.0 - self.shrink * state.global_step)


def drifting_trainer(tmp_path, shrink, stopper):
    cb = SAGOCallback(variant_set(n=16), eval_steps=1, axes="activation", layers=[0], max_new_tokens=3, n_bootstrap=200)
    tr = make_trainer(tmp_path, callbacks=[cb, stopper], max_steps=8, learning_rate=0.0)
    tr.add_callback(Drift(tr.model, shrink))
    return tr
