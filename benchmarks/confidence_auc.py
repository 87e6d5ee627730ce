"""Does an axis read a group whose variants disagree on correctness as less stable than one whose variants are
all right? The known truth behind the confidence axis's definition (docs/definitions.md#confidence).

    .venv/bin/python benchmarks/confidence_auc.py --run runs/demo-real-canonical [--out benchmarks/results/confidence-auc]
    .venv/bin/python benchmarks/confidence_auc.py --from benchmarks/results/confidence-auc   # recompute from records

``--run`` takes a finished ``sago-train run`` of recipes/demo-real.yaml (its final adapter in the output
directory), evaluates the untrained model of its recipe and the fine-tune on the recipe's monitored sets (every
group) with the axes below, writes both evaluations (``base/``, ``finetune/``: summary.json + group records) and
``auc.json``. Groups of the two evaluations are pooled; a group is *unstable* when its variants disagree on
correctness, *stable* when every variant is right (groups all wrong are in neither class). For each axis,
AUC = P(axis value of an unstable group > that of a stable group), ties counted half (the Mann-Whitney U over
n_unstable x n_stable), with a 95% bootstrap CI resampling groups within each class.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

AXES = ("confidence", "confidence_prob", "posix", "activation", "activation_rel", "generation", "mirroring")


def auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(a positive's score > a negative's), ties half: the Mann-Whitney U / (n_pos * n_neg).

    Example:
        >>> auc(np.array([3.0, 2.0]), np.array([1.0, 2.0]))
        0.875
    """
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(positive, negative, alternative="greater").statistic / (positive.size * negative.size))


def auc_ci(positive: np.ndarray, negative: np.ndarray, n_resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    vals = [auc(rng.choice(positive, positive.size), rng.choice(negative, negative.size)) for _ in range(n_resamples)]
    return float(np.quantile(vals, 0.025)), float(np.quantile(vals, 0.975))


def classes(evaluations: dict) -> dict[str, dict[str, list[float]]]:
    """Per axis, the values of the pooled unstable groups and stable groups."""
    out: dict[str, dict[str, list[float]]] = {a: {"unstable": [], "stable": []} for a in AXES}
    for ev in evaluations.values():
        for s in ev.sets.values():
            for g in s.groups:
                if not g.correct:
                    continue
                label = "stable" if all(g.correct) else ("unstable" if any(g.correct) else None)
                if label is None:
                    continue
                for a in AXES:
                    v = g.axes.get(a)
                    if v is not None and np.isfinite(v):
                        out[a][label].append(float(v))
    return out


def table(evaluations: dict) -> dict:
    rows = {}
    for a, c in classes(evaluations).items():
        pos, neg = np.array(c["unstable"]), np.array(c["stable"])
        if not pos.size or not neg.size:
            continue
        lo, hi = auc_ci(pos, neg)
        rows[a] = {"auc": auc(pos, neg), "ci_low": lo, "ci_high": hi, "n_unstable": int(pos.size),
                   "n_stable": int(neg.size), "mean_unstable": float(pos.mean()), "mean_stable": float(neg.mean())}
    return rows


def verdicts(evaluations: dict) -> list[dict]:
    """The fine-tune against the untrained model, per set and quantity, by the one verdict rule (what ``compare``
    and ``report`` say)."""
    from sago_train.analysis.report import paired_against_first

    keep = ("set", "axis", "n", "mean_diff", "ci_low", "ci_high", "outcome", "verdict")
    return [{k: r.get(k) for k in keep} for r in paired_against_first([evaluations["base"], evaluations["finetune"]])]


def evaluate(run: Path, out: Path) -> dict:
    import yaml

    from sago_train import SAGOEvaluator
    from sago_train.cli.recipe import ASSETS
    from sago_train.data.sources import resolve_sets

    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    shipped = "sago://"  # a file shipped with the package (the recipe's own spelling)
    sets = resolve_sets({name: str(ASSETS / p[len(shipped):]) if p.startswith(shipped) else p
                         for name, p in recipe["monitor"]["sets"].items()})
    options = {k: v for k, v in (recipe["monitor"].get("options") or {}).items() if k in ("max_new_tokens",)}
    evaluations = {}
    for label, path in (("base", recipe["model"]["path"]), ("finetune", str(run))):
        ev = SAGOEvaluator.from_pretrained(path, axes=",".join(AXES), max_groups=0, **options)
        evaluations[label] = ev.evaluate(sets)
        evaluations[label].write(out / label)
    return evaluations


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, help="a finished sago-train run of recipes/demo-real.yaml")
    ap.add_argument("--from", dest="source", type=Path, help="recompute from written evaluations")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/confidence-auc"))
    args = ap.parse_args()
    from sago_train.results.evaluation import Evaluation

    if args.source is not None:
        evaluations = {label: Evaluation.read(args.source / label) for label in ("base", "finetune")}
        out = args.source
    elif args.run is not None:
        evaluations, out = evaluate(args.run, args.out), args.out
    else:
        ap.error("give --run or --from")
    rows = table(evaluations)
    (out / "auc.json").write_text(json.dumps(rows, indent=2) + "\n")
    changes = verdicts(evaluations)
    (out / "verdicts.json").write_text(json.dumps(changes, indent=2) + "\n")
    print("| axis | AUC, unstable > stable [95% CI] | unstable groups: mean | stable groups: mean |")
    print("|---|---:|---:|---:|")
    for a, r in rows.items():
        print(f"| {a} | {r['auc']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | {r['n_unstable']}: "
              f"{r['mean_unstable']:.4f} | {r['n_stable']}: {r['mean_stable']:.4f} |")
    print()
    print(verdict_table(changes))


def verdict_table(changes: list[dict]) -> str:
    """Markdown: per quantity, the fine-tune's verdict against the untrained model on each set (the mean
    difference and the one rule's word)."""
    sets = list(dict.fromkeys(c["set"] for c in changes))
    quantities = list(dict.fromkeys(c["axis"] for c in changes))
    by = {(c["set"], c["axis"]): c for c in changes}
    lines = ["| quantity | " + " | ".join(sets) + " |", "|---|" + "---|" * len(sets)]
    for q in quantities:
        cells = []
        for s in sets:
            c = by.get((s, q))
            cells.append("-" if c is None or c.get("mean_diff") is None else f"{c['mean_diff']:+.3f} {c['outcome']}")
        lines.append(f"| {q} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
