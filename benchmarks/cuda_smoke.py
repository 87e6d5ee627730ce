"""CUDA check of the stability loss: the cost benchmark on the GPU (fp32 and bf16 autocast) and a bf16
StabilityTrainer smoke test (a few steps, finite losses, separate terms logged, also with gradient
checkpointing and LoRA).

Exits 0 with a message when CUDA is not available, 1 when a check fails.

Usage:
    python benchmarks/cuda_smoke.py [--hidden 128 --layers 4]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

TERMS = ("sago_task_loss", "sago_act_loss", "sago_conf_loss")


def checkpointing_arg() -> str:
    from transformers import TrainingArguments

    fields = TrainingArguments.__dataclass_fields__
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


def train_smoke(*, gradient_checkpointing: bool, lora: bool, steps: int = 4) -> list[dict]:
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

    model = make_tiny_model("llama", layers=4, hidden=64, ids=SPECIALS_FIRST, eval_mode=False)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    recorder = Recorder()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=2, max_steps=steps, logging_steps=1, learning_rate=1e-3,
            bf16=True, report_to=[], save_strategy="no", disable_tqdm=True, seed=0,
            # transformers 5 renamed gradient_checkpointing to activation_checkpointing.
            **{checkpointing_arg(): gradient_checkpointing},
        )
        trainer = StabilityTrainer(
            model=model, args=args, train_dataset=tiny_groups(8), processing_class=make_byte_tokenizer(TAGGED_TEMPLATE, SPECIALS_FIRST),
            stability_config=StabilityConfig(act_weight=0.5, conf_weight=0.5), callbacks=[recorder],
        )
        trainer.train()
    return [log for log in recorder.logs if "loss" in log]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("cuda_smoke: CUDA is not available on this machine; nothing to check (exit 0).")
        return 0
    from bench_loss import report, run_benchmark

    print(f"device: {torch.cuda.get_device_name(0)}")
    failures: list[str] = []
    for bf16 in (False, True):
        print(f"\n== benchmark, {'bf16 autocast' if bf16 else 'fp32'} ==")
        result = run_benchmark(hidden=args.hidden, layers=args.layers, device="cuda", bf16=bf16, reps=args.reps)
        report(result)
    for gc_on, lora in ((False, False), (True, False), (True, True)):
        name = f"bf16 StabilityTrainer (gradient_checkpointing={gc_on}, lora={lora})"
        try:
            logs = train_smoke(gradient_checkpointing=gc_on, lora=lora)
        except Exception as err:  # report every failing configuration, then fail
            failures.append(f"{name}: {type(err).__name__}: {err}")
            continue
        bad = [log for log in logs if not all(k in log and math.isfinite(log[k]) for k in ("loss", *TERMS))]
        if not logs or bad:
            failures.append(f"{name}: missing or non-finite losses in {bad or logs}")
        else:
            last = logs[-1]
            print(f"{name}: {len(logs)} steps, last loss {last['loss']:.4f} (task {last['sago_task_loss']:.4f}, "
                  f"act {last['sago_act_loss']:.4f}, conf {last['sago_conf_loss']:.5f})")
    if failures:
        print("\nFAILED:\n" + "\n".join(failures))
        return 1
    print("\ncuda_smoke: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
