"""The practitioner's run (issue #33): a TRL ``SFTTrainer`` + LoRA fine-tune of SmolLM2-135M-Instruct on 24
made-up capitals taught in one phrasing, monitored by ``SAGOCallback`` at the manual's recommended cadence
(``generation_every=1, overhead_budget=0.2``) with one early stopper over confidence and accuracy, W&B offline and
TensorBoard.

    WANDB_MODE=offline .venv/bin/python benchmarks/practitioner_run.py runs/practitioner

Prints the row TRL trains on next to the prompt SAGO evaluates, the stopper's start-up lines (in the log), the wall
time of the SAGO evaluations against training, and each evaluation's confidence and accuracy.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

from sago_train import SAGOCallback, SAGOEarlyStoppingCallback
from sago_train.cli.recipe import ASSETS
from sago_train.model.loading import load_model_and_tokenizer
from sago_train.model.tokenize import encode_variant


def main(out: Path) -> None:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    model, tok = load_model_and_tokenizer("sago://smollm2-135m-instruct")
    rows = [json.loads(line) for line in (ASSETS / "demo-real" / "train.jsonl").read_text().splitlines()]
    data = Dataset.from_list([{"messages": [r["variants"][0][0], {
        "role": "assistant", "content": r["target"].replace("<|im_end|>", "")}]} for r in rows])
    sets = {n: str(ASSETS / "demo-real" / f"{n}.jsonl") for n in ("paraphrase", "typo")}
    sago = SAGOCallback(sets, generation_every=1, overhead_budget=0.2, max_new_tokens=12)
    stop = SAGOEarlyStoppingCallback(["sago/paraphrase/confidence", "sago/paraphrase/accuracy"], patience=2)
    args = SFTConfig(str(out), max_steps=40, per_device_train_batch_size=4, learning_rate=3e-3,
                     lr_scheduler_type="constant", logging_steps=10, save_strategy="no",
                     report_to=["tensorboard", "wandb"], bf16=False, use_cpu=True, seed=0, disable_tqdm=True)
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok, callbacks=[sago, stop],
                         peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"))
    sago.attach(trainer)
    print("trained row:     ", repr(tok.decode(trainer.get_train_dataloader().dataset[0]["input_ids"])))
    print("evaluated prompt:", repr(tok.decode(encode_variant(rows[0]["variants"][0][0]["content"], tok, chat=True))))
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    history = [json.loads(line) for line in (out / "sago" / "history.jsonl").read_text().splitlines()]
    monitoring = sum(h.get("runtime_s", 0) for h in history)
    after = sum(h.get("runtime_s", 0) for h in history if h["step"] > 0)
    print(f"train() {total:.0f} s: SAGO evaluations {monitoring:.0f} s at steps {[h['step'] for h in history]}; "
          f"after the baseline {after:.0f} s = {after / (total - monitoring):.0%} of training ({total - monitoring:.0f} s)")
    for h in history:
        print(f"step {h['step']}:", {s: (round(h["sets"][s]["confidence"]["mean"], 3), h["correctness"][s].get("accuracy"))
                                     for s in h["sets"]})
    print("early stopping:", f"stopped at step {stop.stopped_step}" if stop.stopped_step else "did not stop")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/practitioner"))
