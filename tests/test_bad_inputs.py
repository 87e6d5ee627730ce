"""The bad-input corpus (tests/fixtures/bad/): every file gets one clear error line, never a traceback.

Data-driven from ``tests/fixtures/bad/EXPECTED.yaml``: each file goes through (a) the CLI in-process
(exit code 2, exactly one stderr line ``sago-train <cmd>: error: ...`` naming the file, line and field) and
(b) the Python API (``SagoInputError`` with the same text), or is accepted where the SPEC accepts it. A few
cases also run in a real subprocess, with a timeout, to prove that no traceback reaches the terminal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sago_train.cli.main import main
from sago_train.cli.recipe import load_recipe
from sago_train.cli.runner import build_trainer
from sago_train.data.examples import load_examples
from sago_train.data.groups import VariantSet
from sago_train.errors import SagoInputError
from sago_train.model.tiny import tiny_model_path

ROOT = Path(__file__).resolve().parent.parent
BAD = Path(__file__).resolve().parent / "fixtures" / "bad"
MANIFEST: dict[str, dict[str, Any]] = yaml.safe_load((BAD / "EXPECTED.yaml").read_text(encoding="utf-8"))
ENTRIES = {"set": "eval", "recipe": "run", "groups": "run", "examples": "variants"}  # entry -> CLI command
CALL_LIMIT_S = 60  # one in-process call; a hang fails the test instead of stalling the suite
SUBPROCESS_LIMIT_S = 120


def corpus_files() -> list[str]:
    return sorted(p.name for p in BAD.iterdir() if p.is_file() and p.name != "EXPECTED.yaml"
                  and not p.name.startswith("."))


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raise TimeoutError in this (main) thread after ``seconds``; a no-op where SIGALRM does not exist."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s: the input made the call hang")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def groups_recipe(tmp_path: Path, groups_file: Path) -> Path:
    """A valid recipe whose training data (``data.train``) is ``groups_file``."""
    recipe = tmp_path / "groups_recipe.yaml"
    recipe.write_text(
        'sago_train_version: "0.1.0"\n'
        "model:\n  path: sago://tiny-llama\n"
        f"data:\n  train: {json.dumps(str(groups_file))}\n"
        "stability:\n  act_weight: 0.5\n"
        "training:\n  max_steps: 1\n  use_cpu: true\n  report_to: []\n  save_strategy: \"no\"\n",
        encoding="utf-8",
    )
    return recipe


def cli_argv(name: str, entry: str, tmp_path: Path) -> list[str]:
    path = BAD / name
    if entry == "set":
        return ["eval", "--set", f"bad={path}", "--model", tiny_model_path(), "--max-new-tokens", "2", "--quiet",
                "--axes", "activation"]
    if entry == "recipe":
        return ["run", str(path), "--dry-run", "--output-dir", str(tmp_path / "run")]
    if entry == "groups":
        return ["run", str(groups_recipe(tmp_path, path)), "--dry-run", "--output-dir", str(tmp_path / "run")]
    if entry == "examples":
        return ["variants", "--input", str(path), "--out", str(tmp_path / "out.jsonl"), "--typo-rate", "0.1"]
    raise AssertionError(f"unknown entry {entry!r}")


def call_api(name: str, entry: str, tmp_path: Path) -> Any:
    """The Python API for the entry point: raises SagoInputError for a bad input, else returns what it built."""
    path = BAD / name
    if entry == "set":
        return VariantSet.from_jsonl(path)
    if entry == "examples":
        return load_examples(path)
    recipe = load_recipe(path if entry == "recipe" else groups_recipe(tmp_path, path))
    if MANIFEST[name]["outcome"] == "error":
        build_trainer(recipe, output_dir=str(tmp_path / "api-run"))  # fails before the model loads
    return recipe


def rebind_closed_log_streams() -> None:
    """A library's log handler created during an earlier test holds that test's capture stream, closed since
    (transformers also binds the handler's ``flush`` to it); writing to it would print a logging traceback that
    is an artifact of capturing, not of the input. Point such handlers at the current stderr."""
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if type(handler) is not logging.StreamHandler:
                continue
            flush_stream = getattr(handler.__dict__.get("flush"), "__self__", None)
            if getattr(handler.stream, "closed", False) or getattr(flush_stream, "closed", False):
                handler.stream = sys.stderr  # not setStream(): it flushes the closed stream first
                handler.__dict__.pop("flush", None)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rebind_closed_log_streams()
    capsys.readouterr()
    with time_limit(CALL_LIMIT_S):
        rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def check_error_line(err: str, out: str, cmd: str, name: str, spec: dict[str, Any]) -> str:
    """The one error line, checked against the manifest entry; returns the message after the prefix."""
    assert "Traceback" not in err and "Traceback" not in out, err
    lines = err.strip().splitlines()
    if spec.get("after_model"):  # found once the model is loaded: its loading progress may come first
        lines = [line for line in lines if not line.startswith("Loading weights")]
    assert len(lines) == 1, f"expected exactly one line on stderr, got:\n{err}"
    prefix = f"sago-train {cmd}: error: "
    assert lines[0].startswith(prefix), lines[0]
    message = lines[0][len(prefix):]
    assert name in message, f"the error does not name the file: {message}"
    if "line" in spec:
        assert f"{name}:{spec['line']}:" in message, f"expected {name}:{spec['line']}: in {message}"
    assert spec["message"] in message, message
    if "also_names" in spec:
        assert spec["also_names"] in message, message
    return message


# ------------------------------------------------------------------ the manifest itself
def test_corpus_is_large_enough_and_fully_covered() -> None:
    files = corpus_files()
    assert len(files) >= 30, f"the bad-input corpus has only {len(files)} files"
    missing = sorted(set(files) - set(MANIFEST))
    assert not missing, f"files in tests/fixtures/bad/ without an entry in EXPECTED.yaml: {missing}"
    stale = sorted(set(MANIFEST) - set(files))
    assert not stale, f"EXPECTED.yaml entries without a file: {stale}"
    for name, spec in MANIFEST.items():
        assert spec["entry"] in ENTRIES, name
        assert name.startswith(spec["entry"] + "_"), f"{name}: name the file after its entry point"
        assert spec["outcome"] in ("error", "accepted"), name
        if spec["outcome"] == "error":
            assert spec.get("message"), f"{name}: an error entry needs a message substring"


# ------------------------------------------------------------------ every file, CLI and Python API
@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_bad_input(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = MANIFEST[name]
    entry = spec["entry"]
    cmd = ENTRIES[entry]
    rc, out, err = run_cli(cli_argv(name, entry, tmp_path), capsys)

    if spec["outcome"] == "accepted":
        assert rc == 0, err
        assert "Traceback" not in err and "error:" not in err, err
        assert spec["stdout"] in out, out
        with time_limit(CALL_LIMIT_S):
            built = call_api(name, entry, tmp_path)
        if "groups" in spec:
            assert len(built) == spec["groups"]
        if "trust_remote_code" in spec:
            assert built.model.trust_remote_code is spec["trust_remote_code"]
        return

    assert rc == 2, f"exit code {rc}; stderr:\n{err}"
    message = check_error_line(err, out, cmd, name, spec)
    with time_limit(CALL_LIMIT_S), pytest.raises(SagoInputError) as raised:
        call_api(name, entry, tmp_path)
    assert str(raised.value) == message, "the CLI and the Python API report different errors"


# ------------------------------------------------------------------ a 2 MB single variant
def write_huge_set(tmp_path: Path) -> Path:
    """A set whose first group has one ~2 MB variant (a single line), and a normal second group."""
    path = tmp_path / "set_huge_line.jsonl"
    huge = {"id": "huge", "variants": ["word " * 400_000, "A short phrasing?"]}
    small = {"id": "ok", "variants": ["What is 2+2?", "Compute two plus two."]}
    path.write_text(json.dumps(huge) + "\n" + json.dumps(small) + "\n", encoding="utf-8")
    assert path.stat().st_size > 2_000_000
    return path


def test_huge_line_is_skipped_and_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_huge_set(tmp_path)
    assert len(VariantSet.from_jsonl(path)) == 2  # reading it is fine; it is longer than any context
    rc, out, err = run_cli(["eval", "--set", f"huge={path}", "--model", tiny_model_path(), "--max-new-tokens", "2",
                            "--quiet", "--axes", "activation"], capsys)
    assert rc == 0, err
    assert "Traceback" not in err
    assert "set 'huge': 1 groups, 1 skipped" in out, out


# ------------------------------------------------------------------ real subprocesses: nothing reaches the terminal
def run_subprocess(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline")
    return subprocess.run([sys.executable, "-m", "sago_train.cli.main", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=SUBPROCESS_LIMIT_S)


@pytest.mark.parametrize("name", ["set_latin1.jsonl", "recipe_python_object.yaml", "groups_mixed_k.jsonl"])
def test_subprocess_prints_one_line(name: str, tmp_path: Path) -> None:
    spec = MANIFEST[name]
    proc = run_subprocess(cli_argv(name, spec["entry"], tmp_path))
    assert proc.returncode == 2, proc.stderr
    check_error_line(proc.stderr, proc.stdout, ENTRIES[spec["entry"]], name, spec)


def test_subprocess_huge_line_strict(tmp_path: Path) -> None:
    path = write_huge_set(tmp_path)
    proc = run_subprocess(["eval", "--set", f"huge={path}", "--model", tiny_model_path(), "--max-new-tokens", "2",
                           "--quiet", "--axes", "activation", "--strict"])
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]  # loading the model may print a progress bar before it
    assert last.startswith("sago-train eval: error: "), proc.stderr
    assert path.name in last and "group 'huge': variant 0 is longer than 1,000,000 characters" in last, last


# ------------------------------------------------------------------ issue 12: bounded input, outputs checked first
# Each case through the CLI in-process, the Python API, and a subprocess under a 2 GiB address-space limit
# (tests/_helpers/limited.py): one error line, exit code 2, < 10 CPU seconds, peak RSS < 2 GiB.
ISSUE_12_CORPUS = [
    "recipe_billion_laughs_name.yaml", "recipe_billion_laughs_description.yaml", "recipe_billion_laughs_trainer.yaml",
    "recipe_billion_laughs_max_steps.yaml", "recipe_lora_r_zero.yaml", "recipe_lora_target_modules_int.yaml",
    "recipe_deepspeed_missing.yaml", "recipe_name_escapes.yaml", "recipe_data_limit_negative.yaml",
    "recipe_dtype_unknown.yaml", "recipe_set_name_invalid.yaml", "recipe_monitor_layers_out_of_range.yaml",
    "recipe_stability_layers_out_of_range.yaml", "set_lone_surrogate.jsonl", "set_too_many_variants.jsonl",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", ISSUE_12_CORPUS)
def test_issue_12_corpus_in_a_limited_subprocess(name: str, tmp_path: Path) -> None:
    from ._helpers.limited import CPU_LIMIT_S, RUN_CPU_LIMIT_S, assert_one_error_line, run_cli_limited

    spec = MANIFEST[name]
    res = run_cli_limited(cli_argv(name, spec["entry"], tmp_path))
    # A recipe is parsed after transformers' Trainer, TRL and peft are imported (see RUN_CPU_LIMIT_S).
    line = assert_one_error_line(res, name, spec["message"],
                                 cpu_limit_s=CPU_LIMIT_S if spec["entry"] == "set" else RUN_CPU_LIMIT_S)
    assert line.startswith(f"sago-train {ENTRIES[spec['entry']]}: error: ")
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir()), "wrote before failing"


def _unreadable(kind: str, tmp_path: Path) -> tuple[Path, str]:
    """A set path that must be refused before reading, and a substring of the error."""
    if kind == "dev_zero":
        return Path("/dev/zero"), "is a character device, expected a variant set"
    if kind == "fifo_without_writer":
        path = tmp_path / "fifo.jsonl"
        os.mkfifo(path)
        return path, "is a FIFO (named pipe), expected a variant set"
    if kind == "directory":
        return tmp_path, "is a directory, expected a variant set"
    if kind == "sparse_200mb":  # 200 MB on paper, no disk used: refused from its size before any read
        path = tmp_path / "big.jsonl"
        with open(path, "wb") as f:
            f.truncate(200 * 1024 * 1024)
        return path, "is 200 MiB, over the limit of 128 MiB for a variant set (MAX_SET_FILE_BYTES)"
    if kind == "line_over_64mib":  # a 100 MB sparse file without a newline: its first line passes the limit
        path = tmp_path / "oneline.jsonl"
        with open(path, "wb") as f:
            f.truncate(100 * 1024 * 1024)
        return path, "oneline.jsonl:1: line longer than the limit of 64 MiB (MAX_LINE_BYTES)"
    raise AssertionError(kind)


UNREADABLE = ["dev_zero", "fifo_without_writer", "directory", "sparse_200mb", "line_over_64mib"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX only")
@pytest.mark.parametrize("kind", UNREADABLE)
def test_unreadable_set_is_refused_before_reading(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ._helpers.limited import assert_one_error_line, run_cli_limited

    path, expected = _unreadable(kind, tmp_path)
    argv = ["eval", "--set", f"s={path}", "--quiet", "--axes", "activation", "--max-new-tokens", "2"]
    rc, out, err = run_cli(argv, capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and expected in err, err
    with time_limit(10), pytest.raises(SagoInputError, match="expected a variant set|limit"):
        VariantSet.from_jsonl(path)
    assert_one_error_line(run_cli_limited(argv), expected)


def test_line_limit_names_file_and_line(tmp_path: Path) -> None:
    from sago_train.io import read_jsonl

    path = tmp_path / "s.jsonl"
    path.write_text('{"variants": ["a", "b"]}\n' + json.dumps({"variants": ["x" * 5000, "y"]}) + "\n")
    with pytest.raises(SagoInputError, match=r"s\.jsonl:2: line longer than the limit of 4.883 KiB"):
        list(read_jsonl(path, max_line_bytes=5000))


def _write_50mb_variant_set(tmp_path: Path) -> Path:
    path = tmp_path / "set_50mb.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"id": "huge", "variants": ["word " * 10_000_000, "A short phrasing?"]}) + "\n")
        f.write(json.dumps({"id": "ok", "variants": ["What is 2+2?", "Compute two plus two."]}) + "\n")
    assert path.stat().st_size > 50_000_000
    return path


@pytest.mark.slow
def test_50mb_variant_is_skipped_and_counted_before_tokenizing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 12 case 2: tokenized whole, a 50 MB variant took ~9 GB and a SIGABRT; now its group is skipped and
    counted from its character count, in the CLI output, summary.json and the Python result."""
    from sago_train import SAGOEvaluator
    from sago_train.eval.evaluator import SKIP_TOO_MANY_CHARS

    from ._helpers.limited import assert_bounded, run_cli_limited

    path = _write_50mb_variant_set(tmp_path)
    argv = ["eval", "--set", f"huge={path}", "--quiet", "--axes", "activation", "--max-new-tokens", "2"]
    rc, out, err = run_cli(argv, capsys)
    assert rc == 0 and "Traceback" not in err, err
    assert "set 'huge': 1 groups, 1 skipped" in out, out

    from sago_train.model import tokenize

    tokenized: list[int] = []
    real_encode = tokenize.encode_variant

    def counting_encode(variant: Any, tokenizer: Any, **kwargs: Any) -> list[int]:
        tokenized.append(len(variant))
        return real_encode(variant, tokenizer, **kwargs)

    monkeypatch.setattr(tokenize, "encode_variant", counting_encode)  # what the evaluator's renderer calls
    ev = SAGOEvaluator.from_pretrained(tiny_model_path(), axes="activation", max_new_tokens=2)
    result = ev.evaluate({"huge": VariantSet.from_jsonl(path, name="huge")})
    assert result.sets["huge"].skipped == {SKIP_TOO_MANY_CHARS: 1}
    assert [g.id for g in result.sets["huge"].groups] == ["ok"]
    assert max(tokenized) < 1000, "the 50 MB variant reached the tokenizer"

    res = run_cli_limited([*argv, "--out", str(tmp_path / "out")])
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert_bounded(res)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["sets"]["huge"]["skipped"] == {SKIP_TOO_MANY_CHARS: 1}


def test_out_naming_a_file_fails_before_the_model_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 12 case 4: --out naming an existing file used to fail after the whole evaluation."""
    from sago_train.eval import evaluator
    from sago_train.io import check_output_dir

    from ._helpers.limited import assert_one_error_line, run_cli_limited

    existing = tmp_path / "results"
    existing.write_text("not a directory")

    def must_not_load(*a: Any, **k: Any) -> Any:
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(evaluator.SAGOEvaluator, "from_pretrained", must_not_load)
    for out, expected in ((existing, "exists and is not a directory"), (existing / "sub", "is a file, not a directory"),
                          (Path("/proc/sago-no/such"), "is not writable")):
        rc, _, err = run_cli(["eval", "--out", str(out), "--quiet"], capsys)
        assert rc == 2 and expected in err and len(err.strip().splitlines()) == 1, err
        with pytest.raises(SagoInputError, match=expected):
            check_output_dir(out, what="--out")
    assert existing.read_text() == "not a directory"
    assert_one_error_line(run_cli_limited(["eval", "--out", str(existing), "--quiet"]), "--out", str(existing))


@pytest.mark.slow
@pytest.mark.parametrize("config", ["{}", '{"base_model_name_or_path": null}', "[1, 2]", "{not json"])
def test_adapter_config_without_a_base_model(config: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 12 case 5: {} was a KeyError traceback; null a misleading 'couldn't connect to huggingface.co'."""
    from sago_train.model.loading import load_model_and_tokenizer

    from ._helpers.limited import assert_one_error_line, run_cli_limited

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(config)
    expected = "adapter_config.json: field 'model': "
    rc, _, err = run_cli(["eval", "--model", str(adapter), "--quiet"], capsys)
    assert rc == 2 and expected in err and "Traceback" not in err, err
    with pytest.raises(SagoInputError, match="adapter"):
        load_model_and_tokenizer(adapter)
    assert_one_error_line(run_cli_limited(["eval", "--model", str(adapter), "--quiet"]), expected)


def test_run_name_option_cannot_leave_the_runs_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 12 case 6 through --name (recipe_name_escapes.yaml covers the recipe's name:)."""
    from sago_train.cli.recipe import validate_run_name

    from ._helpers.limited import assert_one_error_line, run_cli_limited

    work = tmp_path / "a" / "b" / "c" / "d"
    work.mkdir(parents=True)
    recipe = ROOT / "tests" / "fixtures" / "bad" / "recipe_data_limit_zero.yaml"
    argv = ["run", str(recipe), "--name", "../../../../x", "--training.max_steps", "1"]
    cwd = Path.cwd()
    os.chdir(work)
    try:
        rc, _, err = run_cli(argv, capsys)
    finally:
        os.chdir(cwd)
    assert rc == 2 and "field '--name': invalid run name '../../../../x'" in err, err
    with pytest.raises(SagoInputError, match="invalid run name"):
        validate_run_name("../../../../x")
    assert_one_error_line(run_cli_limited(argv, cwd=work), "invalid run name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"] and not any(work.iterdir()), "wrote outside runs/"


@pytest.mark.parametrize("record, expected", [
    ({"variants": ["x" * 1_000_001, "short"], "target": " t"}, "variant 0 is longer than 1,000,000 characters"),
    ({"variants": ["a", "b"], "target": "t" * 1_000_001}, "the target is longer than 1,000,000 characters"),
    ({"prompt": "p" * 1_000_001, "completion": " c"}, "'prompt' is longer than 1,000,000 characters"),
])
def test_overlong_training_text_fails_before_the_model_loads(record: dict[str, Any], expected: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Training records are tokenized by the collator in the middle of training: the length cap is checked up
    front (an error: a training record cannot be skipped without changing what is trained on)."""
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"variants": ["a", "b"], "target": " ok"} if "variants" in record
                               else {"prompt": "a", "completion": " b"}) + "\n" + json.dumps(record) + "\n")
    recipe = groups_recipe(tmp_path, data)
    if "prompt" in record:
        recipe.write_text(recipe.read_text().replace("stability:\n  act_weight: 0.5\n", ""))
    rc, _, err = run_cli(["run", str(recipe), "--dry-run", "--output-dir", str(tmp_path / "run")], capsys)
    assert rc == 2 and "train.jsonl:2: " in err and expected in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SagoInputError, match=expected):
        build_trainer(load_recipe(recipe), output_dir=str(tmp_path / "api"))


@pytest.mark.parametrize("section", [
    'early_stopping:\n  metric: "sago/{big}/activation"\n',
    "monitor:\n  sets: {{p: sago://demo/paraphrase.jsonl}}\n  options:\n    max_new_tokens: [{ints}]\n",
    'name: "{big}"\n',
    'trainer: "{big}"\n',
])
def test_error_lines_stay_short_whatever_the_value(section: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A 300 KB value (well inside MAX_RECIPE_BYTES) in a recipe makes an error line of at most a few KB."""
    recipe = tmp_path / "long_values.yaml"
    recipe.write_text('sago_train_version: "0.1.0"\nmodel:\n  path: sago://tiny-llama\n'
                      "data:\n  train: sago://demo/groups.jsonl\n"
                      + section.format(big="x" * 300_000, ints=", ".join(["7"] * 60_000)), encoding="utf-8")
    rc, _, err = run_cli(["run", str(recipe), "--dry-run", "--output-dir", str(tmp_path / "run")], capsys)
    assert rc == 2 and "Traceback" not in err, err[:3000]
    assert len(err.strip().splitlines()) == 1 and len(err) < 3000, err[:3000]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX only")
@pytest.mark.parametrize("kind", ["dev_zero", "fifo_without_writer"])
def test_generator_inputs_are_not_read_from_pipes_or_devices(kind: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from sago_train.data.examples import load_text_list

    special = Path("/dev/zero")
    if kind == "fifo_without_writer":
        special = tmp_path / "fifo.json"
        os.mkfifo(special)
    examples = tmp_path / "examples.jsonl"
    examples.write_text('{"id": "e1", "prompt": "What is 2+2?"}\n')
    for argv in (["--input", str(examples), "--templates", str(special)], ["--input", str(special), "--typo-rate", "0.1"]):
        rc, _, err = run_cli(["variants", *argv, "--out", str(tmp_path / "out.jsonl")], capsys)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "expected a" in err, err
        assert "is a character device" in err or "is a FIFO" in err, err
    with time_limit(10), pytest.raises(SagoInputError, match="is a character device|is a FIFO"):
        load_text_list(special)
    with time_limit(10), pytest.raises(SagoInputError, match="is a character device|is a FIFO"):
        load_examples(special)
