"""The power of `sago-train study`'s three tests at the size of a study (docs/study.md#power): how large an effect
must be for the study to claim it, with the groups and the families of tests it has.

    python benchmarks/study_power.py --study runs/study      # the groups and families of that study's report
    python benchmarks/study_power.py --groups 45 --reliability 48 --relations 96 --flips 200

Each test is simulated with the function the study runs (``split_half_reliability``, ``spearman_bootstrap`` with
the family's Bonferroni confidence, ``paired_comparison``: Wilcoxon and the paired bootstrap) on synthetic
per-group values with a known effect, ``--replicates`` times, seeded. The power given is that of ONE true effect
in a family of m tests whose other nulls are true: Holm then claims it when m x p < alpha (its first step). With
more true effects in the family Holm's later steps are easier, so these are lower bounds.

- **reliability**: two halves whose per-group values correlate at Pearson rho (bivariate normal); the claim is
  "not noise".
- **relations**: two axes correlated at rho; the claims are "distinct" (the whole CI inside |rho| < 0.5) and
  "related".
- **flips**: two models whose per-group paired difference is normal with mean +d SD on one set and -d SD on the
  other (d a standardized effect); the claim is a robust flip (both one-sided Wilcoxon p below alpha / m, both
  bootstrap CIs on their side).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sago_train.functional import findings
from sago_train.functional.multiplicity import bonferroni_confidence
from sago_train.functional.stats import ALPHA, paired_comparison

RHOS = (0.0, 0.2, 0.3, 0.5, 0.7)
EFFECTS = (0.0, 0.3, 0.5, 0.8, 1.2)


def _pair(rng: np.random.Generator, n: int, rho: float) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal(n)
    return x, rho * x + np.sqrt(1 - rho**2) * rng.standard_normal(n)


def reliability_power(n: int, m: int, rho: float, replicates: int, seed: int = 0) -> float:
    """The share of replicates in which a split-half correlation of ``rho`` on ``n`` groups is "not noise" in a
    family of ``m`` (m x permutation p < alpha)."""
    rng = np.random.default_rng(seed)
    hits = 0
    for k in range(replicates):
        rel = findings.split_half_reliability(*_pair(rng, n, rho), seed=k)
        hits += m * rel.p_value < ALPHA
    return hits / replicates


def relation_power(n: int, m: int, rho: float, replicates: int, seed: int = 0,
                   n_resamples: int = 1000) -> tuple[float, float]:
    """(share called "distinct", share called "related") for two axes correlated at ``rho`` on ``n`` groups in a
    family of ``m`` pairs."""
    rng = np.random.default_rng(seed)
    confidence = bonferroni_confidence(ALPHA, m)
    distinct = related = 0
    for k in range(replicates):
        _, p, lo, hi, _ = findings.spearman_bootstrap(*_pair(rng, n, rho), n_resamples=n_resamples,
                                                      confidence=confidence, seed=k)
        distinct += max(abs(lo), abs(hi)) < findings.DISTINCT_BOUND
        related += m * p < ALPHA
    return distinct / replicates, related / replicates


def flip_power(n: int, m: int, effect: float, replicates: int, seed: int = 0, n_resamples: int = 1000) -> float:
    """The share of replicates in which a flip of standardized size ``effect`` on both of two sets (``n`` groups
    each) is robust in a family of ``m`` possible flips."""
    rng = np.random.default_rng(seed)
    zero = np.zeros(n)
    hits = 0
    for k in range(replicates):
        a = paired_comparison(zero, effect + rng.standard_normal(n), alternative="greater", n_resamples=n_resamples,
                              seed=k)
        b = paired_comparison(zero, -effect + rng.standard_normal(n), alternative="less", n_resamples=n_resamples,
                              seed=k)
        sides = a.ci_low > 0 and b.ci_high < 0
        hits += bool(sides and m * max(a.p_value, b.p_value) < ALPHA)
    return hits / replicates


def study_sizes(study: Path) -> dict[str, int]:
    """The smallest number of groups of a set, and the three families' sizes, of the study in ``study``: the
    entries its comparison ranked (``report/comparison.json`` as `sago-train study --out` writes it, or
    ``comparison.json`` beside the evaluations), each evaluation in ``study/<label>``; the flips' family as the
    comparison recorded it. Other folders in ``study`` (an earlier study's entries) are not counted."""
    from sago_train.analysis.compare import load_sources
    from sago_train.analysis.report_findings import relations_from_records, reliability_of

    found = [f for f in (study / "report" / "comparison.json", study / "comparison.json") if f.exists()]
    if not found:
        raise SystemExit(f"{study}: no report/comparison.json; run `sago-train study --out {study}` first (it writes "
                         "the comparison this script reads the entries and the flips' family from)")
    cmp = json.loads(found[0].read_text())
    dirs = [study / e["label"] for e in cmp["entries"]]
    missing = [str(d) for d in dirs if not (d / "summary.json").exists()]
    if missing:
        raise SystemExit(f"{found[0]}: the entries' evaluation folders are missing: {', '.join(missing)}")
    evals = load_sources([str(d) for d in dirs], last_only=True)
    family = reliability_of(evals)
    rel_m = sum(1 for r in family.values() if np.isfinite(r.p_holm))  # the tests Holm corrected together
    relations = [r for r in relations_from_records(evals) if r.verdict != "undefined"]
    groups = min(s.n_groups for ev in evals for s in ev.sets.values())
    return {"groups": groups, "reliability": rel_m, "relations": relations[0].family if relations else 0,
            "flips": int(cmp["families"]["axes"]["tested"])}


def table(sizes: dict[str, int], replicates: int, rhos: Sequence[float] = RHOS,
          effects: Sequence[float] = EFFECTS) -> dict[str, Any]:
    n = sizes["groups"]
    return {
        "sizes": sizes, "replicates": replicates, "alpha": ALPHA,
        "smallest_wilcoxon_p": 2.0**-n, "smallest_permutation_p": 1 / 2001,
        "reliability": {f"{r:g}": reliability_power(n, sizes["reliability"], r, replicates) for r in rhos},
        "relations": {f"{r:g}": dict(zip(("distinct", "related"), relation_power(n, sizes["relations"], r, replicates)))
                      for r in rhos},
        "flips": {f"{d:g}": flip_power(n, sizes["flips"], d, replicates) for d in effects},
    }


def markdown(result: dict[str, Any]) -> str:
    s = result["sizes"]
    lines = [f"Power at {s['groups']} groups a set, alpha {result['alpha']}, {result['replicates']} replicates per "
             f"cell (binomial SE at most {0.5 / np.sqrt(result['replicates']):.3f}): the share of replicates in which "
             "the study makes the claim.", "",
             f"| effect | reliability 'not noise' (m = {s['reliability']}) | relations 'distinct' (m = "
             f"{s['relations']}) | relations 'related' |", "|---|---:|---:|---:|"]
    for r, p in result["reliability"].items():
        rel = result["relations"][r]
        lines.append(f"| rho = {r} | {p:.2f} | {rel['distinct']:.2f} | {rel['related']:.2f} |")
    lines += ["", f"| paired effect d (SD), opposite on two sets | robust flip (m = {s['flips']}) |", "|---|---:|"]
    lines += [f"| {d} | {p:.2f} |" for d, p in result["flips"].items()]
    lines += ["", f"Smallest one-sided Wilcoxon p at {s['groups']} groups (exact, without ties): "
                  f"2^-{s['groups']} = "
                  f"{result['smallest_wilcoxon_p']:.2g}; Holm's first threshold for flips: {ALPHA} / {s['flips']} = "
                  f"{ALPHA / max(1, s['flips']):.2g}; for reliability: {ALPHA} / {s['reliability']} = "
                  f"{ALPHA / max(1, s['reliability']):.2g} (the permutation test's smallest p with 2000 permutations: "
                  f"{result['smallest_permutation_p']:.2g})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", type=Path, help="a study's --out folder: its groups and family sizes")
    ap.add_argument("--groups", type=int, default=45)
    ap.add_argument("--reliability", type=int, default=48, help="size of the reliability family")
    ap.add_argument("--relations", type=int, default=96, help="size of the relations family")
    ap.add_argument("--flips", type=int, default=200, help="size of the flip family")
    ap.add_argument("--replicates", type=int, default=200)
    ap.add_argument("--out", type=Path, help="write the result as JSON and markdown here")
    args = ap.parse_args(argv)
    sizes = (study_sizes(args.study) if args.study else
             {"groups": args.groups, "reliability": args.reliability, "relations": args.relations,
              "flips": args.flips})
    result = table(sizes, args.replicates)
    text = markdown(result)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "power.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / "power.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
