"""Tests for sago_train.functional.stats: each function against scipy or a plain reference implementation."""

from __future__ import annotations

import json
import math
import time
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from sago_train.functional import stats, verdict_rule
from sago_train.functional.relations import (
    Correlation,
    KindEffect,
    RankReversal,
    axis_correlation,
    kind_effect,
    rank_reversal,
)
from sago_train.functional.stats import (
    PairedResult,
    Summary,
    bootstrap_ci,
    crossed_paired_bootstrap,
    paired_comparison,
    to_jsonable,
)

NAN = float("nan")

# Per-group values the way the axes produce them: in [0, 1], sometimes undefined (NaN).
unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
unit_or_nan = st.one_of(unit, st.just(NAN))
value_lists = st.lists(unit, min_size=1, max_size=40)
seeds = st.integers(min_value=0, max_value=2**32 - 1)
FAST = settings(max_examples=60, deadline=None)


def reference_bootstrap(values, n_resamples=2000, confidence=0.95, seed=0):
    """Plain Python-loop percentile bootstrap drawing the same indices as the vectorized version."""
    x = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    rng = np.random.default_rng(seed)
    means = []
    for _ in range(n_resamples):
        idx = rng.integers(0, len(x), size=len(x))
        means.append(sum(x[i] for i in idx) / len(x))
    alpha = 1 - confidence
    lo, hi = np.quantile(np.array(means), [alpha / 2, 1 - alpha / 2])
    return float(np.mean(x)), float(lo), float(hi)


# --------------------------------------------------------------------------------------------------------------
# bootstrap_ci
# --------------------------------------------------------------------------------------------------------------


def test_bootstrap_matches_loop_reference():
    x = np.random.default_rng(3).beta(2, 5, size=57)
    s = bootstrap_ci(x, n_resamples=500, seed=11)
    mean, lo, hi = reference_bootstrap(x, n_resamples=500, seed=11)
    assert s.n == 57
    assert s.mean == pytest.approx(mean, abs=1e-12)
    assert s.ci_low == pytest.approx(lo, abs=1e-12)
    assert s.ci_high == pytest.approx(hi, abs=1e-12)


def test_bootstrap_matches_scipy_percentile():
    x = np.random.default_rng(4).beta(2, 5, size=200)
    s = bootstrap_ci(x, n_resamples=4000, seed=1)
    ref = sps.bootstrap((x,), np.mean, n_resamples=4000, method="percentile", confidence_level=0.95, rng=2)
    assert s.ci_low == pytest.approx(ref.confidence_interval.low, abs=0.01)
    assert s.ci_high == pytest.approx(ref.confidence_interval.high, abs=0.01)
    assert s.mean == pytest.approx(float(np.mean(x)))


def test_bootstrap_ci_shrinks_with_n():
    rng = np.random.default_rng(5)
    small = bootstrap_ci(rng.random(20))
    large = bootstrap_ci(rng.random(2000))
    assert (large.ci_high - large.ci_low) < (small.ci_high - small.ci_low) / 4


def test_bootstrap_confidence_widens_interval():
    x = np.random.default_rng(6).random(100)
    narrow = bootstrap_ci(x, confidence=0.5)
    wide = bootstrap_ci(x, confidence=0.99)
    assert wide.ci_low < narrow.ci_low < narrow.mean < narrow.ci_high < wide.ci_high


def test_bootstrap_drops_nan():
    x = [0.1, NAN, 0.5, 0.3, NAN, 0.9]
    s = bootstrap_ci(x, seed=2)
    assert s.n == 4
    assert s == bootstrap_ci([0.1, 0.5, 0.3, 0.9], seed=2)
    assert bootstrap_ci([0.1, None, 0.5]).n == 2  # None (e.g. read back from JSON) counts as NaN


def test_bootstrap_empty_and_all_nan():
    for values in ([], [NAN, NAN], np.array([])):
        s = bootstrap_ci(values)
        assert s.n == 0
        assert math.isnan(s.mean) and math.isnan(s.ci_low) and math.isnan(s.ci_high)
        assert s.to_dict() == {"mean": None, "ci_low": None, "ci_high": None, "n": 0}


def test_bootstrap_single_and_constant():
    assert bootstrap_ci([0.42]) == Summary(0.42, 0.42, 0.42, 1)
    assert bootstrap_ci([NAN, 0.42]) == Summary(0.42, 0.42, 0.42, 1)
    s = bootstrap_ci([0.1] * 1000)
    assert s.n == 1000 and s.ci_low == s.mean == s.ci_high == pytest.approx(0.1)


