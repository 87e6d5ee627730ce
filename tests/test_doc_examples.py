"""Every Python block of README.md and of the manual's pages (docs/*.md) runs as written, or, where it cannot
run here, is parsed with the reason given. The blocks are found by parsing the files; each is named below by its
page and a line only it contains on that page, and a block that no test runs and no reason excuses fails
:func:`test_every_python_block_is_run_or_excused`.

Where a block says its names are the reader's own (``# model, tokenizer ...: yours``), the test defines exactly
those names first (a prelude: the shipped tiny model, tiny data, the bundled sets copied where the block reads
them) and never edits the block's lines. Each runs in a fresh temporary directory."""

from __future__ import annotations

import ast
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sago_train import SAGOConfig, bundled_sets, load_tiny_model, tiny_model_path
from sago_train.data.sources import bundled_set_paths

from ._helpers.docs import PAGES, ROOT, fenced_blocks, page_name

DEMO_TRAIN = ROOT / "sago_train" / "assets" / "demo" / "train.jsonl"

#: Each Python block that runs, by (page, a line that only it contains on that page) -> the test that runs it.
RUN = {
    ("README.md", "evaluator = SAGOEvaluator.from_pretrained("): "test_readme_evaluation_then_reading_it",
    ("docs/results.md", "ev = Evaluation.read("): "test_readme_evaluation_then_reading_it",
    ("README.md", "sago = SAGOCallback("): "test_readme_callback_example",
    ("README.md", "trainer = StabilityTrainer("): "test_readme_stability_example",
    ("docs/getting-started.md", "evaluator = SAGOEvaluator("): "test_evaluator_example",
    ("docs/monitoring.md", "sago = SAGOCallback("): "test_callback_example_then_reading_the_run",
    ("docs/results.md", "run = load_source("): "test_callback_example_then_reading_the_run",
    ("docs/stability-loss.md", "trainer = StabilityTrainer("): "test_stability_trainer_examples",
    ("docs/stability-loss.md", "trainer = StabilitySFTTrainer("): "test_stability_trainer_examples",
    ("docs/stability-loss.md", 'config = StabilityConfig(mode="consistency"'): "test_consistency_example",
    ("docs/monitoring.md", "parser = TrlParser("): "test_trl_script",
    ("docs/accuracy.md", "result = compare_evaluations("): "test_accuracy_beside_stability_example",
    ("docs/early-stopping.md", "stop = SAGOEarlyStoppingCallback(["): "test_early_stopping_examples",
    ("docs/early-stopping.md", "stop.plan(64"): "test_early_stopping_examples",
}
#: Each Python block that is only parsed (and its imports checked, tests/test_docs.py), with why it is not run.
PARSED_ONLY = {
    ("docs/real-models.md", 'load_model_and_tokenizer("sago://gemma-3-270m"'):
        "converts and loads a 1 GB real model once per machine; tests/model/test_real*.py run the same calls",
}


def python_blocks(page: str) -> list[str]:
    return [body for _, body in fenced_blocks(ROOT / page, "python")]


def block(page: str, marker: str, language: str = "python") -> str:
    found = [body for _, body in fenced_blocks(ROOT / page, language) if marker in body]
    assert len(found) == 1, f"{page}: {len(found)} {language} blocks contain {marker!r}"
    return found[0]


def run_block(page: str, marker: str, namespace: dict[str, Any]) -> dict[str, Any]:
    exec(compile(block(page, marker), f"{page} ({marker.strip()})", "exec"), namespace)  # noqa: S102
    return namespace


def copy_bundled_sets(names: list[str]) -> None:
    """The set files a block reads as ``sets/<name>.jsonl``: the bundled tiny sets (relative to the cwd)."""
    Path("sets").mkdir(exist_ok=True)
    for name in names:
        shutil.copy(bundled_set_paths("tiny")[name], Path("sets") / f"{name}.jsonl")


