"""What ``sago-train eval`` prints as findings, on a real model (the shipped tiny model): under a null built from
real evaluations (each group's variants drawn from one pool of prompts; entries made by shuffling group ids) the
family-wise claims stay rare, and a real signal is still found (docs/findings.md)."""

from __future__ import annotations

import numpy as np
import pytest

from sago_train.analysis.compare import compare_evaluations
from sago_train.analysis.display import findings
from sago_train.results.evaluation import Evaluation
from tests._helpers.null_studies import pool_sets, shuffled_entries

REPS = 8  # evaluations of 3 sets x 24 groups, as the review that measured 4 of 30 printing "not noise"


@pytest.fixture(scope="module")
def tiny_evaluator():
    import sago_train
    from sago_train import SAGOEvaluator

    return SAGOEvaluator.from_pretrained(sago_train.tiny_model_path(), device="cpu", max_new_tokens=1, seed=0,
                                         axes="activation,activation_rel,confidence")


@pytest.fixture(scope="module")
def pool():
    from sago_train.data.sources import bundled_sets, resolve_sets

    return sorted({v for vs in resolve_sets(bundled_sets("tiny")).values() for g in vs.groups for v in g.variants})


@pytest.mark.slow  # 8 s + the model load on an idle core (35 s loaded): 8 real evaluations, 8 comparisons
def test_real_tiny_model_findings_under_a_pool_null(tiny_evaluator, pool):
    from sago_train.data import VariantSet

    rng = np.random.default_rng(0)
    records = pool_sets(pool, rng, 3 * REPS, 24)
    result = tiny_evaluator.evaluate({n: VariantSet.from_records(r, name=n) for n, r in records.items()})
    names = list(records)
    noise = kind = flips = old_noise = old_kind = 0
    for r in range(REPS):
        ev = Evaluation({n: result.sets[n] for n in names[3 * r: 3 * r + 3]}, "tiny", {})
        notes = findings(ev)
        noise += any("is not noise" in n for n in notes)
        kind += any("depends on the variant kind" in n for n in notes)
        # The rules this replaces: raw permutation / Friedman p < 0.05 on any set and axis.
        old_noise += any(rel.p_value < 0.05 for s in ev.sets.values() for rel in s.reliability.values())
        old_kind += any(e.p_value < 0.05 for s in ev.sets.values() for e in s.kind_effects.values())
        cmp = compare_evaluations(shuffled_entries(ev, 6, rng))
        flips += any(f["robust"] for a, x in cmp["axes"].items() if a != "instability" for f in x["flips"])
    # Binomial(8, 0.05): P(>= 3) = 0.006. Each evaluation prints at most a few claims of each kind.
    assert noise <= 2 and kind <= 2 and flips <= 2, (noise, kind, flips, old_noise, old_kind)
    assert noise <= old_noise and kind <= old_kind


@pytest.mark.slow  # the model load, shared with the test above
def test_real_tiny_model_instability_is_not_noise_when_groups_truly_differ(tiny_evaluator, pool):
    """Power on the same model: half the groups are one prompt with trivial edits (the model barely moves),
    half are 4 unrelated prompts; every ordering of groups reproduces across halves of their variants."""
    from sago_train.data import VariantSet

    rng = np.random.default_rng(1)
    recs = []
    for i in range(24):
        if i % 2:
            p = pool[int(rng.integers(len(pool)))]
            variants = [p, p + " ", " " + p, p + "  "]
        else:
            variants = [pool[j] for j in rng.choice(len(pool), 4, replace=False)]
        recs.append({"id": f"g{i}", "variants": variants})
    ev = tiny_evaluator.evaluate({"mixed": VariantSet.from_records(recs, name="mixed")})
    rel = ev.reliability()
    assert rel[("mixed", "activation")].verdict() == "not noise"
    assert rel[("mixed", "activation_rel")].verdict() == "same finding as activation"
    assert any("mixed/activation: per-group instability is not noise" in n for n in findings(ev))