def test_bootstrap_rejects_bad_arguments():
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([1.0, 2.0], confidence=1.5)
    with pytest.raises(ValueError, match="n_resamples"):
        bootstrap_ci([1.0, 2.0], n_resamples=0)
    with pytest.raises(ValueError, match="1-D"):
        bootstrap_ci([[1.0, 2.0], [3.0, 4.0]])


def test_bootstrap_is_fast_and_chunking_invariant(monkeypatch):
    x = np.random.default_rng(7).random(1000)
    t0 = time.perf_counter()
    s = bootstrap_ci(x, n_resamples=2000, seed=3)
    assert time.perf_counter() - t0 < 1.0
    monkeypatch.setattr(stats, "_CHUNK_ELEMENTS", 3000)  # draw 3 resamples per chunk
    assert bootstrap_ci(x, n_resamples=2000, seed=3) == s


@FAST
@given(st.lists(unit_or_nan, min_size=0, max_size=40), seeds)
def test_property_ci_contains_mean_and_is_deterministic(values, seed):
    s = bootstrap_ci(values, n_resamples=200, seed=seed)
    assert s.n == sum(not math.isnan(v) for v in values)
    if s.n == 0:
        assert math.isnan(s.mean)
    else:
        assert s.ci_low <= s.mean <= s.ci_high
        assert min(v for v in values if not math.isnan(v)) - 1e-12 <= s.ci_low
    again = bootstrap_ci(values, n_resamples=200, seed=seed)
    assert again.to_dict() == s.to_dict()


def test_bootstrap_seed_changes_interval():
    x = np.random.default_rng(8).random(50)
    assert bootstrap_ci(x, seed=0) != bootstrap_ci(x, seed=1)


# --------------------------------------------------------------------------------------------------------------
# paired_comparison
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
@pytest.mark.parametrize("size", [8, 30, 120])  # exact and normal-approximation regimes of scipy
def test_paired_matches_scipy_wilcoxon(alternative, size):
    rng = np.random.default_rng(size)
    before = rng.random(size)
    after = before + rng.normal(0.05, 0.1, size=size)
    r = paired_comparison(before, after, alternative=alternative, n_resamples=300, seed=4)
    d = after - before
    assert r.p_value == pytest.approx(sps.wilcoxon(d, alternative=alternative).pvalue, rel=1e-12)
    assert r.mean_diff == pytest.approx(float(np.mean(d)))
    assert r.n == size and r.alternative == alternative
    assert (r.ci_low, r.ci_high) == pytest.approx(
        reference_bootstrap(d, n_resamples=300, seed=4)[1:], abs=1e-12
    )


def test_paired_direction():
    before = np.linspace(0.1, 0.5, 20)
    worse = before + 0.1
    assert paired_comparison(before, worse, alternative="greater").p_value < 0.001
    assert paired_comparison(before, worse, alternative="less").p_value > 0.99
    r = paired_comparison(before, worse)
    assert r.alternative == "greater" and r.ci_low == pytest.approx(0.1) and r.mean_diff == pytest.approx(0.1)


def test_paired_drops_pairs_with_nan():
    before = [0.1, NAN, 0.3, 0.4, 0.2, 0.6, 0.1]
    after = [0.2, 0.5, NAN, 0.7, 0.1, 0.9, 0.4]
    r = paired_comparison(before, after, seed=5)
    keep = [0, 3, 4, 5, 6]
    ref = paired_comparison([before[i] for i in keep], [after[i] for i in keep], seed=5)
    assert r == ref and r.n == 5


def test_paired_all_zero_differences_gives_p_one_without_warnings():
    x = [0.2, 0.3, 0.4]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for alternative in ("greater", "less", "two-sided"):
            r = paired_comparison(x, x, alternative=alternative)
            assert r.p_value == 1.0 and r.mean_diff == 0.0 and r.ci_low == r.ci_high == 0.0 and r.n == 3


def test_paired_empty_and_single():
    r = paired_comparison([], [])
    assert r.n == 0 and all(math.isnan(v) for v in (r.mean_diff, r.ci_low, r.ci_high, r.p_value))
    r = paired_comparison([NAN, 0.1], [0.2, NAN])
    assert r.n == 0
    r = paired_comparison([0.1], [0.4])
    assert r.n == 1 and r.mean_diff == r.ci_low == r.ci_high == pytest.approx(0.3)
    assert r.p_value == pytest.approx(sps.wilcoxon([0.3], alternative="greater").pvalue)


