"""The one-process reference of the sharded-training tests: :mod:`tests.distributed.fsdp_worker` in one process
(no launcher), every scenario, started once per session in the background so that it runs beside the first
launch that needs it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from .._helpers.proc import Started

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ["callback", "evaluator", "stability", "lora", "sft", "sft-fp32"]
TIMEOUT_S = 600


def worker_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}


def launch_line(config: Path, out: Path, scenarios: list[str], python: str = sys.executable) -> list[str]:
    """``accelerate launch --config_file CONFIG --num_processes 2 -m tests.distributed.fsdp_worker OUT ...``
    (as docs/distributed.md shows it), on a free port."""
    return [python, "-m", "accelerate.commands.launch", "--config_file", str(config), "--num_processes", "2",
            "--main_process_port", "0", "-m", "tests.distributed.fsdp_worker", str(out), *scenarios]


class Reference:
    """The background reference run; :meth:`result` waits for it (once) and reads a scenario's result."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.started = Started([sys.executable, "-m", "tests.distributed.fsdp_worker", str(out), *SCENARIOS],
                               env=worker_env(), cwd=ROOT)
        self.done = False

    def wait(self) -> Path:
        if not self.done:
            proc = self.started.finish(TIMEOUT_S)
            assert proc.returncode == 0, proc.stderr[-4000:]
            self.done = True
        return self.out

    def result(self, scenario: str) -> dict[str, Any]:
        return json.loads((self.wait() / scenario / "rank0.json").read_text())


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    ref = Reference(tmp_path_factory.mktemp("one-process"))
    yield ref
    ref.started.kill()


def start_launch(config: Path, out: Path, scenarios: list[str], python: str = sys.executable) -> Started:
    """Start :func:`launch_line` in the background."""
    return Started(launch_line(config, out, scenarios, python), env=worker_env(), cwd=ROOT)


def finish_launch(started: Started) -> Path:
    """Wait for a :func:`start_launch` and return its output folder."""
    proc = started.finish(TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return Path(started.cmd[started.cmd.index("tests.distributed.fsdp_worker") + 1])


def launch(config: Path, out: Path, scenarios: list[str], python: str = sys.executable) -> Path:
    """Run :func:`launch_line` and return ``out``."""
    return finish_launch(start_launch(config, out, scenarios, python))


def ranks(out: Path, scenario: str) -> list[dict[str, Any]]:
    return [json.loads((out / scenario / f"rank{r}.json").read_text()) for r in range(2)]


def assert_same(a: Any, b: Any, path: str = "", tol: float = 1e-4) -> None:
    """Equal JSON values, numbers within ``tol`` (NaN equals NaN); a run's duration is not compared."""
    if isinstance(a, dict):
        assert set(a) == set(b), (path, set(a) ^ set(b))
        for key in a:
            if key != "runtime_s":
                assert_same(a[key], b[key], f"{path}/{key}", tol)
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]", tol)
    elif isinstance(a, float) or isinstance(b, float):
        assert b == pytest.approx(a, abs=tol, nan_ok=True), path
    else:
        assert a == b, path


def jsonl(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines()]
