"""Worker of the sharded-training tests (tests/distributed/test_fsdp.py and test_deepspeed.py) and of
benchmarks/cuda_smoke.py's sharded checks: runs on the shipped tiny model, each writing
``OUT/<scenario>/rank<r>.json`` (and the Trainer's output under ``OUT/<scenario>/run``).

    accelerate launch --config_file recipes/accelerate/fsdp.yaml --num_processes 2 \\
        -m tests.distributed.fsdp_worker OUT callback stability lora
    python -m tests.distributed.fsdp_worker OUT callback stability lora      # the one-process reference

Scenarios:

- ``callback``: a ``Trainer`` with ``SAGOCallback`` on the three bundled sets, 5 groups each (an odd number:
  rank 0 evaluates 3, rank 1 two), activations at blocks 1 and 3, confidence, generation (8 new tokens: the
  model's answers end with EOS after different numbers of steps on each rank). Learning rate 0: the weights
  stay as loaded, so every evaluation must equal the one-process one.
- ``evaluator``: ``SAGOEvaluator`` on the sharded model (no Trainer), on :data:`UNEVEN`, with its collectives
  counted (benchmarks/bench_distributed.py).
- ``stability`` / ``lora``: ``StabilityTrainer``, 3 optimizer steps of 4 groups (2 per rank under 2 processes,
  4 in one), the centroid stability loss (its terms are per-group means, so the mean over ranks is the mean
  over the 4 groups), plain and with a LoRA adapter.
- ``sft`` / ``sft-fp32``: the same with ``StabilitySFTTrainer`` (TRL), in bf16 (SFTConfig's default) / in
  float32 (DeepSpeed on CPU: transformers refuses bf16 there).

On a CPU-only machine accelerate does not shard (see :mod:`tests.distributed.cpu_fsdp`), so the worker lets it.
Each rank also records whether its model really is sharded, what each evaluation wrote on it, and how many
groups and decoding steps it ran.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from .cpu_fsdp import allow_fsdp_on_cpu

STEPS = 3
GLOBAL_GROUPS = 4  # groups per optimizer step, over all ranks


def world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def on_cpu() -> bool:
    """Train on the CPU: without CUDA, and not under DeepSpeed (see :func:`deepspeed`)."""
    return not torch.cuda.is_available() and not deepspeed()


def sharded_launch() -> bool:
    """Launched by accelerate with an FSDP or DeepSpeed config."""
    return deepspeed() or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def deepspeed() -> bool:
    """Launched by accelerate with a DeepSpeed config (the Trainer must then not be told to use the CPU: accelerate
    takes its DeepSpeed path only for an accelerator, and DeepSpeed's own CPU accelerator serves instead)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def sharding(model: torch.nn.Module) -> dict[str, Any]:
    """What wraps the model: FSDP2 modules and DTensor parameters (FSDP2), FSDP1 wrappers, ZeRO-3 parameters."""
    import torch.distributed.fsdp as fsdp

    fsdp2 = getattr(fsdp, "FSDPModule", ())
    return {"fsdp2_modules": sum(isinstance(m, fsdp2) for m in model.modules()),
            "fsdp1_modules": sum(isinstance(m, fsdp.FullyShardedDataParallel) for m in model.modules()),
            "dtensor_params": sum(type(p).__name__ == "DTensor" for p in model.parameters()),
            "zero3_params": sum(hasattr(p, "ds_id") for p in model.parameters())}


def training_args(out: Path, cls: Any = None, **kw: Any) -> Any:
    from transformers import TrainingArguments

    cls = cls or TrainingArguments
    _, size = world()
    defaults = dict(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=GLOBAL_GROUPS // size,
                    logging_steps=1, learning_rate=1e-3, report_to=[], use_cpu=on_cpu(), save_strategy="no",
                    ddp_backend="gloo" if deepspeed() and not torch.cuda.is_available() else None,
                    disable_tqdm=True, seed=0, data_seed=0, dataloader_num_workers=0)
    return cls(**{**defaults, **kw})


def load_tiny() -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sago_train import tiny_model_path

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32, local_files_only=True)
    return model, AutoTokenizer.from_pretrained(tiny_model_path(), local_files_only=True)


