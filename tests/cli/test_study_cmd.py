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
            "--out", str(tmp_path / "study")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for name in ("random", "shipped"):
        summary = json.loads((tmp_path / "study" / name / "summary.json").read_text())
        assert sorted(summary["sets"]) == ["format", "paraphrase", "typo"]
        assert f"study: {name} (" in out
    report = (tmp_path / "study" / "report" / "report.md").read_text()
    assert "### 1. Is per-group instability noise?" in report and "### 3. Do rankings reverse across sets?" in report
    assert "Kendall's tau between the sets' rankings" in out and "scored on 6 common groups of set" in out
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
