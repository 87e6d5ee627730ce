"""``SAGOArguments``: the SAGO flags of an ``HfArgumentParser`` / ``TrlParser`` script, generated from the one
declaration of each setting, combined with the Trainer's and TRL's own argument dataclasses."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from transformers import HfArgumentParser, TrainingArguments
from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser

from sago_train import (
    SAGOArguments,
    SAGOCallback,
    SAGOConfig,
    SAGOEarlyStoppingCallback,
    SagoInputError,
    StabilityConfig,
    bundled_sets,
)
from sago_train.data.sources import bundled_set_paths
from sago_train.integrations.arguments import SOURCES, flag_names
from sago_train.integrations.options import MonitorOptions

BASE = ["--output_dir", "out", "--bf16", "false"]  # SFTConfig defaults to bf16, which the CPU lacks


def trl_parser() -> TrlParser:
    return TrlParser((ScriptArguments, SFTConfig, ModelConfig, SAGOArguments))


def parse(argv: list[str]) -> typing.Any:
    return trl_parser().parse_args_and_config([*BASE, *argv])[-1]


def test_flags_are_the_declared_fields_with_their_help_and_default():
    fields = {f.name: f for f in dataclasses.fields(SAGOArguments)}
    expected = {"sago_sets"}
    for _group, cls, prefix in SOURCES:
        for f in dataclasses.fields(cls):
            if f.metadata["help"].startswith("Deprecated name of "):
                assert prefix + f.name not in fields  # aliases get no new flag
                continue
            expected.add(prefix + f.name)
            g = fields[prefix + f.name]
            assert g.metadata["help"] == f.metadata["help"].split(" On the command line:")[0]
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            got = g.default_factory() if g.default_factory is not dataclasses.MISSING else g.default
            assert got == default, prefix + f.name
    assert set(fields) == expected
    # Settings that exist under the same name in TrainingArguments and in two SAGO sources stay apart.
    names = flag_names()
    assert names["monitor"]["eval_steps"] == "sago_eval_steps" and names["eval"]["seed"] == "sago_seed"
    assert names["stability"]["layers"] == "sago_stability_layers" and names["eval"]["layers"] == "sago_layers"
    assert names["early_stopping"]["mode"] == "sago_early_stopping_mode"


def test_defaults_build_the_defaults():
    args = parse([])
    assert args.sago_config() == SAGOConfig()
    assert args.stability_config() == StabilityConfig()
    assert args.callback_kwargs() == dataclasses.asdict(MonitorOptions())


@pytest.mark.parametrize("classes", [
    (TrainingArguments, SAGOArguments),
    (ScriptArguments, TrainingArguments, ModelConfig, SAGOArguments),
    (ScriptArguments, SFTConfig, ModelConfig, SAGOArguments),
])
def test_no_flag_clashes_with_trainer_or_trl_arguments(classes):
    # HfArgumentParser raises argparse.ArgumentError on a flag declared twice: building the parser is the check.
    parser = HfArgumentParser(classes)
    parsed = parser.parse_args_into_dataclasses([*BASE, "--sago_max_groups", "16", "--eval_steps", "7",
                                                 "--sago_eval_steps", "5", "--seed", "3", "--sago_seed", "9"])
    training = next(p for p in parsed if isinstance(p, TrainingArguments))
    sago = parsed[-1]
    assert (training.eval_steps, training.seed) == (7, 3)
    assert (sago.sago_eval_steps, sago.sago_seed, sago.sago_max_groups) == (5, 9, 16)


def test_parsed_flags_build_the_callback_built_by_keywords():
    args = parse(["--sago_sets", "tiny", "--sago_eval_steps", "5", "--no_sago_baseline", "--sago_log_level", "full",
                  "--sago_axes", "activation", "confidence", "--sago_layers", "0", "-1", "--sago_max_groups", "4",
                  "--sago_stop_strings", "Q:", "###", "--sago_prompt_pooling", "mean", "--sago_overwrite",
                  "--sago_log_unstable_groups", "3", "--no_sago_evaluate_at_end", "--sago_raise_on_error", "true"])
    from_flags = SAGOCallback.from_args(args)
    by_keywords = SAGOCallback(bundled_sets(), eval_steps=5, baseline=False, log_level="full",
                               axes="activation,confidence", layers=[0, -1], max_groups=4, stop_strings=["Q:", "###"],
                               prompt_pooling="mean", overwrite=True, log_unstable_groups=3, evaluate_at_end=False,
                               raise_on_error=True)
    assert from_flags.config == by_keywords.config
    assert from_flags.config.axes == ["activation", "confidence"] and from_flags.config.layers == [0, -1]
    assert from_flags.options == by_keywords.options and from_flags.soft_failures == by_keywords.soft_failures
    assert list(from_flags.sets) == list(by_keywords.sets) == ["format", "paraphrase", "typo"]
    assert [g.id for g in from_flags.sets["typo"].groups] == [g.id for g in by_keywords.sets["typo"].groups]
    # Keywords given to from_args win over the flags (objects such as the tokenizer have no flag).
    assert SAGOCallback.from_args(args, eval_steps=7, soft_failures=True).options.eval_steps == 7


def test_sets_as_name_equals_file_and_axes_comma_separated(tmp_path):
    paths = bundled_set_paths("tiny")
    args = parse(["--sago_sets", f"p={paths['paraphrase']}", f"t={paths['typo']}", "--sago_axes",
                  "activation,generation"])
    cb = SAGOCallback.from_args(args)
    assert list(cb.sets) == ["p", "t"]
    assert len(cb.sets["p"].groups) == len(bundled_sets()["paraphrase"].groups)
    assert cb.config.axes == ["activation", "generation"]


def test_stability_and_early_stopping_from_the_same_args():
    args = parse(["--sago_sets", "tiny", "--sago_stability_act_weight", "1.0", "--sago_stability_mode", "anchor",
                  "--sago_stability_layers", "1", "2", "--sago_stability_warmup_steps", "10",
                  "--sago_early_stopping_metric", "sago/typo/confidence", "--sago_early_stopping_patience", "2",
                  "--sago_early_stopping_mode", "threshold", "--sago_early_stopping_min_delta", "0.01"])
    assert args.stability_config() == StabilityConfig(act_weight=1.0, mode="anchor", layers=[1, 2], warmup_steps=10)
    stop = SAGOEarlyStoppingCallback.from_args(args)
    ref = SAGOEarlyStoppingCallback("sago/typo/confidence", patience=2, mode="threshold", min_delta=0.01)
    assert (stop.set_name, stop.axis, stop.patience, stop.alpha, stop.min_delta, stop.mode) == \
        (ref.set_name, ref.axis, ref.patience, ref.alpha, ref.min_delta, ref.mode)


@pytest.mark.parametrize(("argv", "flag"), [
    (["--sago_max_groups", "-1"], "--sago_max_groups"),
    (["--sago_similarity", "tokenf1"], "--sago_similarity"),
    (["--sago_axes", "activaton"], "--sago_axes"),
    (["--sago_layers", "0", "--sago_stability_layers", "1", "--sago_stability_mode", "centriod"],
     "--sago_stability_mode"),
    (["--sago_stability_temperature", "0"], "--sago_stability_temperature"),
    (["--sago_sets", "tiny", "--sago_eval_steps", "0"], "--sago_eval_steps"),
    (["--sago_sets", "tiny", "--sago_log_level", "everything"], "--sago_log_level"),
    (["--sago_sets", "missing.jsonl"], "--sago_sets"),
    (["--sago_sets", "tiny", "tiny"], "--sago_sets"),
    (["--sago_sets", "tiny", "--sago_early_stopping_metric", "sago/typoo/activation"], "--sago_early_stopping_metric"),
    (["--sago_sets", "tiny", "--sago_axes", "confidence", "--sago_early_stopping_metric", "sago/typo/activation"],
     "--sago_early_stopping_metric"),
    (["--sago_early_stopping_metric", "paraphrase/activation"], "--sago_early_stopping_metric"),
    (["--sago_early_stopping_metric", "sago/p/activation", "--sago_early_stopping_alpha", "2"],
     "--sago_early_stopping_alpha"),
])
def test_invalid_values_fail_at_parse_time_naming_the_flag(argv, flag):
    with pytest.raises(SagoInputError) as err:
        parse(argv)
    assert err.value.key == flag and f"'{flag}'" in str(err.value)


def test_unknown_or_malformed_flags_are_named():
    with pytest.raises(ValueError, match="--sago_max_grups"):
        parse(["--sago_max_grups", "4"])  # HfArgumentParser: "Some specified arguments are not used"
    with pytest.raises(SystemExit):  # argparse: not an integer (the message names the flag on stderr)
        parse(["--sago_max_groups", "four"])
    with pytest.raises(SystemExit):
        parse(["--sago_prompt_pooling", "max"])  # declared choices reach argparse


def test_missing_sets_or_metric_name_the_flag():
    args = parse([])
    with pytest.raises(SagoInputError, match="--sago_sets"):
        SAGOCallback.from_args(args)
    with pytest.raises(SagoInputError, match="--sago_early_stopping_metric"):
        SAGOEarlyStoppingCallback.from_args(args)


def test_help_shows_every_flag_with_its_help(capsys):
    with pytest.raises(SystemExit):
        HfArgumentParser((TrainingArguments, SAGOArguments)).parse_args_into_dataclasses(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "SAGO (sago_train):" in out
    for f in dataclasses.fields(SAGOArguments):
        assert f"--{f.name}" in out
        assert " ".join(f.metadata["help"].split())[:40] in out, f.name


def test_yaml_config_file(tmp_path):
    paths = bundled_set_paths("tiny")
    config = tmp_path / "sft.yaml"
    config.write_text(
        "output_dir: out\nbf16: false\n"
        f"sago_sets: [\"para={paths['paraphrase']}\", \"ty={paths['typo']}\"]\n"
        "sago_max_groups: 8\nsago_axes: activation,confidence\nsago_layers: -1\nsago_baseline: false\n"
        "sago_stability_conf_weight: 0.5\nsago_early_stopping_metric: sago/ty/confidence\n"
    )
    parsed = trl_parser().parse_args_and_config(["--config", str(config), "--sago_max_groups", "6"])
    training, args = parsed[1], parsed[-1]
    assert training.output_dir == "out"
    cb = SAGOCallback.from_args(args)
    assert list(cb.sets) == ["para", "ty"] and cb.options.baseline is False
    assert cb.config == SAGOConfig(axes="activation,confidence", layers=[-1], max_groups=6)  # command line wins
    assert args.stability_config() == StabilityConfig(conf_weight=0.5)
    assert SAGOEarlyStoppingCallback.from_args(args).axis == "confidence"
    # A single string for a list key (YAML sets values without argparse's conversion) is one item.
    config.write_text("output_dir: out\nbf16: false\nsago_sets: tiny\nsago_stop_strings: 'Q:'\n")
    args = trl_parser().parse_args_and_config(["--config", str(config)])[-1]
    assert args.sago_sets == ["tiny"] and args.sago_config().stop_strings == ["Q:"]
    config.write_text("output_dir: out\nbf16: false\nsago_max_groups: -1\n")
    with pytest.raises(SagoInputError, match="--sago_max_groups"):
        trl_parser().parse_args_and_config(["--config", str(config)])
    config.write_text("output_dir: out\nbf16: false\nsago_max_grups: 4\n")
    with pytest.raises(ValueError, match="sago_max_grups"):
        trl_parser().parse_args_and_config(["--config", str(config)])


def test_stop_strings_read_backslash_escapes_like_the_eval_cli():
    """'\\n' typed on a shell is a newline for --sago_stop_strings, as for sago-train eval --stop."""
    from transformers import HfArgumentParser, TrainingArguments

    from sago_train import SAGOArguments
    from sago_train.cli.eval_cmd import config_from_args
    from sago_train.cli.main import build_parser

    _, sago = HfArgumentParser((TrainingArguments, SAGOArguments)).parse_args_into_dataclasses(
        ["--output_dir", "out", "--sago_stop_strings", "\\n", "Q:"])
    assert sago.sago_config().stop_strings == ["\n", "Q:"]
    cli = config_from_args(build_parser().parse_args(["eval", "--stop", "\\n", "--stop", "Q:"]))
    assert cli.stop_strings == sago.sago_config().stop_strings


def test_sago_sets_names_one_bundled_set():
    from sago_train.data import bundled_sets

    sets = parse(["--sago_sets", "real/capitals", "tiny"]).variant_sets()
    assert list(sets)[0] == "capitals" and len(sets["capitals"]) == len(bundled_sets("real")["capitals"])


def test_sago_sets_are_read_lazily(tmp_path, monkeypatch):
    """Issue 22: --sago_sets parsed every group although the callback evaluates a capped subset."""
    from .._helpers.lazy_sets import parsed_bytes, set_with_garbage_outside_the_subset

    path = tmp_path / "s.jsonl"
    ids, kept_bytes = set_with_garbage_outside_the_subset(path, n=50, max_groups=3)
    with parsed_bytes(monkeypatch) as seen:
        sago = parse(["--sago_sets", f"s={path}", "--sago_max_groups", "3"])
    assert [g.id for g in sago.variant_sets()["s"]] == ids
    assert seen == {str(path): kept_bytes}
