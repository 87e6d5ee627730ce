"""FSDP2 through accelerate (``recipes/accelerate/fsdp.yaml``, 2 CPU processes over gloo) gives what one
process gives: the SAGO callback's evaluations (history and group records, within 1e-4 on every axis), the
evaluator on a set that makes the ranks' forwards differ, and the stability loss's logged terms (plain, LoRA,
TRL's SFT trainer in bf16); only the main process writes; nothing hangs when a rank has fewer groups; an
evaluation's collectives are what docs/distributed.md's cost model says.

One ``accelerate launch`` runs every scenario of :mod:`tests.distributed.fsdp_worker`, beside the same worker
in one process (the reference) and a DDP launch of ``recipes/accelerate/ddp.yaml``; the tests read what they
wrote.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import ROOT, assert_same, finish_launch, jsonl, ranks, start_launch

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("distributed")]

CONFIG = ROOT / "recipes" / "accelerate" / "fsdp.yaml"
DDP_CONFIG = ROOT / "recipes" / "accelerate" / "ddp.yaml"
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


@pytest.fixture(scope="module")
def launches(tmp_path_factory, reference) -> dict[str, Path]:
    """The FSDP launch and a DDP one (``recipes/accelerate/ddp.yaml``), run beside each other and the one-process
    reference."""
    started = {"fsdp": start_launch(CONFIG, tmp_path_factory.mktemp("fsdp"), SCENARIOS),
               "ddp": start_launch(DDP_CONFIG, tmp_path_factory.mktemp("ddp"), ["stability"])}
    try:
        return {name: finish_launch(s) for name, s in started.items()}
    finally:
        for s in started.values():
            s.kill()


@pytest.fixture(scope="module")
def runs(launches) -> Path:
    return launches["fsdp"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_rank_holds_a_sharded_model(runs, reference, scenario):
    for r in ranks(runs, scenario):
        assert r["world_size"] == 2
        # accelerate's FSDP2: fully_shard on every decoder block and the root, parameters as DTensor shards.
        assert r["sharding"]["fsdp2_modules"] >= 5 and r["sharding"]["dtensor_params"] > 0, r["sharding"]
    assert reference.result(scenario)["sharding"]["dtensor_params"] == 0


def test_callback_history_and_records_equal_one_process(runs, reference):
    one, two = reference.wait() / "callback" / "run" / "sago", runs / "callback" / "run" / "sago"
    history = jsonl(two / "history.jsonl")
    assert [h["step"] for h in history] == [0, 2]
    assert_same(jsonl(one / "history.jsonl"), history)
    records = sorted(p.relative_to(one) for p in one.rglob("step-*/*.jsonl"))
    assert len(records) == 6 and records == sorted(p.relative_to(two) for p in two.rglob("step-*/*.jsonl"))
    for rel in records:
        # Every axis of every group, its per-variant values, split halves and outputs.
        assert_same(jsonl(one / rel), jsonl(two / rel), str(rel))
    for axes in reference.result("callback")["means"].values():
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


def test_evaluator_where_the_ranks_need_different_forwards(runs, reference):
    """No BOS token: rank 0's batches have a shared prefix and multi-token references (a prefix pass and a
    continuation pass), rank 1's neither. Before the ranks agreed on both per batch, this evaluation hung."""
    first, second = ranks(runs, "evaluator")
    assert first["cost"]["forwards"] == second["cost"]["forwards"]
    assert_same(reference.result("evaluator")["records"], first["records"])
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
def test_stability_terms_equal_one_process(runs, reference, scenario):
    one = reference.result(scenario)
    first, second = ranks(runs, scenario)
    # The same groups per optimizer step: one process's batch of 4 groups = rank 0's 2 + rank 1's 2.
    assert [[a[0] + b[0], a[1] + b[1]] for a, b in zip(first["batches"], second["batches"])] == one["batches"]
    assert len(first["logs"]) == len(one["logs"]) == 3
    for mine, ref in zip(first["logs"], one["logs"]):
        for term in TERMS:
            assert mine[term] == pytest.approx(ref[term], rel=FP32_REL), (term, mine, ref)


def test_sft_trainer_in_bf16(runs, reference):
    one = reference.result("sft")
    first, _ = ranks(runs, "sft")
    assert len(first["logs"]) == len(one["logs"]) == 3
    for step, (mine, ref) in enumerate(zip(first["logs"], one["logs"])):
        for term in TERMS:
            assert mine[term] == pytest.approx(ref[term], rel=BF16_REL[min(step, 1)]), (term, mine, ref)


def test_ddp_config_trains_like_one_process(launches, reference):
    """``recipes/accelerate/ddp.yaml``: accelerate's DDP on 2 CPU processes, whole copies of the model."""
    one = reference.result("stability")
    first, second = ranks(launches["ddp"], "stability")
    assert first["world_size"] == 2 and sum(first["sharding"].values()) == 0
    assert [[a[0] + b[0], a[1] + b[1]] for a, b in zip(first["batches"], second["batches"])] == one["batches"]
    for mine, ref in zip(first["logs"], one["logs"]):
        for term in TERMS:
            assert mine[term] == pytest.approx(ref[term], rel=FP32_REL), (term, mine, ref)