def sago_rows(log_history: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Step -> the ``eval_sago/...`` values logged at it."""
    rows: dict[int, dict[str, float]] = {}
    for entry in log_history:
        values = {k: v for k, v in entry.items() if k.startswith("eval_sago/")}
        if values:
            rows.setdefault(int(entry["step"]), {}).update(values)
    return rows


#: Axes that need greedy generation: computed at every ``generation_every``-th evaluation only (default 4), the
#: baseline and the final evaluation always; the others log the remaining axes and no accuracy (and no
#: instability where an axis was skipped).
GENERATION_AXES = ("confidence", "generation", "mirroring")  # confidence: after the model's own lead-in


def assert_sago_logged(log_history: list[dict[str, Any]], steps: list[int], sets: list[str], axes: list[str],
                       without_generation: tuple[int, ...] = ()) -> None:
    rows = sago_rows(log_history)
    assert sorted(rows) == steps
    for step in steps:
        for name in sets:
            if step in without_generation:
                want = [a for a in axes if a not in GENERATION_AXES]
                absent = [a for a in (*GENERATION_AXES, "accuracy") if f"eval_sago/{name}/{a}" in rows[step]]
                assert not absent, (step, name, absent)
            else:
                want = [*axes, "instability", "accuracy"]
            for axis in want:
                value = rows[step][f"eval_sago/{name}/{axis}"]
                assert isinstance(value, float) and math.isfinite(value), (step, name, axis, value)
        assert rows[step]["eval_sago/runtime"] > 0


def test_every_python_block_is_run_or_excused():
    registry = {**RUN, **PARSED_ONLY}
    assert not set(RUN) & set(PARSED_ONLY)
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        blocks = python_blocks(page_name(page))
        # Every fence that opens Python code (```py, ```Python, indented) is one the parse found.
        openers = re.findall(r"^[ \t]*```[ \t]*(?:py|python|python3)[ \t]*$", text, flags=re.M | re.I)
        assert len(openers) == len(blocks), page_name(page)
        for b in blocks:
            owners = [key for key in registry if key[0] == page_name(page) and key[1] in b]
            assert len(owners) == 1, (f"{page_name(page)}: a Python block that no test runs: add it to RUN (with the "
                                      f"test that runs it) or to PARSED_ONLY (with the reason)\n{b[:300]}")
    for (page, marker), test in RUN.items():
        assert sum(marker in b for b in python_blocks(page)) == 1, (page, marker)
        assert callable(globals().get(test)), test
    for (page, marker), reason in PARSED_ONLY.items():
        assert reason and sum(marker in b for b in python_blocks(page)) == 1, (page, marker)
        ast.parse(block(page, marker))


@pytest.mark.slow
def test_readme_evaluation_then_reading_it(tmp_path, monkeypatch, capsys):
    """The README's evaluation of the tiny model on the bundled sets, then results.md reading what it wrote."""
    monkeypatch.chdir(tmp_path)
    ns = run_block("README.md", "evaluator = SAGOEvaluator.from_pretrained(", {})
    result = ns["result"]
    assert sorted(result.sets) == sorted(bundled_sets())
    summary = result.sets["paraphrase"].summaries["confidence"]
    assert f"Summary(mean={summary.mean}" in capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "results" / "paraphrase.jsonl").read_text().splitlines()]
    values = [r["axes"]["confidence"] for r in records]
    assert summary.n == len(values) == len(bundled_sets()["paraphrase"].groups)
    assert summary.mean == pytest.approx(float(np.mean(values)), rel=1e-9) and summary.mean > 0

    ns = run_block("docs/results.md", "ev = Evaluation.read(", {})
    read = ns["ev"].sets["paraphrase"]
    assert read.summaries["confidence"].mean == pytest.approx(summary.mean, rel=1e-12)
    assert read.accuracy == result.sets["paraphrase"].accuracy
    assert str(read.accuracy) in capsys.readouterr().out


def test_evaluator_example(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    copy_bundled_sets(["paraphrase"])
    model, tokenizer = load_tiny_model()
    ns = run_block("docs/getting-started.md", "evaluator = SAGOEvaluator(", {"model": model, "tokenizer": tokenizer})
    summary = ns["result"].sets["paraphrase"].summaries["activation"]
    assert "Summary(mean=" in capsys.readouterr().out
    # The summary is the mean of the per-group values the block wrote.
    records = [json.loads(line) for line in (tmp_path / "results" / "paraphrase.jsonl").read_text().splitlines()]
    values = [r["axes"]["activation"] for r in records]
    assert summary.n == len(values) == len(bundled_sets()["paraphrase"].groups)
    assert summary.mean == pytest.approx(float(np.mean(values)), rel=1e-9) and summary.mean > 0
    assert summary.ci_low <= summary.mean <= summary.ci_high
    assert "paraphrase" in json.loads((tmp_path / "results" / "summary.json").read_text())["sets"]


def _demo_records() -> list[dict[str, str]]:
    return [json.loads(line) for line in DEMO_TRAIN.read_text().splitlines()]


def _tokenized_train_ds(tokenizer: Any, length: int = 16) -> list[dict[str, list[int]]]:
    """The demo's SFT records as fixed-length causal-LM examples (the Trainer's default collator pads no labels)."""
    out = []
    for record in _demo_records():
        enc = tokenizer(record["prompt"] + record["completion"], padding="max_length", max_length=length,
                        truncation=True)
        labels = [t if m else -100 for t, m in zip(enc["input_ids"], enc["attention_mask"], strict=True)]
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels})
    return out


