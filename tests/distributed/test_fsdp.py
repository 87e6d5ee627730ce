"""FSDP2 through accelerate (``recipes/accelerate/fsdp.yaml``, 2 CPU processes over gloo) gives what one
process gives: the SAGO callback's evaluations (history and group records, within 1e-4 on every axis), the
evaluator on a set that makes the ranks' forwards differ, and the stability loss's logged terms (plain, LoRA,
TRL's SFT trainer in bf16); only the main process writes; nothing hangs when a rank has fewer groups; an
evaluation's collectives are what docs/distributed.md's cost model says.

One ``accelerate launch`` runs every scenario of :mod:`tests.distributed.fsdp_worker`, beside the same worker
in one process (the reference); the tests read what both wrote.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from .._helpers.proc import run_together

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fsdp")]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "recipes" / "accelerate" / "fsdp.yaml"
SCENARIOS = ["callback", "evaluator", "stability", "lora", "sft"]
TERMS = ("loss", "sago_task_loss", "sago_act_loss", "sago_conf_loss")
#: fp32: the sharded step sums the two ranks' gradients in another order than one process does (its
#: reduce-scatter), and Adam carries that over 3 steps; measured differences are ~1e-6 relative.
FP32_REL = 1e-5
#: bf16 (SFTConfig's default): FSDP's mixed-precision policy casts the parameters to bf16, one process autocasts
#: the matmuls, so the roundings differ (bf16 keeps 8 significant bits); at the first step (the same weights) the
#: measured differences are <= 2.4e-3 relative. Each bf16 update then moves the two runs' weights apart a little:
#: by the third step the confidence term (a small divergence, the most sensitive) differed by 2.5e-2.
BF16_REL = (1e-2, 5e-2)  # first step, later steps


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}


def launch_line(config: Path, out: Path, scenarios: list[str]) -> list[str]:
    """``accelerate launch --config_file CONFIG --num_processes 2 -m tests.distributed.fsdp_worker OUT ...``
    (docs/distributed.md shows it), on a free port."""
    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    return [accelerate, "launch", "--config_file", str(config), "--num_processes", "2", "--main_process_port", "0",
            "-m", "tests.distributed.fsdp_worker", str(out), *scenarios]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    sharded, single = run_together([launch_line(CONFIG, out / "fsdp", SCENARIOS),
                                    [sys.executable, "-m", "tests.distributed.fsdp_worker", str(out / "single"),
                                     *SCENARIOS]], timeout=600, env=env(), cwd=ROOT)
    assert sharded.returncode == 0, sharded.stdout[-2000:] + sharded.stderr[-4000:]
    assert single.returncode == 0, single.stderr[-4000:]
    return out


def ranks(runs: Path, scenario: str) -> list[dict[str, Any]]:
    return [json.loads((runs / "fsdp" / scenario / f"rank{r}.json").read_text()) for r in range(2)]


def reference(runs: Path, scenario: str) -> dict[str, Any]:
    return json.loads((runs / "single" / scenario / "rank0.json").read_text())


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


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_rank_holds_a_sharded_model(runs, scenario):
    for r in ranks(runs, scenario):
        assert r["world_size"] == 2
        # accelerate's FSDP2: fully_shard on every decoder block and the root, parameters as DTensor shards.
        assert r["sharding"]["fsdp2_modules"] >= 5 and r["sharding"]["dtensor_params"] > 0, r["sharding"]
    assert reference(runs, scenario)["sharding"]["dtensor_params"] == 0


def test_callback_history_and_records_equal_one_process(runs):
    one, two = runs / "single" / "callback" / "run" / "sago", runs / "fsdp" / "callback" / "run" / "sago"
    history = jsonl(two / "history.jsonl")
    assert [h["step"] for h in history] == [0, 2]
    assert_same(jsonl(one / "history.jsonl"), history)
    records = sorted(p.relative_to(one) for p in one.rglob("step-*/*.jsonl"))
    assert len(records) == 6 and records == sorted(p.relative_to(two) for p in two.rglob("step-*/*.jsonl"))
    for rel in records:
        # Every axis of every group, its per-variant values, split halves and outputs.
        assert_same(jsonl(one / rel), jsonl(two / rel), str(rel))
    for axes in reference(runs, "callback")["means"].values():
        assert {"activation", "confidence", "generation"} <= set(axes), axes  # at blocks 1 and 3, with outputs


def test_callback_odd_groups_and_decoding_that_ends_at_different_steps(runs):
    first, second = ranks(runs, "callback")
    # 5 groups per set: rank 0 evaluated 3 of each, rank 1 two, at both evaluations, and nothing failed.
    assert [n for _, n in first["groups"]] == [3] * 6 and [n for _, n in second["groups"]] == [2] * 6
    assert first["failures"] == second["failures"] == []
    # Some batch's answers ended (EOS) after a different number of new tokens on each rank: without decoding
    # in step, the ranks' forwards, hence their all-gathers, would not pair up.
    assert len(first["new_tokens"]) == len(second["new_tokens"])
    assert any(a != b for a, b in zip(first["new_tokens"], second["new_tokens"]))


def test_only_the_main_process_writes(runs):
    first, second = ranks(runs, "callback")
    assert first["writes"] == [0, 2] and second["writes"] == []


def test_evaluator_where_the_ranks_need_different_forwards(runs):
    """No BOS token: rank 0's batches have a shared prefix and multi-token references (a prefix pass and a
    continuation pass), rank 1's neither. Before the ranks agreed on both per batch, this evaluation hung."""
    first, second = ranks(runs, "evaluator")
    assert first["cost"]["forwards"] == second["cost"]["forwards"]
    assert_same(reference(runs, "evaluator")["records"], first["records"])
    assert first["records"] == second["records"]


def test_collectives_follow_the_cost_model(runs):
    for r in ranks(runs, "evaluator"):
        cost, model = r["cost"], r["cost"]["predicted"]
        for name in ("all_gather_single", "all_reduce", "all_gather_object"):
            low, high = model[name]
            assert low <= cost["calls"].get(name, 0) <= high, (name, cost["calls"], model)
        low, high = model["all_gather_bytes"]
        assert low <= cost["bytes"]["all_gather_single"] <= high
        # 5 one-group batches, each: the prompt pass, a prefix pass, a continuation pass, then decoding.
        assert cost["generate_calls"] == 3 and cost["forwards"] == 3 * 3 + cost["decode_forwards"]
        assert cost["decode_forwards"] <= 3 * 6  # max_new_tokens=6


@pytest.mark.parametrize("scenario", ["stability", "lora"])
def test_stability_terms_equal_one_process(runs, scenario):
    one = reference(runs, scenario)
    first, second = ranks(runs, scenario)
    # The same groups per optimizer step: one process's batch of 4 groups = rank 0's 2 + rank 1's 2.
    assert [[a[0] + b[0], a[1] + b[1]] for a, b in zip(first["batches"], second["batches"])] == one["batches"]
    assert len(first["logs"]) == len(one["logs"]) == 3
    for mine, ref in zip(first["logs"], one["logs"]):
        for term in TERMS:
            assert mine[term] == pytest.approx(ref[term], rel=FP32_REL), (term, mine, ref)


def test_sft_trainer_in_bf16(runs):
    one = reference(runs, "sft")
    first, _ = ranks(runs, "sft")
    assert len(first["logs"]) == len(one["logs"]) == 3
    for step, (mine, ref) in enumerate(zip(first["logs"], one["logs"])):
        for term in TERMS:
            assert mine[term] == pytest.approx(ref[term], rel=BF16_REL[min(step, 1)]), (term, mine, ref)
