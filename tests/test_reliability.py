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

from ._helpers.proc import run as run_proc
from ._helpers.trainer import make_trainer, variant_set

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
    from sago_train.eval import extraction

    real = extraction.Extractor.run
    sizes = []

    def score(self, *a, **k):
        sizes.append(self.batch_size)
        if self.batch_size > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, *a, **k)

    monkeypatch.setattr(extraction.Extractor, "run", score)
    cb = SAGOCallback(variant_set(), eval_steps=2, batch_size=16, **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=2)
    tr.train()
    assert [h["step"] for h in _history(tmp_path)] == [0, 2]
    assert sizes[:3] == [16, 8, 4] and not cb.failures
    assert "out of memory at batch size 16" in caplog.text


def test_persistent_oom_skips_the_evaluation_with_a_reason(tmp_path, monkeypatch, caplog):
    from sago_train.eval import extraction

    real = extraction.Extractor.run
    calls = {"n": 0}

    def score(self, *a, **k):
        calls["n"] += 1
        if calls["n"] > 1:  # the baseline succeeds, every later attempt runs out of memory
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real(self, *a, **k)

    monkeypatch.setattr(extraction.Extractor, "run", score)
    # activation alone: one extraction pass per evaluation (confidence adds the lead-in's scoring pass)
    cb = SAGOCallback(variant_set(), eval_steps=2, batch_size=4, **{**FAST, "axes": "activation"})
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
        if h.shape[0] == 1:  # the batch's shared prefix runs as a batch of one: poisoning it would reach every row
            return None
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

    from sago_train.results import store

    monkeypatch.setattr(sio, "atomic_write_text", write)
    monkeypatch.setattr(store, "atomic_write_text", write)
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
    cb = SAGOCallback(variant_set(), eval_steps=2, guard_reporters=True, **FAST)
    tr = make_trainer(tmp_path / "a", callbacks=[cb], max_steps=4, report_to=["wandb", "tensorboard"])
    tr.train()
    assert tr.state.global_step == 4 and [h["step"] for h in _history(tmp_path / "a")] == [0, 2, 4]
    assert "WandbCallback failed" in caplog.text
    monkeypatch.undo()

    # W&B dies mid-run: the run's log call starts raising after the baseline.
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cb = SAGOCallback(variant_set(), eval_steps=2, guard_reporters=True, **FAST)
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
    from sago_train.model.tiny import load_tiny_model

    model, tok = load_tiny_model()
    sets = {k: v.subset(range(10)) for k, v in bundled_sets().items()}
    a = SAGOEvaluator(model, tok, seed=3).evaluate(sets).to_summary()
    b = SAGOEvaluator(model, tok, seed=3).evaluate(sets).to_summary()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


# ------------------------------------------------------------------ issue 12: one process per run, no history lost
HOLDER = ("import sys, time\nfrom sago_train.io import acquire_run_lock\nacquire_run_lock(sys.argv[1])\n"
          "print('held', flush=True)\ntime.sleep(300)\n")


