"""The family-wise false-claim rate of each finding, measured under a known truth (docs/findings.md).

    PYTHONPATH=. .venv/bin/python benchmarks/findings_error_rates.py --reps 200 --out rates.json
    PYTHONPATH=. .venv/bin/python benchmarks/findings_error_rates.py --scenario tiny-null --reps 30 --cache /tmp/tiny

Each scenario simulates many evaluations or comparisons in which no claim of one kind is true, runs them through
the same public code the commands print from, and counts the share of runs that print at least one claim of that
kind (with its Monte-Carlo standard error). Scenarios:

- ``eval-null``: 3 sets x 24 groups x 4 variants, 5 axes, every per-group value independent (halves, axes,
  kinds): what ``sago-train eval`` prints ("not noise", "related", the kind effect and the kind named).
- ``distinct-bound``: 3 sets, 5 axes whose Spearman correlation is exactly 0.5 (the bound), at 24 and at 200
  groups: any "distinct" is false.
- ``flips-null``: 6 entries x 3 sets x 24 groups x 4 axes (+ instability), no entry differs: any robust flip is
  false, and so is "the best entry depends on the set".
- ``flips-separated``: the same, but the entries truly differ on one set (a shift of 0.3 per entry): a flip
  needs the reverse order on another set, where they do not differ, so every robust flip is still false.
- ``tiny-null``: the shipped tiny model on 3 sets x 24 groups whose 4 variants are drawn from one pool of
  prompts (30 evaluations, as the review that found the problem), then 6 entries made from each evaluation by
  shuffling group ids: "not noise", kind claims and robust flips.

The script only uses constructors that older versions have too, so the same command measures an older checkout
(``PYTHONPATH=/path/to/old``): the figures in docs/findings.md come from both.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_HELPER = Path(__file__).resolve().parents[1] / "tests" / "_helpers" / "null_studies.py"


def _null_studies():
    # Loaded from its file, not through sys.path: the package measured is the one on PYTHONPATH.
    spec = importlib.util.spec_from_file_location("null_studies", _HELPER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _rate(hits: int, reps: int) -> dict[str, float]:
    p = hits / reps
    return {"rate": round(p, 4), "mc_se": round(math.sqrt(max(p * (1 - p), 1e-12) / reps), 4), "hits": hits,
            "reps": reps}


def _eval_claims(ev) -> dict[str, bool]:
    """What ``sago-train eval`` prints for one evaluation, by kind of claim."""
    from sago_train.analysis.display import findings

    notes = findings(ev)
    return {"not noise": any("is not noise" in n for n in notes),
            "related": any("are related" in n for n in notes),
            "distinct": any("are distinct" in n for n in notes),
            "kind effect": any("depends on the variant kind" in n for n in notes),
            "kind named": any("variants move most" in n or "lowest on" in n for n in notes)}


def _flip_claims(entries) -> dict[str, bool]:
    from sago_train.analysis.compare import compare_evaluations

    res = compare_evaluations(entries)
    axes = {a: r for a, r in res["axes"].items() if a != "instability"}
    robust_axes = any(f["robust"] for r in axes.values() for f in r["flips"])
    robust_any = any(f["robust"] for r in res["axes"].values() for f in r["flips"])
    try:
        from sago_train.analysis.ranking import reversal_headline
    except ImportError:  # before the family-wise correction: any robust flip printed "which entry is best depends"
        best = robust_any
    else:
        best = any("the best entry depends on the set" in line for line in reversal_headline(res))
    return {"robust flip (axes)": robust_axes, "robust flip (any, incl. instability)": robust_any,
            "best entry depends on the set": best}


def _tally(rows: list[dict[str, bool]]) -> dict[str, dict[str, float]]:
    return {k: _rate(sum(r[k] for r in rows), len(rows)) for k in rows[0]}


def eval_null(reps: int, seed: int) -> dict:
    ns = _null_studies()
    rng = np.random.default_rng(seed)
    return _tally([_eval_claims(ns.null_evaluation(rng)) for _ in range(reps)])


def distinct_bound(reps: int, seed: int) -> dict:
    from sago_train.functional.findings import axis_relations

    ns = _null_studies()
    out = {}
    for n in (24, 200):
        rng = np.random.default_rng(seed)
        hits = sum(any(r.verdict == "distinct" for r in axis_relations(ns.correlated_per_set(rng, 3, n)))
                   for _ in range(reps))
        out[f"distinct ({n} groups)"] = _rate(hits, reps)
    return out


def flips(reps: int, seed: int, separated: float) -> dict:
    ns = _null_studies()
    rng = np.random.default_rng(seed)
    return _tally([_flip_claims(ns.null_entries(rng, separated=separated)) for _ in range(reps)])


def tiny_null(reps: int, seed: int, cache: Path | None) -> dict:
    """``reps`` real evaluations (3 sets x 24 groups from one pool each), generated once into ``cache``."""
    from sago_train.analysis.compare import load_evaluation
    from sago_train.results.evaluation import Evaluation

    ns = _null_studies()
    cache = cache or Path("runs/findings-null-tiny")
    dirs = [cache / f"eval{r:03d}" for r in range(reps)]
    if not all((d / "summary.json").is_file() for d in dirs):
        import sago_train
        from sago_train import SAGOEvaluator
        from sago_train.data import VariantSet
        from sago_train.data.sources import bundled_sets, resolve_sets

        pool = sorted({v for vs in resolve_sets(bundled_sets("tiny")).values() for g in vs.groups for v in g.variants})
        rng = np.random.default_rng(seed)
        records = ns.pool_sets(pool, rng, 3 * reps, 24)
        evaluator = SAGOEvaluator.from_pretrained(sago_train.tiny_model_path(), device="cpu", max_new_tokens=8,
                                                  seed=seed)
        result = evaluator.evaluate({name: VariantSet.from_records(recs, name=name) for name, recs in records.items()})
        names = list(records)
        for r, d in enumerate(dirs):
            chunk = {f"set{i}": result.sets[names[3 * r + i]] for i in range(3)}
            for i, s in enumerate(chunk.values()):
                s.name = f"set{i}"
            Evaluation(chunk, result.model, result.config, seed=seed).write(d)
    rng = np.random.default_rng(seed + 1)
    rows = []
    for d in dirs:
        ev = load_evaluation(d)
        for s in ev.sets.values():
            # summary.json does not keep a set's kinds (the evaluator found them aligned); the records do.
            kinds = {tuple(g.kinds or ()) for g in s.groups or []}
            if s.kinds is None and len(kinds) == 1 and kinds != {()}:
                s.kinds = list(next(iter(kinds)))
        rows.append({**_eval_claims(ev), **_flip_claims(ns.shuffled_entries(ev, 6, rng))})
    return _tally(rows)


SCENARIOS = ("eval-null", "distinct-bound", "flips-null", "flips-separated", "tiny-null")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", action="append", choices=SCENARIOS, help="default: all but tiny-null")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, default=None, help="tiny-null: where the real evaluations are kept")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import sago_train

    out = {"package": str(Path(sago_train.__file__).parent), "reps": args.reps, "seed": args.seed, "scenarios": {}}
    for name in args.scenario or SCENARIOS[:-1]:
        t = time.time()
        if name == "eval-null":
            res = eval_null(args.reps, args.seed)
        elif name == "distinct-bound":
            res = distinct_bound(args.reps, args.seed)
        elif name == "flips-null":
            res = flips(args.reps, args.seed, 0.0)
        elif name == "flips-separated":
            res = flips(args.reps, args.seed, 0.3)
        else:
            res = tiny_null(args.reps, args.seed, args.cache)
        out["scenarios"][name] = {**res, "seconds": round(time.time() - t, 1)}
        print(name, json.dumps(out["scenarios"][name]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
