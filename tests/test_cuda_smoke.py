"""The prepared GPU check (benchmarks/cuda_smoke.py) runs its CPU path end to end in a tiny configuration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_cuda_smoke_cpu_path_runs_every_benchmark_and_the_training_smoke():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cuda_smoke.py"), "--device", "cpu", "--tiny"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    # Each benchmark printed its ratios (measured, so only their presence and finiteness are checked here).
    for figure in ("engine / today's floor:", "engine / work lower bound:", "time   sago/task =",
                   "time inside SAGOCallback / the rest of the same run:"):
        line = next((ln for ln in out.splitlines() if figure in ln), None)
        assert line is not None, f"missing {figure!r} in:\n{out[-3000:]}"
        assert "nan" not in line.lower() and "inf" not in line.split(figure)[1].lower()
    for gc_on, lora in ((False, False), (True, False), (True, True)):
        assert f"bf16 StabilityTrainer (gradient_checkpointing={gc_on}, lora={lora}): 2 steps" in out
    # Sharded training through accelerate in one process: FSDP2 runs on the CPU; FSDP1 needs an accelerator.
    assert "FSDP2: evaluator, stability: sharded" in out
    assert "FSDP1: skipped: FSDP1 needs an accelerator" in out
    assert "cuda_smoke: all checks passed" in out
