"""Predictive validity (docs/validity.md, `make validity`): does an axis measured on the monitored sets predict how
well a fine-tune does on a perturbation kind it never trained, and does it add anything to plain accuracy?

    python scripts/validity.py --model tiny|smollm2 [--run] [--shards 2] [--out runs/validity/<model>]
                               [--publish benchmarks/results/validity/<model>]
    python scripts/validity.py --from benchmarks/results/validity          # the tables and the plot, from records

``--run`` trains the loss experiment's arms x seeds x leave-one-kind-out rotations (scripts/experiment_loss.py,
the settings of :data:`DESIGN`) with every axis evaluated at every checkpoint, and records each (run, step, set,
group). The summary is computed from those records alone. In a rotation that holds out kind ``h``:

- the **target** of a run at a step is its accuracy on the held-out kind: on the ``kinds-h`` set (held-out facts,
  two draws of ``h``), the mean over groups of the mean correctness of the ``h`` variants (the canonical left out);
- the **predictors** are measured where a user's monitor measures them, on the ``instances-h`` set (held-out facts
  under the *trained* kinds): each axis's mean over groups, and the all-variant accuracy (the mean correctness
  of every variant), the plain baseline an axis must beat.

Per axis four statistics, each computed within each rotation and then averaged over the rotations, oriented so that
a positive value means "reads more stable where the held-out kind is answered better" (an axis whose lower value is
more stable is negated):

- ``across_runs``: Spearman's rho over runs (arm x seed) at the last step;
- ``beyond_accuracy``: the partial Spearman correlation at the last step, given monitored-set accuracy (the ranks'
  residuals after a linear fit on the accuracy's ranks): what the axis adds to accuracy;
- ``within_runs``: Pearson's r over the fine-tuned checkpoints with every run's own mean removed: whether the axis
  moves with held-out-kind accuracy while the model trains;
- ``within_beyond``: the same with the demeaned monitored-set accuracy partialled out.

The untrained model's evaluation (step 0, arm ``base``) is in no statistic. It is one evaluation shared by every
run, so resampling runs cannot represent its chance error: counted as every run's step 0, the within-runs CIs
excluded 0 in 0.355 of null replicates (``benchmarks/validity_ci_coverage.py`` at commit 5af485c, nominal 0.05), the whole
correlation resting on one contrast. The loss experiment's summary of the same records reports it as a reference.

95% CIs: percentile bootstrap resampling runs within each rotation (:data:`N_BOOT` resamples).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sago_train.functional.axes.registry import higher_is_better

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Every axis the validity runs record (the registry's, in the order the tables show them).
AXES = ("confidence", "confidence_prob", "generation", "posix", "mirroring", "activation", "activation_rel")
ACCURACY = "accuracy"
STATISTICS = ("across_runs", "beyond_accuracy", "within_runs", "within_beyond")
#: The statistics that partial out monitored-set accuracy (none for accuracy itself).
BEYOND = ("beyond_accuracy", "within_beyond")
LABELS = {"across_runs": "across runs", "beyond_accuracy": "beyond accuracy", "within_runs": "within runs",
          "within_beyond": "within runs, beyond accuracy"}
#: The runs per model: the loss experiment's arms (runs that differ in what they train on), seeds and rotations,
#: evaluated every ``eval_steps`` steps. SmolLM2's is smaller (about 5 min a run on one core with every axis at
#: three checkpoints).
DESIGN: dict[str, dict[str, Any]] = {
    "tiny": {"seeds": "0,1,2,3,4", "draws": 2, "eval_steps": 20,
             "arms": "canonical,augment-fixed,augment-fresh,consistency-kl,consistency-js,relative-default"},
    "smollm2": {"seeds": "0,1", "draws": 1, "eval_steps": 10,
                "arms": "canonical,augment-fixed,augment-fresh,consistency-kl"},
}
N_BOOT = 2000


@dataclass
class Point:
    """One run at one step in one rotation: the target and the monitored-set predictors."""

    unit: tuple[str, int]  # (arm, seed); ("base", -1) is the untrained model
    step: int
    target: float
    predictors: dict[str, float] = field(default_factory=dict)  # axis -> mean, and "accuracy"


def _mean(values: Sequence[float]) -> float:
    vals = [v for v in values if v is not None and np.isfinite(v)]
    return float(np.mean(vals)) if vals else float("nan")


def points(rows: Sequence[dict[str, Any]]) -> dict[str, list[Point]]:
    """``{rotation: [Point]}`` from the records (one per run and step with both of the rotation's sets)."""
    cells: dict[tuple[str, tuple[str, int], int], dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list))
    for r in rows:
        cells[(r["rotation"], (r["arm"], int(r["seed"])), int(r["step"]))][r["set"]].append(r)
    out: dict[str, list[Point]] = defaultdict(list)
    for (rotation, unit, step), sets in sorted(cells.items()):
        if not sets.get("kinds") or not sets.get("instances"):
            continue
        target = _mean([_mean([c for k, c in zip(r["kinds"], r["correct"]) if k != "canonical"])
                        for r in sets["kinds"]])
        monitored = sets["instances"]
        pred = {ACCURACY: _mean([_mean(r["correct"]) for r in monitored])}
        for axis in AXES:
            pred[axis] = _mean([r.get("axes", {}).get(axis) for r in monitored])
        out[rotation].append(Point(unit, step, target, pred))
    return dict(out)


