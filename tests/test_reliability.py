"""Reliability: fault injection during real Trainer runs, kill-and-resume, determinism.

Monitoring must never cost the training run, lose numbers already written, or duplicate an evaluation.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from sago_train import SAGOCallback, SAGOEvaluator
from sago_train.data import bundled_sets

from ._proc import run as run_proc
from ._trainer import make_trainer, variant_set

pytestmark = pytest.mark.slow
FAST = dict(max_new_tokens=3, n_bootstrap=200)
ROOT = Path(__file__).resolve().parents[1]


def _history(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "sago" / "history.jsonl").read_text().splitlines()]


def _all_jsonl_parse(out: Path) -> None:
    """No file under sago/ is half-written: every line of every JSONL parses."""
    for path in (out / "sago").rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            json.loads(line)


# ------------------------------------------------------------------ faults inside evaluations
def test_oom_retries_with_smaller_batch_then_succeeds(tmp_path, monkeypatch, caplog):
    from sago_train import extraction

    real = extraction.Extractor.score
    sizes = []

    def score(self, *a, **k):
        sizes.append(self.batch_size)
        if self.batch_size > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, *a, **k)

    monkeypatch.setattr(extraction.Extractor, "score", score)
    cb = SAGOCallback(variant_set(), eval_steps=2, batch_size=16, **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=2)
    tr.train()
    assert [h["step"] for h in _history(tmp_path)] == [0, 2]
    assert sizes[:3] == [16, 8, 4] and not cb.failures
    assert "out of memory at batch size 16" in caplog.text


def test_persistent_oom_skips_the_evaluation_with_a_reason(tmp_path, monkeypatch, caplog):
    from sago_train import extraction

    real = extraction.Extractor.score
    calls = {"n": 0}

    def score(self, *a, **k):
        calls["n"] += 1
        if calls["n"] > 1:  # the baseline succeeds, every later attempt runs out of memory
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real(self, *a, **k)

    monkeypatch.setattr(extraction.Extractor, "score", score)
    cb = SAGOCallback(variant_set(), eval_steps=2, batch_size=4, **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=4)
    tr.train()
    assert tr.state.global_step == 4
    assert [h["step"] for h in _history(tmp_path)] == [0]
    assert [f["step"] for f in cb.failures] == [2, 4]
    assert "OutOfMemoryError" in cb.failures[0]["error"]
    assert "evaluation at step 2 failed and was skipped" in caplog.text


def test_nan_hidden_states_are_skipped_and_counted(tmp_path):
    cb = SAGOCallback(variant_set(), eval_steps=2, axes="activation,confidence", **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=2)
    state = {"broken": False}

    def poison(module, inputs, output):
        if not state["broken"]:
            return None
        h = output[0] if isinstance(output, tuple) else output
        h = h.clone()
        h[:1] = float("nan")  # the first row of each batch goes bad
        return (h, *output[1:]) if isinstance(output, tuple) else h

    tr.model.model.layers[0].register_forward_hook(poison)
    # Training never sees the NaNs: the model is broken only during the second SAGO evaluation.
    real_eval = cb._run_evaluator
    calls = {"n": 0}

    def run_eval(*a, **k):
        calls["n"] += 1
        state["broken"] = calls["n"] == 2
        try:
            return real_eval(*a, **k)
        finally:
            state["broken"] = False

    cb._run_evaluator = run_eval
    tr.train()
    hist = _history(tmp_path)
    assert [h["step"] for h in hist] == [0, 2]
    assert hist[0]["sets"]["num"]["activation"]["n"] == 8
    assert 0 < hist[1]["sets"]["num"]["activation"]["n"] < 8
    last = cb.last_result.sets["num"]
    assert last.skipped.get("non-finite hidden states or log-probabilities", 0) == 8 - last.n_groups
    assert all(v is not None for v in hist[1]["sets"]["num"]["activation"].values())


def test_full_disk_keeps_what_was_written_and_training_goes_on(tmp_path, monkeypatch):
    import errno

    from sago_train import io as sio

    real = sio.atomic_write_text
    calls = {"n": 0}

    def write(path, text):
        calls["n"] += 1
        if "history" in str(path) and calls["n"] > 2 and calls["n"] <= 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, text)

    from sago_train import monitoring

    monkeypatch.setattr(sio, "atomic_write_text", write)
    monkeypatch.setattr(monitoring, "atomic_write_text", write)
    cb = SAGOCallback(variant_set(), eval_steps=2, **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=6)
    tr.train()
    assert tr.state.global_step == 6
    hist = _history(tmp_path)
    assert hist[0]["step"] == 0  # written before the disk filled up, never lost
    assert any("No space left" in f["error"] for f in cb.failures)
    _all_jsonl_parse(tmp_path)
    assert not list((tmp_path / "sago").glob(".*.tmp"))  # failed writes leave no temporary files


def test_wandb_init_failure_and_death_mid_run(tmp_path, monkeypatch, caplog):
    import wandb

    wandb.finish()  # another test in this process may have left a run open; the Trainer would reuse it
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")

    def refuse(*a, **k):
        raise wandb.errors.CommError("could not reach the W&B server")

    monkeypatch.setattr(wandb, "init", refuse)
    cb = SAGOCallback(variant_set(), eval_steps=2, **FAST)
    tr = make_trainer(tmp_path / "a", callbacks=[cb], max_steps=4, report_to=["wandb", "tensorboard"])
    tr.train()
    assert tr.state.global_step == 4 and [h["step"] for h in _history(tmp_path / "a")] == [0, 2, 4]
    assert "WandbCallback failed" in caplog.text
    monkeypatch.undo()

    # W&B dies mid-run: the run's log call starts raising after the baseline.
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cb = SAGOCallback(variant_set(), eval_steps=2, **FAST)
    tr = make_trainer(tmp_path / "b", callbacks=[cb], max_steps=4, report_to=["wandb"])
    real_log = wandb.log
    calls = {"n": 0}

    def dying_log(*a, **k):
        calls["n"] += 1
        if calls["n"] > 2:
            raise BrokenPipeError("wandb service died")
        return real_log(*a, **k)

    monkeypatch.setattr(wandb, "log", dying_log)
    tr.train()
    wandb.finish()
    assert tr.state.global_step == 4 and [h["step"] for h in _history(tmp_path / "b")] == [0, 2, 4]


# ------------------------------------------------------------------ kill and resume
def _worker(out: Path, *flags: str):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false"}
    return run_proc([sys.executable, "-m", "tests.reliability_worker", str(out), *flags], cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    proc = _worker(out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.parametrize("kill", ["step:5", "eval:4", "write:7"])
def test_sigkill_then_resume_has_every_evaluation_once(tmp_path, reference_run, kill):
    out = tmp_path / "run"
    killed = _worker(out, "--kill", kill)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    _all_jsonl_parse(out)  # nothing half-written, even when killed inside a write
    before = [h["step"] for h in _history(out)]
    assert before == sorted(set(before))
    resumed = _worker(out, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _all_jsonl_parse(out)
    hist, ref = _history(out), _history(reference_run)
    assert [h["step"] for h in hist] == [h["step"] for h in ref] == [0, 2, 4, 6, 8]
    for a, b in zip(ref, hist):
        for key in ("mean", "ci_low", "ci_high", "n"):
            assert b["sets"]["num"]["activation"][key] == pytest.approx(a["sets"]["num"]["activation"][key], abs=1e-5)
    # Early-stopping state after resume is what the checkpoint held.
    finished = json.loads((out / "finished.json").read_text())
    ckpt = Path(finished["resumed_from"])
    saved = json.loads((ckpt / "trainer_state.json").read_text())["stateful_callbacks"]["SAGOEarlyStoppingCallback"]
    at_begin = json.loads((out / "stopper_at_begin.json").read_text())
    assert at_begin["counter"] == saved["attributes"]["counter"]
    assert at_begin["decisions"] == saved["attributes"]["decisions"]
    assert at_begin["best_step"] == saved["attributes"]["best_step"] is not None


# ------------------------------------------------------------------ determinism
def test_same_seed_same_numbers_twice():
    from sago_train.tiny_model import load_tiny_model

    model, tok = load_tiny_model()
    sets = {k: v.subset(range(10)) for k, v in bundled_sets().items()}
    a = SAGOEvaluator(model, tok, seed=3).evaluate(sets).summary()
    b = SAGOEvaluator(model, tok, seed=3).evaluate(sets).summary()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
