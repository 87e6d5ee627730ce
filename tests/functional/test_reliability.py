"""*Instability is not noise* as one family (docs/findings.md): Holm over every (set, axis) a command prints,
``activation_rel`` counted with ``activation``, and its error rate measured by simulation under a global null
through the public functions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sago_train.functional.findings import (
    NOT_ENOUGH_TO_TEST,
    holm,
    reliability_family,
    split_half_reliability,
)

ALPHA = 0.05
AXES = ("activation", "activation_rel", "confidence")


def _mc_bound(rate: float, reps: int) -> float:
    """The rate plus 2.33 Monte-Carlo standard errors (one-sided 99%)."""
    return rate + 2.33 * math.sqrt(rate * (1 - rate) / reps)


def _family(rng: np.random.Generator, n_sets: int, n_groups: int, signal: float = 0.0,
            n_permutations: int = 499) -> dict:
    """One evaluation's reliabilities: each (set, axis) from halves that share a per-group signal of
    ``signal`` (0: the global null); activation_rel is activation over a constant of the set."""
    rels = {}
    for s in range(n_sets):
        for axis in ("activation", "confidence"):
            truth = signal * rng.random(n_groups)
            a, b = truth + rng.random(n_groups), truth + rng.random(n_groups)
            rels[(f"set{s}", axis)] = split_half_reliability(a, b, n_permutations=n_permutations, seed=s)
            if axis == "activation":
                rels[(f"set{s}", "activation_rel")] = split_half_reliability(a / 0.4, b / 0.4,
                                                                             n_permutations=n_permutations, seed=s)
    return reliability_family(rels)


def test_not_noise_family_wise_rate_under_a_global_null():
    """250 evaluations of 3 sets x 3 axes x 16 groups whose halves are unrelated: the share printing any 'not
    noise' is <= alpha within Monte-Carlo error; counting each raw p < alpha, as before, it is ~0.26 (6 tests;
    activation_rel repeats activation's p)."""
    rng = np.random.default_rng(0)
    reps = 250
    new = old = 0
    for _ in range(reps):
        fam = _family(rng, 3, 16)
        new += any(r.verdict() == "not noise" for r in fam.values())
        old += any(r.p_value < ALPHA for r in fam.values())
    assert new / reps <= _mc_bound(ALPHA, reps)
    assert old / reps > 0.15  # the uncorrected rule this replaces
    assert new < old


def test_not_noise_power_on_a_clear_signal():
    # Halves that share a strong per-group signal: every set and axis is called 'not noise' after Holm.
    rng = np.random.default_rng(1)
    called = [sum(r.verdict() == "not noise" for r in _family(rng, 3, 24, signal=5.0).values()) for _ in range(20)]
    assert min(called) == 6  # 3 sets x (activation, confidence); activation_rel is the same finding


def test_activation_rel_is_activation_s_finding_not_a_second_test():
    rng = np.random.default_rng(2)
    fam = _family(rng, 2, 16)
    tested = [k for k, r in fam.items() if not r.same_as]
    assert sorted(tested) == [("set0", "activation"), ("set0", "confidence"), ("set1", "activation"),
                              ("set1", "confidence")]
    for s in ("set0", "set1"):
        rel = fam[(s, "activation_rel")]
        assert rel.same_as == "activation" and rel.verdict() == "same finding as activation"
        assert math.isnan(rel.p_holm) and "the same finding as activation" in rel.sentence(s, "activation_rel")
        assert rel.p_value == fam[(s, "activation")].p_value  # the same ranking of groups, the same test
    # Holm over the 4 tests, by hand.
    p = [fam[k].p_value for k in tested]
    assert [fam[k].p_holm for k in tested] == pytest.approx(holm(p))
    assert all(fam[k].family == 4 for k in fam)
    # Without activation (not computed), activation_rel is tested.
    only_rel = reliability_family({("s", "activation_rel"): split_half_reliability(rng.random(16), rng.random(16))})
    assert not only_rel[("s", "activation_rel")].same_as


def test_not_enough_groups_to_test_is_said_when_no_data_could_pass():
    perfect = [0.1, 0.2, 0.3, 0.4]  # 4 groups: the exact permutation test's smallest p is 1/24 = 0.042
    alone = split_half_reliability(perfect, perfect)
    assert alone.p_min == pytest.approx(1 / 24) and alone.verdict() == "not noise"  # a family of one passes
    fam = reliability_family({("s", "activation"): alone, ("s", "confidence"): alone})
    # Two tests: even a perfect ordering gives Holm p >= 2/24 > 0.05: never a claim, and said so.
    for key in fam:
        assert fam[key].verdict() == NOT_ENOUGH_TO_TEST
        assert fam[key].p_holm == pytest.approx(2 / 24)
        assert NOT_ENOUGH_TO_TEST in fam[key].sentence("s", key[1])
    # With many groups the same family can pass.
    rng = np.random.default_rng(4)
    t = rng.random(30)
    strong = split_half_reliability(t, t + 0.01 * rng.random(30))
    fam = reliability_family({("s", "activation"): strong, ("s", "confidence"): strong})
    assert {r.verdict() for r in fam.values()} == {"not noise"}