def test_paired_length_mismatch_names_both_lengths():
    with pytest.raises(ValueError, match=r"before has 3 values, after has 2"):
        paired_comparison([0.1, 0.2, 0.3], [0.1, 0.2])


def test_paired_rejects_unknown_alternative():
    with pytest.raises(ValueError, match="alternative"):
        paired_comparison([0.1, 0.2], [0.2, 0.3], alternative="bigger")


@FAST
@given(st.lists(st.tuples(unit_or_nan, unit_or_nan), min_size=0, max_size=30), seeds)
def test_property_paired_swap_symmetry(pairs, seed):
    a = [p[0] for p in pairs]
    b = [p[1] for p in pairs]
    ab = paired_comparison(a, b, alternative="greater", n_resamples=200, seed=seed)
    ba = paired_comparison(b, a, alternative="less", n_resamples=200, seed=seed)
    assert ab.n == ba.n
    if ab.n == 0:
        assert math.isnan(ab.p_value) and math.isnan(ba.p_value)
        return
    assert ab.p_value == pytest.approx(ba.p_value, rel=1e-9, abs=1e-12)
    assert ab.mean_diff == -ba.mean_diff
    assert ab.ci_low == pytest.approx(-ba.ci_high, abs=1e-9)
    assert ab.ci_high == pytest.approx(-ba.ci_low, abs=1e-9)
    assert ab.ci_low <= ab.mean_diff <= ab.ci_high
    assert 0.0 <= ab.p_value <= 1.0
    assert paired_comparison(a, b, n_resamples=200, seed=seed) == ab  # deterministic


# --------------------------------------------------------------------------------------------------------------
# kind_effect
# --------------------------------------------------------------------------------------------------------------


def test_kind_effect_friedman_matches_scipy():
    rng = np.random.default_rng(9)
    x = rng.random((40, 4)) + np.array([0.0, 0.1, 0.3, 0.05])
    kinds = ["canonical", "paraphrase", "typo", "format"]
    e = kind_effect(x, kinds)
    ref = sps.friedmanchisquare(*x.T)
    assert e.test == "friedman" and e.n == 40 and e.kinds == kinds
    assert e.statistic == pytest.approx(ref.statistic) and e.p_value == pytest.approx(ref.pvalue)
    assert e.means == pytest.approx({k: float(x[:, i].mean()) for i, k in enumerate(kinds)})
    assert e.p_value < 0.001


def test_kind_effect_two_kinds_is_not_tested():
    """SPEC: with K = 2 the per-kind test is skipped. The audit found activation 'testable' at K = 2: both
    per-variant values are equal by construction and float noise alone gave a p-value."""
    rng = np.random.default_rng(10)
    pair = rng.random(25)
    noise = rng.normal(scale=1e-8, size=25)  # the float noise of two per-variant values that are equal
    x = np.stack([pair, pair + noise], axis=1)
    assert sps.wilcoxon(x[:, 1] - x[:, 0]).pvalue < 1  # the old test "found" something in float noise
    e = kind_effect(x, ["canonical", "typo"])
    assert e.test == "none" and e.n == 25 and "K = 2" in e.note
    assert math.isnan(e.statistic) and math.isnan(e.p_value)
    assert e.means == pytest.approx({"canonical": pair.mean(), "typo": (pair + noise).mean()})


def test_kind_effect_drops_rows_with_nan():
    x = np.array([[0.1, 0.2, 0.3], [NAN, 0.2, 0.1], [0.3, 0.1, 0.5], [0.2, 0.4, 0.6], [0.0, 0.5, NAN]])
    e = kind_effect(x, ["a", "b", "c"])
    clean = x[[0, 2, 3]]
    assert e.n == 3
    assert e.means == pytest.approx(
        {"a": clean[:, 0].mean(), "b": clean[:, 1].mean(), "c": clean[:, 2].mean()}
    )
    assert e.statistic == pytest.approx(sps.friedmanchisquare(*clean.T).statistic)


