"""`sago-train report`: PNG plots and report.md from recorded runs and eval dirs; located errors for bad dirs.

Most fixtures are synthetic files in the exact formats the callback and `sago-train eval --out` write (fast, no
torch); one test records a real, tiny training run so a format drift between the callback and the report shows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sago_train.cli.main import main
from sago_train.formatting import fmt_num, fmt_p

from .._helpers.results_dirs import (
    _set_summary,
    _write_jsonl,
    assert_report,
    axis_values,
    run_cli,
    write_eval_dir,
    write_run_dir,
)


def test_report_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["report", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "RUN_DIR" in out and "--out" in out


@pytest.mark.slow
def test_report_from_a_recorded_training_run(tmp_path, capsys):
    from sago_train.integrations.callback import SAGOCallback

    from .._helpers.trainer import make_trainer, variant_set

    run = tmp_path / "run"
    make_trainer(run, callbacks=[SAGOCallback(variant_set(), eval_steps=2, max_new_tokens=3)], max_steps=4).train()
    code, out, err = run_cli(["report", str(run)], capsys)
    assert code == 0, err
    report = run / "sago" / "report"
    md = assert_report(report, ["steps_num.png", "groups_num.png", "axis_correlation.png"])
    assert "### set `num`" in md
    assert "| run | 4 |" in md  # the last evaluation is at the last step
    assert "Change since the baseline" in md  # the callback's own paired test against the baseline
    assert "report.md" in out


def test_report_from_an_eval_dir(tmp_path, capsys):
    ev = write_eval_dir(tmp_path / "ev", {"para": axis_values(0), "typo": axis_values(1)})
    code, out, err = run_cli(["report", str(ev)], capsys)
    assert code == 0, err
    report = ev / "report"
    md = assert_report(report, ["groups_para.png", "groups_typo.png", "axis_correlation.png"])
    assert not list(report.glob("steps_*.png"))  # no history: no over-steps plot
    assert "no over-steps plot" in md
    assert "Paired comparison" not in md
    # The last-evaluation table: mean [CI] per axis, accuracy.
    row = next(line for line in md.splitlines() if line.startswith("| ev | - |"))
    s = json.loads((ev / "summary.json").read_text())["sets"]["para"]["axes"]["activation"]
    assert f"{s['mean']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}]" in md
    assert "0.500" in row
    # mirroring is 0 on every group: one line, no column (and no panel, see the next test).
    section = md[md.index("### set `para`"):md.index("### set `typo`")]
    assert "- mirroring: constant at 0.000 (left out of the tables and plots)\n" in section
    header = next(line for line in section.splitlines() if line.startswith("| run |"))
    assert header == "| run | step | activation | confidence | generation | instability | accuracy | groups |"


def test_constant_axes_are_left_out_of_the_plots(tmp_path):
    from sago_train.analysis.compare import load_source
    from sago_train.analysis.report_plots import constant_axes

    run = load_source(write_run_dir(tmp_path / "r", {0: {"s": axis_values(0)}, 5: {"s": axis_values(1)}}))
    evals = [run.evaluation(step) for step in run.steps]
    assert constant_axes(evals, "s") == {"mirroring": 0.0}
    moving = axis_values(2)
    moving["mirroring"] = [0.0] * 11 + [0.5]  # not constant at step 10: it gets its panel back
    run = load_source(write_run_dir(tmp_path / "r2", {0: {"s": axis_values(0)}, 10: {"s": moving}}))
    assert constant_axes([run.evaluation(step) for step in run.steps], "s") == {}


def test_two_runs_give_the_paired_comparison(tmp_path, capsys):
    # runB is planted clearly less stable on activation at its last evaluation; other axes are identical.
    a = write_run_dir(tmp_path / "runA", {0: {"num": axis_values(0)}, 5: {"num": axis_values(1)}})
    b = write_run_dir(tmp_path / "runB", {0: {"num": axis_values(0)}, 5: {"num": axis_values(1, shift=0.3)}})
    out_dir = tmp_path / "rep"
    code, out, err = run_cli(["report", str(a), str(b), "--out", str(out_dir)], capsys)
    assert code == 0, err
    md = assert_report(out_dir, ["steps_num.png", "groups_num.png", "axis_correlation.png"])
    assert "## Paired comparison against `runA`" in md
    rows = {line.split(" | ")[2]: line for line in md.splitlines() if line.startswith("| runB | num |")}
    assert "runB less stable" in rows["activation"]
    assert "no significant difference" in rows["confidence"]
    assert "| 12 |" in rows["activation"]  # paired over the 12 shared groups
    assert "set `num`, activation: runB less stable than runA (difference" in md
    assert "runB less stable" in out


def test_paired_comparison_pairs_by_group_id(tmp_path):
    from sago_train.analysis.compare import load_evaluation
    from sago_train.analysis.report import paired_against_first

    values = axis_values(3)
    a = write_eval_dir(tmp_path / "a", {"s": values})
    b = write_eval_dir(tmp_path / "b", {"s": values})
    # Same groups in another order and one group fewer: pairing by id still finds no difference.
    recs = [json.loads(x) for x in (b / "s.jsonl").read_text().splitlines()]
    kept = list(reversed(recs))[1:]
    _write_jsonl(b / "s.jsonl", kept)
    # its summary made from the records kept (a summary of other records is refused on reading: round 4)
    summary = json.loads((b / "summary.json").read_text())
    entry = _set_summary({k: [r["axes"][k] for r in kept] for k in values})
    summary["sets"]["s"].update(n_groups=len(kept), axes={k: entry[k] for k in values})
    (b / "summary.json").write_text(json.dumps(summary))
    rows = paired_against_first([load_evaluation(a), load_evaluation(b)])
    act = next(r for r in rows if r["axis"] == "activation")
    assert act["n"] == 11 and act["mean_diff"] == 0 and act["verdict"] == "no significant difference"


def test_several_dirs_need_out(tmp_path, capsys):
    a = write_eval_dir(tmp_path / "a", {"s": axis_values(0)})
    code, _, err = run_cli(["report", str(a), str(a)], capsys)
    assert code == 2 and "--out" in err and len(err.strip().splitlines()) == 1


def _corrupt_history(tmp_path: Path) -> tuple[Path, str]:
    run = write_run_dir(tmp_path / "run", {0: {"s": axis_values(0)}, 2: {"s": axis_values(1)}})
    lines = (run / "sago" / "history.jsonl").read_text().splitlines()
    (run / "sago" / "history.jsonl").write_text(lines[0] + "\n" + lines[1][:40] + "\n")
    return run, "history.jsonl:2: malformed JSON"


def _corrupt_records(tmp_path: Path) -> tuple[Path, str]:
    ev = write_eval_dir(tmp_path / "ev", {"s": axis_values(0)})
    lines = (ev / "s.jsonl").read_text().splitlines()
    lines[2] = json.dumps({"id": "g2", "axes": {"activation": "high"}})
    (ev / "s.jsonl").write_text("\n".join(lines) + "\n")
    return ev, "s.jsonl:3: field 'axes.activation': expected a number or null"


def _corrupt_summary(tmp_path: Path) -> tuple[Path, str]:
    ev = write_eval_dir(tmp_path / "ev", {"s": axis_values(0)})
    (ev / "summary.json").write_text('{"sets": {"s": \n  {"axes": nope}}}')
    return ev, "summary.json:2: malformed JSON"


def _history_without_step(tmp_path: Path) -> tuple[Path, str]:
    run = tmp_path / "run"
    _write_jsonl(run / "sago" / "history.jsonl", [{"sets": {"s": {}}}])
    return run, "history.jsonl:1: field 'step': expected an integer step"


def _neither(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty", "holds no SAGO results: expected summary.json"


def _missing(tmp_path: Path) -> tuple[Path, str]:
    return tmp_path / "nope", "directory not found"


@pytest.mark.parametrize(
    "make", [_corrupt_records, _corrupt_summary, _history_without_step, _neither, _missing]
)
def test_bad_directories_give_one_line_errors(tmp_path, capsys, make):
    path, expected = make(tmp_path)
    code, _, err = run_cli(["report", str(path), "--out", str(tmp_path / "rep")], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert expected in err


def test_a_corrupt_history_line_is_skipped_with_a_warning(tmp_path, capsys, caplog):
    path, expected = _corrupt_history(tmp_path)  # line 2 (step 2) torn; line 1 (step 0) valid
    with caplog.at_level("WARNING", logger="sago_train"):
        code, out, err = run_cli(["report", str(path), "--out", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    warned = [r.getMessage() for r in caplog.records if "corrupt history line" in r.getMessage()]
    assert len(warned) == 1 and expected in warned[0] and str(path / "sago" / "history.jsonl") in warned[0]
    assert "skipped 1 corrupt line(s)" in out
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "training run, 1 evaluation(s), steps 0..0, 1 corrupt history line(s) skipped" in md


def test_missing_records_are_noted_not_fatal(tmp_path, capsys):
    run = write_run_dir(tmp_path / "run", {0: {"s": axis_values(0)}, 2: {"s": axis_values(1)}})
    (run / "sago" / "step-2" / "s.jsonl").unlink()
    code, _, err = run_cli(["report", str(run)], capsys)
    assert code == 0, err
    md = assert_report(run / "sago" / "report", ["steps_s.png"])
    assert "Per-group records missing" in md and "`run/s`" in md
    assert not (run / "sago" / "report" / "groups_s.png").exists()


def test_nan_values_and_missing_ci_are_handled(tmp_path, capsys):
    # An axis undefined for some groups (NaN written as null) and a summary with null CI bounds.
    values = axis_values(0, n=6)
    values["confidence"] = [math.nan, 0.1, 0.2, math.nan, 0.3, 0.1]
    ev = write_eval_dir(tmp_path / "ev", {"s": values}, accuracy=None)
    recs = [json.loads(x.replace("NaN", "null")) for x in (ev / "s.jsonl").read_text().splitlines()]
    for r in recs:  # mirroring undefined for every group, as the summary below says (n = 0)
        r["axes"]["mirroring"] = None
    _write_jsonl(ev / "s.jsonl", recs)
    summary = json.loads((ev / "summary.json").read_text().replace("NaN", "null"))
    summary["sets"]["s"]["axes"]["mirroring"] = {"mean": None, "ci_low": None, "ci_high": None, "n": 0}
    (ev / "summary.json").write_text(json.dumps(summary))
    code, _, err = run_cli(["report", str(ev)], capsys)
    assert code == 0, err
    assert_report(ev / "report", ["groups_s.png", "axis_correlation.png"])


# ---------------------------------------------------------------------------------------------------------------
# Findings section (SPEC "Findings")
# ---------------------------------------------------------------------------------------------------------------


def _with_halves(path: Path, set_name: str, halves: dict[str, tuple[list[float], list[float]]]) -> None:
    """Add per-half values (as the evaluator records them) to the records of an eval dir."""
    recs = [json.loads(x) for x in (path / f"{set_name}.jsonl").read_text().splitlines()]
    for i, r in enumerate(recs):
        r["halves"] = {a: [h[0][i], h[1][i]] for a, h in halves.items()}
    _write_jsonl(path / f"{set_name}.jsonl", recs)


def test_report_findings_are_computed_per_set_from_records(tmp_path, capsys):
    from sago_train.functional.findings import axis_relations, split_half_reliability

    rng = np.random.default_rng(3)
    n = 30
    truth = rng.random(n)
    values = {s: axis_values(i, n=n) for i, s in enumerate(("setX", "setY"))}
    # B is worse than A on setX for every group and better on setY for every group: a robust flip.
    shifted = {"setX": {a: list(np.array(v) + 0.05) for a, v in values["setX"].items()},
               "setY": {a: list(np.array(v) - 0.05) for a, v in values["setY"].items()}}
    a = write_eval_dir(tmp_path / "A", values)
    b = write_eval_dir(tmp_path / "B", shifted)
    ha, hb = list(truth + 0.1 * rng.random(n)), list(truth + 0.1 * rng.random(n))
    _with_halves(a, "setX", {"activation": (ha, hb)})
    code, _, err = run_cli(["report", str(a), str(b), "--out", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    md = (tmp_path / "rep" / "report.md").read_text()
    section = md[md.index("## Findings"):]
    rel = split_half_reliability(ha, hb)
    row = next(line for line in section.splitlines() if line.startswith("| A | setX | activation |"))
    # The only computed test of the report (the other axes and runs have no halves): a family of one, Holm p = p.
    assert (f"| {fmt_num(rel.r)} | {fmt_num(rel.reliability)} | {fmt_p(rel.p_value)} | {fmt_p(rel.p_value)} | 30 "
            "| not noise |") in row
    # Records without halves: said, not invented.
    assert "| A | setY | activation | - | - | - | - | 0 | not computed (needs at least 3 groups with K >= 4" in section
    # Finding 2 per run and set with the numbers of axis_relations on that set's groups alone, one family over
    # every run, set and pair the report prints.
    axes = ("activation", "confidence", "generation", "mirroring")
    rels = axis_relations({f"{run}, {s}": {ax: vals[s][ax] for ax in axes}
                           for run, vals in (("A", values), ("B", shifted)) for s in ("setX", "setY")})
    r = next(x for x in rels if x.set == "A, setX" and x.axes == ("activation", "generation"))
    assert r.family == sum(x.verdict != "undefined" for x in rels) > 6 and f"- {r.sentence()}" in section
    assert "weakly related (rho=" not in md and "different failure modes" not in md
    # Finding 3: one pair of runs, flipping robustly on every axis that moved.
    row = next(line for line in section.splitlines() if line.startswith("| activation |"))
    assert row.startswith("| activation | 1 | 1 | 1 | 0 | ")
    assert "B beats A on setY, the reverse on setX" in row or "A beats B on setX, the reverse on setY" in row


def _with_between(path, values):
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    for r, v in zip(recs, values):
        r["extra"] = {"activation_rel_between": float(v)}
    _write_jsonl(path, recs)


def _collapse_values(n=12):
    rng = np.random.default_rng(1)
    between, act = rng.uniform(0.3, 0.5, n), rng.uniform(0.1, 0.3, n)
    rel = act / 0.4
    return between, {"activation": list(act), "activation_rel": list(rel)}, \
        {"activation": list(act * 0.5), "activation_rel": list(rel)}


def test_paired_comparison_flags_a_collapse_below_the_baseline(tmp_path, capsys):
    """A run whose groups all moved closer to the other groups than at its baseline (the model before training)
    is flagged as a collapse, with scipy's Wilcoxon p-value, even when its raw activation looks 'more stable'."""
    import scipy.stats as sps

    from sago_train.analysis.compare import load_sources
    from sago_train.analysis.report import paired_against_first

    between, before, after = _collapse_values()
    run = write_run_dir(tmp_path / "R", {0: {"s": before}, 5: {"s": after}})
    _with_between(run / "sago" / "step-0" / "s.jsonl", between)
    _with_between(run / "sago" / "step-5" / "s.jsonl", between * 0.5)
    specs = [f"{run}@0", f"{run}@5"]
    evals = load_sources(specs, last_only=True)
    ref, new = evals[0].label, evals[1].label
    rows = {r["axis"]: r for r in paired_against_first(evals)}
    assert rows["between_dispersion"]["verdict"] == f"{new} less dispersed between groups than {ref} (a collapse)"
    assert rows["between_dispersion"]["p_better"] == pytest.approx(
        sps.wilcoxon(between * 0.5 - between, alternative="less").pvalue)
    # Raw activation fell with the between-group dispersion: a collapse, never "more stable" (issue 18).
    assert rows["activation"]["verdict"] == f"{new} lower than {ref}, but so is the between-group dispersion: a " \
        "collapse, not stability" and rows["activation_rel"]["verdict"] == "no significant difference"
    code, out, err = run_cli(["report", *specs, "--out", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    assert f"s/between_dispersion: {new} less dispersed between groups than {ref} (a collapse) (difference" in out


def test_two_trained_models_are_never_a_collapse(tmp_path, capsys):
    """Issue 33: a drop in between-group dispersion between two trained models (neither a baseline) is "less
    dispersed", not a collapse; raw activation lower with it says so, and every sentence reads."""
    from sago_train.analysis.compare import load_sources
    from sago_train.analysis.report import paired_against_first

    between, before, after = _collapse_values()
    a = write_eval_dir(tmp_path / "sft", {"s": before})
    b = write_eval_dir(tmp_path / "augment", {"s": after})
    _with_between(a / "s.jsonl", between)
    _with_between(b / "s.jsonl", between * 0.5)
    rows = {r["axis"]: r for r in paired_against_first(load_sources([a, b], last_only=True))}
    assert rows["between_dispersion"]["verdict"] == "augment less dispersed between groups than sft"
    assert rows["activation"]["verdict"] == ("augment lower than sft, with a lower between-group dispersion too: "
                                             "read activation_rel")
    code, out, err = run_cli(["report", str(a), str(b), "--out", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "collapse" not in out and "collapse, not stability than" not in md
    assert "set `s`, activation: augment lower than sft, with a lower between-group dispersion too" in md


def test_verdict_is_the_one_rule_not_the_wilcoxon_alone(tmp_path, capsys):
    """Issue 13: the report said "more stable" (Wilcoxon p = 0.017) beside a bootstrap CI spanning 0. The
    constructed pair has exactly that; the row, report.md and the console say "no significant difference"."""
    import scipy.stats as sps

    from sago_train.analysis.compare import load_sources
    from sago_train.analysis.report import paired_against_first

    from .._helpers import verdict_case as case

    a = write_eval_dir(tmp_path / "A", {"s": {"activation": list(case.before())}})
    b = write_eval_dir(tmp_path / "B", {"s": {"activation": list(case.after())}})
    row = next(r for r in paired_against_first(load_sources([a, b], last_only=True)) if r["axis"] == "activation")
    assert row["p_worse"] == pytest.approx(sps.wilcoxon(case.DIFF, alternative="greater").pvalue)
    assert row["p_worse"] < 0.05 and row["ci_low"] < 0 < row["ci_high"]
    assert row["mean_diff"] == pytest.approx(case.DIFF.mean())
    assert row["outcome"] == row["verdict"] == "no significant difference"
    code, out, err = run_cli(["report", str(a), str(b), "--out", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "B less stable" not in md and "No significant stability difference from `A` on any set or axis." in md
    assert "excludes 0 on the same side" in md
    assert "no significant stability difference from A" in out and "less stable than" not in out


def test_too_few_groups_is_said_not_hidden(tmp_path, capsys):
    values = [0.1, 0.2, 0.3, 0.4]
    a = write_eval_dir(tmp_path / "A", {"s": {"activation": values}})
    b = write_eval_dir(tmp_path / "B", {"s": {"activation": [v + 0.3 for v in values]}})
    code, out, err = run_cli(["report", str(a), str(b), "--out", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    assert "s/activation: B vs A: not enough groups (4; a paired test at alpha 0.05 needs >= 5)" in out
    assert "no significant stability difference from A where it could be tested" in out
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Not tested (too few paired groups or no records): `s`/activation" in md


def test_change_since_baseline_applies_the_rule_to_recorded_numbers(tmp_path, capsys):
    """A history line as the callback wrote it before the rule (p_value only, no verdict): p < 0.05 with a CI
    spanning 0 is no longer reported as "less stable"; a line from the current callback carries its verdict."""
    run = write_run_dir(tmp_path / "run", {0: {"s": axis_values(0)}, 5: {"s": axis_values(1)}})
    hist = run / "sago" / "history.jsonl"
    lines = [json.loads(x) for x in hist.read_text().splitlines()]
    lines[1]["compare"] = {"s": {
        "activation": {"vs_baseline": {"mean_diff": 0.005, "ci_low": -0.11, "ci_high": 0.07, "p_value": 0.017,
                                       "n": 12, "alternative": "greater", "step": 0}},
        "confidence": {"vs_baseline": {"mean_diff": 0.1, "ci_low": 0.05, "ci_high": 0.15, "p_value": 0.001,
                                       "p_better": 0.999, "n": 12, "verdict": "worse", "step": 0}}}}
    hist.write_text("".join(json.dumps(x) + "\n" for x in lines))
    code, _, err = run_cli(["report", str(run)], capsys)
    assert code == 0, err
    md = (run / "sago" / "report" / "report.md").read_text()
    section = md[md.index("### Change since the baseline"):]
    section = section[:section.index("\n## ")]
    rows = {line.split(" | ")[2]: line for line in section.splitlines() if line.startswith("| run | s |")}
    assert rows["activation"].endswith("| no significant difference |")
    assert rows["confidence"].endswith("| less stable |")


@pytest.mark.parametrize("plot", ["steps_s.png", "groups_s.png", "axis_correlation.png"])
@pytest.mark.parametrize("what", ["directory", "link"])
def test_every_plot_path_is_checked_before_any_plot_is_drawn(tmp_path, capsys, monkeypatch, plot, what):
    """Issue 22: a directory (or a link leaving --out) where a PNG goes failed with a traceback after the other
    plots were drawn, or wrote through the link."""
    import sago_train.analysis.report_plots as plots

    run = write_run_dir(tmp_path / "run", {0: {"s": axis_values(0)}, 2: {"s": axis_values(1)}})
    rep, outside = tmp_path / "rep", tmp_path / "outside.png"
    outside.write_bytes(b"the user's file")
    if what == "directory":
        (rep / plot).mkdir(parents=True)
    else:
        rep.mkdir()
        (rep / plot).symlink_to(outside)
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(path))
    code, _, err = run_cli(["report", str(run), "--out", str(rep)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    expected = "is a directory, expected a file" if what == "directory" else \
        "is a symbolic link; sago_train never writes through one"
    assert f"--out {rep / plot} {expected}" in err, err
    assert drawn == [] and not (rep / "report.md").exists() and outside.read_bytes() == b"the user's file"
