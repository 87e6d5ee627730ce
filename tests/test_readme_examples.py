"""Every Python block of README.md runs as written. The blocks are found by parsing the file; each is named below
by a line only it contains, and a block that no test runs fails :func:`test_every_python_block_is_run`.

Where a block says its names are the reader's own (``# model, tokenizer ...: yours``), the test defines exactly
those names first (a prelude: the shipped tiny model, tiny data, the bundled sets copied where the block reads
them) and never edits the block's lines. Each runs in a fresh temporary directory."""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DEMO_TRAIN = ROOT / "sago_train" / "assets" / "demo" / "train.jsonl"

#: Each README Python block, by a line that only it contains -> the test that runs it.
BLOCKS = {
    "evaluator = SAGOEvaluator(": "test_evaluator_example",
    "sago = SAGOCallback(": "test_callback_example",
    "trainer = StabilityTrainer(": "test_stability_trainer_examples",
    "trainer = StabilitySFTTrainer(": "test_stability_trainer_examples",
    "parser = TrlParser(": "test_trl_script",
}


def fenced_blocks(language: str) -> list[str]:
    """The bodies of README's fenced blocks tagged ``language``, from a line-by-line parse of the file."""
    blocks: list[str] = []
    current: list[str] | None = None
    fence_lang = None
    for line in README.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if current is None and stripped.startswith("```"):
            fence_lang = stripped[3:].strip().lower()
            current = []
        elif current is not None and stripped == "```":
            if fence_lang == language:
                blocks.append("\n".join(current) + "\n")
            current = None
        elif current is not None:
            current.append(line)
    assert current is None, "README.md: a fenced block is not closed"
    return blocks


def block(marker: str, language: str = "python") -> str:
    found = [b for b in fenced_blocks(language) if marker in b]
    assert len(found) == 1, f"README.md: {len(found)} {language} blocks contain {marker!r}"
    return found[0]


def run_block(marker: str, namespace: dict[str, Any]) -> dict[str, Any]:
    exec(compile(block(marker), f"README.md ({marker.strip()})", "exec"), namespace)  # noqa: S102
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
GENERATION_AXES = ("generation", "mirroring")


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


def test_every_python_block_is_run():
    blocks = fenced_blocks("python")
    text = README.read_text(encoding="utf-8")
    # Every fence that opens Python code (```py, ```Python, indented) is one the parse above found.
    openers = re.findall(r"^[ \t]*```[ \t]*(?:py|python|python3)[ \t]*$", text, flags=re.M | re.I)
    assert len(openers) == len(blocks) >= 5
    for b in blocks:
        owners = [m for m in BLOCKS if m in b]
        assert len(owners) == 1, f"README.md Python block run by no test (add it to BLOCKS):\n{b[:300]}"
    for marker, test in BLOCKS.items():
        assert sum(marker in b for b in blocks) == 1, marker
        assert callable(globals().get(test)), test


def test_evaluator_example(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    copy_bundled_sets(["paraphrase"])
    model, tokenizer = load_tiny_model()
    ns = run_block("evaluator = SAGOEvaluator(", {"model": model, "tokenizer": tokenizer})
    summary = ns["result"].sets["paraphrase"].summaries["activation"]
    assert "Summary(mean=" in capsys.readouterr().out
    # The summary is the mean of the per-group values the block wrote.
    records = [json.loads(line) for line in (tmp_path / "results" / "paraphrase.jsonl").read_text().splitlines()]
    values = [r["axes"]["activation"] for r in records]
    assert summary.n == len(values) == len(bundled_sets()["paraphrase"].groups)
    assert summary.mean == pytest.approx(float(np.mean(values)), rel=1e-9) and summary.mean > 0
    assert summary.ci_low <= summary.mean <= summary.ci_high
    assert "paraphrase" in json.loads((tmp_path / "results" / "summary.json").read_text())["sets"]


def _tokenized_train_ds(tokenizer: Any, length: int = 16) -> list[dict[str, list[int]]]:
    """The demo's SFT records as fixed-length causal-LM examples (the Trainer's default collator pads no labels)."""
    out = []
    for line in DEMO_TRAIN.read_text().splitlines():
        record = json.loads(line)
        enc = tokenizer(record["prompt"] + record["completion"], padding="max_length", max_length=length,
                        truncation=True)
        labels = [t if m else -100 for t, m in zip(enc["input_ids"], enc["attention_mask"], strict=True)]
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels})
    return out