def test_readme_callback_example(tmp_path, monkeypatch):
    """Quick start 2 of the README runs as written (issue 33: it read sets/paraphrase.jsonl and used model and
    args it never defined): a TRL SFTTrainer on the shipped tiny model and the bundled sets, nothing given."""
    monkeypatch.chdir(tmp_path)
    ns = run_block("README.md", "sago = SAGOCallback(", {})
    trainer, sago = ns["trainer"], ns["sago"]
    assert trainer.state.global_step == 4 and not sago.failures
    assert_sago_logged(trainer.state.log_history, [0, 4], sorted(bundled_sets()), sago.config.axes)
    history = [json.loads(line) for line in (tmp_path / "out" / "sago" / "history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [0, 4]
    assert all(h["sets"]["typo"]["confidence"]["n"] == len(bundled_sets()["typo"].groups) for h in history)


@pytest.mark.slow
def test_callback_example_then_reading_the_run(tmp_path, monkeypatch, capsys):
    """monitoring.md's callback with early stopping in a Trainer (its output_dir where results.md reads a run),
    then results.md reading that run back."""
    from transformers import TrainingArguments

    monkeypatch.chdir(tmp_path)
    copy_bundled_sets(["paraphrase", "typo"])
    model, tokenizer = load_tiny_model()
    args = TrainingArguments("runs/demo/augment", max_steps=2, per_device_train_batch_size=4, report_to=[],
                             save_strategy="no", disable_tqdm=True)
    ns = run_block("docs/monitoring.md", "sago = SAGOCallback(", {"model": model, "tokenizer": tokenizer,
                                                                  "args": args,
                                                                  "train_ds": _tokenized_train_ds(tokenizer)})
    trainer, sago, stop = ns["trainer"], ns["sago"], ns["stop"]
    assert trainer.state.global_step == 2 and not sago.failures
    assert_sago_logged(trainer.state.log_history, [0, 2], ["paraphrase", "typo"], sago.config.axes)
    # The early stopper was fed by the callback: its best is the step-2 evaluation (the step-0 baseline is never
    # the best), with the mean logged for the metric it watches.
    key = "eval_" + stop.metric
    logged = {step: row[key] for step, row in sago_rows(trainer.state.log_history).items()}
    assert stop.best_step == 2 and stop.best_mean == pytest.approx(logged[2], rel=1e-6)
    assert [d["step"] for d in stop.decisions] == [0, 2] and stop.decisions[0]["verdict"].startswith("baseline")

    capsys.readouterr()
    ns = run_block("docs/results.md", "run = load_source(", {})
    assert ns["run"].steps == [0, 2]
    accuracy = ns["final"].score("paraphrase", "accuracy")
    logged_accuracy = sago_rows(trainer.state.log_history)[2]["eval_sago/paraphrase/accuracy"]
    assert accuracy.mean == pytest.approx(logged_accuracy, rel=1e-6)
    assert capsys.readouterr().out.startswith("[0, 2] ")


def test_early_stopping_examples(caplog):
    """early-stopping.md: one stopper over stability and accuracy (alpha split between them), accepted by the
    SAGOCallback's checks at train start (the bundled paraphrase set has references), at a cadence whose cost is
    said beside it; the start-up line as the page shows it; then the plan's arithmetic."""
    import logging

    from transformers import TrainerState, TrainingArguments

    from sago_train import SAGOCallback, SAGOEarlyStoppingCallback

    ns = run_block("docs/early-stopping.md", "stop = SAGOEarlyStoppingCallback([", {})
    sago, stop = ns["sago"], ns["stop"]
    # The recipe's cost, said beside it: the automatic cadence within 20% of training (at most ~25%, issue 33).
    assert sago.options.eval_steps is None and sago.options.overhead_budget == 0.2
    assert "at most 20% of training time" in block("docs/early-stopping.md", "stop = SAGOEarlyStoppingCallback([")
    assert [w.alpha for w in stop.watchers] == [0.025, 0.025]
    sago.add_listener(stop)
    sago._check_listeners(TrainingArguments("unused", report_to=[]), TrainerState(max_steps=2000))
    assert [w.looks for w in stop.watchers] == [None, None]  # automatic cadence: the spending sequence
    planned = SAGOCallback(bundled_sets(), eval_steps=100, generation_every=1)
    fixed = SAGOEarlyStoppingCallback(stop.metrics, patience=3, alpha=0.05)
    planned.add_listener(fixed)
    with caplog.at_level(logging.INFO, logger="sago_train"):
        planned._check_listeners(TrainingArguments("unused", report_to=[]), TrainerState(max_steps=2000))
    assert [w.looks for w in fixed.watchers] == [15, 15]  # 20 evaluations after the baseline, patience 3
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith(
        "sago early stopping: sago/paraphrase/accuracy"))
    assert block("docs/early-stopping.md", "sago early stopping: sago/", "text").strip() == line
    ns = run_block("docs/early-stopping.md", "stop.plan(64", {})
    assert ns["stop"].looks == 15


def test_readme_stability_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer = run_block("README.md", "trainer = StabilityTrainer(", {})["trainer"]
    assert trainer.state.global_step == 10
    terms = [h for h in trainer.state.log_history if "sago_conf_loss" in h]
    assert [h["step"] for h in terms] == [5, 10] and all(math.isfinite(h["sago_conf_loss"]) for h in terms)
    assert any(h["sago_conf_loss"] > 0 for h in terms)  # the variants' distributions differ from the canonical's
    assert all("sago_act_loss" not in h for h in trainer.state.log_history)  # act_weight 0: no activation term


def test_accuracy_beside_stability_example(capsys):
    """accuracy.md's example: the entry ranked first on stability alone is named as the less accurate one."""
    ns = run_block("docs/accuracy.md", "result = compare_evaluations(", {})
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("set 'capitals'") and "B ranks first but is less accurate than A" in line
                         and "consistently wrong?" in line for line in lines)
    assert [c["line"] for c in ns["result"]["accuracy"]["checks"]] == lines