def test_kind_effect_too_few_groups_and_constant():
    e = kind_effect([[0.1, 0.2, 0.3]], ["a", "b", "c"])
    assert e.n == 1 and math.isnan(e.statistic) and math.isnan(e.p_value)
    assert e.means == pytest.approx({"a": 0.1, "b": 0.2, "c": 0.3})
    e = kind_effect(np.empty((0, 3)), ["a", "b", "c"])
    assert e.n == 0 and all(math.isnan(v) for v in e.means.values())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in (3, 4):
            e = kind_effect(np.full((10, k), 0.25), [str(i) for i in range(k)])
            assert e.p_value == 1.0 and e.statistic == 0.0
            # Rows constant within each group (kind has no effect), different across groups.
            e = kind_effect(np.repeat(np.linspace(0, 1, 10)[:, None], k, axis=1), [str(i) for i in range(k)])
            assert e.p_value == 1.0


def test_kind_effect_validates_shape():
    with pytest.raises(ValueError, match="columns"):
        kind_effect(np.zeros((3, 3)), ["a", "b"])
    with pytest.raises(ValueError, match="unique"):
        kind_effect(np.zeros((3, 2)), ["a", "a"])
    with pytest.raises(ValueError, match="at least 2"):
        kind_effect(np.zeros((3, 1)), ["a"])
    with pytest.raises(ValueError, match="groups, kinds"):
        kind_effect(np.zeros(3), ["a", "b", "c"])


# --------------------------------------------------------------------------------------------------------------
# axis_correlation
# --------------------------------------------------------------------------------------------------------------


def test_axis_correlation_matches_scipy_pairwise():
    rng = np.random.default_rng(12)
    a = rng.random(60)
    data = {"activation": a, "confidence": a + rng.normal(0, 0.2, 60), "generation": rng.random(60)}
    c = axis_correlation(data)
    axes = list(data)
    assert c.axes == axes and c.n == 60
    for i, x in enumerate(axes):
        assert c.rho[i][i] == 1.0 and c.p_value[i][i] == 0.0
        for j, y in enumerate(axes):
            if i != j:
                ref = sps.spearmanr(data[x], data[y])
                assert c.rho[i][j] == pytest.approx(ref.statistic) and c.p_value[i][j] == pytest.approx(
                    ref.pvalue
                )
    assert np.allclose(np.array(c.rho), np.array(c.rho).T)
    full = sps.spearmanr(np.stack(list(data.values()), axis=1))
    assert np.allclose(np.array(c.rho), full.statistic)


def test_axis_correlation_drops_rows_with_nan():
    data = {
        "a": [0.1, 0.2, NAN, 0.4, 0.5, 0.3],
        "b": [0.5, 0.1, 0.3, NAN, 0.2, 0.4],
        "c": [0.1, 0.3, 0.2, 0.6, 0.4, 0.9],
    }
    c = axis_correlation(data)
    keep = [0, 1, 4, 5]
    assert c.n == 4
    ref = sps.spearmanr([data["a"][i] for i in keep], [data["c"][i] for i in keep])
    assert c.rho[0][2] == pytest.approx(ref.statistic)


def test_axis_correlation_constant_axis_gives_nan_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = axis_correlation(
            {"a": [0.1, 0.2, 0.3, 0.4], "b": [0.5, 0.5, 0.5, 0.5], "c": [0.4, 0.1, 0.3, 0.2]}
        )
    assert math.isnan(c.rho[0][1]) and math.isnan(c.rho[1][0]) and math.isnan(c.p_value[1][2])
    assert c.rho[1][1] == 1.0 and c.p_value[1][1] == 0.0
    assert c.rho[0][2] == pytest.approx(sps.spearmanr([0.1, 0.2, 0.3, 0.4], [0.4, 0.1, 0.3, 0.2]).statistic)
    d = c.to_dict()
    assert d["rho"][0][1] is None and d["rho"][0][0] == 1.0
    json.dumps(d, allow_nan=False)


def test_axis_correlation_one_axis_empty_and_mismatch():
    c = axis_correlation({"activation": [0.1, 0.2, 0.3]})
    assert c.axes == ["activation"] and c.rho == [[1.0]] and c.p_value == [[0.0]] and c.n == 3
    c = axis_correlation({"a": [], "b": []})
    assert c.n == 0 and math.isnan(c.rho[0][1])
    assert axis_correlation({}) == Correlation([], [], [], 0)
    with pytest.raises(ValueError, match="lengths differ"):
        axis_correlation({"a": [0.1, 0.2], "b": [0.1]})


# --------------------------------------------------------------------------------------------------------------
# rank_reversal
# --------------------------------------------------------------------------------------------------------------