@pytest.mark.slow
def test_callback_example(tmp_path, monkeypatch):
    from transformers import TrainingArguments

    monkeypatch.chdir(tmp_path)
    copy_bundled_sets(["paraphrase", "typo"])
    model, tokenizer = load_tiny_model()
    args = TrainingArguments("out", max_steps=2, per_device_train_batch_size=4, report_to=[], save_strategy="no",
                             disable_tqdm=True)
    ns = run_block("sago = SAGOCallback(", {"model": model, "tokenizer": tokenizer, "args": args,
                                            "train_ds": _tokenized_train_ds(tokenizer)})
    trainer, sago, stop = ns["trainer"], ns["sago"], ns["stop"]
    assert trainer.state.global_step == 2 and not sago.failures
    assert_sago_logged(trainer.state.log_history, [0, 2], ["paraphrase", "typo"], sago.config.axes)
    history = [json.loads(line) for line in (tmp_path / "out" / "sago" / "history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [0, 2]
    # The early stopper was fed by the callback: its best is the step-2 evaluation (the step-0 baseline is never
    # the best), with the mean logged for it.
    logged = {step: row["eval_sago/paraphrase/activation"] for step, row in sago_rows(trainer.state.log_history).items()}
    assert stop.best_step == 2 and stop.best_mean == pytest.approx(logged[2], rel=1e-6)
    assert [d["step"] for d in stop.decisions] == [0, 2] and stop.decisions[0]["verdict"].startswith("baseline")


@pytest.mark.slow
def test_stability_trainer_examples(tmp_path, monkeypatch):
    """Both stability examples, as written: the second continues the first's names (as the README says)."""
    monkeypatch.chdir(tmp_path)
    ns = run_block("trainer = StabilityTrainer(", {})
    trainer = ns["trainer"]
    assert trainer.state.global_step == 20
    sago = next(cb for cb in trainer.callback_handler.callbacks if type(cb).__name__ == "SAGOCallback")
    assert not sago.failures
    # Step 10 is SAGO's first periodic evaluation: without generation (generation_every=4).
    assert_sago_logged(trainer.state.log_history, [0, 10, 20], list(bundled_sets()), sago.config.axes, (10,))

    run_block("trainer = StabilitySFTTrainer(", ns)
    trainer = ns["trainer"]
    assert trainer.state.global_step == 20
    losses = [h["sago_act_loss"] for h in trainer.state.log_history if "sago_act_loss" in h]
    assert losses and all(math.isfinite(v) for v in losses)
    assert_sago_logged(trainer.state.log_history, [0, 10, 20], list(bundled_sets()), sago.config.axes, (10,))


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.slow
def test_trl_script(tmp_path):
    """The TRL-style script as a file, on the shipped tiny model and the demo's SFT data: SAGO options from a
    ``--config`` YAML and from flags."""
    (tmp_path / "sft_sago.py").write_text(block("parser = TrlParser("))
    (tmp_path / "data").mkdir()
    shutil.copy(DEMO_TRAIN, tmp_path / "data" / "train.jsonl")  # --dataset_name data: its train split
    (tmp_path / "sago.yaml").write_text("sago_sets: tiny\nsago_max_groups: 4\nsago_axes: activation,confidence\n"
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
    assert all(h["sets"]["typo"]["confidence"]["n"] == 4 for h in history)  # sago_max_groups: 4
    state = json.loads((tmp_path / "out" / "checkpoint-3" / "trainer_state.json").read_text())
    assert_sago_logged(state["log_history"], [0, 2, 3], list(bundled_sets()), ["activation", "confidence"], (2,))
    assert sorted(history[0]["sets"]["typo"]) == ["activation", "confidence", "instability"]  # sago_axes (YAML)


def test_trl_command_and_yaml_parse(tmp_path, monkeypatch):
    """The README's command line and YAML for the script parse into what they say (model and data are only
    strings at parse time; the set files are the bundled ones, copied where the README names them)."""
    from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser

    from sago_train import SAGOArguments

    monkeypatch.chdir(tmp_path)
    copy_bundled_sets(["paraphrase", "typo"])
    (tmp_path / "sft_sago.yaml").write_text(block("sago_sets:", "yaml"))
    shell = block("python sft_sago.py", "bash").replace("\\\n", " ")
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
        assert sago_args.early_stopping_kwargs()["metric"] == "sago/paraphrase/activation"
    assert parsed[0][3].sago_eval_steps == 100 and parsed[0][3].sago_config().axes == SAGOConfig().axes
    assert parsed[1][3].sago_config().axes == ["activation", "confidence"]



def _shell_commands() -> list[list[str]]:
    """Every command line of README's bash blocks, continuation lines joined and comments dropped."""
    out = []
    for text in fenced_blocks("bash"):
        for line in text.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


def test_shell_commands_name_what_exists():
    """A cheap check of the bash blocks: each ``sago-train`` command line parses with the CLI's own parser (a
    ``run`` line's overrides with the recipe's), each ``make`` target and each script exists."""
    from sago_train.cli.main import build_parser
    from sago_train.cli.recipe import parse_recipe
    from sago_train.cli.recipe_yaml import apply_overrides, load_yaml, parse_overrides

    makefile = (ROOT / "Makefile").read_text()
    checked = {"sago-train": 0, "make": 0, "python": 0}
    for words in _shell_commands():
        if "sago_train.cli.main" in words:  # torchrun ... -m sago_train.cli.main eval ...
            words = ["sago-train", *words[words.index("sago_train.cli.main") + 1:]]
        if words[0] == "sago-train":
            args, extra = build_parser().parse_known_args(words[1:])  # SystemExit on an unknown flag
            if args.command == "run":
                parse_recipe(apply_overrides(load_yaml(ROOT / args.recipe), parse_overrides(extra)),
                             source=args.recipe)
            else:
                assert not extra, words
        elif words[0] == "make":
            assert re.search(rf"^{re.escape(words[1])}:", makefile, flags=re.M), words
        elif words[0] == "python" and words[1] != "sft_sago.py":  # the README's own script: test_trl_script
            assert (ROOT / words[1]).is_file(), words
        else:
            continue
        checked[words[0]] += 1
    assert all(checked.values()), checked