def test_consistency_example(tmp_path, monkeypatch):
    """stability-loss.md's consistency example, as written: an EMA teacher, fresh variants, an unlabeled prompt."""
    monkeypatch.chdir(tmp_path)
    ns = run_block("docs/stability-loss.md", 'config = StabilityConfig(mode="consistency"', {})
    trainer = ns["distill"]
    assert trainer.state.global_step == 4
    conf = [h["sago_conf_loss"] for h in trainer.state.log_history if "sago_conf_loss" in h]
    assert conf and all(math.isfinite(v) and v >= 0 for v in conf)
    assert trainer._sago_teacher.kind == "ema"


@pytest.mark.slow
def test_stability_trainer_examples(tmp_path, monkeypatch):
    """Both examples of stability-loss.md, as written: the second continues the first's names (as it says)."""
    monkeypatch.chdir(tmp_path)
    ns = run_block("docs/stability-loss.md", "trainer = StabilityTrainer(", {})
    trainer = ns["trainer"]
    assert trainer.state.global_step == 20
    sago = next(cb for cb in trainer.callback_handler.callbacks if type(cb).__name__ == "SAGOCallback")
    assert not sago.failures
    # Step 10 is SAGO's first periodic evaluation: without generation (generation_every=4), unless every axis
    # needs generation (the defaults, confidence and generation): then every evaluation is complete.
    cheap = (10,) if set(sago.config.axes) - set(GENERATION_AXES) else ()
    assert_sago_logged(trainer.state.log_history, [0, 10, 20], list(bundled_sets()), sago.config.axes, cheap)

    run_block("docs/stability-loss.md", "trainer = StabilitySFTTrainer(", ns)
    trainer = ns["trainer"]
    assert trainer.state.global_step == 20
    losses = [h["sago_act_loss"] for h in trainer.state.log_history if "sago_act_loss" in h]
    assert losses and all(math.isfinite(v) for v in losses)
    assert_sago_logged(trainer.state.log_history, [0, 10, 20], list(bundled_sets()), sago.config.axes, cheap)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.slow