def text_dataset(tok: Any, n: int = 16, width: int = 24) -> Any:
    from datasets import Dataset

    rows = []
    for i in range(n):
        ids = tok(f"The number {i} is {i}.")["input_ids"][:width]
        pad = width - len(ids)
        rows.append({"input_ids": ids + [tok.pad_token_id] * pad, "attention_mask": [1] * len(ids) + [0] * pad,
                     "labels": ids + [-100] * pad})
    return Dataset.from_list(rows)


def run_callback(out: Path) -> dict[str, Any]:
    from transformers import Trainer

    from sago_train import SAGOCallback, bundled_sets
    from sago_train.eval.evaluator import SAGOEvaluator
    from sago_train.eval.extraction import Extractor
    from sago_train.results.monitor import MonitorState

    seen: dict[str, list] = {"writes": [], "groups": [], "new_tokens": []}
    record, groups, generate = MonitorState.record, SAGOEvaluator._evaluate_groups, Extractor._generate

    def spy_record(self, ev, line):
        seen["writes"].append(int(ev.step or 0))
        return record(self, ev, line)

    def spy_groups(self, vs, indices, *args, **kwargs):
        seen["groups"].append([vs.name, len(indices)])
        return groups(self, vs, indices, *args, **kwargs)

    def spy_generate(self, input_ids, *args, **kwargs):
        gen = generate(self, input_ids, *args, **kwargs)
        seen["new_tokens"].append(int(gen.shape[1] - input_ids.shape[1]))
        return gen

    MonitorState.record, SAGOEvaluator._evaluate_groups, Extractor._generate = spy_record, spy_groups, spy_generate
    model, tok = load_tiny()
    cb = SAGOCallback(bundled_sets(), eval_steps=2, max_groups=5, layers=[1, 3], max_new_tokens=8, batch_size=4,
                      n_bootstrap=200, axes="activation,activation_rel,confidence,generation,mirroring")
    trainer = Trainer(model=model, args=training_args(out, max_steps=2, learning_rate=0.0),
                      train_dataset=text_dataset(tok), processing_class=tok, callbacks=[cb])
    cb.attach(trainer)
    trainer.train()
    means = {name: {axis: s.summaries[axis].mean for axis in s.summaries} for name, s in cb.last_result.sets.items()}
    return {**seen, "sharding": sharding(trainer.model), "means": means, "failures": cb.failures}


#: Groups that make the ranks' forwards differ (no BOS token): with 2 ranks, rank 0 gets the even groups, whose
#: variants share their first token (a prefix pass) and whose references are longer than one token (a
#: continuation pass); rank 1 gets the odd ones, with neither. One batch is one group.
UNEVEN = [{"id": f"u{i}", "variants": [f"The number {i} is", f"The count {i} is"], "reference": f" {i}{i}{i}"}
          if i % 2 == 0 else
          {"id": f"u{i}", "variants": [f"Say {i}:", f"Number {i}:"], "reference": f"{i}"} for i in range(5)]