def _hold_lock(sago_dir: Path):
    """Another process holding the run directory (the same acquire_run_lock a run uses)."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(sago_dir)], stdout=subprocess.PIPE, text=True,
                            env=env)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _small_recipe(tmp_path: Path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(
        'sago_train_version: "0.1.0"\nmodel:\n  path: sago://tiny-llama\n'
        "data:\n  train: sago://demo/groups.jsonl\n  limit: 4\n"
        "monitor:\n  sets:\n    paraphrase: sago://demo/paraphrase.jsonl\n  eval_steps: 2\n"
        "  options: {max_groups: 2, max_new_tokens: 2, axes: activation, n_bootstrap: 100}\n"
        "training:\n  max_steps: 2\n  per_device_train_batch_size: 2\n  use_cpu: true\n  report_to: []\n"
        '  save_strategy: "no"\n  disable_tqdm: true\n',
        encoding="utf-8")
    return path


def test_second_process_is_refused_while_the_first_holds_the_directory(tmp_path, caplog):
    from sago_train.errors import SagoInputError

    from ._helpers.limited import RUN_CPU_LIMIT_S, assert_one_error_line, run_cli_limited

    holder = _hold_lock(tmp_path / "sago")
    try:
        cb = SAGOCallback(variant_set(), eval_steps=2, **FAST)
        tr = make_trainer(tmp_path, callbacks=[cb], max_steps=2)
        with pytest.raises(SagoInputError, match=f"is in use by process {holder.pid} on "):
            tr.train()
        assert tr.state.global_step == 0 and not (tmp_path / "sago" / "history.jsonl").exists()
        res = run_cli_limited(["run", str(_small_recipe(tmp_path)), "--output-dir", str(tmp_path)])
        assert_one_error_line(res, f"in use by process {holder.pid}", "run.lock", cpu_limit_s=RUN_CPU_LIMIT_S)
    finally:
        holder.kill()
        holder.wait()
    # The holder died (as after a SIGKILL): its lock file still names it, and the next run takes it over.
    assert json.loads((tmp_path / "sago" / "run.lock").read_text())["pid"] == holder.pid
    cb = SAGOCallback(variant_set(), eval_steps=2, **FAST)
    make_trainer(tmp_path, callbacks=[cb], max_steps=2).train()
    assert f"taking over the stale lock {tmp_path / 'sago' / 'run.lock'} of pid {holder.pid}" in caplog.text
    assert [h["step"] for h in _history(tmp_path)] == [0, 2]
    assert not (tmp_path / "sago" / "run.lock").exists()  # released cleanly at train end: no lock file left


def test_fresh_run_cannot_replace_another_runs_history(tmp_path):
    from sago_train.errors import SagoInputError

    make_trainer(tmp_path, callbacks=[SAGOCallback(variant_set(), eval_steps=2, **FAST)], max_steps=2).train()
    before = (tmp_path / "sago" / "history.jsonl").read_bytes()
    assert len(before.splitlines()) == 2
    tr = make_trainer(tmp_path, callbacks=[SAGOCallback(variant_set(), eval_steps=2, **FAST)], max_steps=2)
    with pytest.raises(SagoInputError, match=r"already holds the SAGO history of another run \(2 evaluation"):
        tr.train()
    assert tr.state.global_step == 0
    assert (tmp_path / "sago" / "history.jsonl").read_bytes() == before
    # Asked for explicitly: the old history is set aside whole, the new run starts its own.
    make_trainer(tmp_path, callbacks=[SAGOCallback(variant_set(), eval_steps=2, overwrite=True, **FAST)],
                 max_steps=2).train()
    (old,) = (tmp_path / "sago").glob("history.jsonl.*.old")
    assert old.read_bytes() == before
    assert [h["step"] for h in _history(tmp_path)] == [0, 2]


def test_cli_refuses_a_fresh_run_over_history_before_loading_the_model(tmp_path, capsys):
    from sago_train.cli.main import main

    from ._helpers.limited import RUN_CPU_LIMIT_S, assert_one_error_line, run_cli_limited

    recipe, out = _small_recipe(tmp_path), tmp_path / "out"
    assert main(["run", str(recipe), "--output-dir", str(out)]) == 0
    before = (out / "sago" / "history.jsonl").read_bytes()
    res = run_cli_limited(["run", str(recipe), "--output-dir", str(out)])
    assert_one_error_line(res, "already holds the SAGO history of another run", "--resume", "--overwrite", cpu_limit_s=RUN_CPU_LIMIT_S)
    assert "Loading weights" not in res.stderr  # refused before the model loaded
    res = run_cli_limited(["run", str(recipe), "--output-dir", str(out), "--resume"])
    assert_one_error_line(res, "--resume: no checkpoint-* folder in", cpu_limit_s=RUN_CPU_LIMIT_S)
    assert (out / "sago" / "history.jsonl").read_bytes() == before
    capsys.readouterr()
    assert main(["run", str(recipe), "--output-dir", str(out), "--overwrite"]) == 0
    (old,) = (out / "sago").glob("history.jsonl.*.old")
    assert old.read_bytes() == before and len(_history(out)) == 2


def _trainer_without_processing_class(out: Path, callback: SAGOCallback, *, attach: bool = True, **kwargs):
    from transformers import Trainer, TrainingArguments

    from ._helpers.tiny import make_byte_tokenizer, make_tiny_model
    from ._helpers.trainer import train_dataset

    args = TrainingArguments(output_dir=str(out), max_steps=2, per_device_train_batch_size=8, report_to=[],
                             save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)
    tr = Trainer(model=make_tiny_model("llama"), args=args, train_dataset=train_dataset(make_byte_tokenizer()),
                 callbacks=[callback], **kwargs)
    if attach:
        callback.attach(tr)
    return tr


def test_callback_without_a_tokenizer_fails_at_train_begin(tmp_path, caplog):
    """Issue 12 case 8: it used to skip every evaluation with a log line, failures == [] and no history."""
    from transformers import DataCollatorWithPadding

    from sago_train.errors import SagoInputError

    from ._helpers.tiny import make_byte_tokenizer

    tr = _trainer_without_processing_class(tmp_path / "a", SAGOCallback(variant_set(), eval_steps=2, **FAST))
    with pytest.raises(SagoInputError, match=r"no tokenizer: pass processing_class=tokenizer to the Trainer, or "
                                             r"SAGOCallback\(\.\.\., tokenizer=tokenizer\)"):
        tr.train()
    assert tr.state.global_step == 0

    # Soft failures asked for: training goes on, every skipped evaluation is counted.
    cb = SAGOCallback(variant_set(), eval_steps=2, soft_failures=True, **FAST)
    tr = _trainer_without_processing_class(tmp_path / "b", cb)
    tr.train()
    assert tr.state.global_step == 2
    assert [f["step"] for f in cb.failures] == [0, 2]
    assert all("skipped: SAGOCallback has no tokenizer" in f["error"] for f in cb.failures)
    assert not (tmp_path / "b" / "sago" / "history.jsonl").exists()

    # The data collator's tokenizer is found, and named once at train start; so is an explicit one.
    tok = make_byte_tokenizer()
    cb = SAGOCallback(variant_set(), eval_steps=2, **FAST)
    _trainer_without_processing_class(tmp_path / "c", cb, data_collator=DataCollatorWithPadding(tok)).train()
    assert "evaluating with the tokenizer" in caplog.text and "data_collator.tokenizer" in caplog.text
    assert [h["step"] for h in _history(tmp_path / "c")] == [0, 2] and not cb.failures
    cb = SAGOCallback(variant_set(), eval_steps=2, tokenizer=tok, **FAST)
    _trainer_without_processing_class(tmp_path / "d", cb).train()
    assert [h["step"] for h in _history(tmp_path / "d")] == [0, 2] and not cb.failures
    # A Trainer built as the transformers docs show: the collator holds the tokenizer, no processing_class, the
    # callback only in callbacks=[...] (not bound): the training dataloader's collate function has it.
    caplog.clear()
    cb = SAGOCallback(variant_set(), eval_steps=2, **FAST)
    _trainer_without_processing_class(tmp_path / "e", cb, attach=False,
                                      data_collator=DataCollatorWithPadding(tok)).train()
    assert "from the training data collator's tokenizer" in caplog.text
    assert [h["step"] for h in _history(tmp_path / "e")] == [0, 2] and not cb.failures



def test_two_training_processes_on_one_directory(tmp_path):
    """Issue 12 case 7: two `sago-train run` into one output_dir both exited 0 and one history replaced the
    other's. Now the second is refused while the first trains, and the first's history is whole."""
    import subprocess
    import time

    from ._helpers.limited import RUN_CPU_LIMIT_S, assert_one_error_line, run_cli_limited

    recipe, out = _small_recipe(tmp_path), tmp_path / "out"
    # Long enough (~50 evaluations) that the second process starts and checks while the first still trains.
    recipe.write_text(recipe.read_text().replace("max_steps: 2", "max_steps: 200").replace("eval_steps: 2",
                                                                                           "eval_steps: 4"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    first = subprocess.Popen([sys.executable, "-m", "sago_train.cli.main", "run", str(recipe), "--output-dir",
                              str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lock = out / "sago" / "run.lock"
        deadline = time.monotonic() + 120
        while not (lock.exists() and f'"pid": {first.pid}' in lock.read_text()):
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the first run never took the lock"
            time.sleep(0.1)
        second = run_cli_limited(["run", str(recipe), "--output-dir", str(out)])
        running = first.poll() is None
        _, err = first.communicate(timeout=600)
    finally:
        first.kill()
    assert running, "the first run ended before the second was tried: the test proves nothing"
    assert_one_error_line(second, f"is in use by process {first.pid}", cpu_limit_s=RUN_CPU_LIMIT_S)
    assert first.returncode == 0, err[-3000:]
    assert [h["step"] for h in _history(out)] == list(range(0, 201, 4))


def test_cli_resume_keeps_the_history_and_continues_it(tmp_path, capsys):
    from sago_train.cli.main import main

    recipe, out = _small_recipe(tmp_path), tmp_path / "out"
    save = ["--training.save_strategy", "steps", "--training.save_steps", "2"]
    assert main(["run", str(recipe), "--output-dir", str(out), *save]) == 0
    first = (out / "sago" / "history.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in first] == [0, 2] and (out / "checkpoint-2").is_dir()
    capsys.readouterr()
    assert main(["run", str(recipe), "--output-dir", str(out), "--resume", "--training.max_steps", "4", *save]) == 0
    assert "resuming from" in capsys.readouterr().out
    after = (out / "sago" / "history.jsonl").read_text().splitlines()
    assert after[:2] == first and [json.loads(x)["step"] for x in after] == [0, 2, 4]