def test_trl_script(tmp_path):
    """monitoring.md's TRL-style script as a file, on the shipped tiny model and the demo's SFT data: SAGO
    options from a ``--config`` YAML and from flags."""
    (tmp_path / "sft_sago.py").write_text(block("docs/monitoring.md", "parser = TrlParser("))
    (tmp_path / "data").mkdir()
    shutil.copy(DEMO_TRAIN, tmp_path / "data" / "train.jsonl")  # --dataset_name data: its train split
    (tmp_path / "sago.yaml").write_text("sago_sets: tiny\nsago_max_groups: 4\nsago_axes: activation,confidence_prob\n"
                                        "sago_early_stopping_metric: sago/paraphrase/activation\n")
    argv = ["--config", "sago.yaml", "--model_name_or_path", str(tiny_model_path()), "--dataset_name", "data",
            "--output_dir", "out", "--max_steps", "3", "--bf16", "false", "--report_to", "none",
            "--disable_tqdm", "true", "--sago_eval_steps", "2"]
    proc = subprocess.run([sys.executable, "sft_sago.py", *argv], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    history = [json.loads(line) for line in (tmp_path / "out" / "sago" / "history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [0, 2, 3]  # baseline, --sago_eval_steps 2, the final evaluation
    assert sorted(history[0]["sets"]) == sorted(bundled_sets())
    assert all(h["sets"]["typo"]["confidence_prob"]["n"] == 4 for h in history)  # sago_max_groups: 4
    state = json.loads((tmp_path / "out" / "checkpoint-3" / "trainer_state.json").read_text())
    assert_sago_logged(state["log_history"], [0, 2, 3], list(bundled_sets()), ["activation", "confidence_prob"], (2,))
    assert sorted(history[0]["sets"]["typo"]) == ["activation", "confidence_prob", "instability"]  # sago_axes (YAML)


def test_trl_command_and_yaml_parse(tmp_path, monkeypatch):
    """monitoring.md's command lines and YAML for the script parse into what they say (model and data are only
    strings at parse time; the set files are the bundled ones, copied where the page names them)."""
    from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser

    from sago_train import SAGOArguments

    monkeypatch.chdir(tmp_path)
    copy_bundled_sets(["paraphrase", "typo"])
    (tmp_path / "sft_sago.yaml").write_text(block("docs/monitoring.md", "sago_sets:", "yaml"))
    shell = block("docs/monitoring.md", "python sft_sago.py", "bash").replace("\\\n", " ")
    commands = [shlex.split(line, comments=True) for line in shell.splitlines() if line.strip()]
    assert [c[:2] for c in commands] == [["python", "sft_sago.py"]] * 2
    parsed = []
    for command in commands:
        parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig, SAGOArguments))
        # bf16 is SFTConfig's default, which this CPU-only machine refuses: the one argument added here.
        parsed.append(parser.parse_args_and_config([*command[2:], "--bf16", "false"]))
    for script_args, training_args, model_args, sago_args in parsed:
        assert script_args.dataset_name == "trl-lib/Capybara"
        assert model_args.model_name_or_path == "Qwen/Qwen2.5-0.5B-Instruct" and training_args.output_dir == "out"
        assert sago_args.sago_config().max_groups == 64
        assert list(sago_args.variant_sets()) == ["paraphrase", "typo"]
    # The command line watches stability and accuracy with one stopper (issue 33); the YAML one metric.
    assert parsed[0][3].early_stopping_kwargs()["metric"] == "sago/paraphrase/accuracy,sago/paraphrase/generation"
    assert parsed[1][3].early_stopping_kwargs()["metric"] == "sago/paraphrase/accuracy"
    assert parsed[0][3].sago_eval_steps == 100 and parsed[0][3].sago_config().axes == SAGOConfig().axes
    assert parsed[1][3].sago_config().axes == ["confidence", "generation"]


def test_yaml_blocks_are_run():
    """The only YAML block is the TRL script's config, which the test above parses."""
    blocks = [(page_name(p), b) for p in PAGES for _, b in fenced_blocks(p, "yaml")]
    assert [(page, "sago_sets:" in b) for page, b in blocks] == [("docs/monitoring.md", True)]


def test_every_monitoring_recipe_says_what_it_costs():
    """Issue 33: the manual's early-stopping recipe cost 145% of training, unsaid. Every SAGOCallback a Python
    block of the README or the manual builds has its cost beside it (the comment line above it: a share of
    training time), and one without eval_steps keeps within that share: the automatic cadence's budget."""
    import re

    seen = 0
    for page in PAGES:
        for _, body in fenced_blocks(page, "python"):
            lines = body.splitlines()
            for i, line in enumerate(lines):
                code = line.split("#")[0]  # a mention in a comment builds nothing
                if "SAGOCallback(" not in code or "SAGOCallback.from_args" in code:
                    continue
                if "=" not in code.split("SAGOCallback(")[0] and "callbacks=[" not in code:
                    continue
                above = next((x for x in reversed(lines[:i]) if x.strip()), "")
                said = re.search(r"at most (\d+)% of training time", above)
                assert said, f"{page_name(page)}: {line.strip()} (no cost said above it)"
                assert int(said.group(1)) <= 25
                if "eval_steps" not in line:
                    budget = re.search(r"overhead_budget=([0-9.]+)", line)
                    assert int(said.group(1)) == round(100 * (float(budget.group(1)) if budget else 0.05))
                seen += 1
    assert seen >= 5

