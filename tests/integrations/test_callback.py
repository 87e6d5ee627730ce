"""SAGOCallback inside real Trainer / SFTTrainer runs on a tiny model."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from sago_train import SAGOCallback, SAGOEarlyStoppingCallback

from .._helpers.evaluator_ref import FIVE_AXES
from .._helpers.lazy_sets import parsed_bytes, set_with_garbage_outside_the_subset
from .._helpers.trainer import Drift, drifting_trainer, make_trainer, variant_set

pytestmark = pytest.mark.slow
FAST = dict(max_new_tokens=3, n_bootstrap=200, axes=FIVE_AXES)  # the callback's mechanics on every axis


class Recorder(TrainerCallback):
    """Records callback events (and which SAGO keys each log carried) to check order and content."""

    def __init__(self):
        self.events: list[tuple[str, int, list[str]]] = []

    def on_train_begin(self, args, state, control, **kw):
        self.events.append(("train_begin", state.global_step, []))

    def on_step_end(self, args, state, control, **kw):
        self.events.append(("step_end", state.global_step, []))

    def on_log(self, args, state, control, logs=None, **kw):
        self.events.append(("log", state.global_step, sorted(k for k in logs if k.startswith("eval_sago"))))

    def on_evaluate(self, args, state, control, metrics=None, **kw):
        self.events.append(("evaluate", state.global_step, sorted(k for k in metrics if k.startswith("eval_sago"))))


def fail_nth_evaluation(monkeypatch, n: int) -> dict[str, int]:
    """Make the n-th SAGO evaluation raise; returns the call counter (settable, to re-arm it)."""
    from sago_train.eval import evaluator as ev_mod

    calls = {"n": 0}
    real = ev_mod.SAGOEvaluator.evaluate

    def flaky(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            raise ValueError("injected failure")
        return real(self, *a, **k)

    monkeypatch.setattr(ev_mod.SAGOEvaluator, "evaluate", flaky)
    return calls


def _history(out):
    return [json.loads(x) for x in (out / "sago" / "history.jsonl").read_text().splitlines()]


def test_lora_run_logs_history_and_files(tmp_path):
    rec = Recorder()
    cb = SAGOCallback(variant_set(), eval_steps=5, generation_every=1, **FAST)  # every axis at every step
    tr = make_trainer(tmp_path, callbacks=[cb, rec], lora=True, max_steps=10)
    tr.train()
    hist = _history(tmp_path)
    assert [h["step"] for h in hist] == [0, 5, 10]
    assert hist[0]["baseline"] is True
    for h in hist:
        assert set(h) >= {"step", "epoch", "sets"}
        for axis in ("activation", "activation_rel", "confidence", "generation", "mirroring"):
            assert set(h["sets"]["num"][axis]) == {"mean", "ci_low", "ci_high", "n"}
        between = h["set_level"]["num"]["activation_rel"]["between_dispersion"]
        assert between["n_groups"] == 8 and 0 < between["mean"] < 2
        records = (tmp_path / "sago" / f"step-{h['step']}" / "num.jsonl").read_text().splitlines()
        assert len(records) == 8 and {"variants", "outputs", "axes"} <= set(json.loads(records[0]))
    assert "vs_baseline" in hist[1]["compare"]["num"]["activation"]
    # Metrics reached the Trainer's log at the right global step, beside its own loss logs.
    sago_logs = [h for h in tr.state.log_history if "eval_sago/num/activation" in h]
    assert [h["step"] for h in sago_logs] == [0, 5, 10]
    # The default log level logs the headline numbers; CIs, paired changes and set-level figures stay in the
    # history and in the callback's full metrics (which the Trainer's evaluation metrics receive).
    assert all("eval_sago/instability" in h and "eval_sago/num/activation_ci_low" not in h for h in sago_logs)
    for h, line in zip(sago_logs, hist):
        assert h["eval_sago/num/activation_rel"] == pytest.approx(line["sets"]["num"]["activation_rel"]["mean"])
        assert "eval_sago/num/between_dispersion" not in h
        full = cb._done[h["step"]]
        assert full["eval_sago/num/activation_ci_low"] == pytest.approx(line["sets"]["num"]["activation"]["ci_low"])
        assert full["eval_sago/num/between_dispersion"] == pytest.approx(
            line["set_level"]["num"]["activation_rel"]["between_dispersion"]["mean"])
    assert "eval_sago/num/activation_vs_baseline" not in sago_logs[1]
    assert cb._done[5]["eval_sago/num/activation_vs_baseline"] == pytest.approx(
        hist[1]["compare"]["num"]["activation"]["vs_baseline"]["mean_diff"])
    assert [h["step"] for h in tr.state.log_history if "loss" in h] == [5, 10]
    # Order: baseline inside train_begin before any step; the step-5 evaluation logs right after step_end 5.
    names = [(e, s) for e, s, keys in rec.events if e != "log" or keys]
    assert names[0] == ("log", 0)  # the baseline is logged from on_train_begin, before any training step
    assert names.index(("log", 0)) < names.index(("step_end", 1))
    # The step-5 evaluation is logged during step 5's on_step_end (callbacks run in order, so ours precedes
    # the recorder's), i.e. after step 4 ended and before step 6.
    assert names.index(("step_end", 4)) < names.index(("log", 5)) < names.index(("step_end", 6))


SAGO_AXES = ("activation", "activation_rel", "confidence", "generation", "mirroring")


@pytest.mark.parametrize("log_level", ["default", "full"])
def test_log_level_bounds_the_keys_of_one_evaluation(tmp_path, log_level):
    """Issue 13's "Done when": a default run logs at most sets x axes + a few SAGO numbers per evaluation."""
    rec = Recorder()
    sets = {"num": variant_set("num"), "more": variant_set("more", n=4)}
    cb = SAGOCallback(sets, eval_steps=2, log_level=log_level, **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb, rec], max_steps=2)
    tr.train()
    logs = [keys for e, step, keys in rec.events if e == "log" and keys]
    assert len(logs) == 2  # the baseline and step 2
    headline = {"eval_sago/instability", "eval_sago/runtime"} | {
        f"eval_sago/{n}/{k}" for n in sets for k in (*SAGO_AXES, "instability", "accuracy")}
    bound = len(sets) * (len(SAGO_AXES) + 2) + 2
    assert len(headline) == bound == 16
    if log_level == "default":
        for keys in logs:
            assert set(keys) <= headline and len(keys) <= bound
        assert {"eval_sago/num/activation", "eval_sago/more/instability"} <= set(logs[1])
    else:
        assert "eval_sago/num/activation_ci_low" in logs[0] and "eval_sago/num/activation_vs_baseline_p" in logs[1]
        assert len(logs[1]) > 3 * bound
    # Either way, the full metrics are kept for metric_for_best_model.
    assert "eval_sago/num/activation_vs_baseline_p" in cb._done[2]  # no _vs_best: step 0 is never the best


