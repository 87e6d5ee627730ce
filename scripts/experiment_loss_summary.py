"""The loss experiment's summary (docs/loss-experiment.md), computed from its per-group records alone.

A record is one group of one held-out set in one run: ``{model, arm, seed, run, rotation, set, id, kinds, correct,
confidence}`` (``set`` is ``kinds`` or ``instances``; ``rotation`` the kind that run held out). Per arm, seed, set
and group the endpoints combine the group's rotations:

- ``accuracy`` (all-variant accuracy): the mean correctness over every variant of every rotation;
- ``worst_kind`` (worst-kind accuracy): per perturbation kind the mean correctness of its variants (over the
  rotations that evaluated the kind in this set), then the minimum over kinds; the canonical is not a kind here;
- ``confidence`` (confidence instability, the SAGO axis; lower is more stable): the mean over rotations;
- ``canonical``: the canonical variant's correctness, the mean over rotations (the non-inferiority constraint).

Tests, against the baseline arm on the same groups and seeds: per group the mean over seeds, a one-sided Wilcoxon
signed-rank test (:func:`sago_train.functional.stats.paired_comparison`), the crossed groups x seeds paired bootstrap
CI of the difference (:func:`sago_train.functional.stats.crossed_paired_bootstrap`), Holm over the primary
endpoints x arms of a set (:func:`sago_train.functional.multiplicity.holm`), and the sign of the difference per seed.
Canonical accuracy: non-inferior when the crossed CI's lower bound is above ``-MARGIN``.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

#: endpoint -> (label, alternative of "arm vs baseline": the direction that means better)
PRIMARY: dict[str, tuple[str, str]] = {
    "worst_kind": ("worst-kind accuracy", "greater"),
    "accuracy": ("all-variant accuracy", "greater"),
    "confidence": ("confidence instability", "less"),
}
MARGIN = 0.02
#: Arms whose canonical accuracy is also checked against the arm they add one thing to: the shipped relative loss
#: sits on top of fixed-phrasing augmentation (its term), and fixed-phrasing augmentation, today's
#: ``StabilityConfig()``, on top of canonical-only training (the augmentation itself).
OWN_CONTROL = {"relative-default": "augment-fixed", "consistency-kl": "augment-fresh", "consistency-js": "augment-fresh",
               "augment-fixed": "canonical"}
SETS = {"kinds": "held-out kinds (primary)", "instances": "held-out instances (secondary)"}
_REPEAT = re.compile(r"-\d+$")  # build_variant_set's suffix of a repeated kind ("typo-2")


def complete(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The records of the (arm, seed) pairs that have every rotation of every set, and the pairs left out (an
    interrupted experiment: endpoints over some rotations only would not be comparable)."""
    rotations: dict[str, set[str]] = defaultdict(set)
    seen: dict[tuple[str, int, str], set[str]] = defaultdict(set)
    for r in rows:
        rotations[r["set"]].add(r["rotation"])
        seen[(r["arm"], int(r["seed"]), r["set"])].add(r["rotation"])
    bad = {(a, s) for (a, s, part), rots in seen.items() if rots != rotations[part]}
    return ([r for r in rows if (r["arm"], int(r["seed"])) not in bad],
            [f"{a} seed {s}" for a, s in sorted(bad)])