def run_evaluator(out: Path) -> dict[str, Any]:
    """``SAGOEvaluator`` on a model that accelerate sharded (no Trainer), on :data:`UNEVEN`."""
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from benchmarks.bench_distributed import fsdp_units, measure, predicted
    from sago_train import SAGOEvaluator, VariantSet, tiny_model_path

    accelerator = Accelerator(cpu=on_cpu())
    model, _ = load_tiny()
    tok = AutoTokenizer.from_pretrained(tiny_model_path(), local_files_only=True, add_bos_token=False)
    if sharded_launch():  # FSDP2 through accelerate prepares the model with its optimizer
        model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0))
    ev = SAGOEvaluator(model, tok, axes="activation,activation_rel,confidence,generation", layers=[0, 3],
                       max_new_tokens=6, batch_size=2, n_bootstrap=100)
    results = []
    cost = measure(model, lambda: results.append(ev.evaluate(VariantSet.from_records(UNEVEN, name="uneven"))))
    # Every group has a reference: the prompt pass has one batch per generate call.
    cost["predicted"] = predicted(forwards=cost["forwards"], decode_forwards=cost["decode_forwards"],
                                  generate_calls=cost["generate_calls"], batches=cost["generate_calls"], sets=1,
                                  units=fsdp_units(model), passes=3)  # confidence: the lead-in's pass too
    records = [{"id": g.id, "axes": g.axes, "outputs": g.outputs} for g in results[0].sets["uneven"].groups]
    return {"records": records, "cost": cost, "sharding": sharding(model)}


def groups_dataset() -> list[dict]:
    from tests._helpers.tiny import tiny_groups

    return tiny_groups(STEPS * GLOBAL_GROUPS)


def run_stability(out: Path, *, lora: bool = False, sft: bool = False, fp32: bool = False) -> dict[str, Any]:
    from transformers import TrainerCallback

    from sago_train import StabilityConfig
    from sago_train.training import trainer as trainers

    class Recorder(TrainerCallback):
        logs: list[dict] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.logs.append({k: float(v) for k, v in logs.items() if isinstance(v, (int, float))})

    model, tok = load_tiny()
    model.train()
    if lora:
        import peft

        torch.manual_seed(0)  # the adapter's initial weights: the same on every rank and in the reference
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                           lora_dropout=0.0))
    config = StabilityConfig(act_weight=1.0, conf_weight=1.0, mode="centroid", layers=[1, 3])
    recorder = Recorder()
    kwargs: dict[str, Any] = dict(model=model, train_dataset=groups_dataset(), processing_class=tok,
                                  stability_config=config, callbacks=[recorder])
    if sft:
        from trl import SFTConfig

        # SFTConfig trains in bf16 by default; transformers refuses bf16 on a CPU it is not told to use
        # (use_cpu=False, as DeepSpeed on CPU needs), hence the float32 scenario.
        args = training_args(out, cls=SFTConfig, bf16=not fp32)
        trainer = trainers.StabilitySFTTrainer(args=args, **kwargs)
    else:
        trainer = trainers.StabilityTrainer(args=training_args(out, remove_unused_columns=False), **kwargs)
    batches: list[list[int]] = []  # per micro-batch: rows and a checksum of the token ids (which groups)
    compute_loss = trainer.compute_loss

    def spy(model, inputs, *args, **kw):
        batches.append([int(inputs["input_ids"].shape[0]), int(inputs["input_ids"].sum())])
        return compute_loss(model, inputs, *args, **kw)

    trainer.compute_loss = spy
    trainer.train()
    return {"logs": recorder.logs, "batches": batches, "sharding": sharding(trainer.model)}


def main() -> None:
    out, scenarios = Path(sys.argv[1]), sys.argv[2:]
    torch.set_num_threads(1)
    allow_fsdp_on_cpu()
    rank, size = world()
    runs = {"callback": run_callback, "evaluator": run_evaluator, "stability": run_stability,
            "lora": lambda o: run_stability(o, lora=True), "sft": lambda o: run_stability(o, sft=True),
            "sft-fp32": lambda o: run_stability(o, sft=True, fp32=True)}
    for name in scenarios:
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        result = runs[name](folder / "run")
        (folder / f"rank{rank}.json").write_text(json.dumps({"world_size": size, **result}))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # every rank has written its results; no collective is left
        # gloo's shutdown can hang or abort one rank now and then on a loaded machine (see
        # tests/ddp_callback_worker.py); the work is on disk, so leave without the teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
