"""`sago-train eval` under torchrun (2 CPU processes, gloo) gives the single-process results."""

from __future__ import annotations

import json
import os
import sys

import pytest

from ._helpers.proc import run as run_proc

pytestmark = pytest.mark.slow


def _run(cmd, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    return run_proc(cmd, timeout=300, env=env, **kw)


def test_torchrun_two_processes_equal_single(tmp_path, saved_tiny_model, sample_set_file):
    args = ["eval", "--model", str(saved_tiny_model), "--set", f"sample={sample_set_file}", "--max-new-tokens", "4",
            "--batch-size", "3", "--quiet", "--device", "cpu", "--axes",
            "activation,activation_rel,confidence,generation,mirroring,posix"]
    single = _run([sys.executable, "-m", "sago_train.cli.main", *args, "--out", str(tmp_path / "one")])
    assert single.returncode == 0, single.stderr
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    multi = _run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "sago_train.cli.main", *args,
                  "--out", str(tmp_path / "two")])
    assert multi.returncode == 0, multi.stderr[-3000:]
    # Only rank 0 prints the table.
    assert multi.stdout.count("SAGO evaluation") == 1
    one = [json.loads(line) for line in (tmp_path / "one" / "sample.jsonl").read_text().splitlines()]
    two = [json.loads(line) for line in (tmp_path / "two" / "sample.jsonl").read_text().splitlines()]
    assert [r["id"] for r in one] == [r["id"] for r in two]
    for a, b in zip(one, two):
        assert a["outputs"] == b["outputs"]
        for axis, v in a["axes"].items():
            assert b["axes"][axis] == pytest.approx(v, abs=1e-4), (a["id"], axis)
            # Split halves (findings) too, activation_rel's measured against the whole set's dispersion.
            assert b["halves"][axis] == pytest.approx(a["halves"][axis], abs=1e-4), (a["id"], axis)
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert "activation_rel" in s1["sets"]["sample"]["axes"]  # a set-level axis: groups sharded, sums gathered
    for axis, v in s1["sets"]["sample"]["axes"].items():
        for key in ("mean", "ci_low", "ci_high", "n"):
            assert s2["sets"]["sample"]["axes"][axis][key] == pytest.approx(v[key], abs=1e-4)
    b1 = s1["sets"]["sample"]["set_level"]["activation_rel"]["between_dispersion"]
    b2 = s2["sets"]["sample"]["set_level"]["activation_rel"]["between_dispersion"]
    assert b1["n_groups"] == b2["n_groups"] == 10 and b1["n_variants"] == b2["n_variants"] == 40
    assert b2["per_layer"] == pytest.approx(b1["per_layer"], abs=1e-6)
    for axis, rel in s1["sets"]["sample"]["reliability"].items():
        assert s2["sets"]["sample"]["reliability"][axis] == pytest.approx(rel, abs=1e-4, nan_ok=True), axis