def _nanmean(values: Sequence[float]) -> float:
    """The mean of the finite values (NaN where a rotation's statistic is undefined, e.g. a constant axis)."""
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def _ranks(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x)


def _corr(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def _residual(y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``y`` minus its least-squares line on ``z``."""
    design = np.column_stack([np.ones_like(z), z])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    return y - design @ coef


def partial_corr(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> float:
    """Pearson's correlation of ``x`` and ``y`` after each is fitted linearly on ``z``."""
    if len(x) < 4 or np.std(z) == 0:
        return float("nan")
    return _corr(_residual(x, z), _residual(y, z))


def _demeaned(values: np.ndarray, units: list[tuple[str, int]]) -> np.ndarray:
    """``values`` minus the mean of their unit's values."""
    codes = np.unique(np.array([f"{a}\x00{b}" for a, b in units]), return_inverse=True)[1]
    means = np.bincount(codes, weights=values) / np.bincount(codes)
    return values - means[codes]


def statistic(name: str, pts: Sequence[Point], axis: str) -> float:
    """One of :data:`STATISTICS` for ``axis`` over one rotation's points, oriented (positive: more stable where the
    held-out kind is answered better)."""
    sign = 1.0 if axis == ACCURACY or higher_is_better(axis) else -1.0
    if name in ("across_runs", "beyond_accuracy"):
        last: dict[tuple[str, int], Point] = {}
        for p in pts:
            if p.unit[0] != "base" and (p.unit not in last or p.step > last[p.unit].step):
                last[p.unit] = p
        sel = [p for p in last.values() if np.isfinite(p.predictors[axis])]
        x = _ranks(np.array([sign * p.predictors[axis] for p in sel]))
        y = _ranks(np.array([p.target for p in sel]))
        if name == "across_runs":
            return _corr(x, y)
        return partial_corr(x, y, _ranks(np.array([p.predictors[ACCURACY] for p in sel])))
    # Within runs: every run's fine-tuned checkpoints (the untrained model is in no statistic: module docstring).
    rows = [(p.unit, p) for p in pts if p.unit[0] != "base" and np.isfinite(p.predictors[axis])]
    units = [u for u, _ in rows]
    x = _demeaned(np.array([sign * p.predictors[axis] for _, p in rows]), units)
    y = _demeaned(np.array([p.target for _, p in rows]), units)
    if name == "within_runs":
        return _corr(x, y)
    return partial_corr(x, y, _demeaned(np.array([p.predictors[ACCURACY] for _, p in rows]), units))


def _resample(pts: Sequence[Point], rng: np.random.Generator) -> list[Point]:
    """The rotation's runs drawn with replacement (each draw a new unit: a run drawn twice counts twice); the
    untrained model, in no statistic, is left out."""
    units = sorted({p.unit for p in pts if p.unit[0] != "base"})
    by_unit = defaultdict(list)
    for p in pts:
        by_unit[p.unit].append(p)
    out: list[Point] = []
    for k, i in enumerate(rng.integers(0, len(units), len(units))):
        out += [Point((units[i][0], k), p.step, p.target, p.predictors) for p in by_unit[units[i]]]
    return out


def analyse(by_rotation: dict[str, list[Point]], n_boot: int = N_BOOT, seed: int = 0) -> dict[str, Any]:
    """Every statistic of every quantity: the mean over rotations, its bootstrap CI and the per-rotation values."""
    rng = np.random.default_rng(seed)
    quantities = [ACCURACY, *[a for a in AXES if any(np.isfinite(p.predictors[a])
                                                     for pts in by_rotation.values() for p in pts)]]
    result: dict[str, Any] = {}
    boots = [{rot: _resample(pts, rng) for rot, pts in by_rotation.items()} for _ in range(n_boot)]
    for q in quantities:
        result[q] = {}
        for name in STATISTICS:
            if q == ACCURACY and name in BEYOND:
                continue  # accuracy beyond itself
            per_rot = {rot: statistic(name, pts, q) for rot, pts in by_rotation.items()}
            draws = [_nanmean([statistic(name, pts, q) for pts in b.values()]) for b in boots]
            draws = [d for d in draws if np.isfinite(d)]
            lo, hi = (np.percentile(draws, [2.5, 97.5]) if draws else (float("nan"),) * 2)
            result[q][name] = {"estimate": _nanmean(list(per_rot.values())), "ci": [float(lo), float(hi)],
                               "per_rotation": per_rot}
    return result


def summarize(rows: Sequence[dict[str, Any]], model: str, n_boot: int = N_BOOT) -> dict[str, Any]:
    by_rotation = points(rows)
    runs = {rot: len({p.unit for p in pts if p.unit[0] != "base"}) for rot, pts in by_rotation.items()}
    steps = sorted({p.step for pts in by_rotation.values() for p in pts})
    return {"model": model, "runs_per_rotation": runs, "steps": steps, "n_boot": n_boot,
            "statistics": analyse(by_rotation, n_boot)}


def _cell(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "—"
    lo, hi = entry["ci"]
    return f"{entry['estimate']:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def markdown(summary: dict[str, Any]) -> str:
    stats = summary["statistics"]
    runs = ", ".join(f"{r} {n}" for r, n in summary["runs_per_rotation"].items())
    lines = [f"**{summary['model']}**: runs per held-out kind: {runs}; checkpoints at steps "
             f"{', '.join(str(s) for s in summary['steps'] if s)} (the untrained model's step 0 is in no statistic); "
             f"{summary['n_boot']} bootstrap resamples.",
             "", "| quantity (monitored sets) | " + " | ".join(LABELS[s] for s in STATISTICS) + " |",
             "|---|" + "---:|" * len(STATISTICS)]
    for q, entry in stats.items():
        lines.append(f"| {q} | " + " | ".join(_cell(entry.get(s)) for s in STATISTICS) + " |")
    return "\n".join(lines) + "\n"


def plot(summaries: Sequence[dict[str, Any]], path: Path) -> None:
    """The across-runs, beyond-accuracy and within-runs estimates with their CIs, one panel per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summaries), figsize=(5.5 * len(summaries), 3.9), squeeze=False)
    for ax, summary in zip(axes[0], summaries):
        stats = summary["statistics"]
        names = list(stats)
        for k, (stat, colour) in enumerate((("across_runs", "tab:blue"), ("beyond_accuracy", "tab:orange"),
                                            ("within_runs", "tab:green"))):
            ys = np.arange(len(names)) + (k - 1) * 0.25
            est = [stats[q].get(stat, {}).get("estimate", np.nan) for q in names]
            lo = [stats[q].get(stat, {}).get("ci", [np.nan, np.nan])[0] for q in names]
            hi = [stats[q].get(stat, {}).get("ci", [np.nan, np.nan])[1] for q in names]
            ax.errorbar(est, ys, xerr=[np.subtract(est, lo), np.subtract(hi, est)], fmt="o", color=colour,
                        label=LABELS[stat], capsize=2, markersize=4)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(np.arange(len(names)), names)
        ax.invert_yaxis()
        ax.set_xlim(-1, 1)
        ax.set_title(f"{summary['model']}: predicting held-out-kind accuracy", fontsize=9)
        ax.set_xlabel("correlation (positive: more stable where generalization is better)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(model: str, out: Path, shards: int) -> int:
    """The validity runs of ``model`` (resumable: finished runs are kept)."""
    import experiment_loss

    d = DESIGN[model]
    return experiment_loss.main(["--model", model, "--seeds", d["seeds"], "--arms", d["arms"], "--draws",
                                 str(d["draws"]), "--eval-steps", str(d["eval_steps"]), "--axes", ",".join(AXES),
                                 "--shards", str(shards), "--out", str(out)])


def write(records: Path, out: Path, model: str, n_boot: int = N_BOOT) -> dict[str, Any]:
    from experiment_loss_summary import read_jsonl

    from sago_train.functional.stats import to_jsonable

    rows = read_jsonl(records)
    if not rows:
        raise SystemExit(f"{records}: no records; run `make validity MODEL={model}` first")
    summary = summarize(rows, model, n_boot)
    out.mkdir(parents=True, exist_ok=True)
    (out / "validity.json").write_text(json.dumps(to_jsonable(summary), indent=1) + "\n")
    (out / "validity.md").write_text(markdown(summary))
    return summary


#: What the published records keep (the validity summary and the loss experiment's read these; the run's own
#: records keep the per-variant log-probabilities too).
PUBLISHED = ("arm", "seed", "run", "rotation", "set", "step", "id", "kinds", "correct", "confidence", "axes")


def publish(out: Path, dest: Path) -> None:
    """The validity summary, the loss experiment's summary of the same runs, the timings and the records'
    :data:`PUBLISHED` fields (gzipped; the same records give the same bytes) under ``dest``."""
    import experiment_loss

    experiment_loss.publish(out, dest, fields=PUBLISHED, names=("validity.md", "validity.json", "summary.md",
                                                                 "summary.json", "timings.jsonl"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=tuple(DESIGN), default="tiny")
    ap.add_argument("--run", action="store_true", help="train and evaluate the runs first (resumes)")
    ap.add_argument("--shards", type=int, default=2, help="processes of one thread each (2 on 2 cores)")
    ap.add_argument("--out", default=None, help="default runs/validity/<model>")
    ap.add_argument("--publish", default=None, metavar="DIR", help="copy the summary and gzipped records to DIR")
    ap.add_argument("--from", dest="from_", default=None, metavar="DIR",
                    help="summarize every <DIR>/<model>/records.jsonl.gz and draw the plot (docs/validity.png)")
    ap.add_argument("--n-boot", type=int, default=N_BOOT)
    args = ap.parse_args(argv)
    if args.from_:
        summaries = [write(d / "records.jsonl", d, d.name, args.n_boot)
                     for d in sorted(Path(args.from_).iterdir()) if (d / "records.jsonl.gz").exists()]
        for s in summaries:
            print(markdown(s))
        plot(summaries, ROOT / "docs" / "validity.png")
        return 0
    out = Path(args.out or f"runs/validity/{args.model}")
    if args.run:
        code = run(args.model, out, args.shards)
        if code:
            return code
    summary = write(out / "records.jsonl", out, args.model, args.n_boot)
    print(markdown(summary))
    if args.publish:
        publish(out, Path(args.publish))
    return 0


if __name__ == "__main__":
    sys.exit(main())