def group_endpoints(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, int, str], dict[str, dict[str, float]]]:
    """``{(arm, seed, set): {endpoint: {group id: value}}}`` from the records (see the module docstring), at each
    run's last evaluated step (records of validity runs hold every checkpoint)."""
    rows = list(rows)
    last: dict[tuple[str, int, str], int] = {}
    for r in rows:
        key = (r["arm"], int(r["seed"]), r.get("run", r["rotation"]))
        last[key] = max(last.get(key, 0), int(r.get("step", 0)))
    cells: dict[tuple[str, int, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if int(r.get("step", 0)) != last[(r["arm"], int(r["seed"]), r.get("run", r["rotation"]))]:
            continue
        cells[(r["arm"], int(r["seed"]), r["set"], r["id"])].append(r)
    out: dict[tuple[str, int, str], dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for (arm, seed, part, gid), recs in cells.items():
        per_kind: dict[str, list[int]] = defaultdict(list)
        for r in recs:
            for kind, c in zip(r["kinds"], r["correct"]):
                if kind != "canonical":
                    per_kind[_REPEAT.sub("", kind)].append(int(c))
        e = out[(arm, seed, part)]
        e["accuracy"][gid] = float(np.mean([np.mean(r["correct"]) for r in recs]))
        e["worst_kind"][gid] = float(min(np.mean(v) for v in per_kind.values())) if per_kind else float("nan")
        e["confidence"][gid] = float(np.mean([r["confidence"] for r in recs]))
        e["canonical"][gid] = float(np.mean([r["correct"][r["kinds"].index("canonical")] for r in recs]))
        for kind, v in per_kind.items():  # a diagnostic: which kind sets the worst-kind accuracy
            e[f"kind:{kind}"][gid] = float(np.mean(v))
    return out


def grids(ends: dict[tuple[str, int, str], dict[str, dict[str, float]]], arm: str, baseline: str, part: str,
          endpoint: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """``(baseline [G, S], arm [G, S], seeds)`` over the seeds both arms have and the groups every one of them has."""
    seeds = sorted({s for (a, s, p) in ends if a == arm and p == part} &
                   {s for (a, s, p) in ends if a == baseline and p == part})
    if not seeds:
        raise ValueError(f"arm {arm!r} and baseline {baseline!r} share no seed on set {part!r}")
    ids = set.intersection(*(set(ends[(a, s, part)][endpoint]) for a in (arm, baseline) for s in seeds))
    order = sorted(ids)
    base = np.array([[ends[(baseline, s, part)][endpoint][g] for s in seeds] for g in order])
    other = np.array([[ends[(arm, s, part)][endpoint][g] for s in seeds] for g in order])
    return base, other, seeds


def compare(base: np.ndarray, other: np.ndarray, alternative: str) -> dict[str, Any]:
    """One arm against the baseline on ``[G, S]`` grids: the tests of the module docstring."""
    from sago_train.functional import stats

    keep = ~(np.isnan(base).any(1) | np.isnan(other).any(1))
    base, other = base[keep], other[keep]
    wil = stats.paired_comparison(base.mean(1), other.mean(1), alternative=alternative)
    crossed = stats.crossed_paired_bootstrap(base, other)
    per_seed = (other - base).mean(0)
    p_seeds = seed_level_p(per_seed, alternative)
    # The claim's p: the larger of the two. The Wilcoxon's unit is the group, so a training run's shift shared by all
    # its groups reads as an effect; the seeds' t-test has the run as its unit. A claim needs both (measured:
    # tests/test_experiment_loss.py's null simulation with run-to-run variation).
    return {"diff": crossed.mean, "ci_low": crossed.ci_low, "ci_high": crossed.ci_high, "p": wil.p_value,
            "p_seeds": p_seeds, "p_claim": max(wil.p_value, p_seeds) if alternative != "two-sided" else wil.p_value,
            "groups": int(base.shape[0]), "seeds": int(base.shape[1]),
            "per_seed": [float(v) for v in per_seed],
            "signs": "".join("+" if v > 0 else "-" if v < 0 else "0" for v in per_seed)}


def seed_level_p(per_seed: np.ndarray, alternative: str) -> float:
    """One-sided t-test of the per-seed mean differences (the training run as the unit; df = seeds - 1). Equal
    differences have no spread: p 0 when they all point the tested way, 1 otherwise.

    Example:
        >>> round(seed_level_p(np.array([0.02, 0.03, 0.01, 0.04, 0.02]), "greater"), 4)
        0.0046
    """
    from scipy import stats as st

    d = np.asarray(per_seed, float)
    if len(d) < 2 or alternative == "two-sided":
        return 1.0
    if np.allclose(d, d[0]):
        toward = d[0] > 0 if alternative == "greater" else d[0] < 0
        return 0.0 if toward else 1.0
    return float(st.ttest_1samp(d, 0.0, alternative=alternative).pvalue)


def summarize(rows: list[dict[str, Any]], baseline: str) -> dict[str, Any]:
    """Every arm's endpoints and tests against ``baseline``, per set; JSON-able."""
    from sago_train.functional import stats
    from sago_train.functional.multiplicity import holm

    rows, incomplete = complete(rows)
    ends = group_endpoints(rows)
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    parts = [p for p in SETS if any(k[2] == p for k in ends)]
    result: dict[str, Any] = {"baseline": baseline, "margin": MARGIN, "sets": {}, "incomplete": incomplete}
    for part in parts:
        levels, tests, canon = {}, {}, {}
        for arm in arms:
            seeds = sorted(s for (a, s, p) in ends if a == arm and p == part)
            if not seeds:
                continue
            levels[arm] = {}
            kinds = sorted({e for s in seeds for e in ends[(arm, s, part)] if e.startswith("kind:")})
            for endpoint in [*PRIMARY, "canonical", *kinds]:
                ids = sorted(set.intersection(*(set(ends[(arm, s, part)][endpoint]) for s in seeds)))
                per_group = np.array([np.mean([ends[(arm, s, part)][endpoint][g] for s in seeds]) for g in ids])
                summ = stats.bootstrap_ci(per_group)
                levels[arm][endpoint] = {"mean": summ.mean, "ci_low": summ.ci_low, "ci_high": summ.ci_high,
                                         "groups": len(ids), "seeds": len(seeds)}
            if arm == baseline or not set(seeds) & {s for (a, s, p) in ends if a == baseline and p == part}:
                continue  # the baseline itself, or a reference with no training seed (the untrained model)
            tests[arm] = {e: compare(*grids(ends, arm, baseline, part, e)[:2], alt) for e, (_, alt) in PRIMARY.items()}
            c = compare(*grids(ends, arm, baseline, part, "canonical")[:2], "two-sided")
            canon[arm] = {**c, "non_inferior": bool(c["ci_low"] > -MARGIN), "against": baseline}
            control = OWN_CONTROL.get(arm)
            if control not in (None, baseline) and any(k[0] == control and k[2] == part for k in ends):
                c = compare(*grids(ends, arm, control, part, "canonical")[:2], "two-sided")
                canon[f"{arm} vs {control}"] = {**c, "non_inferior": bool(c["ci_low"] > -MARGIN), "against": control}
        family = [(arm, e) for arm in tests for e in PRIMARY]
        for (arm, e), adj in zip(family, holm([tests[arm][e]["p_claim"] for arm, e in family])):
            tests[arm][e]["p_holm"] = adj
        result["sets"][part] = {"levels": levels, "tests": tests, "canonical": canon}
    return result


def _ci(d: dict[str, Any], key: str = "mean") -> str:
    return f"{d[key]:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]" if key == "diff" else \
        f"{d[key]:.3f} [{d['ci_low']:.3f}, {d['ci_high']:.3f}]"


def glance(summary: dict[str, Any], part: str = "kinds") -> list[str]:
    """One row per arm on ``part``: each primary endpoint's Δ against the baseline with its Holm p, canonical
    accuracy's Δ [95% CI], and the signs per seed of all-variant accuracy (the README's table)."""
    res = summary["sets"].get(part)
    if not res:
        return []
    base = summary["baseline"]
    lines = [f"| arm (vs `{base}`) | " + " | ".join(f"Δ {lbl} (Holm p)" for lbl, _ in PRIMARY.values()) +
             " | Δ canonical accuracy [95% CI] | all-variant Δ per seed |", "|---|" + "---:|" * (len(PRIMARY) + 1) + "---|"]
    for arm, t in res["tests"].items():
        c = res["canonical"][arm]
        cells = [f"{t[e]['diff']:+.3f} ({t[e]['p_holm']:.2g})" for e in PRIMARY]
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {_ci(c, 'diff')} | `{t['accuracy']['signs']}` |")
    return lines


def markdown(summary: dict[str, Any], walls: dict[str, float] | None = None) -> str:
    """The summary's tables (docs/loss-experiment.md pastes them)."""
    base = summary["baseline"]
    lines: list[str] = []
    if "kinds" in summary["sets"]:
        lines += [f"### At a glance: {SETS['kinds']}", "", *glance(summary), ""]
    for part, res in summary["sets"].items():
        levels, tests, canon = res["levels"], res["tests"], res["canonical"]
        lines += [f"### {SETS[part]}", "",
                  "Level: mean over groups of the mean over seeds [95% bootstrap CI over groups]; `base` is the "
                  "untrained model (a reference, not tested).", "",
                  "| arm | groups x seeds | " + " | ".join(lbl for lbl, _ in PRIMARY.values()) + " | canonical accuracy |",
                  "|---|---:|" + "---:|" * (len(PRIMARY) + 1)]
        for arm, lv in levels.items():
            size = f"{lv['accuracy']['groups']} x {lv['accuracy']['seeds']}"
            lines.append(f"| {arm} | {size} | " + " | ".join(_ci(lv[e]) for e in [*PRIMARY, "canonical"]) + " |")
        kinds = sorted({e for lv in levels.values() for e in lv if e.startswith("kind:")})
        lines += ["", "Accuracy per perturbation kind (diagnostic, not tested): mean over groups and seeds.", "",
                  "| arm | " + " | ".join(k[5:] for k in kinds) + " |", "|---|" + "---:|" * len(kinds)]
        for arm, lv in levels.items():
            lines.append(f"| {arm} | " + " | ".join(f"{lv[k]['mean']:.3f}" if k in lv else "-" for k in kinds) + " |")
        lines += ["", f"Against `{base}`: Δ = arm − {base} [95% crossed groups x seeds bootstrap CI]; p = one-sided "
                  "Wilcoxon on the per-group means over seeds (accuracy: higher; instability: lower), Holm over "
                  f"{len(PRIMARY)} endpoints x {len(tests)} arms of the larger of p and p (seeds), the one-sided t-test of "
                  "the per-seed mean differences (a training run as the unit); signs = the sign of Δ per seed.", "",
                  "| arm | endpoint | Δ [95% CI] | p | p (seeds) | Holm p | signs per seed |",
                  "|---|---|---:|---:|---:|---:|---|"]
        for arm, t in tests.items():
            for e, (label, _) in PRIMARY.items():
                r = t[e]
                lines.append(f"| {arm} | {label} | {_ci(r, 'diff')} | {r['p']:.2g} | {r['p_seeds']:.2g} | {r['p_holm']:.2g} | "
                             f"`{r['signs']}` |")
        lines += ["", f"Canonical accuracy, non-inferiority against `{base}`, and of an arm against the arm it adds "
                  "one thing to (`relative-default` vs `augment-fixed`: its term; `augment-fixed`, the library's "
                  "`StabilityConfig()`, vs `canonical`: augmentation): lower 95% bound of Δ above "
                  f"−{summary['margin']}.", "", "| arm | Δ canonical [95% CI] | non-inferior | signs per seed |",
                  "|---|---:|---|---|"]
        for arm, c in canon.items():
            lines.append(f"| {arm} | {_ci(c, 'diff')} | {'yes' if c['non_inferior'] else 'no'} | `{c['signs']}` |")
        lines.append("")
    if summary.get("incomplete"):
        lines += ["Left out (not every rotation recorded yet): " + ", ".join(summary["incomplete"]) + ".", ""]
    if walls:
        lines += ["Wall time per arm (every seed and rotation, training and final evaluation): " +
                  ", ".join(f"{arm} {s / 60:.1f} min" for arm, s in walls.items()) +
                  f"; total {sum(walls.values()) / 60:.1f} min.", ""]
    return "\n".join(lines)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path``, or of ``path`` + ``.gz`` (the committed copy) when only that exists."""
    gz = path.with_name(path.name + ".gz")
    if not path.exists() and gz.exists():
        text = gzip.decompress(gz.read_bytes()).decode()
    elif path.exists():
        text = path.read_text()
    else:
        return []
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def write_summary(records: Path, out: Path, *, baseline: str, timings: Path | None = None) -> str:
    """``out/summary.json`` and ``out/summary.md`` from ``records``; returns the markdown."""
    from sago_train.functional.stats import to_jsonable

    rows = read_jsonl(records)
    if not rows:
        raise SystemExit(f"{records}: no records; run the experiment first")
    summary = summarize(rows, baseline)
    walls: dict[str, float] = defaultdict(float)
    for t in read_jsonl(timings) if timings else []:
        walls[t["arm"]] += float(t["wall_s"])
    summary["wall_s"] = dict(walls)
    text = markdown(summary, dict(walls))
    (out / "summary.json").write_text(json.dumps(to_jsonable(summary), indent=1) + "\n")
    (out / "summary.md").write_text(text)
    return text