def test_cost_and_progress_lines(tmp_path, caplog):
    """After the baseline: seconds per evaluation and the cadence's total; once steps are timed, its share;
    per set a progress line (pytest's stderr is not a terminal, as in a log file)."""
    cb = SAGOCallback(variant_set(), eval_steps=5, **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=10)
    with caplog.at_level("INFO", logger="sago_train"):
        tr.train()
    text = caplog.text
    # step 5 skips generation (generation_every=4), step 10 is the final, complete one
    assert "the cadence plans 2 more up to step 10 (1 complete, 1 without generation): at most" in text
    assert "(3 steps timed)" in text and "the 2 planned evaluations (1 complete, 1 without generation)" in text
    assert "% of it" in text
    assert "sago: an evaluation without generation-based axes took" in text and "of a complete one" in text
    for step in (0, 5, 10):
        assert f"sago step {step}: set 'num' done (1/1 sets, " in text


def test_log_level_is_checked():
    from sago_train.errors import SagoInputError

    with pytest.raises(SagoInputError, match="log_level"):
        SAGOCallback(variant_set(), log_level="verbose")


def test_follows_trainer_evaluation_and_best_model(tmp_path):
    cb = SAGOCallback(variant_set(), **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=6, eval_dataset=True, eval_strategy="steps", eval_steps=3,
                      save_strategy="steps", save_steps=3, load_best_model_at_end=True,
                      metric_for_best_model="sago/num/activation", greater_is_better=False)
    tr.train()
    assert [h["step"] for h in _history(tmp_path)] == [0, 3, 6]
    evals = [h for h in tr.state.log_history if "eval_loss" in h]
    assert [h["step"] for h in evals] == [3, 6]
    assert tr.state.best_metric is not None
    best = min((h for h in tr.state.log_history if "eval_sago/num/activation" in h and h["step"] > 0),
               key=lambda h: h["eval_sago/num/activation"])
    assert tr.state.best_metric == pytest.approx(best["eval_sago/num/activation"])


