"""How often scripts/validity.py's 95% bootstrap CIs exclude 0 when an axis predicts nothing (docs/validity.md).

    python benchmarks/validity_ci_coverage.py [--replicates 200] [--n-boot 200]

Each replicate is a seeded set of fabricated runs (2 rotations x 20 runs x 2 checkpoints and
the untrained model's step 0, 30 groups a set) whose
held-out-kind accuracy, monitored-set accuracy and axis are independent; the whole public path (records ->
``validity.summarize``) computes every statistic and its CI. Prints the share of replicates whose CI excludes 0
per statistic (nominal 0.05) and the binomial standard error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import validity  # noqa: E402


def null_rows(seed: int, n_runs: int = 20, rotations: tuple[str, ...] = ("typo", "casing"), n: int = 30) -> list[dict]:
    rng = np.random.default_rng(seed)
    # The untrained model (step 0 of every run, as the validity runs record it), then the fine-tuned checkpoints.
    cells = [("base", -1, 0)] + [("arm", run, step) for run in range(n_runs) for step in (10, 20)]
    rows = []
    for rot in rotations:
        for arm, unit, step in cells:
            right, mon = int(round(rng.uniform(0.2, 0.8) * n)), int(round(rng.uniform(0.2, 0.8) * n))
            axes = {"confidence": float(rng.normal())}
            meta = {"arm": arm, "seed": unit, "run": rot, "rotation": rot, "step": step, "id": "g"}
            rows += [{**meta, "set": "kinds", "kinds": ["canonical", rot, f"{rot}-2"],
                      "correct": [1, 1, 1] if i < right else [1, 0, 0], "axes": {}} for i in range(n)]
            rows += [{**meta, "set": "instances", "kinds": ["canonical", "a", "b"],
                      "correct": [1, 1, 1] if i < mon else [0, 0, 0], "axes": axes} for i in range(n)]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicates", type=int, default=200)
    ap.add_argument("--n-boot", type=int, default=200)
    args = ap.parse_args()
    excluded = dict.fromkeys(validity.STATISTICS, 0)
    for k in range(args.replicates):
        stats = validity.summarize(null_rows(k), "null", n_boot=args.n_boot)["statistics"]["confidence"]
        for name in excluded:
            lo, hi = stats[name]["ci"]
            excluded[name] += not lo <= 0 <= hi
    se = np.sqrt(0.05 * 0.95 / args.replicates)
    for name, count in excluded.items():
        print(f"{name}: CI excludes 0 in {count / args.replicates:.3f} of {args.replicates} null replicates "
              f"(nominal 0.05, SE {se:.3f})")


if __name__ == "__main__":
    main()
