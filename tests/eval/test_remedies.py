"""Every warning's remedy is valid where it is printed: a flag on the command line, a SAGOCallback argument
inside a Trainer, a SAGOConfig field in Python, a recipe key under ``sago-train run``; never a chat template
for a tokenizer without one. Each test follows the remedy printed and checks that it runs."""

from __future__ import annotations

import ast
import json
import re
import shlex
import warnings

import pytest

from sago_train import SAGOCallback, SAGOConfig, SAGOEvaluator
from sago_train.cli.main import main
from sago_train.data import VariantSet
from sago_train.eval.extraction import Extractor
from sago_train.integrations.measure import run_evaluator
from sago_train.results.degenerate import setting

from .._helpers.tiny import make_byte_tokenizer

QA = "Question: What is the capital of {}?\nAnswer:"
RECORDS = [{"id": f"g{i}", "variants": [QA.format(f"C{i}"), QA.format(f"c{i}")], "reference": f"X{i}"}
           for i in range(4)]


def _patch(monkeypatch, outputs):
    monkeypatch.setattr(Extractor, "_prefill_unsupported", lambda *_a: "test: generations patched")
    monkeypatch.setattr(Extractor, "generate", lambda self, prompts: [outputs(i) for i in range(len(prompts))])


def _sets():
    return {"t": VariantSet.from_records(RECORDS, name="t")}


def _call_args(note: str, owner: str) -> list[dict]:
    """Every ``owner(name=value)`` a note suggests, as keyword arguments."""
    return [{m.group(1): ast.literal_eval(m.group(2))} for m in re.finditer(owner + r"\((\w+)=(.+?)\)(?=[),;]|$)", note)]


def _flags(note: str) -> list[list[str]]:
    """Every ``--flag value`` a note suggests."""
    return [shlex.split(m.group(0)) for m in re.finditer(r"--[a-z-]+ (?:'[^']*'|\S+?)(?=[),;]|$)", note)]


def test_setting_names_the_remedy_where_it_is_printed():
    assert setting("chat_template", "never", "cli") == "--chat-template never"
    assert setting("max_new_tokens", 16, "callback") == "SAGOCallback(max_new_tokens=16)"
    assert setting("stop_strings", ["\n"], "python") == "SAGOConfig(stop_strings=['\\n'])"
    assert setting("stop_strings", ["\n"], "recipe") == "monitor.options.stop_strings: ['\\n']"


def test_inside_a_trainer_the_remedies_are_sagocallback_arguments_that_run(tiny_llama, byte_tokenizer, monkeypatch):
    _patch(monkeypatch, lambda i: "")  # empty generations: the degenerate-output warning
    cb = SAGOCallback(_sets(), max_new_tokens=8)
    ev = run_evaluator(tiny_llama, byte_tokenizer, cb.sets, cb.config, 0, disable_bar=True,
                       remedy_style=cb.remedy_style)
    (note,) = ev.warnings
    assert "--" not in note  # no command-line flag inside a Trainer script
    suggested = _call_args(note, "SAGOCallback")
    assert {next(iter(kw)) for kw in suggested} == {"chat_template", "max_new_tokens"}
    for kwargs in suggested:  # following each one builds the callback and evaluates
        followed = SAGOCallback(_sets(), **kwargs)
        run_evaluator(tiny_llama, byte_tokenizer, followed.sets, followed.config, 0, disable_bar=True)


def test_in_python_the_remedies_are_sagoconfig_fields_that_run(tiny_llama, byte_tokenizer, monkeypatch):
    _patch(monkeypatch, lambda i: f" X{i // 2} and then it goes on and on")  # runs on to max_new_tokens
    (note,) = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="generation", max_new_tokens=8).evaluate(_sets()).warnings
    suggested = _call_args(note, "SAGOConfig")
    assert {next(iter(kw)) for kw in suggested} == {"max_new_tokens", "stop_strings"}
    for kwargs in suggested:
        SAGOEvaluator(tiny_llama, byte_tokenizer, config=SAGOConfig(axes="generation", **kwargs)).evaluate(_sets())


def test_no_chat_template_is_suggested_to_a_tokenizer_without_one(tiny_llama, monkeypatch):
    _patch(monkeypatch, lambda i: "")
    tok = make_byte_tokenizer(chat_template=None)
    (note,) = SAGOEvaluator(tiny_llama, tok, axes="generation", max_new_tokens=8).evaluate(_sets()).warnings
    assert "chat_template" not in note and "has no chat template" in note
    for kwargs in _call_args(note, "SAGOConfig"):  # what is suggested runs
        SAGOEvaluator(tiny_llama, tok, config=SAGOConfig(axes="generation", **kwargs)).evaluate(_sets())


def test_on_the_command_line_the_remedies_are_flags_that_run(saved_tiny_model, tmp_path, monkeypatch):
    _patch(monkeypatch, lambda i: "")
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    argv = ["eval", "--model", str(saved_tiny_model), "--set", f"t={path}", "--axes", "generation",
            "--max-new-tokens", "8", "--quiet", "--device", "cpu", "--n-bootstrap", "100"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    (note,) = json.loads((tmp_path / "a" / "summary.json").read_text())["warnings"]
    flags = _flags(note)
    assert [f[0] for f in flags] == ["--chat-template", "--max-new-tokens"]
    for i, flag in enumerate(flags):
        assert main([*argv, *flag, "--out", str(tmp_path / f"b{i}")]) == 0


def test_the_always_rule_refused_without_a_template_names_both_places():
    with pytest.raises(Exception, match="no chat template") as err:
        SAGOConfig(chat_template="always") and SAGOEvaluator(None, make_byte_tokenizer(chat_template=None),
                                                              chat_template="always")
    assert "chat_template 'never'" in err.value.hint and "--chat-template" in err.value.hint


def test_under_sago_train_run_the_remedies_are_recipe_keys_that_load(tiny_llama, byte_tokenizer, monkeypatch,
                                                                     tmp_path):
    from pathlib import Path

    from sago_train.cli.recipe import load_recipe
    from sago_train.cli.runner import build_trainer

    demo = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"
    base = ["--training.report_to=[]"]
    trainer = build_trainer(load_recipe(demo, base), output_dir=str(tmp_path / "run"))
    (cb,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, SAGOCallback)]
    assert cb.remedy_style == "recipe"
    _patch(monkeypatch, lambda i: "")
    ev = run_evaluator(tiny_llama, byte_tokenizer, _sets(), cb.config, 0, disable_bar=True,
                       remedy_style=cb.remedy_style)
    (note,) = ev.warnings
    keys = re.findall(r"(monitor\.options\.\w+): ([^),;]+)", note)
    assert [k for k, _ in keys] == ["monitor.options.chat_template", "monitor.options.max_new_tokens"]
    for key, value in keys:  # each one, as a recipe override, loads and builds the run
        recipe = load_recipe(demo, [*base, f"--{key}={value}"])
        assert str(recipe.monitor.options[key.rsplit(".", 1)[1]]) == value
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # the recipe's collator renders as its monitor evaluates
            built = build_trainer(recipe, output_dir=str(tmp_path / key))
        if key.endswith("chat_template"):
            assert built.data_collator.renderer.rule == value
