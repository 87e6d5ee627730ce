"""No ranking on stability alone (docs/accuracy.md): ``compare`` and ``report`` give each entry's accuracy with
its CI beside every ranking, and an entry ranked first that is significantly less accurate than another is
said so on its line, with "more stable but less accurate: consistently wrong?" when it is also significantly
more stable. The forgetting case is built synthetically here (the tiny-model run is
tests/integrations/test_callback_forgetting.py); the check's false-alarm rate is measured by simulation."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from sago_train.analysis.compare import compare_evaluations, load_sources
from sago_train.analysis.report import paired_against_first
from sago_train.functional import stats
from sago_train.results.wording import CONSISTENTLY_WRONG

from .._helpers.forgetting import SET, evaluation
from .._helpers.results_dirs import run_cli, write_eval_dir

STABILITY = ("activation", "generation", "instability")


def _forgetting_dirs(tmp_path, n: int = 16):
    """A (accurate, less stable) and B (forgot: accuracy 0.15, more stable on every group), as eval dirs."""
    rng = np.random.default_rng(0)
    gen = rng.uniform(0.3, 0.5, n)
    a = evaluation(None, 0.75, gen, seed=1).write(tmp_path / "A")
    b = evaluation(None, 0.15, gen - rng.uniform(0.1, 0.2, n), seed=2).write(tmp_path / "B")
    return a, b


def _per_group_accuracy(ev):
    return {g.id: float(np.mean(g.correct)) for g in ev.sets[SET].groups}


def test_compare_puts_accuracy_beside_the_ranking_and_flags_the_forgetting_entry(tmp_path):
    a, b = _forgetting_dirs(tmp_path)
    evals = load_sources([a, b], last_only=True)
    result = compare_evaluations(evals)
    for axis in STABILITY:
        assert result["axes"][axis]["ranks"][SET] == {"A": 2, "B": 1}  # B is the most stable...
    scores = result["accuracy"]["scores"][SET]
    for ev in evals:  # ...beside each entry's accuracy over its variants (a plain reference), with a CI
        flat = [c for g in ev.sets[SET].groups for c in g.correct]
        acc = scores[ev.label]["accuracy"]
        assert acc["mean"] == pytest.approx(np.mean(flat)) and acc["ci_low"] <= acc["mean"] <= acc["ci_high"]
        assert scores[ev.label]["accuracy_all"]["mean"] == pytest.approx(
            np.mean([all(g.correct) for g in ev.sets[SET].groups]))
    checks = {c["axis"]: c for c in result["accuracy"]["checks"]}
    assert set(checks) == set(STABILITY)  # ...and B is named less accurate on each of them
    before, after = (_per_group_accuracy(ev) for ev in evals)
    diff = np.array([after[g] - before[g] for g in before])
    for axis, c in checks.items():
        assert (c["first"], c["other"], c["set"]) == ("B", "A", SET)
        assert c["accuracy"]["verdict"] == stats.WORSE
        assert c["accuracy"]["mean_diff"] == pytest.approx(diff.mean())
        assert c["accuracy"]["p_worse"] == pytest.approx(sps.wilcoxon(diff, alternative="less").pvalue)
        assert c["stability"]["verdict"] == stats.BETTER and c["words"] == CONSISTENTLY_WRONG
        assert c["line"].startswith(f"set '{SET}', {axis}: B ranks first but is less accurate than A (accuracy ")
        assert c["line"].endswith(CONSISTENTLY_WRONG)


def test_compare_cli_prints_accuracy_under_each_rank_and_the_less_accurate_line(tmp_path, capsys):
    a, b = _forgetting_dirs(tmp_path)
    code, out, err = run_cli(["compare", str(a), str(b)], capsys)
    assert code == 0, err
    text = " ".join(out.split())  # rich wraps long lines
    assert "and beneath it the entry's accuracy [95% CI] on the same groups" in text
    assert text.count("accuracy 0.") >= 2 * len(STABILITY)  # each entry's accuracy in each stability table
    for axis in STABILITY:
        assert f"less accurate: set '{SET}', {axis}: B ranks first but is less accurate than A" in text
    assert CONSISTENTLY_WRONG in text


def test_report_says_it_in_the_comparison_the_section_and_a_warning(tmp_path, capsys):
    a, b = _forgetting_dirs(tmp_path)
    rows = {r["axis"]: r for r in paired_against_first(load_sources([a, b], last_only=True))}
    assert {"accuracy", "accuracy_all", "accuracy_worst_kind"} <= set(rows)
    assert rows["accuracy"]["verdict"] == "B less accurate than A"
    assert rows["generation"]["verdict"] == "B more stable but less accurate than A: consistently wrong?"
    code, out, err = run_cli(["report", str(a), str(b), "--out", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    md = (tmp_path / "rep" / "report.md").read_text()
    assert f"set `{SET}`, generation: B more stable but less accurate than A: consistently wrong? (difference" in md
    assert f"**Warning**: accuracy of `B` on set `{SET}` fell significantly against `A`" in md
    section = md[md.index("## Stability beside accuracy"):]
    row_b = next(line for line in section.splitlines() if line.startswith(f"| {SET} | B |"))
    assert row_b.endswith("| activation, generation, instability |") and " [" in row_b  # accuracy with its CI
    assert f"- **less accurate**: set '{SET}', instability: B ranks first but is less accurate than A" in section
    assert "warning" in out and "fell significantly against" in " ".join(out.split())
    # The last-evaluation table carries accuracy with its CI too.
    last = md[md.index("## Last evaluation"):md.index("## Per-group")]
    assert any(line.startswith("| B | - |") and line.count("[") >= 4 for line in last.splitlines())


def test_without_accuracy_the_ranking_says_it_is_on_stability_alone(tmp_path, capsys):
    rng = np.random.default_rng(0)
    values = {"activation": list(rng.uniform(0.1, 0.5, 8))}
    a = write_eval_dir(tmp_path / "A", {"s": values}, accuracy=None)
    b = write_eval_dir(tmp_path / "B", {"s": {"activation": [v / 2 for v in values["activation"]]}}, accuracy=None)
    result = compare_evaluations(load_sources([a, b], last_only=True))
    assert result["accuracy"]["checks"] == [] and result["accuracy"]["scores"] == {}
    [note] = result["accuracy"]["notes"]
    assert "set 's': no entry recorded accuracy" in note and "on stability alone" in note
    code, out, _ = run_cli(["compare", str(a), str(b)], capsys)
    assert code == 0 and "on stability alone" in " ".join(out.split())


def _false_check_rate(reps: int, n: int = 20) -> float:
    """Share of simulated pairs of entries with the same accuracy (p = 0.6 per variant) and different stability
    where compare names the first-ranked entry less accurate (compare_evaluations, in memory)."""
    flagged = 0
    for rep in range(reps):
        gen = np.random.default_rng(rep).uniform(0.2, 0.5, n)
        a = evaluation(None, 0.6, gen, seed=2 * rep, label="A", n_bootstrap=20)
        b = evaluation(None, 0.6, gen * 0.8, seed=2 * rep + 1, label="B", n_bootstrap=20)
        flagged += bool(compare_evaluations([a, b], axes=["generation"])["accuracy"]["checks"])
    return flagged / reps


@pytest.mark.slow
def test_less_accurate_check_false_alarm_rate_by_simulation():
    """Under equal accuracy the check (one-sided, the one verdict rule) fires at most at its 5% level plus
    Monte Carlo slack."""
    rate = _false_check_rate(300)
    assert rate <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / 300), rate
