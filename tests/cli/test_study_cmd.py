"""``sago-train study``: several models on the same sets, then compare and report over them."""

from __future__ import annotations

import json

import pytest

from sago_train.cli.main import main
from sago_train.cli.study_cmd import parse_models
from sago_train.errors import SagoInputError


def test_model_names():
    assert parse_models(None) == [("smollm2", "sago://smollm2-135m-instruct"), ("gemma", "sago://gemma-3-270m")]
    assert parse_models(["m/x", "y=m/z"]) == [("x", "m/x"), ("y", "m/z")]
    with pytest.raises(SagoInputError, match="two models named 'x'"):
        parse_models(["a/x", "b/x"])
    with pytest.raises(SagoInputError, match="at least 2 models"):
        parse_models(["only=a"])
    with pytest.raises(SagoInputError, match="cannot be a folder name"):
        parse_models(["../up=a", "b=c"])


@pytest.mark.slow
def test_study_evaluates_every_model_then_compares_and_reports(tmp_path, capsys, saved_tiny_model):
    from sago_train import tiny_model_path

    argv = ["study", "--model", f"random={saved_tiny_model}", "--model", f"shipped={tiny_model_path()}",
            "--set", "tiny", "--max-groups", "6", "--max-new-tokens", "4", "--n-bootstrap", "200",
            "--axes", "activation,activation_rel,confidence,generation,mirroring",
            "--out", str(tmp_path / "study")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for name in ("random", "shipped"):
        summary = json.loads((tmp_path / "study" / name / "summary.json").read_text())
        assert sorted(summary["sets"]) == ["format", "paraphrase", "typo"]
        assert f"study: {name} (" in out
    report = (tmp_path / "study" / "report" / "report.md").read_text()
    assert "### 1. Is per-group instability noise?" in report and "### 3. Do rankings reverse across sets?" in report
    # Two models: Kendall's tau between the sets' rankings is +-1 by construction, so it is not printed.
    assert "Kendall's tau between the sets' rankings" not in out and "scored on 6 common groups of set" in out
    # The findings are printed as report.md states them, and the comparison is kept as JSON.
    assert "### 1. Is per-group instability noise?" in out and "### 3. Do rankings reverse across sets?" in out
    assert "| shipped | paraphrase | activation |" in out
    comparison = json.loads((tmp_path / "study" / "report" / "comparison.json").read_text())
    assert [e["label"] for e in comparison["entries"]] == ["random", "shipped"]
    assert sorted(comparison["sets"]) == ["format", "paraphrase", "typo"] and "activation" in comparison["axes"]
    # Evaluated once: a second run with --reuse keeps both evaluations (same options).
    assert main([*argv, "--reuse"]) == 0
    again = capsys.readouterr().out
    assert "study: random: reusing" in again and "study: shipped: reusing" in again
    assert "### 1. Is per-group instability noise?" in again and "| shipped | paraphrase | activation |" in again


def _study_set(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": f"g{i}", "variants": [f"{i} + 1 =", f"Add one to {i}:"]}) + "\n"
                            for i in range(3)))
    return path


@pytest.mark.parametrize("where, make, expected", [
    ("a", "link", "--out {out}/a is a symbolic link; sago_train never writes through one"),
    ("b/summary.json", "dir", "--out {out}/b/summary.json is a directory, expected a file"),
    ("a/s.jsonl", "link", "--out {out}/a/s.jsonl is a symbolic link"),
    ("a/s.jsonl", "input", "--out {out}/a/s.jsonl is the set 's' (--set), an input of this command"),
    ("report", "link", "--out {out}/report is a symbolic link"),
    ("report/report.md", "dir", "--out {out}/report/report.md is a directory, expected a file"),
    ("report/groups_s.png", "dir", "--out {out}/report/groups_s.png is a directory, expected a file"),
    ("report/axis_correlation.png", "link", "--out {out}/report/axis_correlation.png is a symbolic link"),
    ("report/comparison.json", "dir", "--out {out}/report/comparison.json is a directory, expected a file"),
])
def test_every_path_the_study_writes_is_checked_before_any_model_loads(tmp_path, capsys, monkeypatch, where, make,
                                                                        expected):
    """Issue 22: only --out was checked; a directory or a link where a report file, an evaluation directory or
    one of its files goes failed (or wrote outside) after every model was evaluated."""
    from sago_train.eval.evaluator import SAGOEvaluator

    out, outside = tmp_path / "study", tmp_path / "outside"
    outside.mkdir()
    target = out / where
    target.parent.mkdir(parents=True, exist_ok=True)
    data = _study_set(tmp_path / "in" / "s.jsonl")
    if make == "dir":
        target.mkdir()
    elif make == "link":
        target.symlink_to(outside if "." not in target.name else outside / "x")
    else:
        data = _study_set(target)  # the set file itself lies where the records of set 's' go
    monkeypatch.setattr(SAGOEvaluator, "from_pretrained", lambda *a, **k: pytest.fail("a model was loaded"))
    code = main(["study", "--model", "a=m1", "--model", "b=m2", "--set", f"s={data}", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert expected.format(out=out) in err, err
    assert list(outside.iterdir()) == []