def test_rank_reversal_planted_flip_and_tau():
    scores = {
        "paraphrase": {"base": 0.30, "lora": 0.10, "full": 0.20},
        "typo": {"base": 0.40, "lora": 0.50, "full": 0.20},
    }
    r = rank_reversal(scores)
    assert r.rankings == {"paraphrase": ["lora", "full", "base"], "typo": ["full", "base", "lora"]}
    ref = sps.kendalltau([0.30, 0.20, 0.10], [0.40, 0.20, 0.50])  # models sorted: base, full, lora
    assert r.tau["paraphrase"]["typo"] == pytest.approx(ref.statistic)
    assert r.tau["typo"]["paraphrase"] == r.tau["paraphrase"]["typo"]
    assert r.tau["typo"]["typo"] == pytest.approx(1.0)
    assert r.flips == [
        {"models": ["base", "lora"], "sets": ["paraphrase", "typo"],
         "order": {"paraphrase": ["lora", "base"], "typo": ["base", "lora"]}},
        {"models": ["full", "lora"], "sets": ["paraphrase", "typo"],
         "order": {"paraphrase": ["lora", "full"], "typo": ["full", "lora"]}},
    ]  # fmt: skip
    json.dumps(r.to_dict(), allow_nan=False)


def reference_flips(scores, higher_is_better):
    """Brute force: every (model pair, set pair) whose strict order differs."""
    out = set()
    sets = list(scores)
    for i, s1 in enumerate(sets):
        for s2 in sets[i + 1 :]:
            common = sorted(set(scores[s1]) & set(scores[s2]))
            for x in common:
                for y in common:
                    if x < y:
                        d1 = scores[s1][x] - scores[s1][y]
                        d2 = scores[s2][x] - scores[s2][y]
                        if d1 * d2 < 0:
                            out.add((x, y, s1, s2))
    return out


def test_rank_reversal_agreeing_orders_has_no_flip():
    scores = {
        "a": {"m1": 0.1, "m2": 0.2, "m3": 0.3},
        "b": {"m1": 0.2, "m2": 0.4, "m3": 0.9},
        "c": {"m1": 0.0, "m3": 1.0},
    }
    r = rank_reversal(scores)
    assert r.flips == []
    assert r.tau["a"]["b"] == pytest.approx(1.0) and r.tau["a"]["c"] == pytest.approx(1.0)


def test_rank_reversal_higher_is_better_and_ties():
    scores = {"s1": {"b": 0.5, "a": 0.5, "c": 0.9}, "s2": {"a": 0.1, "b": 0.6, "c": 0.2}}
    r = rank_reversal(scores, higher_is_better=True)
    assert r.rankings == {"s1": ["c", "a", "b"], "s2": ["b", "c", "a"]}
    # (a, b) is tied on s1: not a flip; (a, c) agree; only (b, c) reverses.
    assert [f["models"] for f in r.flips] == [["b", "c"]]
    assert r.flips[0]["order"] == {"s1": ["c", "b"], "s2": ["b", "c"]}
    assert r.tau["s1"]["s2"] == pytest.approx(sps.kendalltau([0.5, 0.5, 0.9], [0.1, 0.6, 0.2]).statistic)
    # higher_is_better changes the rankings, never tau or which pairs flip.
    low = rank_reversal(scores)
    assert low.rankings["s1"] == ["a", "b", "c"] and low.tau == r.tau
    assert [(f["models"], f["sets"]) for f in low.flips] == [(f["models"], f["sets"]) for f in r.flips]


