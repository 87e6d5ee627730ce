"""scripts/experiment_shards.py: which runs each shard takes (balanced, every pending run once), the merge of the
shards' records, and a restart after an interruption."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import experiment_shards  # noqa: E402


def _loads(costs, assign, shards, preload):
    load = [preload[i] if i < len(preload) else 0 for i in range(shards)]
    for c, i in zip(costs, assign):
        load[i] += c
    return load


def test_balance_is_near_the_best_split_and_takes_every_job_once():
    """Against brute force over every assignment: the greedy longest-first split's largest load is within the
    largest job of the best one (the bound of the greedy rule), every job goes to one shard, and the result depends
    only on the inputs (each shard computes it alone)."""
    cases = [([6, 2, 2, 2, 2], 2, [6]), ([6, 6, 2, 2, 2, 2, 2, 2], 2, [0]), ([1] * 7, 3, []), ([5, 4, 3, 3, 3], 2, [])]
    for costs, shards, preload in cases:
        got = experiment_shards.balance(list(range(len(costs))), costs, shards, preload)
        assert sorted(set(got)) <= list(range(shards)) and len(got) == len(costs)
        best = min(max(_loads(costs, a, shards, preload))
                   for a in itertools.product(range(shards), repeat=len(costs)))
        assert max(_loads(costs, got, shards, preload)) <= best + max(costs), (costs, got, best)
        assert got == experiment_shards.balance(list(range(len(costs))), costs, shards, preload)
    # The validity runs' remaining work after an interruption: a rotation-free run (every rotation's sets) and
    # four one-rotation runs, with the untrained model's evaluation on shard 0: the heavy run goes to shard 1.
    assert experiment_shards.balance(list("cabde"), [19, 7, 7, 7, 7], 2, preload=[6]) == [1, 0, 0, 1, 0]
    with pytest.raises(ValueError, match="a cost per job"):
        experiment_shards.balance(["a"], [1, 2], 2)
    import doctest

    result = doctest.DocTestRunner().run(doctest.DocTestFinder().find(experiment_shards.balance)[0])
    assert result.failed == 0 and result.attempted == 1


def test_merging_shards_keeps_each_run_once(tmp_path):
    def write(path, runs):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"arm": a, "seed": s, "run": r, "v": v}) + "\n" for a, s, r, v in runs))

    write(tmp_path / "records.jsonl", [("augment-fresh", 0, "typo", "parent")])
    # Overlapping shards (e.g. SHARDS changed after an interrupted merge): one copy of each run, the first seen.
    write(tmp_path / "shard-0" / "records.jsonl", [("augment-fresh", 0, "typo", "s0"), ("canonical", 0, "all", "s0")])
    write(tmp_path / "shard-1" / "records.jsonl", [("canonical", 0, "all", "s1"), ("canonical", 1, "all", "s1")])
    experiment_shards.merge_shards(tmp_path, 2)
    rows = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert [(r["arm"], r["seed"], r["v"]) for r in rows] == [("augment-fresh", 0, "parent"), ("canonical", 0, "s0"),
                                                              ("canonical", 1, "s1")]
    assert not list(tmp_path.glob("shard-*/records.jsonl"))
    experiment_shards.merge_shards(tmp_path, 2)  # nothing new: unchanged
    assert [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()] == rows


def test_a_restart_merges_what_an_interrupted_start_left_before_the_shards_start(tmp_path, monkeypatch):
    """An interrupted start leaves runs in the shards' files (and a shard folder beyond the new count): the next
    start merges them into the experiment's records first, so every shard's --also-done sees them."""
    def write(path, runs):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"arm": a, "seed": s, "run": r}) + "\n" for a, s, r in runs))

    write(tmp_path / "shard-0" / "records.jsonl", [("canonical", 0, "all")])
    write(tmp_path / "shard-2" / "records.jsonl", [("augment-fresh", 1, "typo")])  # an earlier --shards 3
    seen = []

    class Proc:
        pid = 0

        def __init__(self, cmd, **kw):
            seen.append([json.loads(x)["arm"] for x in (tmp_path / "records.jsonl").read_text().splitlines()])

        def wait(self):
            return 0

    monkeypatch.setattr(experiment_shards.subprocess, "Popen", Proc)
    args = type("A", (), {"shards": 2})()
    assert experiment_shards.run_shards(args, tmp_path, script="x.py", common=[]) == 0
    assert seen == [["canonical", "augment-fresh"]] * 2
    assert not list(tmp_path.glob("shard-*/records.jsonl"))