def test_activation_rel_as_best_model_metric_and_early_stopping_target(tmp_path):
    stopper = SAGOEarlyStoppingCallback("sago/num/activation_rel", patience=5, mode="threshold")
    cb = SAGOCallback(variant_set(), layers=[0, 1], **{**FAST, "axes": "activation,activation_rel"})
    tr = make_trainer(tmp_path, callbacks=[cb, stopper], max_steps=6, eval_dataset=True, eval_strategy="steps",
                      eval_steps=3, save_strategy="steps", save_steps=3, load_best_model_at_end=True,
                      metric_for_best_model="sago/num/activation_rel", greater_is_better=False)
    tr.train()
    hist = {h["step"]: h["sets"]["num"]["activation_rel"]["mean"] for h in _history(tmp_path)}
    assert sorted(hist) == [0, 3, 6]
    assert tr.state.best_metric == pytest.approx(min(hist[3], hist[6]))
    best_step = 3 if hist[3] <= hist[6] else 6
    assert tr.state.best_model_checkpoint.endswith(f"checkpoint-{best_step}")
    assert [d["step"] for d in stopper.decisions] == [0, 3, 6]
    assert [d["mean"] for d in stopper.decisions] == pytest.approx([hist[0], hist[3], hist[6]])


def test_runs_without_eval_dataset_at_automatic_cadence(tmp_path):
    # A huge budget allows an evaluation after every step; a tiny one none but the baseline and the final one.
    cb = SAGOCallback(variant_set(), overhead_budget=1e6, **FAST)
    make_trainer(tmp_path / "a", callbacks=[cb], max_steps=4).train()
    assert [h["step"] for h in _history(tmp_path / "a")] == [0, 1, 2, 3, 4]
    cb = SAGOCallback(variant_set(), overhead_budget=1e-6, **FAST)
    make_trainer(tmp_path / "b", callbacks=[cb], max_steps=4).train()
    assert [h["step"] for h in _history(tmp_path / "b")] == [0, 4]


def test_sft_trainer(tmp_path):
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    from .._helpers.tiny import make_byte_tokenizer, make_tiny_model

    tok = make_byte_tokenizer()
    ds = Dataset.from_dict({"prompt": [f"The number {i} is" for i in range(32)],
                            "completion": [f" {i}." for i in range(32)]})
    cb = SAGOCallback(variant_set(), eval_steps=2, **FAST)
    args = trl.SFTConfig(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=8, report_to=[],
                         use_cpu=True, disable_tqdm=True, logging_steps=2, save_strategy="no", max_length=32)
    tr = trl.SFTTrainer(model=make_tiny_model("llama"), args=args, train_dataset=ds, processing_class=tok,
                        callbacks=[cb])
    cb.attach(tr)
    tr.train()
    assert [h["step"] for h in _history(tmp_path)] == [0, 2, 4]
    assert any("eval_sago/num/activation" in h for h in tr.state.log_history)
    # SAGO's numbers come in a row of their own; TRL's training extras stay in TRL's training rows (its
    # SFTTrainer.log folds them into whatever row is logged: SAGO logs through the base Trainer.log).
    extras = ("entropy", "mean_token_accuracy", "num_tokens")
    sago_rows = [h for h in tr.state.log_history if "eval_sago/num/activation" in h]
    train_rows = [h for h in tr.state.log_history if "loss" in h]
    assert sago_rows and not any(k in h for h in sago_rows for k in extras)
    assert train_rows and all(all(k in h for k in extras) for h in train_rows)