def test_rank_reversal_missing_models_and_degenerate_tau():
    scores = {
        "s1": {"m1": 0.1, "m2": NAN, "m3": 0.3},
        "s2": {"m1": 0.5, "m2": 0.2},
        "s3": {"m1": 0.4, "m3": 0.4},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = rank_reversal(scores)
    assert r.rankings["s1"] == ["m1", "m3"]
    assert math.isnan(r.tau["s1"]["s2"])  # only m1 shared
    assert math.isnan(r.tau["s1"]["s3"])  # constant on s3
    assert r.flips == []
    assert rank_reversal({}) == RankReversal({}, {}, [])


@FAST
@given(
    st.dictionaries(
        st.sampled_from(["s1", "s2", "s3", "s4"]),
        st.dictionaries(
            st.sampled_from(["m1", "m2", "m3", "m4", "m5"]), st.sampled_from([0.1, 0.2, 0.3, 0.4, 0.5])
        ),
        max_size=4,
    ),
    st.booleans(),
)
def test_property_rank_reversal_matches_brute_force(scores, higher_is_better):
    r = rank_reversal(scores, higher_is_better=higher_is_better)
    got = [(*f["models"], *f["sets"]) for f in r.flips]
    assert set(got) == reference_flips(scores, higher_is_better)
    assert got == sorted(got, key=lambda t: (t[0], t[1], list(scores).index(t[2]), list(scores).index(t[3])))
    for f in r.flips:
        for s, (better, worse) in f["order"].items():
            assert r.rankings[s].index(better) < r.rankings[s].index(worse)
    assert rank_reversal(scores, higher_is_better=higher_is_better) == r


# --------------------------------------------------------------------------------------------------------------
# JSON conversion
# --------------------------------------------------------------------------------------------------------------


def test_to_dict_and_to_jsonable_are_plain_json():
    results = [
        bootstrap_ci(np.array([0.1, 0.2, 0.4])),
        paired_comparison([0.1, 0.2], [0.3, 0.3]),
        kind_effect([[0.1, 0.2]], ["a", "b"]),
        axis_correlation({"a": [0.1, 0.2, 0.3], "b": [0.3, 0.3, 0.3]}),
        rank_reversal({"s": {"m": 0.1}}),
    ]
    for r in results:
        d = r.to_dict()
        assert d == to_jsonable(r)
        assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert isinstance(results[2], KindEffect) and results[2].to_dict()["statistic"] is None
    assert isinstance(results[1], PairedResult) and results[1].to_dict()["alternative"] == "greater"
    assert bootstrap_ci([0.5, 0.7]).to_dict().keys() == {"mean", "ci_low", "ci_high", "n"}
    converted = to_jsonable(
        {1: np.float32(0.5), "b": np.int64(3), "c": (np.bool_(True), np.array([NAN, 1.0])), "d": float("inf")}
    )
    assert converted == {"1": 0.5, "b": 3, "c": [True, [None, 1.0]], "d": None}
    assert type(converted["b"]) is int


# --------------------------------------------------------------------------------------------------------------
# The verdict rule (issue 13: one rule for "more/less stable" everywhere)
# --------------------------------------------------------------------------------------------------------------


def test_min_groups_is_where_an_exact_one_sided_wilcoxon_can_reach_alpha():
    for alpha in (0.05, 0.01, 0.2):
        n = verdict_rule.min_groups(alpha)
        # n pairs all on one side: scipy's exact p is 2**-n; one pair fewer cannot get below alpha.
        assert sps.wilcoxon(np.arange(1.0, n + 1), alternative="greater").pvalue < alpha
        assert sps.wilcoxon(np.arange(1.0, n), alternative="greater").pvalue >= alpha


def test_verdict_needs_the_wilcoxon_and_the_ci_to_agree():
    from .._helpers import verdict_case as case

    v = verdict_rule.paired_verdict(case.before(), case.after(), seed=0)
    d = case.DIFF
    # The numbers against scipy and a brute-force bootstrap: Wilcoxon says "worse", the CI spans 0.
    assert v.p_worse == pytest.approx(sps.wilcoxon(d, alternative="greater").pvalue, rel=1e-12)
    assert v.p_worse == pytest.approx(0.01708984375) and v.p_worse < 0.05
    assert v.p_better == pytest.approx(sps.wilcoxon(d, alternative="less").pvalue, rel=1e-12)
    mean, lo, hi = reference_bootstrap(d, n_resamples=2000, confidence=0.95, seed=0)
    assert (v.mean_diff, v.ci_low, v.ci_high) == pytest.approx((mean, lo, hi), abs=1e-12)
    assert lo < 0 < hi
    assert v.verdict == stats.NO_DIFFERENCE and not v.significant and v.words() == "no significant difference"
    # Shift every difference up: both tests agree, so it is "worse" (= less stable on an instability) ...
    v = verdict_rule.paired_verdict(case.before(), case.before() + 0.05 + 0.01 * np.arange(case.N), seed=0)
    assert v.verdict == stats.WORSE and v.words() == "less stable" and v.ci_low > 0
    # ... and the same numbers on a higher-is-better quantity are "better".
    v2 = verdict_rule.paired_verdict(case.before(), case.before() + 0.05 + 0.01 * np.arange(case.N), seed=0,
                              higher_is_better=True)
    assert v2.verdict == stats.BETTER and v2.p_better == pytest.approx(v.p_worse)


def test_verdict_min_delta_and_too_few_groups():
    before = np.linspace(0.1, 0.5, 20)
    assert verdict_rule.paired_verdict(before, before + 0.01).verdict == stats.WORSE
    assert verdict_rule.paired_verdict(before, before + 0.01, min_delta=0.02).verdict == stats.NO_DIFFERENCE
    assert verdict_rule.paired_verdict(before, before - 0.03, min_delta=0.02).verdict == stats.BETTER
    # Four groups all worse by a lot: p = 1/16 can never be < 0.05, so it says so (never "no difference").
    v = verdict_rule.paired_verdict(before[:4], before[:4] + 0.3)
    assert v.verdict == stats.NOT_ENOUGH and v.n == 4 and "needs >= 5" in v.words()
    assert verdict_rule.paired_verdict(before[:5], before[:5] + 0.3).verdict == stats.WORSE
    assert verdict_rule.paired_verdict([], []).verdict == stats.NOT_ENOUGH
    same = verdict_rule.paired_verdict(before, before)
    assert same.verdict == stats.NO_DIFFERENCE and same.p_worse == same.p_better == 1.0
    with pytest.raises(ValueError, match="alpha"):
        verdict_rule.paired_verdict(before, before, alpha=1.0)
    with pytest.raises(ValueError, match="min_delta"):
        verdict_rule.paired_verdict(before, before, min_delta=-0.1)


def test_decide_on_recorded_numbers_treats_missing_as_not_significant():
    # A history line written before the rule had no p_better: never "better", and NaN never significant.
    assert verdict_rule.decide(-0.1, -0.2, -0.05, 0.99, NAN, 20) == stats.NO_DIFFERENCE
    assert verdict_rule.decide(0.1, 0.05, 0.2, 0.01, NAN, 20) == stats.WORSE
    assert verdict_rule.decide(0.1, NAN, NAN, 0.01, 0.99, 20) == stats.NO_DIFFERENCE
    # The CI is the 1 - alpha interval: at alpha = 0.05 a p of 0.03 counts only with the CI on the same side.
    assert verdict_rule.decide(0.1, -0.01, 0.2, 0.03, 0.97, 20) == stats.NO_DIFFERENCE


def test_worse_verdict_says_worse_exactly_when_the_full_verdict_does():
    """Early stopping's directed question: the same "worse" as paired_verdict on the same numbers, with the same
    p and CI when it is worse; the CI (and p_better) are only skipped where they cannot change the answer."""
    rng = np.random.default_rng(7)
    seen = set()
    for case in range(300):
        n = int(rng.integers(3, 40))
        before = rng.uniform(0.1, 0.9, n)
        after = before + rng.normal(rng.choice([-0.05, 0.0, 0.02, 0.05]), rng.choice([0.01, 0.05, 0.2]), n)
        after[rng.random(n) < 0.1] = NAN
        kw = dict(higher_is_better=bool(case % 2), alpha=float(rng.choice([0.05, 0.01, 0.002])),
                  min_delta=float(rng.choice([0.0, 0.0, 0.03])), seed=case)
        full, fast = verdict_rule.paired_verdict(before, after, **kw), verdict_rule.worse_verdict(before, after, **kw)
        assert (fast.verdict == stats.WORSE) == (full.verdict == stats.WORSE), (case, full, fast)
        assert (fast.verdict == stats.NOT_ENOUGH) == (full.verdict == stats.NOT_ENOUGH)
        assert fast.n == full.n and fast.mean_diff == pytest.approx(full.mean_diff, nan_ok=True)
        if fast.verdict == stats.WORSE:
            assert (fast.p_worse, fast.ci_low, fast.ci_high) == (full.p_worse, full.ci_low, full.ci_high)
        elif fast.verdict != stats.NOT_ENOUGH:
            assert fast.verdict == stats.NOT_WORSE and math.isnan(fast.p_better)
        seen.add((full.verdict, fast.verdict))
    # Every branch was met: worse, better (not worse here), no difference, too few groups.
    assert {stats.WORSE, stats.BETTER, stats.NO_DIFFERENCE, stats.NOT_ENOUGH} <= {full for full, _ in seen}
    with pytest.raises(ValueError, match="same groups"):
        verdict_rule.worse_verdict([0.1, 0.2], [0.1])


def _ratio_ci_reference(num, den, n_resamples, seed, confidence=0.95):
    """Plain loop: the same seeded index draws (one chunk), the pooled ratio of each resample, percentiles."""
    rng = np.random.default_rng(seed)
    n = len(num)
    idx = rng.integers(0, n, size=(n_resamples, n))
    ratios = []
    for row in idx:
        ratios.append(sum(num[i] for i in row) / sum(den[i] for i in row))
    a = 1 - confidence
    lo, hi = np.quantile(ratios, [a / 2, 1 - a / 2])
    return sum(num) / sum(den), lo, hi


def test_bootstrap_ratio_ci_matches_a_plain_loop_and_the_mean_ci_on_equal_denominators():
    num, den = [3, 1, 2, 4, 0, 5, 2], [4, 2, 4, 4, 3, 6, 2]
    got = stats.bootstrap_ratio_ci(num, den, n_resamples=500, seed=3)
    ratio, lo, hi = _ratio_ci_reference(num, den, 500, 3)
    assert got.mean == pytest.approx(17 / 25) and got.mean == pytest.approx(ratio)
    assert (got.ci_low, got.ci_high) == (pytest.approx(min(lo, ratio)), pytest.approx(max(hi, ratio)))
    assert got.n == 7 and got.ci_low < got.mean < got.ci_high
    # Equal denominators: the pooled ratio is the mean of per-group ratios, and the resamples are the same.
    eq = stats.bootstrap_ratio_ci([1, 3, 2, 4, 0], [4] * 5, n_resamples=800, seed=1)
    ref = stats.bootstrap_ci([0.25, 0.75, 0.5, 1.0, 0.0], n_resamples=800, seed=1)
    assert (eq.mean, eq.ci_low, eq.ci_high) == (pytest.approx(ref.mean), pytest.approx(ref.ci_low),
                                                pytest.approx(ref.ci_high))
    one = stats.bootstrap_ratio_ci([2], [4])
    assert (one.mean, one.ci_low, one.ci_high, one.n) == (0.5, 0.5, 0.5, 1)
    assert stats.bootstrap_ratio_ci([], []).n == 0
    with pytest.raises(ValueError, match="denominators"):
        stats.bootstrap_ratio_ci([1], [0])


def _reference_crossed(d, n_resamples, seed):
    rng = np.random.default_rng(seed)
    g = [rng.integers(0, d.shape[0], d.shape[0]) for _ in range(n_resamples)]
    s = [rng.integers(0, d.shape[1], d.shape[1]) for _ in range(n_resamples)]
    return np.array([d[np.ix_(gi, si)].mean() for gi, si in zip(g, s)])


def test_crossed_paired_bootstrap_matches_a_plain_loop():
    rng = np.random.default_rng(3)
    before, after = rng.normal(size=(25, 4)), rng.normal(0.3, 1.0, size=(25, 4))
    got = crossed_paired_bootstrap(before, after, n_resamples=500, seed=7)
    means = _reference_crossed(after - before, 500, 7)
    lo, hi = np.quantile(means, [0.025, 0.975])
    assert got.mean == pytest.approx((after - before).mean())
    assert (got.ci_low, got.ci_high) == pytest.approx((min(lo, got.mean), max(hi, got.mean)))
    assert got.n == 100
    # Seed variation widens the interval: a seed-level offset is invisible to a groups-only bootstrap.
    offset = np.array([0.0, 0.0, 1.0, -1.0])
    wide = crossed_paired_bootstrap(before, after + offset, n_resamples=500, seed=7)
    assert wide.ci_high - wide.ci_low > got.ci_high - got.ci_low
    with pytest.raises(ValueError, match="NaN"):
        crossed_paired_bootstrap([[0.0, np.nan]], [[1.0, 1.0]])
    with pytest.raises(ValueError, match="one shape"):
        crossed_paired_bootstrap([[0.0, 1.0]], [[1.0]])


def test_crossed_paired_bootstrap_with_one_seed_is_the_groups_bootstrap():
    # One seed: the crossed bootstrap resamples groups only, so its CI is the one scipy's percentile bootstrap
    # of the mean difference gives, up to Monte Carlo error.
    rng = np.random.default_rng(5)
    before, after = rng.normal(size=(60, 1)), rng.normal(0.5, 1.0, size=(60, 1))
    got = crossed_paired_bootstrap(before, after, n_resamples=4000, seed=1)
    ref = sps.bootstrap(((after - before)[:, 0],), np.mean, n_resamples=4000, method="percentile",
                        random_state=np.random.default_rng(2)).confidence_interval
    assert got.ci_low == pytest.approx(ref.low, abs=0.05) and got.ci_high == pytest.approx(ref.high, abs=0.05)
