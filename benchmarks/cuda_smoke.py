"""One prepared GPU check: the three benchmarks on the real model in bf16 on CUDA, then the bf16
StabilityTrainer smoke test (a few steps, finite losses, separate terms logged, also with gradient
checkpointing and LoRA), within a time budget (10 minutes by default).

- ``bench_eval.py``: engine / today's floor and engine / the work lower bound, 64 groups x 4 variants, chat
  rendering, 16 new tokens;
- ``bench_loss.py``: the stability loss's step time and peak memory vs the task loss and the naive
  implementation, LoRA r=8;
- ``bench_monitoring.py``: the callback's share of a LoRA fine-tune at its default cadence;
- sharded training through accelerate on one GPU (:func:`sharded_runs`): FSDP2, FSDP1, DeepSpeed ZeRO-2/3 (when
  installed), each running the tests' FSDP worker (the callback, the evaluator, the stability loss).

Exits 0 with a message when CUDA is not available (unless ``--device cpu``), 1 when a check fails.
``--device cpu --tiny`` runs the same script in a tiny configuration (the shipped model, a few groups and
steps); the test suite runs it that way.

Usage:
    python benchmarks/cuda_smoke.py                      # on a CUDA machine: real model, bf16, <= 10 min
    python benchmarks/cuda_smoke.py --device cpu --tiny  # the CPU path, in about a minute
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import subprocess
import sys
import tempfile
import time
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


def train_smoke(*, gradient_checkpointing: bool, lora: bool, steps: int = 4, device: str = "cuda") -> list[dict]:
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
            bf16=True, report_to=[], save_strategy="no", disable_tqdm=True, seed=0, use_cpu=device == "cpu",
            # transformers 5 renamed gradient_checkpointing to activation_checkpointing.
            **{checkpointing_arg(): gradient_checkpointing},
        )
        trainer = StabilityTrainer(
            model=model, args=args, train_dataset=tiny_groups(8), processing_class=make_byte_tokenizer(TAGGED_TEMPLATE, SPECIALS_FIRST),
            stability_config=StabilityConfig(act_weight=0.5, conf_weight=0.5), callbacks=[recorder],
        )
        trainer.train()
    return [log for log in recorder.logs if "loss" in log]


def benchmark_commands(device: str, tiny: bool, model: str) -> list[tuple[str, list[str], float]]:
    """(name, argv, share of the time budget) of each benchmark run."""
    bench = ROOT / "benchmarks"
    py = [sys.executable]
    if tiny:  # the shipped tiny model / a tiny random Llama, a few groups and steps
        return [
            ("eval", py + [str(bench / "bench_eval.py"), "--device", device, "--dtype", "bfloat16", "--groups", "4",
                           "--max-new-tokens", "4", "--repeats", "1", "--no-naive", "--threads", "1"], 0.3),
            ("loss", py + [str(bench / "bench_loss.py"), "--device", device, "--bf16", "--hidden", "32", "--layers",
                           "2", "--vocab", "256", "--groups", "2", "--reps", "1", "--warmup", "1", "--threads", "1"], 0.3),
            ("monitoring", py + [str(bench / "bench_monitoring.py"), "--device", device, "--bf16", "--steps", "4",
                                 "--repeats", "1", "--max-groups", "2", "--max-new-tokens", "2", "--threads", "1"], 0.3),
        ]
    return [
        ("eval", py + [str(bench / "bench_eval.py"), "--model", model, "--device", device, "--dtype", "bfloat16",
                       "--groups", "64", "--max-new-tokens", "16", "--repeats", "3", "--no-naive"], 0.3),
        ("loss", py + [str(bench / "bench_loss.py"), "--model", model, "--lora", "8", "--device", device, "--bf16",
                       "--groups", "4", "--target-len", "64", "--reps", "20"], 0.2),
        ("monitoring", py + [str(bench / "bench_monitoring.py"), "--model", model, "--device", device, "--bf16",
                             "--steps", "400", "--repeats", "1"], 0.35),
    ]


def run_benchmarks(device: str, tiny: bool, model: str, budget_s: float) -> list[str]:
    """Run each benchmark as its own process within its share of the budget; print its figures; return the
    failures."""
    failures = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    for name, argv, share in benchmark_commands(device, tiny, model):
        print(f"\n== {name}: {' '.join(Path(a).name if a.endswith('.py') else a for a in argv[1:])} ==", flush=True)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=share * budget_s, env=env, cwd=ROOT)
        except subprocess.TimeoutExpired:
            failures.append(f"{name}: over its {share * budget_s:.0f} s share of the budget")
            continue
        # The figures, without per-repeat progress lines or the Trainer's logged dicts.
        lines = [ln for ln in proc.stdout.splitlines()
                 if ln.strip() and not ln.lstrip().startswith(("repeat ", "{", "[INFO]"))]
        print("\n".join(lines[-14:]))
        print(f"({time.perf_counter() - t0:.0f} s)")
        if proc.returncode != 0:
            failures.append(f"{name}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:] or ''}")
    return failures


def sharded_runs(device: str, tiny: bool) -> list[tuple[str, list[str], str | None, str | None]]:
    """(name, accelerate launch arguments, why it is skipped or None, the worker's sharding count that must be
    positive) of each sharded-training check: the tests' FSDP worker (tests/distributed/fsdp_worker.py) in one
    process under FSDP2, FSDP1 and DeepSpeed ZeRO-2/3 (a one-GPU wrap is still a real wrap: sharded parameters,
    forwards that gather them). ZeRO-2 shards gradients and optimizer state only: no parameter to count."""
    configs = ROOT / "recipes" / "accelerate"
    scenarios = ["evaluator", "stability"] if tiny else ["callback", "evaluator", "stability", "lora", "sft"]
    no_deepspeed = None if importlib.util.find_spec("deepspeed") else \
        "DeepSpeed is not installed here (make test-deepspeed installs it into .venv-ds)"
    runs = [("FSDP2", ["--config_file", str(configs / "fsdp.yaml")], None, "fsdp2_modules"),
            ("FSDP1", ["--config_file", str(configs / "fsdp.yaml"), "--fsdp_version", "1"],
             None if device == "cuda" else "FSDP1 needs an accelerator: accelerate's plugin syncs module states on "
             "one and torch's FullyShardedDataParallel computes on one (docs/distributed.md)", "fsdp1_modules"),
            ("DeepSpeed ZeRO-2", ["--config_file", str(configs / "deepspeed-zero2.yaml")], no_deepspeed, None),
            ("DeepSpeed ZeRO-3", ["--config_file", str(configs / "deepspeed-zero3.yaml")], no_deepspeed,
             "zero3_params")]
    tail = ["--num_processes", "1", "--main_process_port", "0", "-m", "tests.distributed.fsdp_worker", "{out}",
            *scenarios]
    return [(name, [*args, *tail], why, expect) for name, args, why, expect in runs]


def sharded_smoke(device: str, tiny: bool, budget_s: float) -> list[str]:
    """Run each :func:`sharded_runs` check: it must exit 0, with a sharded model and finite logged losses."""
    import json

    failures = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    for name, argv, why, expect in sharded_runs(device, tiny):
        if why is not None:
            print(f"{name}: skipped: {why}")
            continue
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "accelerate.commands.launch", *[a.replace("{out}", out) for a in argv]]
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget_s, env=env, cwd=ROOT)
            except subprocess.TimeoutExpired:
                failures.append(f"{name}: over {budget_s:.0f} s")
                continue
            if proc.returncode != 0:
                failures.append(f"{name}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            results = {p.parent.name: json.loads(p.read_text()) for p in Path(out).glob("*/rank0.json")}
        sharded = expect is None or all(r["sharding"][expect] > 0 for r in results.values())
        losses = [log[k] for r in results.values() for log in r.get("logs", []) for k in ("loss", *TERMS)]
        if not results or not sharded or not losses or not all(math.isfinite(x) for x in losses):
            failures.append(f"{name}: scenarios {sorted(results)}, sharded={sharded}, losses {losses}")
        else:
            print(f"{name}: {', '.join(sorted(results))}: sharded, {len(losses)} finite losses "
                  f"({time.perf_counter() - t0:.0f} s)")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny: the tested CPU path)")
    ap.add_argument("--tiny", action="store_true", help="the shipped tiny model and a few groups/steps")
    ap.add_argument("--model", default="sago://smollm2-135m-instruct")
    ap.add_argument("--budget-s", type=float, default=600.0, help="time budget for the benchmarks")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("cuda_smoke: CUDA is not available on this machine; nothing to check (exit 0).")
        return 0
    if args.device == "cuda":
        print(f"device: {torch.cuda.get_device_name(0)}")
    failures = run_benchmarks(args.device, args.tiny, args.model, args.budget_s)
    for gc_on, lora in ((False, False), (True, False), (True, True)):
        name = f"bf16 StabilityTrainer (gradient_checkpointing={gc_on}, lora={lora})"
        try:
            logs = train_smoke(gradient_checkpointing=gc_on, lora=lora, steps=2 if args.tiny else 4, device=args.device)
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
    failures += sharded_smoke(args.device, args.tiny, budget_s=args.budget_s / 4)
    if failures:
        print("\nFAILED:\n" + "\n".join(failures))
        return 1
    print("\ncuda_smoke: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