def test_the_wandb_reader_waits_for_the_closing_record(tmp_path, monkeypatch):
    """The tests read W&B's offline file right after wandb.finish(), which can return before wandb-core has written
    the last rows: the reader must see every row of a closed run and refuse a file without its exit record."""
    wandb = pytest.importorskip("wandb")
    from .._helpers.wandb_reader import history_rows, read_records

    wandb.finish()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))  # wandb keeps the first one per process: never the repository
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="sago-reader")
    for step in range(5):
        wandb.log({"x": step})
    run_dir = Path(run.dir).parent
    wandb.finish()
    (path,) = glob.glob(str(run_dir / "*.wandb"))
    assert [json.loads(r["x"]) for r in history_rows(path)] == [0, 1, 2, 3, 4]
    data = Path(path).read_bytes()
    kinds = [r.WhichOneof("record_type") for r in read_records(path)]
    assert kinds[-1] == "exit" and kinds.count("exit") == 1
    cut = tmp_path / "unfinished.wandb"
    cut.write_bytes(data[: len(data) // 2])  # what a reader racing wandb-core can see: no exit record yet
    with pytest.raises(TimeoutError, match="no 'exit' record after 0 s"):
        read_records(cut, complete_within_s=0.3)


def test_wandb_offline_receives_metrics_histograms_and_table(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from .._helpers.wandb_reader import history_rows

    wandb.finish()  # another test in this process may have left a run open; the Trainer would reuse it
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "sago-test")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    cb = SAGOCallback(variant_set(), eval_steps=5, **FAST)
    make_trainer(tmp_path / "out", callbacks=[cb], max_steps=5, report_to=["wandb", "tensorboard"]).train()
    # wandb caches its settings per process, so find this run's folder from the run itself, not WANDB_DIR.
    run_dir = Path(wandb.run.dir).parent
    wandb.finish()  # the Trainer leaves the run open; finishing flushes it to the offline file
    files = glob.glob(str(run_dir / "*.wandb"))
    assert len(files) == 1
    rows = history_rows(files[0])
    scalars = [r for r in rows if "eval/sago/num/activation" in r]
    assert [int(r["train/global_step"]) for r in scalars] == [0, 5]
    hist0 = _history(tmp_path / "out")[0]["sets"]["num"]["activation"]["mean"]
    assert float(scalars[0]["eval/sago/num/activation"]) == pytest.approx(hist0, rel=1e-6)
    rel0 = _history(tmp_path / "out")[0]["sets"]["num"]["activation_rel"]["mean"]
    assert float(scalars[0]["eval/sago/num/activation_rel"]) == pytest.approx(rel0, rel=1e-6)
    # Default log level: the set-level and CI figures are not charts but one table per evaluation.
    assert "eval/sago/num/between_dispersion" not in scalars[0]
    assert not any(k.endswith("_ci_low") for k in scalars[0])
    assert any(k.startswith("eval/sago/details") for r in rows for k in r)
    from .._helpers.wandb_reader import config_items

    sago_config = json.loads(config_items(files[0])["sago"])
    assert sago_config["eval_steps"] == 5 and sago_config["sets"] == ["num"] and sago_config["max_new_tokens"] == 3
    assert any("eval/sago/num/activation_hist/_type" in r for r in rows)
    assert any("eval/sago/num/activation_rel_hist/_type" in r for r in rows)
    assert any(k.startswith("eval/sago/unstable_groups") for r in rows for k in r)
    # TensorBoard got the same scalars, read back from its event files.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    event_dirs = {p.rsplit("/", 1)[0] for p in glob.glob(str(tmp_path / "tb" / "**" / "events.*"), recursive=True)}
    tags = {}
    for d in event_dirs:
        acc = EventAccumulator(d)
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            tags[tag] = [(e.step, e.value) for e in acc.Scalars(tag)]
    assert [s for s, _ in tags["eval/sago/num/activation"]] == [0, 5]
    histograms = {}
    for d in event_dirs:
        acc = EventAccumulator(d, size_guidance={"histograms": 0})  # 0: keep all (the default keeps one)
        acc.Reload()
        for tag in acc.Tags()["histograms"]:
            histograms[tag] = acc.Histograms(tag)
    hist = histograms["eval/sago/num/activation"]
    assert [h.step for h in hist] == [0, 5]
    assert hist[0].histogram_value.num == 8  # one value per group
    assert hist[0].histogram_value.sum == pytest.approx(8 * hist0, rel=1e-5)
    assert tags["eval/sago/num/activation"][0][1] == pytest.approx(hist0, rel=1e-5)


def test_failing_wandb_keeps_history_and_training(tmp_path, monkeypatch):
    import wandb

    wandb.finish()

    def boom(*a, **k):
        raise RuntimeError("wandb is down")

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cb = SAGOCallback(variant_set(), eval_steps=5, **FAST)
    tr = make_trainer(tmp_path / "out", callbacks=[cb], max_steps=5, report_to=["wandb"])
    monkeypatch.setattr(wandb, "Histogram", boom)
    tr.train()
    wandb.finish()
    assert [h["step"] for h in _history(tmp_path / "out")] == [0, 5]


def test_evaluation_exception_does_not_stop_training(tmp_path, monkeypatch):
    calls = fail_nth_evaluation(monkeypatch, 2)
    cb = SAGOCallback(variant_set(), eval_steps=5, **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=10)
    tr.train()
    assert tr.state.global_step == 10
    assert [h["step"] for h in _history(tmp_path)] == [0, 10]
    assert cb.failures and "injected failure" in cb.failures[0]["error"]
    with pytest.raises(ValueError, match="injected"):
        calls["n"] = 1
        make_trainer(tmp_path / "r", callbacks=[SAGOCallback(variant_set(), eval_steps=5, raise_on_error=True, **FAST)],
                     max_steps=5).train()


def test_monitoring_does_not_change_training_bitwise(tmp_path):
    def final_weights(callbacks, out):
        tr = make_trainer(out, callbacks=callbacks, max_steps=12, lora=True, gradient_accumulation_steps=2)
        tr.train()
        return {k: v.detach().clone() for k, v in tr.model.state_dict().items()}

    off = final_weights([], tmp_path / "off")
    on = final_weights([SAGOCallback(variant_set(), eval_steps=3, **FAST)], tmp_path / "on")
    assert off.keys() == on.keys()
    for k in off:
        assert torch.equal(off[k], on[k]), k


def test_restores_model_state(tmp_path):
    cb = SAGOCallback(variant_set(), eval_steps=2, **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=2, gradient_checkpointing=True)
    tok = tr.processing_class
    tok.padding_side = "left"
    use_cache = tr.model.config.use_cache
    tr.train()
    assert tr.model.training  # the Trainer leaves it in train mode; evaluation restored it
    assert tok.padding_side == "left" and tr.model.config.use_cache == use_cache
    assert tr.model.is_gradient_checkpointing


def test_resume_has_every_evaluation_once(tmp_path):
    out = tmp_path / "run"
    cb = SAGOCallback(variant_set(), eval_steps=3, **FAST)
    tr = make_trainer(out, callbacks=[cb], max_steps=9, save_strategy="steps", save_steps=3)
    tr.train()
    full = _history(out)
    assert [h["step"] for h in full] == [0, 3, 6, 9]
    # Resume from step 3 as after a crash: later evaluations are redone exactly once.
    cb2 = SAGOCallback(variant_set(), eval_steps=3, **FAST)
    tr2 = make_trainer(out, callbacks=[cb2], max_steps=9, save_strategy="steps", save_steps=3)
    tr2.train(resume_from_checkpoint=str(out / "checkpoint-3"))
    hist = _history(out)
    assert [h["step"] for h in hist] == [0, 3, 6, 9]
    assert hist[0] == full[0] and hist[1] == full[1]
    for a, b in zip(full[2:], hist[2:]):
        assert b["sets"]["num"]["activation"]["mean"] == pytest.approx(a["sets"]["num"]["activation"]["mean"], abs=1e-5)
    # The baseline survived the resume: comparisons are still against step 0.
    assert hist[2]["compare"]["num"]["activation"]["vs_baseline"]["step"] == 0




def test_resume_over_a_corrupt_history_line_keeps_the_valid_lines_and_warns(tmp_path, caplog):
    out = tmp_path / "run"
    cb = SAGOCallback(variant_set(), eval_steps=3, **FAST)
    make_trainer(out, callbacks=[cb], max_steps=6, save_strategy="steps", save_steps=3).train()
    path = out / "sago" / "history.jsonl"
    lines = path.read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 3, 6]
    path.write_text(lines[0] + "\n" + lines[1][:30] + "\n" + lines[1] + "\n" + lines[2] + "\n")  # line 2 torn
    cb2 = SAGOCallback(variant_set(), eval_steps=3, **FAST)
    tr2 = make_trainer(out, callbacks=[cb2], max_steps=6, save_strategy="steps", save_steps=3)
    with caplog.at_level("WARNING", logger="sago_train"):
        tr2.train(resume_from_checkpoint=str(out / "checkpoint-3"))
    warned = [r.getMessage() for r in caplog.records if "corrupt history line" in r.getMessage()]
    assert len(warned) == 1 and f"{path}:2: malformed JSON" in warned[0], warned
    assert cb2.monitor.skipped_lines == 1
    hist = _history(out)  # the valid lines up to the checkpoint kept, step 6 redone, the torn line dropped
    assert [h["step"] for h in hist] == [0, 3, 6]
    assert hist[0] == json.loads(lines[0]) and hist[1] == json.loads(lines[1])
    assert hist[2]["compare"]["num"]["activation"]["vs_baseline"]["step"] == 0


def test_early_stopping_triggers_on_crafted_regression(tmp_path):
    stopper = SAGOEarlyStoppingCallback("sago/num/activation", patience=2, alpha=0.05)
    tr = drifting_trainer(tmp_path, 0.12, stopper)
    tr.train()
    assert tr.state.global_step < 8
    assert stopper.stopped_step == tr.state.global_step and "worse than the reference" in stopper.reason
    # The baseline is left out; steps 1-2 are the reference, 3 opens the window, 4 is the first look.
    assert [d["verdict"] for d in stopper.decisions][:4] == [
        "baseline (never the best: no checkpoint; not in the reference)", "reference (1/2)", "reference (2/2)",
        "window (1/2)"]
    assert stopper.decisions[-1]["verdict"] == "worse" and stopper.looks == 5  # 8 evaluations after the baseline


class _Noise(TrainerCallback):
    """Real evaluation noise without a trend: a hook on block 0 adds fresh Gaussian noise to every hidden state
    at every forward (its own generator, so the callback's RNG guard does not replay it). Per-group values then
    differ at every evaluation, up and down, independently across groups."""

    def __init__(self, model, sigma: float, seed: int = 0):
        self.sigma = sigma
        self.gen = torch.Generator().manual_seed(seed)
        model.model.layers[0].register_forward_hook(self._hook)

    def _hook(self, module, inputs, output):
        h = output[0] if isinstance(output, tuple) else output
        h = h + self.sigma * torch.randn(h.shape, generator=self.gen, dtype=h.dtype)
        return (h, *output[1:]) if isinstance(output, tuple) else h


def _noisy_trainer(tmp_path, stopper, sigma=3.0, steps=10):
    cb = SAGOCallback(variant_set(n=16), eval_steps=1, layers=[0], **{**FAST, "axes": "activation"})
    tr = make_trainer(tmp_path, callbacks=[cb, stopper], max_steps=steps, learning_rate=0.0)
    tr.add_callback(Drift(tr.model, 0.0))  # a constant shared direction: activation well inside (0, 1)
    tr.add_callback(_Noise(tr.model, sigma))
    return tr


def test_early_stopping_ignores_noise(tmp_path):
    """The audit found this test trained with learning rate 0 and no noise, so every evaluation was identical
    and any rule would pass. Here evaluations differ by real, trendless noise: a mean-only rule stops, the
    paired rule does not (its run-level false-stop rate is measured in tests/benchmarks)."""
    stopper = SAGOEarlyStoppingCallback("sago/num/activation", patience=2, alpha=0.05)
    tr = _noisy_trainer(tmp_path / "paired", stopper)
    tr.train()
    means = [d["mean"] for d in stopper.decisions]
    assert len(means) == 11 and (max(means) - min(means)) / min(means) > 0.05  # the evaluations really differ
    looks = [d for d in stopper.decisions if "look" in d]
    assert len(looks) == stopper.looks == 7  # 10 evaluations after the baseline: 2 + 2 fill the reference and window
    assert tr.state.global_step == 10 and stopper.stopped_step is None
    assert not any(d["verdict"] == "worse" for d in stopper.decisions)
    # The same noise stops a rule that compares means only: the noise is large enough to matter.
    naive = SAGOEarlyStoppingCallback("sago/num/activation", patience=2, mode="threshold")
    tr = _noisy_trainer(tmp_path / "threshold", naive)
    tr.train()
    assert naive.stopped_step is not None and tr.state.global_step < 10


def test_torchrun_two_processes_history_equals_single(tmp_path):
    import os
    import sys

    from .._helpers.proc import run as run_proc

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline"}
    root = str(Path(__file__).resolve().parents[2])
    single = run_proc([sys.executable, "-m", "tests.ddp_callback_worker", str(tmp_path / "one")], cwd=root, env=env)
    assert single.returncode == 0, single.stderr[-3000:]
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    multi = run_proc([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "tests.ddp_callback_worker",
                      str(tmp_path / "two")], cwd=root, env=env)
    assert multi.returncode == 0, multi.stderr[-3000:]
    one, two = _history(tmp_path / "one"), _history(tmp_path / "two")
    assert [h["step"] for h in two] == [h["step"] for h in one] == [0, 2, 4]
    for a, b in zip(one, two):
        for axis, v in a["sets"]["num"].items():
            for key in ("mean", "ci_low", "ci_high", "n"):
                assert b["sets"]["num"][axis][key] == pytest.approx(v[key], abs=1e-4), (a["step"], axis, key)
    r0 = json.loads((tmp_path / "two" / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "two" / "rank1.json").read_text())
    assert r0["world"] == r1["world"] == 2
    assert r0["writes"] and not r1["writes"]  # only rank 0 writes files
    assert r0["groups"] == r1["groups"] and len(r0["groups"]["num"]) == 7  # every rank sees the gathered result


def test_eval_on_start_reuses_the_baseline(tmp_path):
    calls = {"n": 0}
    cb = SAGOCallback(variant_set(), **FAST)
    real = cb._run_evaluator

    def counting(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    cb._run_evaluator = counting
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=3, eval_dataset=True, eval_strategy="steps", eval_steps=3,
                      eval_on_start=True)
    tr.train()
    assert [h["step"] for h in _history(tmp_path)] == [0, 3]
    assert calls["n"] == 2  # the baseline served the Trainer's eval_on_start too
    starts = [h for h in tr.state.log_history if "eval_loss" in h and h["step"] == 0]
    assert starts  # the Trainer's own evaluation at step 0 happened


def test_best_model_metric_survives_a_failed_evaluation(tmp_path, monkeypatch):
    fail_nth_evaluation(monkeypatch, 2)
    cb = SAGOCallback(variant_set(), **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=4, eval_dataset=True, eval_strategy="steps", eval_steps=2,
                      save_strategy="steps", save_steps=2, load_best_model_at_end=True,
                      metric_for_best_model="sago/num/activation", greater_is_better=False)
    tr.train()  # the step-2 evaluation failed: the Trainer still found its metric (no KeyError)
    assert tr.state.global_step == 4
    hist = {h["step"]: h["sets"]["num"]["activation"]["mean"] for h in _history(tmp_path)}
    assert sorted(hist) == [0, 4]
    # Step 2 got the worst value (never the baseline's, a measurement of another step), so the Trainer's best is
    # step 4, the one evaluation it was handed a measured value for (see test_best_metric.py).
    assert tr.state.best_metric == pytest.approx(hist[4])
    assert tr.state.best_model_checkpoint.endswith("checkpoint-4")


def test_early_stopping_on_an_unmonitored_set_fails_before_training(tmp_path):
    from sago_train import SagoInputError

    stopper = SAGOEarlyStoppingCallback("sago/other/activation")
    tr = make_trainer(tmp_path, callbacks=[SAGOCallback(variant_set(), **FAST), stopper], max_steps=2)
    with pytest.raises(SagoInputError, match="not monitored"):
        tr.train()
    assert tr.state.global_step == 0


# ------------------------------------------------------------------ binding (no frame walking)
def test_unbound_callback_still_records_and_says_what_it_misses(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    cb = SAGOCallback(variant_set(), eval_steps=5, **FAST)
    tr = make_trainer(tmp_path / "out", callbacks=[cb], bind=False, max_steps=5, report_to=["tensorboard"])
    with caplog.at_level("WARNING"):
        tr.train()
    assert cb.trainer is None
    assert "not bound to the Trainer" in caplog.text and "attach(trainer)" in caplog.text
    assert [h["step"] for h in _history(tmp_path / "out")] == [0, 5]
    logged = [h for h in tr.state.log_history if "eval_sago/num/activation" in h]
    assert [h["step"] for h in logged] == [0, 5]
    assert logged[0]["eval_sago/num/activation"] == pytest.approx(
        _history(tmp_path / "out")[0]["sets"]["num"]["activation"]["mean"], rel=1e-9)


def test_early_stopping_needs_a_bound_callback(tmp_path):
    from sago_train.errors import SagoInputError

    stopper = SAGOEarlyStoppingCallback("sago/num/activation", patience=2)
    tr = make_trainer(tmp_path, callbacks=[SAGOCallback(variant_set(), eval_steps=5, **FAST), stopper], bind=False,
                      max_steps=2)
    with pytest.raises(SagoInputError, match="receives no SAGO evaluations"):
        tr.train()


def test_reporter_guard_wraps_and_never_patches(tmp_path, monkeypatch):
    from transformers.integrations import TensorBoardCallback

    from sago_train.integrations.reporters import GuardedReporter

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    cb = SAGOCallback(variant_set(), eval_steps=5, guard_reporters=True, **FAST)
    tr = make_trainer(tmp_path / "out", callbacks=[cb], max_steps=1, report_to=["tensorboard"])
    guarded = [c for c in tr.callback_handler.callbacks if isinstance(c, GuardedReporter)]
    assert len(guarded) == 1 and isinstance(guarded[0].wrapped, TensorBoardCallback)
    assert not any(name.startswith("on_") for name in vars(guarded[0].wrapped))  # its methods are its own
    calls = []
    guarded[0].wrapped.on_log = lambda *a, **k: (calls.append(1), 1 / 0)  # a reporter that dies
    tr.train()
    assert tr.state.global_step == 1 and guarded[0].disabled and calls


@pytest.mark.parametrize("max_groups, kept", [(4, 4), (None, 64)], ids=["max_groups_4", "in_training_default_64"])
def test_a_monitored_set_file_is_read_lazily(tmp_path, monkeypatch, max_groups, kept):
    """Issue 22: only `sago-train eval --max-groups` read a set lazily; the callback parsed a monitored set whole
    although it evaluates a capped subset (by default 64 groups)."""
    from sago_train.data import VariantSet
    from sago_train.integrations.fingerprint import set_fingerprints

    path = tmp_path / "s.jsonl"
    ids, kept_bytes = set_with_garbage_outside_the_subset(path, n=100, max_groups=kept)
    with parsed_bytes(monkeypatch) as seen:
        cb = SAGOCallback({"s": str(path)}, max_groups=max_groups)
    assert [g.id for g in cb.sets["s"]] == ids and len(ids) == kept
    assert seen == {str(path): kept_bytes}  # the 100 - kept garbage lines (200 kB each) were never parsed
    # The lazily read set is fingerprinted as the whole file would be: a resume across versions still matches.
    whole = VariantSet.from_records([{"id": f"g{i}", "variants": [f"The number {i} is", f"number {i}:"],
                                      "reference": f" {i}"} for i in range(100)], name="s")
    assert cb.fingerprints == set_fingerprints({"s": whole}, cb.config)


def test_no_stack_frame_walking_in_the_package():
    import pathlib

    import sago_train

    root = pathlib.Path(sago_train.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "f_locals" not in text and "currentframe" not in text, path
