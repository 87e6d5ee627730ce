"""The pool experiment's summary (docs/loss-experiment.md#the-pool-experiment), computed from its records alone.

A record is one group of one evaluated set in one run (scripts/experiment_pool.py). The unit is the **fact**: per
arm, seed, set and fact the endpoints are the means over the fact's groups (its noise draws):

- ``accuracy``: the share of all the fact's variants answered right (canonical included); on ``instances`` this
  is **the primary endpoint**;
- ``confidence``: the SAGO confidence axis (docs/definitions.md; lower is more stable);
- ``canonical``: the canonical prompt answered right (the non-inferiority constraint on ``instances``);
- ``kind:<k>``: per perturbation kind (diagnostic).

Every arm is tested against the baseline on the same facts and seeds as the first experiment's summary tests
(scripts/experiment_loss_summary.py ``compare``: the larger of a one-sided Wilcoxon over facts and a one-sided
t-test over seeds, a crossed facts x seeds bootstrap CI), Holm over the arms of each (set, endpoint) family; only
the primary family is confirmatory. The power of the primary test is computed from the records' own variances.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from experiment_loss_summary import compare, grids, read_jsonl

SETS = {"instances": "held-out facts, trained kinds (primary set)", "kinds": "held-out facts, kinds never trained",
        "labeled": "the labeled training facts", "pool": "the unlabeled pool's facts"}
ENDPOINTS = {"accuracy": ("all-variant accuracy", "greater"), "confidence": ("confidence instability", "less"),
             "canonical": ("canonical accuracy", "greater")}
PRIMARY = ("instances", "accuracy")
MARGIN = 0.02
#: The minimum effect the design must detect (the issue's 0.02 in all-variant accuracy) and the power it needs.
EFFECT, POWER, ALPHA = 0.02, 0.80, 0.05
DOSE_ARMS = {0.0: "augment", 0.3: "pool-kl-0.3", 1.0: "pool-kl-1", 3.0: "pool-kl-3", 10.0: "pool-kl-10"}


def fact_endpoints(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str], dict[str, dict[str, float]]]:
    """``{(arm, seed, set): {endpoint: {fact: value}}}`` at each run's last step."""
    last: dict[tuple[str, int], int] = {}
    for r in rows:
        key = (r["arm"], int(r["seed"]))
        last[key] = max(last.get(key, 0), int(r.get("step", 0)))
    cells: dict[tuple[str, int, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if int(r.get("step", 0)) == last[(r["arm"], int(r["seed"]))]:
            cells[(r["arm"], int(r["seed"]), r["set"], r["fact"])].append(r)
    out: dict[tuple[str, int, str], dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for (arm, seed, part, fact), recs in cells.items():
        e = out[(arm, seed, part)]
        e["accuracy"][fact] = float(np.mean([c for r in recs for c in r["correct"]]))
        e["confidence"][fact] = float(np.mean([r["confidence"] for r in recs]))
        e["canonical"][fact] = float(np.mean([r["correct"][r["kinds"].index("canonical")] for r in recs]))
        per_kind: dict[str, list[int]] = defaultdict(list)
        for r in recs:
            for kind, c in zip(r["kinds"], r["correct"]):
                per_kind[kind].append(int(c))
        for kind, v in per_kind.items():
            e[f"kind:{kind}"][fact] = float(np.mean(v))
    return out


def level(ends: dict, arm: str, part: str, endpoint: str) -> dict[str, Any] | None:
    """Mean over facts of the mean over seeds, with a bootstrap CI over facts."""
    from sago_train.functional import stats

    seeds = sorted(s for (a, s, p) in ends if a == arm and p == part)
    if not seeds:
        return None
    facts = sorted(set.intersection(*(set(ends[(arm, s, part)][endpoint]) for s in seeds)))
    per_fact = np.array([np.mean([ends[(arm, s, part)][endpoint][f] for s in seeds]) for f in facts])
    ci = stats.bootstrap_ci(per_fact)
    return {"mean": ci.mean, "ci_low": ci.ci_low, "ci_high": ci.ci_high, "facts": len(facts), "seeds": len(seeds)}


def power(base: np.ndarray, other: np.ndarray, m: int, seeds: int | None = None) -> dict[str, Any]:
    """The primary test's power, from the ``[facts, seeds]`` grids: the claim needs both the seeds' one-sided
    t-test and the facts' Wilcoxon at Holm's first threshold ``ALPHA / m``. For each: the effect detectable at
    ``POWER`` with the units there are, and the units needed for ``EFFECT`` (the Wilcoxon by its asymptotic
    relative efficiency 3/pi to the t-test). The facts' test runs on per-fact means over seeds, whose spread
    shrinks with more seeds: with the differences as fact + seed + residual (two-way, no interaction), its SD at
    ``seeds`` seeds is sqrt(tau^2 + sigma^2 / seeds) (``facts["sd_at"]``, and the same figures under ``"at"``).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> b = rng.normal(0.5, 0.1, (40, 20)); p = power(b, b + rng.normal(0, 0.02, (40, 20)), 1)
        >>> 0.005 < p["seeds"]["detectable"] < 0.03 and p["seeds"]["n"] == 20
        True
    """
    from scipy import optimize
    from scipy import stats as st

    alpha = ALPHA / m

    def detectable(sd: float, n: int, are: float = 1.0) -> float:
        if n < 2 or sd == 0:
            return float("nan") if n < 2 else 0.0
        df = n - 1
        crit = st.t.ppf(1 - alpha, df)
        f = lambda d: st.nct.sf(crit, df, d * np.sqrt(n * are) / sd) - POWER  # noqa: E731
        # the noncentrality runs up to 60: power is 1 there for any df >= 1 and alpha >= 1e-4
        return float(optimize.brentq(f, 1e-12, 60 * sd / np.sqrt(n * are)))

    def needed(sd: float, are: float = 1.0) -> int:
        for n in range(2, 10_000):
            if detectable(sd, n, are) <= EFFECT:
                return n
        return 10_000

    d = other - base
    n_f, n_s = d.shape
    sd_seeds = float(d.mean(0).std(ddof=1)) if n_s > 1 else float("nan")
    sd_facts = float(d.mean(1).std(ddof=1))
    if n_s > 1 and n_f > 1:
        resid = d - d.mean(1, keepdims=True) - d.mean(0, keepdims=True) + d.mean()
        sigma2 = float((resid ** 2).sum() / ((n_f - 1) * (n_s - 1)))
        tau2 = max(sd_facts ** 2 - sigma2 / n_s, 0.0)
    else:
        sigma2, tau2 = float("nan"), float("nan")
    at = seeds or n_s
    sd_at = float(np.sqrt(tau2 + sigma2 / at)) if np.isfinite(sigma2) else sd_facts
    are = 3 / np.pi
    return {"alpha": alpha, "effect": EFFECT, "power": POWER, "seeds_at": at,
            "seeds": {"n": int(n_s), "sd": sd_seeds, "detectable": detectable(sd_seeds, n_s),
                      "detectable_at": detectable(sd_seeds, at), "needed": needed(sd_seeds) if np.isfinite(sd_seeds) else None},
            "facts": {"n": int(n_f), "sd": sd_facts, "detectable": detectable(sd_facts, n_f, are),
                      "needed": needed(sd_facts, are), "tau": float(np.sqrt(tau2)) if np.isfinite(tau2) else None,
                      "sigma": float(np.sqrt(sigma2)) if np.isfinite(sigma2) else None, "sd_at": sd_at,
                      "detectable_at": detectable(sd_at, n_f, are), "needed_at": needed(sd_at, are)}}


def summarize(rows: list[dict[str, Any]], baseline: str, planned_seeds: int | None = None,
              order: Sequence[str] = ()) -> dict[str, Any]:
    """Every arm's levels and tests against ``baseline``, the positive control and the primary test's power
    (projected to ``planned_seeds`` seeds where given: a pilot's records planning the experiment); JSON-able."""
    from sago_train.functional.multiplicity import holm

    ends = fact_endpoints(rows)
    # Tables list the arms in ``order`` (the design's), the baseline first and the untrained model last, whatever
    # order the shards recorded them in; an arm ``order`` does not name follows in record order.
    seen = list(dict.fromkeys(r["arm"] for r in rows))
    named = [baseline, *(a for a in order if a != baseline)]
    arms = [a for a in named if a in seen] + [a for a in seen if a not in named and a != "base"] + \
        (["base"] if "base" in seen else [])
    trained = [a for a in arms if a != "base"]
    result: dict[str, Any] = {"baseline": baseline, "margin": MARGIN, "levels": {}, "tests": {}, "power": {}}
    for part in [p for p in SETS if any(k[2] == p for k in ends)]:
        for endpoint in ENDPOINTS:
            result["levels"][f"{part}/{endpoint}"] = {a: level(ends, a, part, endpoint) for a in arms}
        kinds = sorted({e for k, v in ends.items() if k[2] == part for e in v if e.startswith("kind:")})
        for kind in kinds:
            result["levels"][f"{part}/{kind}"] = {a: level(ends, a, part, kind) for a in arms}
        for endpoint, (_, alt) in ENDPOINTS.items():
            fam = {a: compare(*grids(ends, a, baseline, part, endpoint)[:2],
                              "two-sided" if endpoint == "canonical" else alt)
                   for a in trained if a != baseline}
            if endpoint != "canonical":
                for a, adj in zip(fam, holm([t["p_claim"] for t in fam.values()])):
                    fam[a]["p_holm"] = adj
            result["tests"][f"{part}/{endpoint}"] = fam
    m = len([a for a in trained if a != baseline])
    part, endpoint = PRIMARY
    for a in trained:
        if a != baseline:
            result["power"][a] = power(*grids(ends, a, baseline, part, endpoint)[:2], m, planned_seeds)
    if "control-kl" in arms and "canonical" in arms:  # the positive control against the arm without its term
        result["control"] = {f"{p}/{e}": compare(*grids(ends, "control-kl", "canonical", p, e)[:2], alt)
                             for p in ("labeled", "instances") for e, (_, alt) in ENDPOINTS.items() if e != "canonical"}
    return result


def _ci(d: dict[str, Any], key: str = "mean") -> str:
    if key == "diff":
        return f"{d[key]:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"
    return f"{d[key]:.3f} [{d['ci_low']:.3f}, {d['ci_high']:.3f}]"


#: A run was measured on its own when it ran in a process of its own (no ``rss_start_mb``) or was the first run of
#: its process (held less than this when it started: the imports, not an earlier run's model and allocations).
OWN_PROCESS_START_MB = 1024.0


def cost(timings: list[dict[str, Any]], baseline: str) -> dict[str, dict[str, Any]]:
    """Per arm, the median wall time and peak memory of a run, and their ratios to ``baseline``'s.

    Only runs measured on their own count: they record their ``threads`` (the cores were theirs) and ran in a
    process of their own or first in it (:data:`OWN_PROCESS_START_MB`), so their time and peak are theirs alone.
    Medians, so one disturbed run does not set the figure.

    >>> c = cost([{"arm": "a", "wall_s": 10, "threads": 2, "peak_rss_mb": 100},
    ...           {"arm": "b", "wall_s": 50, "threads": 2, "peak_rss_mb": 400},
    ...           {"arm": "b", "wall_s": 70, "threads": 2, "peak_rss_mb": 300, "rss_start_mb": 280},
    ...           {"arm": "b", "wall_s": 20, "threads": 2, "peak_rss_mb": 9000, "rss_start_mb": 8000},
    ...           {"arm": "b", "wall_s": 900}], baseline="a")
    >>> c["b"]["wall_s"], c["b"]["wall_x"], c["b"]["peak_mb"], c["b"]["peak_x"], c["b"]["runs"], c["b"]["peak_runs"]
    (60.0, 6.0, 350.0, 3.5, 2, 2)
    """
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in timings:
        if t.get("threads") and (t.get("rss_start_mb") or 0.0) < OWN_PROCESS_START_MB:
            by[t["arm"]].append(t)
    out: dict[str, dict[str, Any]] = {}
    for arm, ts in by.items():
        peaks = [t["peak_rss_mb"] for t in ts if t.get("peak_rss_mb") is not None]
        out[arm] = {"runs": len(ts), "threads": ",".join(str(n) for n in sorted({int(t["threads"]) for t in ts})),
                    "wall_s": float(np.median([t["wall_s"] for t in ts])),
                    "peak_runs": len(peaks), "peak_mb": float(np.median(peaks)) if peaks else None}
    ref = out.get(baseline)
    for c in out.values():
        c["wall_x"] = c["wall_s"] / ref["wall_s"] if ref and ref["wall_s"] > 0 else None
        c["peak_x"] = c["peak_mb"] / ref["peak_mb"] if ref and ref["peak_mb"] and c["peak_mb"] else None
    return out


def markdown(s: dict[str, Any], losses: list[dict[str, Any]], walls: dict[str, float]) -> str:
    base = s["baseline"]
    lv, tests = s["levels"], s["tests"]
    arms = list(lv["instances/accuracy"])
    lines = ["### Primary: all-variant accuracy on held-out facts (trained kinds)", "",
             f"Against `{base}`: Δ [95% crossed facts x seeds bootstrap CI]; p = one-sided Wilcoxon over facts "
             "(means over seeds); p (seeds) = one-sided t-test of the per-seed mean differences; Holm over the arms "
             "of the larger; signs per seed.", "",
             "| arm | level [95% CI] | Δ vs augment | p | p (seeds) | Holm p | signs |", "|---|---:|---:|---:|---:|---:|---|"]
    for a in arms:
        cell = lv["instances/accuracy"][a]
        t = tests["instances/accuracy"].get(a)
        row = f"| {a} | {_ci(cell)} | "
        row += (f"{_ci(t, 'diff')} | {t['p']:.2g} | {t['p_seeds']:.2g} | {t['p_holm']:.2g} | `{t['signs']}` |"
                if t else "— | — | — | — | — |")
        lines.append(row)
    parts = [p for p in SETS if f"{p}/accuracy" in lv]
    lines += ["", "### Every set (level: mean over facts of the mean over seeds [95% CI over facts])", "",
              "| arm | " + " | ".join(f"{p}: accuracy | {p}: confidence" for p in parts) + " |",
              "|---|" + "---:|" * (2 * len(parts))]
    for a in arms:
        cells = [f"{lv[f'{p}/{e}'][a]['mean']:.3f}" if lv[f"{p}/{e}"].get(a) else "—"
                 for p in parts for e in ("accuracy", "confidence")]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    lines += ["", "### Dose-response of the KL term on the pool (weight relative to the task loss; 0 = `augment`)",
              "", "| weight | " + " | ".join(f"{p} accuracy" for p in parts) + " | instances confidence | "
              "Δ instances accuracy vs augment |", "|---:|" + "---:|" * (len(parts) + 2)]
    for w, a in DOSE_ARMS.items():
        if a not in arms:
            continue
        t = tests["instances/accuracy"].get(a)
        lines.append(f"| {w:g} | " + " | ".join(_ci(lv[f"{p}/accuracy"][a]) for p in parts) +
                     f" | {_ci(lv['instances/confidence'][a])} | {_ci(t, 'diff') if t else '—'} |")
    if "control" in s:
        lines += ["", "### Positive control: `control-kl` (canonical task loss + the KL term) against `canonical`", "",
                  "| set / endpoint | Δ [95% CI] | p | p (seeds) | signs |", "|---|---:|---:|---:|---|"]
        for key, t in s["control"].items():
            lines.append(f"| {key} | {_ci(t, 'diff')} | {t['p']:.2g} | {t['p_seeds']:.2g} | `{t['signs']}` |")
    lines += ["", f"### Canonical accuracy on held-out facts: non-inferiority against `{base}` (lower bound > "
              f"−{s['margin']})", "", "| arm | Δ [95% CI] | non-inferior |", "|---|---:|---|"]
    for a, t in tests["instances/canonical"].items():
        lines.append(f"| {a} | {_ci(t, 'diff')} | {'yes' if t['ci_low'] > -s['margin'] else 'no'} |")
    at = next(iter(s["power"].values()))["seeds_at"] if s["power"] else 0
    lines += ["", f"### Power of the primary test (one-sided, α = 0.05 / {len(s['power'])} arms, {POWER:.0%} power)",
              "", "The claim needs both tests. Seeds: the t-test of the per-seed differences. Facts: the Wilcoxon "
              "over the per-fact means over seeds, whose SD at S seeds is sqrt(tau² + sigma²/S) (tau: the facts' "
              f"own spread, sigma: the residual; columns 'at {at} seeds').", "",
              f"| arm | SD per-seed Δ | detectable (seeds now / at {at}) | seeds for 0.02 | tau, sigma | "
              f"SD per-fact Δ at {at} seeds | detectable with the facts at {at} seeds | facts for 0.02 at {at} "
              "seeds |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for a, p in s["power"].items():
        ps, pf = p["seeds"], p["facts"]
        ts = "—" if pf["tau"] is None else f"{pf['tau']:.3f}, {pf['sigma']:.3f}"
        lines.append(f"| {a} | {ps['sd']:.4f} | {ps['detectable']:.3f} ({ps['n']}) / {ps['detectable_at']:.3f} | "
                     f"{ps['needed']} | {ts} | {pf['sd_at']:.4f} | {pf['detectable_at']:.3f} ({pf['n']}) | "
                     f"{pf['needed_at']} |")
    if losses:
        by: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in losses:
            by[r["arm"]].append(r)
        lines += ["", "### Training log (mean over seeds and logging steps)", "",
                  "| arm | task loss | KL term (raw) | unlabeled share |", "|---|---:|---:|---:|"]
        for a, rs in by.items():
            def mean(k: str, rs: list = rs) -> str:
                v = [r[k] for r in rs if r.get(k) is not None]
                return f"{np.mean(v):.4f}" if v else "—"
            lines.append(f"| {a} | {mean('sago_task_loss')} | {mean('sago_conf_loss')} | {mean('sago_unlabeled_share')} |")
    if s.get("cost"):
        lines += ["", f"### Cost per run (median over the runs measured on their own; x: against `{base}`)", "",
                  "A run counts when it recorded its threads and ran in a process of its own or first in it. Peak "
                  "memory: the process's high-water mark (runs with it recorded in parentheses).", "",
                  "| arm | runs | threads | wall per run | x | peak memory | x |", "|---|---:|---:|---:|---:|---:|---:|"]
        for a, c in s["cost"].items():
            peak = f"{c['peak_mb'] / 1024:.1f} GiB ({c['peak_runs']})" if c["peak_mb"] else "—"
            wx = f"{c['wall_x']:.1f}" if c["wall_x"] is not None else "—"
            px = f"{c['peak_x']:.1f}" if c["peak_x"] else "—"
            lines.append(f"| {a} | {c['runs']} | {c['threads']} | {c['wall_s']:.0f} s | {wx} | {peak} | {px} |")
    if walls:
        lines += ["", "Wall time per arm (every seed, training and final evaluation): " +
                  ", ".join(f"{a} {v / 60:.1f} min" for a, v in walls.items()) +
                  f"; total {sum(walls.values()) / 60:.1f} min."]
    return "\n".join(lines) + "\n"


def write_summary(out: Path, *, baseline: str, planned_seeds: int | None = None, order: Sequence[str] = ()) -> str:
    """``out/summary.json`` and ``out/summary.md`` from ``out``'s records (or their committed ``.gz``)."""
    from sago_train.functional.stats import to_jsonable

    rows = read_jsonl(out / "records.jsonl")
    if not rows:
        raise SystemExit(f"{out / 'records.jsonl'}: no records; run the experiment first")
    summary = summarize(rows, baseline, planned_seeds, order)
    timings = read_jsonl(out / "timings.jsonl")
    walls: dict[str, float] = defaultdict(float)
    for t in timings:
        walls[t["arm"]] += float(t["wall_s"])
    summary["wall_s"] = dict(walls)
    costs = cost(timings, baseline)
    if costs:  # the runs before threads were recorded (tiny, pilot) have no cost table
        summary["cost"] = dict(sorted(costs.items(), key=lambda kv: (kv[0] != baseline, kv[0])))
    text = markdown(summary, read_jsonl(out / "losses.jsonl"), dict(walls))
    (out / "summary.json").write_text(json.dumps(to_jsonable(summary), indent=1) + "\n")
    (out / "summary.md").write_text(text)
    return text
