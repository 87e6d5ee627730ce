"""`sago-train eval`: output files, the table, and one-line errors with exit code 2 for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sago_train.cli.main import main

BASE = ["--max-new-tokens", "4", "--quiet", "--device", "cpu"]


def run_cli(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_eval_writes_summary_and_group_records(tmp_path, capsys, saved_tiny_model, sample_set_file):
    code, out, err = run_cli(["eval", "--model", str(saved_tiny_model), "--set", f"s={sample_set_file}", *BASE,
                              "--layers", "0,-1", "--axes", "activation,confidence,generation,mirroring",
                              "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    assert "set 's'" in out and "activation" in out and "correctness" in out
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert set(summary) >= {"sago_train_version", "model", "sets", "axis_correlation"}
    s = summary["sets"]["s"]
    assert s["n_groups"] == 10
    assert set(s) >= {"n_groups", "axes", "correctness", "kinds"}
    for axis in ("activation", "confidence", "generation", "mirroring"):
        assert set(s["axes"][axis]) == {"mean", "ci_low", "ci_high", "n"}
    recs = [json.loads(line) for line in (tmp_path / "o" / "s.jsonl").read_text().splitlines()]
    assert len(recs) == 10
    assert set(recs[0]) >= {"id", "variants", "outputs", "axes", "logprobs"}
    assert len(recs[0]["outputs"]) == 4


def test_eval_axes_and_similarity_options(tmp_path, capsys, saved_tiny_model, sample_set_file):
    code, out, err = run_cli(["eval", "--model", str(saved_tiny_model), "--set", f"s={sample_set_file}", *BASE,
                              "--axes", "generation,mirroring", "--similarity", "exact", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["sets"]["s"]["axes"]) == {"generation", "mirroring"}


def _bad(tmp_path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    "content,expected",
    [
        ('{"id": "a", "variants": ["x", "y"]}\n{"id": "b", "variants": ["x"', "bad.jsonl:2: malformed JSON"),
        ('{"id": "a", "variants": ["only one"]}\n', "at least 2 variants"),
        ('{"id": "a", "variants": ["x", "  "]}\n', "variant 1 is empty"),
        ('{"id": "a", "variants": ["x", "y"]}\n{"id": "a", "variants": ["x", "y"]}\n', "duplicate id 'a'"),
        ('{"id": "a", "variants": ["x", "y"], "kinds": ["k"]}\n', "field 'kinds': expected one kind per variant"),
        ('{"id": "a", "variants": "xy"}\n', "field 'variants': expected a list"),
        ('{"id": "a", "variant": ["x", "y"]}\n', "Did you mean 'variants'"),
        ("", "empty"),
    ],
)
def test_bad_sets_one_line_exit_2(tmp_path, capsys, saved_tiny_model, content, expected):
    path = _bad(tmp_path, "bad.jsonl", content)
    code, out, err = run_cli(["eval", "--model", str(saved_tiny_model), "--set", f"x={path}", *BASE], capsys)
    assert code == 2
    assert expected in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--axes", "activaton"], "Did you mean 'activation'"),
        (["--similarity", "token-f1"], "Did you mean 'token_f1'"),
        (["--pooling", "max"], "pooling"),
        (["--layers", "0,99", "--axes", "activation"], "out of range"),
        (["--layers", "a,b"], "comma-separated integers"),
        (["--batch-size", "0"], "positive integer"),
    ],
)
def test_bad_options_exit_2(capsys, saved_tiny_model, sample_set_file, args, expected):
    code, out, err = run_cli(["eval", "--model", str(saved_tiny_model), "--set", f"s={sample_set_file}", *BASE, *args],
                             capsys)
    assert code == 2, err
    assert expected in err and "Traceback" not in err


def test_missing_model_path_exit_2(capsys, sample_set_file, tmp_path):
    code, out, err = run_cli(["eval", "--model", str(tmp_path / "nope"), "--set", f"s={sample_set_file}", *BASE], capsys)
    assert code == 2
    assert "does not exist" in err


def test_missing_set_file_exit_2(capsys, saved_tiny_model, tmp_path):
    code, out, err = run_cli(["eval", "--model", str(saved_tiny_model), "--set", f"s={tmp_path / 'x.jsonl'}", *BASE],
                             capsys)
    assert code == 2 and "file not found" in err


def test_bad_set_name_cannot_escape_output_dir(capsys, saved_tiny_model, sample_set_file):
    code, out, err = run_cli(["eval", "--model", str(saved_tiny_model), "--set", f"../../x={sample_set_file}", *BASE],
                             capsys)
    assert code == 2 and "invalid set name" in err


def test_subprocess_has_no_traceback(tmp_path, saved_tiny_model):
    path = _bad(tmp_path, "b.jsonl", '{"id": 1, "variants": ["a"]}\n')
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "sago_train.cli.main", "eval", "--model", str(saved_tiny_model),
                           "--set", f"b={path}", "--quiet"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("sago-train eval: error:")
    assert "b.jsonl:1" in proc.stderr and "Traceback" not in proc.stderr


def test_help_lists_options(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--model", "--set", "--axes", "--layers", "--pooling", "--similarity", "--max-new-tokens",
                "--batch-size", "--seed", "--out"):
        assert opt in out


def test_eval_progress_reaches_a_log_file(capsys, saved_tiny_model, sample_set_file):
    """Without --quiet and with stderr not a terminal (as here, and in a log file), one line per set."""
    args = [a for a in BASE if a != "--quiet"]
    code, out, err = run_cli(["eval", "--model", str(saved_tiny_model), "--set", f"s={sample_set_file}", *args], capsys)
    assert code == 0, err
    line = next(x for x in err.splitlines() if x.startswith("sago eval: set 's' done"))
    assert line.startswith("sago eval: set 's' done (1/1 sets, ") and line.endswith(" s)")
