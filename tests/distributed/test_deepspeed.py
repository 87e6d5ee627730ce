"""DeepSpeed ZeRO-2 and ZeRO-3 through accelerate (``recipes/accelerate/deepspeed-zero{2,3}.yaml``, 2 CPU
processes, DeepSpeed's CPU accelerator over gloo) give what one process gives: the SAGO callback's evaluations,
the evaluator where the ranks need different forwards, the stability loss's terms (plain, LoRA, TRL's SFT
trainer in float32); only the main process writes.

Opt-in (``make test-deepspeed``, which sets ``SAGO_TEST_DEEPSPEED=1``): DeepSpeed is not installed with the
package, because once installed every ``Trainer`` imports it (accelerate's ``unwrap_model``), which costs each
process about a second and a warning line. ``make test-deepspeed`` installs it into ``.venv-ds``, a venv that
sees ``.venv``'s packages; ``SAGO_DEEPSPEED_PYTHON`` names another interpreter that has it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .conftest import ROOT, assert_same, jsonl, launch, ranks

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("distributed"),
              pytest.mark.skipif(os.environ.get("SAGO_TEST_DEEPSPEED") != "1",
                                 reason="opt-in: make test-deepspeed (SAGO_TEST_DEEPSPEED=1)")]

SCENARIOS = ["callback", "evaluator", "stability", "lora", "sft-fp32"]
TERMS = ("loss", "sago_task_loss", "sago_act_loss", "sago_conf_loss")
#: As for FSDP (tests/distributed/test_fsdp.py): the ranks' gradients are summed in another order than in one
#: process; measured differences are ~1e-6 relative.
FP32_REL = 1e-5


def deepspeed_python() -> str:
    python = os.environ.get("SAGO_DEEPSPEED_PYTHON") or str(ROOT / ".venv-ds" / "bin" / "python")
    found = subprocess.run([python, "-c", "import deepspeed"], capture_output=True).returncode == 0 \
        if Path(python).exists() else False
    if not found:
        pytest.fail(f"no DeepSpeed at {python}: run `make test-deepspeed` (or set SAGO_DEEPSPEED_PYTHON)")
    return python


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def runs(request, tmp_path_factory, reference) -> tuple[int, Path]:
    stage = request.param
    config = ROOT / "recipes" / "accelerate" / f"deepspeed-zero{stage}.yaml"
    return stage, launch(config, tmp_path_factory.mktemp(f"zero{stage}"), SCENARIOS, deepspeed_python())


def test_stage_three_partitions_every_parameter(runs):
    stage, out = runs
    for scenario in SCENARIOS:
        for r in ranks(out, scenario):
            assert r["world_size"] == 2
            params = r["sharding"]["zero3_params"]
            assert (params > 0) if stage == 3 else (params == 0), (scenario, r["sharding"])


def test_callback_equals_one_process_and_only_the_main_process_writes(runs, reference):
    _, out = runs
    one, two = reference.wait() / "callback" / "run" / "sago", out / "callback" / "run" / "sago"
    assert_same(jsonl(one / "history.jsonl"), jsonl(two / "history.jsonl"))
    records = sorted(p.relative_to(one) for p in one.rglob("step-*/*.jsonl"))
    assert len(records) == 6
    for rel in records:
        assert_same(jsonl(one / rel), jsonl(two / rel), str(rel))
    first, second = ranks(out, "callback")
    assert first["writes"] == [0, 2] and second["writes"] == []
    assert [n for _, n in first["groups"]] == [3] * 6 and [n for _, n in second["groups"]] == [2] * 6


def test_evaluator_where_the_ranks_need_different_forwards(runs, reference):
    _, out = runs
    first, second = ranks(out, "evaluator")
    assert_same(reference.result("evaluator")["records"], first["records"])
    assert first["records"] == second["records"]


@pytest.mark.parametrize("scenario", ["stability", "lora", "sft-fp32"])
def test_stability_terms_equal_one_process(runs, reference, scenario):
    _, out = runs
    one = reference.result(scenario)
    first, second = ranks(out, scenario)
    assert [[a[0] + b[0], a[1] + b[1]] for a, b in zip(first["batches"], second["batches"])] == one["batches"]
    assert len(first["logs"]) == len(one["logs"]) == 3
    for mine, ref in zip(first["logs"], one["logs"]):
        for term in TERMS:
            assert mine[term] == pytest.approx(ref[term], rel=FP32_REL), (term, mine, ref)
