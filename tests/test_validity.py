"""scripts/validity.py (docs/validity.md, `make validity`): the statistics against plain references, known truths
on fabricated records (an axis that predicts, one that does not, one that only restates accuracy), and the records
of a real (toy) run holding every checkpoint and every axis."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import experiment_loss  # noqa: E402
import experiment_loss_summary as loss_summary  # noqa: E402
import validity  # noqa: E402


def test_partial_correlation_matches_the_textbook_formula():
    rng = np.random.default_rng(0)
    z = rng.normal(size=40)
    x, y = z + rng.normal(size=40), 2 * z + rng.normal(size=40)
    rxy, rxz, ryz = np.corrcoef(x, y)[0, 1], np.corrcoef(x, z)[0, 1], np.corrcoef(y, z)[0, 1]
    ref = (rxy - rxz * ryz) / np.sqrt((1 - rxz**2) * (1 - ryz**2))
    assert validity.partial_corr(x, y, z) == pytest.approx(ref, abs=1e-12)


def _row(rot, arm, seed, step, part, correct, axes, kinds=None):
    kinds = kinds or (["canonical", rot, f"{rot}-2"] if part == "kinds" else ["canonical", "a", "b"])
    return {"arm": arm, "seed": seed, "run": rot, "rotation": rot, "set": part, "step": step, "id": "g",
            "kinds": kinds, "correct": correct, "axes": axes}


def test_points_take_the_held_out_kind_without_the_canonical_and_every_monitored_variant():
    rows = [_row("typo", "a", 0, 5, "kinds", [1, 0, 0], {}), _row("typo", "a", 0, 5, "kinds", [0, 1, 1], {}),
            _row("typo", "a", 0, 5, "instances", [1, 1, 0], {"confidence": 0.2}),
            _row("typo", "a", 0, 5, "instances", [0, 0, 0], {"confidence": 0.4})]
    (p,) = validity.points(rows)["typo"]
    assert p.target == pytest.approx(np.mean([0.0, 1.0]))  # canonical left out: (0+0)/2 and (1+1)/2
    assert p.predictors["accuracy"] == pytest.approx(np.mean([2 / 3, 0.0]))
    assert p.predictors["confidence"] == pytest.approx(0.3)
    assert np.isnan(p.predictors["posix"])  # not recorded


def _fabricated(n_runs=24, rotations=("typo", "casing"), steps=(10, 20), seed=0):
    """Runs whose held-out-kind accuracy is known: ``predicts`` (an instability, lower is more stable) falls with
    it, ``noise`` is independent of it, ``restates`` is a function of monitored accuracy alone (which tracks it)."""
    rng = np.random.default_rng(seed)
    rows = []
    for rot in rotations:
        for r in range(n_runs):
            skill = rng.uniform(0.2, 0.8)
            for step in steps:
                target = np.clip(skill + 0.1 * step / 20 + rng.normal(0, 0.02), 0, 1)
                acc = np.clip(target + rng.normal(0, 0.15), 0, 1)
                axes = {"confidence": 1 - target + rng.normal(0, 0.03), "posix": rng.normal(),
                        "generation": 1 - acc}
                n = 60
                right = int(round(target * n))
                kinds = [[1, 1, 1]] * right + [[1, 0, 0]] * (n - right)
                mon = int(round(acc * n))
                rows += [_row(rot, "arm", r, step, "kinds", c, {}) for c in kinds]
                rows += [_row(rot, "arm", r, step, "instances", [1, 1, 1] if i < mon else [0, 0, 0], axes)
                         for i in range(n)]
    return rows


def test_known_truths_read_as_they_are():
    stats = validity.summarize(_fabricated(), "toy", n_boot=200)["statistics"]
    # confidence (the axis that predicts): positive across runs, beyond accuracy and within runs.
    for name in ("across_runs", "beyond_accuracy", "within_runs"):
        assert stats["confidence"][name]["ci"][0] > 0.3, name
    # posix (noise): every CI covers 0.
    for name in validity.STATISTICS:
        lo, hi = stats["posix"][name]["ci"]
        assert lo < 0 < hi, name
    # generation restates monitored accuracy: predicts across runs, adds nothing beyond it.
    assert stats["generation"]["across_runs"]["ci"][0] > 0.3
    lo, hi = stats["generation"]["beyond_accuracy"]["ci"]
    assert lo < 0.05 and abs(stats["generation"]["beyond_accuracy"]["estimate"]) < 0.15
    assert stats["accuracy"]["across_runs"]["estimate"] > 0.5 and "beyond_accuracy" not in stats["accuracy"]


def test_across_runs_is_spearman_over_the_last_step_of_each_run_averaged_over_rotations():
    rows = _fabricated(n_runs=10)
    by_rot = validity.points(rows)
    per_rot = []
    for pts in by_rot.values():
        last = [p for p in pts if p.step == 20]
        per_rot.append(spearmanr([-p.predictors["confidence"] for p in last], [p.target for p in last])[0])
    stats = validity.analyse(by_rot, n_boot=20)
    assert stats["confidence"]["across_runs"]["estimate"] == pytest.approx(np.mean(per_rot), abs=1e-12)


def test_within_runs_removes_each_runs_level():
    """An axis whose level differs between runs at random (uncorrelated with their skill) but that falls as each run
    improves: nothing across runs, a strong correlation within runs."""
    rng = np.random.default_rng(1)
    rows = []
    for r in range(20):
        level, skill = rng.normal(0, 5), rng.uniform(0.2, 0.6)
        for step in (10, 20, 30):
            target = skill + step / 100
            right = int(round(target * 50))
            axes = {"confidence": level - step / 100 + rng.normal(0, 0.005)}
            rows += [_row("typo", "arm", r, step, "kinds", [1, 1, 1] if i < right else [1, 0, 0], {})
                     for i in range(50)]
            rows += [_row("typo", "arm", r, step, "instances", [1, 1, 1], axes) for _ in range(50)]
    stats = validity.summarize(rows, "toy", n_boot=100)["statistics"]["confidence"]
    assert abs(stats["across_runs"]["estimate"]) < 0.5
    assert stats["within_runs"]["estimate"] > 0.9


def test_within_runs_leaves_out_the_untrained_model():
    """Forgetting as the only contrast: the untrained model (step 0) is right and stable, every fine-tuned
    checkpoint is worse on both, and among the fine-tuned checkpoints the axis is noise. Counted as every run's
    step 0, the one shared evaluation would make the within-runs statistic read that contrast with a narrow CI
    (the run bootstrap cannot resample it); without it the statistic reads nothing."""
    rng = np.random.default_rng(2)
    n = 50

    def cell(run, step, target, monitored, conf, arm="arm"):
        right, mon = int(round(target * n)), int(round(monitored * n))
        kinds = [_row("typo", arm, run, step, "kinds", [1, 1, 1] if i < right else [1, 0, 0], {}) for i in range(n)]
        inst = [_row("typo", arm, run, step, "instances", [1, 1, 1] if i < mon else [0, 0, 0],
                     {"confidence": conf}) for i in range(n)]
        return kinds + inst

    rows = cell(-1, 0, 0.9, 0.9, 0.1, arm="base")
    for r in range(16):
        for step in (10, 20, 30):  # monitored accuracy independent of the target: "beyond accuracy" has room
            rows += cell(r, step, rng.uniform(0.3, 0.6), rng.uniform(0.3, 0.6), 0.5 + rng.normal(0, 0.05))
    stats = validity.summarize(rows, "toy", n_boot=200)["statistics"]["confidence"]
    for name in ("within_runs", "within_beyond"):
        lo, hi = stats[name]["ci"]
        assert lo < 0 < hi and abs(stats[name]["estimate"]) < 0.25, name
    # The same statistic by hand: Pearson r of the demeaned values over the fine-tuned checkpoints.
    pts = [p for p in validity.points(rows)["typo"] if p.unit[0] != "base"]
    units = sorted({p.unit for p in pts})
    x = np.concatenate([[-p.predictors["confidence"] for p in pts if p.unit == u] for u in units])
    y = np.concatenate([[p.target for p in pts if p.unit == u] for u in units])
    mx = np.concatenate([np.full(3, np.mean([-p.predictors["confidence"] for p in pts if p.unit == u])) for u in units])
    my = np.concatenate([np.full(3, np.mean([p.target for p in pts if p.unit == u])) for u in units])
    assert stats["within_runs"]["estimate"] == pytest.approx(np.corrcoef(x - mx, y - my)[0, 1], abs=1e-9)


def test_markdown_and_plot_restate_the_summary(tmp_path):
    summary = validity.summarize(_fabricated(n_runs=8), "toy", n_boot=50)
    text = validity.markdown(summary)
    c = summary["statistics"]["confidence"]["across_runs"]
    assert f"| confidence | {c['estimate']:+.2f} [{c['ci'][0]:+.2f}, {c['ci'][1]:+.2f}]" in text
    validity.plot([summary], tmp_path / "v.png")
    assert (tmp_path / "v.png").stat().st_size > 1000


@pytest.mark.slow  # about 30-60 s on 2 shared cores: 3 tiny training runs with every axis at two checkpoints
def test_validity_runs_record_every_checkpoint_and_every_axis(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    axes = ",".join(validity.AXES)
    assert experiment_loss.main(["--seeds", "0", "--arms", "canonical,augment-fresh", "--kinds", "typo,whitespace",
                                 "--draws", "1", "--max-train", "8", "--max-groups", "4", "--steps", "4",
                                 "--eval-steps", "2", "--axes", axes, "--out", str(tmp_path)]) == 0
    rows = loss_summary.read_jsonl(tmp_path / "records.jsonl")
    assert {(r["arm"], r["step"]) for r in rows} == {("base", 0), ("canonical", 2), ("canonical", 4),
                                                    ("augment-fresh", 2), ("augment-fresh", 4)}
    assert all(set(r["axes"]) == set(validity.AXES) and len(r["logprobs"]) == len(r["kinds"]) for r in rows)
    # The loss summary reads each run's last step only.
    summary = json.loads((tmp_path / "summary.json").read_text())
    last = [r for r in rows if r["arm"] == "canonical" and r["step"] == 4 and r["set"] == "kinds"]
    by_group = {}
    for r in last:
        by_group.setdefault(r["id"], []).append(np.mean(r["correct"]))
    want = np.mean([np.mean(v) for v in by_group.values()])
    assert summary["sets"]["kinds"]["levels"]["canonical"]["accuracy"]["mean"] == pytest.approx(want)
    result = validity.write(tmp_path / "records.jsonl", tmp_path, "tiny", n_boot=20)
    assert result["steps"] == [0, 2, 4] and result["runs_per_rotation"] == {"typo": 2, "whitespace": 2}
    # The published copy (fewer fields, gzipped) gives the same summary.
    validity.publish(tmp_path, tmp_path / "published")
    again = validity.write(tmp_path / "published" / "records.jsonl", tmp_path / "published", "tiny", n_boot=20)
    assert json.dumps(again["statistics"], sort_keys=True) == json.dumps(result["statistics"], sort_keys=True)


def test_the_committed_summary_is_computed_from_the_committed_records_and_quoted_in_the_docs():
    root = Path(__file__).resolve().parents[1]
    results = root / "benchmarks" / "results" / "validity"
    doc = (root / "docs" / "validity.md").read_text()
    for folder in sorted(p for p in results.iterdir() if (p / "records.jsonl.gz").exists()):
        committed = json.loads((folder / "validity.json").read_text())
        again = validity.summarize(loss_summary.read_jsonl(folder / "records.jsonl"), committed["model"], n_boot=0)
        for q, entry in committed["statistics"].items():
            for name, stat in entry.items():
                assert again["statistics"][q][name]["estimate"] == pytest.approx(stat["estimate"], abs=1e-9), (q, name)
        table = validity.markdown(committed)
        assert table.split("\n", 2)[2] in doc, f"docs/validity.md does not quote {folder.name}'s table"


def test_the_readme_quotes_the_committed_figures():
    """Each correlation the README's "What the signals mean" paragraph quotes is the committed summary's."""
    root = Path(__file__).resolve().parents[1]
    readme = " ".join((root / "README.md").read_text().split())
    para = readme[readme.index("**What the signals mean**"): readme.index("## Install")]

    def figure(model, quantity, stat, ci=False):
        entry = json.loads((root / "benchmarks" / "results" / "validity" / model / "validity.json").read_text())
        e = entry["statistics"][quantity][stat]
        text = f"{e['estimate']:+.2f}"
        return text + (f" [{e['ci'][0]:+.2f}, {e['ci'][1]:+.2f}]" if ci else "")

    quoted = [f"tiny {figure('tiny', 'accuracy', 'across_runs')} across runs, "
              f"{figure('tiny', 'accuracy', 'within_runs')} within runs",
              f"SmolLM2 {figure('smollm2', 'accuracy', 'within_runs')} within runs, "
              f"{figure('smollm2', 'accuracy', 'across_runs', ci=True)} across its 8 runs",
              f"({figure('tiny', 'generation', 'across_runs')} across runs)",
              "(" + ", ".join(figure("tiny", a, "across_runs") for a in ("confidence", "posix", "activation"))
              + " across runs)",
              "(" + ", ".join(figure("smollm2", a, "within_runs") for a in ("confidence", "posix", "activation"))
              + " within runs, CIs covering 0)"]
    for a in ("confidence", "posix", "activation"):  # "CIs covering 0"
        lo, hi = json.loads((root / "benchmarks" / "results" / "validity" / "smollm2" / "validity.json").read_text()
                            )["statistics"][a]["within_runs"]["ci"]
        assert lo < 0 < hi, a
    for q in quoted:
        assert q in para, q
