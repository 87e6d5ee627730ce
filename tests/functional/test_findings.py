"""The tests behind the findings (SPEC "Findings") against plain references: exhaustive permutations,
per-resample scipy loops, hand-computed Holm values, and the evaluator's per-half axis values against the
axes recomputed on each half."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats as sps
import torch

from sago_train import SAGOEvaluator
from sago_train.data import VariantSet
from sago_train.functional.axes import (
    activation_instability,
    activation_relative,
    confidence_instability,
    confidence_prob_instability,
)
from sago_train.functional.findings import (
    axis_relations,
    holm,
    reversal_counts,
    spearman_bootstrap,
    split_half_reliability,
    split_halves,
)

# ------------------------------------------------------------------------------------------------ split halves


def test_split_halves_fixed_disjoint_and_seeded():
    for k in range(4, 10):
        a, b = split_halves(k, "g7", seed=3)
        assert sorted(a + b) == list(range(k)) and not set(a) & set(b)
        assert (len(a), len(b)) == (k // 2, k - k // 2)
        assert split_halves(k, "g7", seed=3) == (a, b)
    assert split_halves(3, "g7") is None and split_halves(2, "g7") is None
    # Without kinds the split differs between groups (seeded by the group id).
    splits = {tuple(split_halves(6, f"g{i}")[0]) for i in range(30)}
    assert len(splits) > 5


KINDS = ["canonical", "paraphrase", "format", "typo"]


def test_split_halves_with_kinds_puts_the_same_kinds_in_each_half():
    rng = np.random.default_rng(0)
    for seed in range(4):
        halves = set()
        for i in range(20):
            kinds = list(rng.permutation(KINDS))  # each group lists its variants in another order
            a, b = split_halves(4, f"g{i}", seed=seed, kinds=kinds)
            assert sorted(a + b) == [0, 1, 2, 3]
            halves.add((frozenset(kinds[j] for j in a), frozenset(kinds[j] for j in b)))
        assert len(halves) == 1  # one kind split for every group
    # A repeated kind: still disjoint halves of k // 2 and k - k // 2 variants, the same for the same kinds.
    kinds = ["canonical", "paraphrase", "paraphrase", "paraphrase", "typo", "typo"]
    a, b = split_halves(6, "x", kinds=kinds)
    assert (len(a), len(b)) == (3, 3) and sorted(a + b) == list(range(6))
    assert split_halves(6, "y", kinds=kinds) == (a, b)
    with pytest.raises(ValueError, match="one kind per variant"):
        split_halves(4, "x", kinds=KINDS[:3])


def _simulated_reliability(rng, *, group_effect: bool, by_kind: bool, n: int = 20, dim: int = 64):
    """One simulated set: each group's four variants are its base hidden state (random direction, fixed
    norm) plus a per-kind offset shared by every group - 'format' far off, as on the real sets - plus noise
    whose scale is the group's own (a true group effect: lognormal across groups) or the same for every group
    (the null). Variants are listed in a random order per group. Returns the activation axis's split-half
    reliability through split_halves -> activation_instability on each half -> split_half_reliability."""
    scale = dict(zip(KINDS, (0.0, 0.3, 1.5, 0.3)))
    offsets = {k: torch.tensor(rng.normal(size=dim)) * s for k, s in scale.items()}
    half_a, half_b = [], []
    for i in range(n):
        base = torch.tensor(rng.normal(size=dim))
        base = 4 * base / base.norm()
        sigma = 0.3 * (math.exp(rng.normal(0.0, 1.2)) if group_effect else 1.0)
        kinds = list(rng.permutation(KINDS))
        hidden = torch.stack([base + offsets[k] + sigma * torch.tensor(rng.normal(size=dim)) for k in kinds])
        a, b = split_halves(4, f"g{i}", kinds=kinds if by_kind else None)
        half_a.append(activation_instability(hidden[a, None]).value)
        half_b.append(activation_instability(hidden[b, None]).value)
    return split_half_reliability(half_a, half_b, n_permutations=199, seed=int(rng.integers(1 << 30)))


@pytest.mark.slow
def test_kind_aligned_split_keeps_the_error_rate_and_finds_what_the_id_split_misses():
    """Error rate and power measured under a known truth (100 simulated sets each): with a strong kind
    effect, the kind-aligned split calls a set 'not noise' at most at alpha when groups do not differ (the
    null), and mostly when they do; the id-seeded split, where the far-off kind lands in half A of some groups
    and half B of others, almost never does (its r is driven negative), which is what the real models showed."""
    def rate(**kw):
        rng = np.random.default_rng(7)
        rels = [_simulated_reliability(rng, **kw) for _ in range(100)]
        return float(np.mean([r.verdict() == "not noise" for r in rels])), float(np.mean([r.r for r in rels]))

    null_rate, null_r = rate(group_effect=False, by_kind=True)
    assert null_rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 100) and abs(null_r) < 0.1
    aligned_power, aligned_r = rate(group_effect=True, by_kind=True)
    id_power, id_r = rate(group_effect=True, by_kind=False)
    assert aligned_power >= 0.6 and aligned_r > 0.4
    assert id_power <= 0.1 and id_r < aligned_r - 0.3


# ------------------------------------------------------------------------------------------------ reliability


def _exhaustive_p(a, b) -> float:
    r = sps.spearmanr(a, b).statistic
    null = [sps.spearmanr([a[i] for i in perm], b).statistic for perm in itertools.permutations(range(len(a)))]
    return sum(x >= r - 1e-12 for x in null) / len(null)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reliability_matches_exhaustive_permutations(seed):
    rng = np.random.default_rng(seed)
    truth = rng.random(6)
    a, b = truth + 0.3 * rng.random(6), truth + 0.3 * rng.random(6)
    rel = split_half_reliability(a, b, n_permutations=720)  # 6! = 720: every order of one half
    r = sps.spearmanr(a, b).statistic
    assert rel.r == pytest.approx(r, abs=1e-12)
    assert rel.reliability == pytest.approx(2 * r / (1 + r), abs=1e-12)
    assert rel.p_value == pytest.approx(_exhaustive_p(a, b), abs=1e-12)
    assert rel.n == 6 and rel.note == ""


def test_reliability_exact_values_and_random_permutations():
    a, b = [0.1, 0.2, 0.3, 0.4, 0.5], [0.15, 0.1, 0.35, 0.3, 0.6]
    rel = split_half_reliability(a, b)
    assert rel.r == pytest.approx(0.8) and rel.reliability == pytest.approx(1.6 / 1.8)
    assert rel.p_value == pytest.approx(8 / 120)  # 8 of the 120 orders reach rho >= 0.8
    # Many groups: a seeded random subset of orders; a strong signal gives the smallest p, 1/(n+1).
    rng = np.random.default_rng(4)
    truth = rng.random(60)
    rel = split_half_reliability(truth + 0.05 * rng.random(60), truth + 0.05 * rng.random(60), n_permutations=499)
    assert rel.p_value == pytest.approx(1 / 500) and rel.reliability > 0.9
    noise = split_half_reliability(rng.random(60), rng.random(60), n_permutations=499, seed=1)
    assert noise.p_value > 0.05


def test_reliability_drops_nan_groups_and_says_why_it_cannot_run():
    rel = split_half_reliability([0.1, math.nan, 0.3, 0.2, 0.5], [0.2, 0.1, math.nan, 0.1, 0.7])
    assert rel.n == 3 and rel.r == pytest.approx(sps.spearmanr([0.1, 0.2, 0.5], [0.2, 0.1, 0.7]).statistic)
    none = split_half_reliability([math.nan] * 5, [math.nan] * 5)
    assert none.n == 0 and "K >= 4" in none.note and none.verdict() == "not computed"
    const = split_half_reliability([0.0] * 5, [0.1, 0.2, 0.3, 0.4, 0.5])
    assert math.isnan(const.r) and "constant" in const.note


# ------------------------------------------------------------------------------------------------ distinct axes


def test_spearman_bootstrap_matches_a_per_resample_loop():
    rng = np.random.default_rng(5)
    x = rng.random(30)
    y = 0.5 * x + rng.random(30)
    rho, p, lo, hi, n = spearman_bootstrap(x, y, n_resamples=300, seed=11)
    ref = sps.spearmanr(x, y)
    assert (rho, p, n) == (pytest.approx(ref.statistic), pytest.approx(ref.pvalue), 30)
    idx = np.random.default_rng(11).integers(0, 30, size=(300, 30))
    boot = np.array([sps.spearmanr(x[i], y[i]).statistic for i in idx])
    boot = boot[np.isfinite(boot)]
    # Fisher's z with the bootstrap standard error: tanh(atanh(rho) +- 1.96 sd(atanh(rho*))).
    se = np.std(np.arctanh(boot), ddof=1)
    z = sps.norm.ppf(0.975)
    want = np.tanh(np.arctanh(ref.statistic) - z * se), np.tanh(np.arctanh(ref.statistic) + z * se)
    assert (lo, hi) == (pytest.approx(want[0]), pytest.approx(want[1]))
    # At a Bonferroni level (27 pairs) the same standard error, a wider z.
    _, _, lo27, hi27, _ = spearman_bootstrap(x, y, n_resamples=300, seed=11, confidence=1 - 0.05 / 27)
    z27 = sps.norm.ppf(1 - 0.025 / 27)
    assert hi27 == pytest.approx(np.tanh(np.arctanh(ref.statistic) + z27 * se)) and lo27 < lo


def _exact_spearman_p(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sided p by brute force: the share of all n! pairings with |rho| at least the observed one."""
    obs = abs(sps.spearmanr(x, y).statistic)
    rhos = [abs(sps.spearmanr(x, y[list(perm)]).statistic) for perm in itertools.permutations(range(len(x)))]
    return float(np.mean([r >= obs - 1e-12 for r in rhos]))


@pytest.mark.parametrize("x,y", [
    ([0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.9]),  # rho = 1 on 4 groups: scipy's t approximation says p = 0
    ([0.3, 0.1, 0.4, 0.2, 0.5], [0.2, 0.1, 0.5, 0.4, 0.3]),
    ([1.0, 2.0, 2.0, 3.0, 5.0, 4.0], [0.2, 0.1, 0.3, 0.3, 0.6, 0.5]),  # ties
])
def test_spearman_p_is_exact_on_few_groups(x, y):
    x, y = np.array(x), np.array(y)
    _, p, _, _, n = spearman_bootstrap(x, y, n_resamples=200)
    assert p == pytest.approx(_exact_spearman_p(x, y))
    (rel,) = axis_relations({"s": {"x": x, "y": y}}, n_resamples=200)
    assert rel.p_holm == pytest.approx(p)
    if n == 4:  # the smallest two-sided p over 4! pairings is 2/24: 4 groups can never show a relation
        assert p == pytest.approx(2 / 24) and rel.verdict != "related"


def test_holm_matches_hand_computed_values():
    # sorted p: 0.01 (x4 = 0.04), 0.02 (x3 = 0.06), 0.03 (x2 = 0.06), 0.5 (x1 = 0.5); NaN is no test.
    assert holm([0.03, 0.01, math.nan, 0.5, 0.02]) == pytest.approx([0.06, 0.04, math.nan, 0.5, 0.06], nan_ok=True)
    assert holm([0.3, 0.4]) == pytest.approx([0.6, 0.6])  # monotone: never below an earlier step
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])


def test_axis_relations_verdicts_per_set_never_pooled():
    rng = np.random.default_rng(6)
    n = 200
    base = rng.random(n)
    per_set = {
        # strongly related: rho ~ 0.9
        "s1": {"a": base, "b": base + 0.1 * rng.random(n), "c": rng.random(n)},
        # few groups, unrelated: neither distinct (CI wide) nor related
        "s2": {"a": rng.random(8), "b": rng.random(8), "c": np.zeros(8)},
    }
    rels = {(r.set, r.axes): r for r in axis_relations(per_set, n_resamples=500)}
    assert rels[("s1", ("a", "b"))].verdict == "related"
    assert rels[("s1", ("a", "c"))].verdict == "distinct"  # n = 200 independent: |rho| < 0.5 across the CI
    assert max(abs(rels[("s1", ("a", "c"))].ci_low), abs(rels[("s1", ("a", "c"))].ci_high)) < 0.5
    assert rels[("s2", ("a", "b"))].verdict == "inconclusive"
    assert rels[("s2", ("a", "c"))].verdict == "undefined"  # c is constant on s2
    # Holm over every (set, pair) tested: the adjusted p of the strongest pair is m x its raw p (m = 5 tests).
    tested = [r for r in rels.values() if r.verdict != "undefined"]
    strongest = min(tested, key=lambda r: r.p_value)
    assert strongest.p_holm == pytest.approx(min(1.0, len(tested) * strongest.p_value))
    # Never pooled: rho on s1 is the Spearman of s1's groups alone.
    assert rels[("s1", ("a", "b"))].rho == pytest.approx(sps.spearmanr(per_set["s1"]["a"], per_set["s1"]["b"]).statistic)


def test_weak_but_significant_correlation_is_distinct_and_strong_one_is_never_distinct():
    rng = np.random.default_rng(8)
    n = 3000
    x = rng.normal(size=n)
    y = 0.2 * x + rng.normal(size=n)  # rho ~ 0.19, very significant, CI far below 0.5
    (rel,) = axis_relations({"s": {"x": x, "y": y}}, n_resamples=300)
    assert rel.verdict == "distinct" and rel.p_holm < 0.05 and "weakly related" in rel.sentence()
    # The audit's case: rho = 0.36 with n = 72 was called "different failure modes"; its CI reaches 0.5.
    x = rng.normal(size=72)
    y = 0.4 * x + rng.normal(size=72)
    (rel,) = axis_relations({"s": {"x": x, "y": y}}, n_resamples=1000)
    assert 0.25 < rel.rho < 0.5 and rel.ci_high > 0.5 and rel.verdict != "distinct"


def test_activation_and_its_ratio_are_not_tested_against_each_other():
    v = np.linspace(0, 1, 10)
    rels = axis_relations({"s": {"activation": v, "activation_rel": 2 * v, "confidence": v[::-1]}}, n_resamples=50)
    assert {r.axes for r in rels} == {("activation", "confidence"), ("activation_rel", "confidence")}


# ------------------------------------------------------------------------------------------------ rank reversal


def test_reversal_counts_pairs_not_entries_and_robust_separately():
    flips = [
        {"models": ["a", "b"], "sets": ["x", "y"], "robust": False},
        {"models": ["a", "b"], "sets": ["x", "z"], "robust": True},
        {"models": ["a", "b"], "sets": ["y", "z"], "robust": False},
        {"models": ["b", "c"], "sets": ["x", "y"], "robust": None},
        {"models": ["a", "c"], "sets": ["x", "y"], "robust": False},
    ]
    # 5 entries, 3 model pairs flip, 1 of them robustly, 1 untestable.
    assert reversal_counts(flips, 4) == {"pairs": 6, "flipped": 3, "robust": 1, "unknown": 1}
    assert reversal_counts([], 2) == {"pairs": 1, "flipped": 0, "robust": 0, "unknown": 0}


# ------------------------------------------------------------------------------------------------ the evaluator


RECORDS = [
    {"id": f"g{i}", "variants": [f"The number {i} is", f"number {i} is", f"Tell me about {i}:", f"{i} =",
                                 f"what is {i}"][: 4 + i % 2], "reference": f" {i}"}
    for i in range(7)
] + [{"id": "short", "variants": ["Dogs say", "A dog goes", "dgos say"], "reference": " woof"}]


def test_evaluator_half_values_equal_the_axes_on_each_half(byte_tokenizer, tiny_llama):
    vs = VariantSet.from_records(RECORDS, name="t")
    res = SAGOEvaluator(tiny_llama, byte_tokenizer, layers=[0, 2],
                        axes="activation,activation_rel,confidence,confidence_prob", max_new_tokens=2, seed=5)
    s = res.evaluate(vs).sets["t"]
    ids = [g.id for g in s.groups]
    # Recompute hidden states and log-probs one variant at a time, then the axes on each recorded half.
    hidden, lps = {}, {}
    with torch.no_grad():
        for rec in RECORDS:
            hs, lp = [], []
            r_ids = byte_tokenizer(rec["reference"], add_special_tokens=False)["input_ids"]
            for v in rec["variants"]:
                p = byte_tokenizer(v)["input_ids"]
                o = tiny_llama(torch.tensor([p + r_ids]), output_hidden_states=True)
                hs.append(torch.stack([o.hidden_states[layer + 1][0, len(p) - 1] for layer in (0, 2)]))
                logp = torch.log_softmax(o.logits[0].double(), -1)
                lp.append(float(np.mean([float(logp[len(p) - 1 + j, t]) for j, t in enumerate(r_ids)])))
            hidden[rec["id"]], lps[rec["id"]] = torch.stack(hs), torch.tensor(lp)
    _, between = activation_relative([hidden[i] for i in ids])
    for g in s.groups:
        if g.id == "short":
            assert g.split is None and g.halves == {}  # K = 3 < 4: no split
            continue
        assert g.split == [list(h) for h in split_halves(len(g.variants), g.id, seed=5, kinds=g.kinds)]
        for half, idx in enumerate(g.split):
            h = hidden[g.id][idx]
            assert g.halves["activation"][half] == pytest.approx(activation_instability(h).value, abs=1e-4)
            assert g.halves["confidence_prob"][half] == pytest.approx(
                confidence_prob_instability(lps[g.id][idx]).value, abs=1e-4)
            answer = torch.tensor(g.answer_logprobs) if g.answer_logprobs is not None else lps[g.id]
            assert g.halves["confidence"][half] == pytest.approx(confidence_instability(answer[idx]).value, abs=1e-4)
            # A half's activation_rel is its within-dispersion over the *whole set's* between-group dispersion.
            within = np.array([np.mean([1 - float(torch.nn.functional.cosine_similarity(h[i, li], h[j, li], dim=0))
                                        for i, j in itertools.combinations(range(len(idx)), 2)])
                               for li in range(2)])  # unclipped, as activation_rel uses it
            assert g.halves["activation_rel"][half] == pytest.approx(float(np.mean(within / between)), abs=1e-4)
    # The set's reliability is the function applied to those halves; the short group is left out.
    a, b = s.half_values("activation")
    assert np.isnan(a[ids.index("short")])
    want = split_half_reliability(a, b, n_permutations=s.n_bootstrap, seed=s.seed)
    assert s.reliability["activation"] == want and want.n == 7
    summary = s.to_summary()["reliability"]["activation"]
    assert summary["n"] == 7 and summary["r"] == pytest.approx(want.r)


def test_eval_display_words_each_finding_by_its_test():
    """`sago-train eval` prints findings with the test behind each word: reliability ('not noise' only with a
    permutation p < 0.05), per-set relations with CI and Holm p, and no per-kind test at K = 2."""
    import io

    from rich.console import Console

    from sago_train.analysis.display import print_result
    from sago_train.results.evaluation import Evaluation, GroupRecord, SetEvaluation

    rng = np.random.default_rng(12)
    groups = []
    for i in range(40):
        t = rng.random()
        act, gen, conf = t, t + 0.05 * rng.random(), rng.random()
        groups.append(GroupRecord(
            f"g{i}", ["a", "b"], ["canonical", "typo"], None, None, None,
            {"activation": act, "generation": gen, "confidence": conf},
            {"activation": [act, act], "generation": [gen, gen], "confidence": [conf, conf + 1e-9]},
            halves={"activation": [t + 0.1 * rng.random(), t + 0.1 * rng.random()],
                    "confidence": [rng.random(), rng.random()]}))
    s = SetEvaluation.from_groups("s", ["activation", "generation", "confidence"], groups, ["canonical", "typo"], {},
                  n_bootstrap=500)
    result = Evaluation({"s": s}, "m", {})
    buf = io.StringIO()
    print_result(result, Console(file=buf, width=300))
    out = buf.getvalue()
    rel = split_half_reliability(*s.half_values("activation"), n_permutations=500)
    assert rel.p_value < 0.05
    # Holm over the evaluation's two computed tests (activation, confidence; generation has no halves): the
    # smaller p is doubled.
    assert (f"s/activation: per-group instability is not noise (split-half Spearman r={rel.r:.2f}, "
            f"Spearman-Brown {rel.reliability:.2f}, permutation p={rel.p_value:.2g}, Holm "
            f"p={min(1.0, 2 * rel.p_value):.2g} over 2 tests, n=40 groups)") in out
    assert "s/confidence: per-group instability is not noise" not in out
    assert "not computed (needs at least 3 groups with K >= 4 variants, got 0)" in out  # generation: no halves
    assert "not tested with K = 2" in out and s.kind_effects["confidence"].test == "none"
    rels = {r.axes: r for r in result.axis_relations()}
    assert rels[("activation", "generation")].verdict == "related"
    assert rels[("activation", "generation")].sentence() in out
    assert "different failure modes" not in out and "weakly related (Spearman" not in out


def test_eval_display_says_inconclusive_relations_once_per_set():
    """Inconclusive axis pairs are one line per set (the per-pair CIs stay in summary.json), so the verdicts that
    say something are not buried; decided relations keep their own sentence."""
    import io

    from rich.console import Console

    from sago_train.analysis.display import print_result
    from sago_train.results.evaluation import Evaluation, GroupRecord, SetEvaluation

    rng = np.random.default_rng(3)
    groups = []
    for i in range(6):  # too few groups for any verdict but 'inconclusive'
        a, g, c = rng.random(), rng.random(), rng.random()
        groups.append(GroupRecord(f"g{i}", ["x", "y"], None, None, None, None,
                                  {"activation": a, "generation": g, "confidence": c},
                                  {"activation": [a, a], "generation": [g, g], "confidence": [c, c]}))
    s = SetEvaluation.from_groups("s", ["activation", "generation", "confidence"], groups, None, {}, n_bootstrap=200)
    result = Evaluation({"s": s}, "m", {})
    rels = [r for r in result.axis_relations() if r.verdict == "inconclusive"]
    assert len(rels) == 3
    buf = io.StringIO()
    print_result(result, Console(file=buf, width=400))
    out = buf.getvalue()
    assert "neither distinct nor related (rho=" not in out  # no per-pair sentence
    line = [x for x in out.splitlines() if "axis pair(s) inconclusive" in x]
    assert len(line) == 1
    assert line[0].strip().startswith("- s: 3 axis pair(s) inconclusive, neither distinct nor related (n=6 groups")
    for r in rels:
        assert f"{r.axes[0]}/{r.axes[1]} (rho=" in line[0]
    # summary.json exists only with --out: the line says so instead of pointing at a file that may not be there.
    assert "each pair's CI and p: axis_relations in summary.json, written by --out" in line[0]


def test_spearman_brown_is_shown_only_for_positive_half_agreement():
    # Halves in reverse order: r = -1, and 2r/(1+r) has no reading as a reliability (it is -inf here, and below
    # -1 for any r < -1/3), so the sentence and tables say n/a while the record keeps the formula's value.
    a, b = [0.1, 0.2, 0.3, 0.4, 0.5], [0.5, 0.4, 0.3, 0.2, 0.1]
    rel = split_half_reliability(a, b)
    assert rel.r == pytest.approx(-1.0) and rel.corrected is None
    assert "Spearman-Brown n/a (r <= 0)" in rel.sentence("s", "activation")
    anti = split_half_reliability([0.1, 0.2, 0.3, 0.4, 0.5], [0.3, 0.5, 0.1, 0.4, 0.2])
    r = sps.spearmanr([0.1, 0.2, 0.3, 0.4, 0.5], [0.3, 0.5, 0.1, 0.4, 0.2]).statistic
    assert anti.r == pytest.approx(r) and r < 0 and anti.reliability == pytest.approx(2 * r / (1 + r))
    assert anti.corrected is None
    pos = split_half_reliability([0.1, 0.2, 0.3, 0.4, 0.5], [0.15, 0.1, 0.35, 0.3, 0.6])
    assert pos.corrected == pytest.approx(1.6 / 1.8) and "Spearman-Brown 0.89" in pos.sentence("s", "activation")


# ------------------------------------------------------------------------------------------------ error rates
# Each claim's family-wise rate measured under a known truth through axis_relations (docs/findings.md).


def _mc_bound(rate: float, reps: int) -> float:
    """The rate plus 2.33 Monte-Carlo standard errors (one-sided 99%)."""
    return rate + 2.33 * math.sqrt(rate * (1 - rate) / reps)


def test_related_family_wise_rate_when_no_axes_are_related():
    """200 evaluations of 2 sets x 5 independent axes x 24 groups (16 pairs; activation_rel is activation over
    a constant, its pair with activation left out): the share printing any 'related' is <= 0.05 within MC error;
    raw p < 0.05 per pair, as an uncorrected rule would, gives ~0.35 (the activation_rel pairs repeat)."""
    from tests._helpers.null_studies import correlated_per_set

    rng = np.random.default_rng(0)
    reps = 200
    new = old = 0
    for _ in range(reps):
        rels = axis_relations(correlated_per_set(rng, 2, 24, spearman=0.0), n_resamples=200)
        new += any(r.verdict == "related" for r in rels)
        old += any(r.p_value < 0.05 for r in rels)
    assert new / reps <= _mc_bound(0.05, reps)
    assert old / reps > 0.2 and new < old


@pytest.mark.slow  # 6 s on an idle core, 40 s loaded: 150 evaluations x 6 pairs x 2000 resamples of 150 groups
def test_distinct_family_wise_rate_at_the_bound():
    """'distinct' is false when |rho| >= 0.5; at exactly 0.5 (the least favourable truth) 150 evaluations of
    1 set x 4 equicorrelated axes x 150 groups (6 pairs, simultaneous 99.2% CIs) print any 'distinct' in at
    most 5% within MC error."""
    from tests._helpers.null_studies import correlated_per_set

    rng = np.random.default_rng(1)
    reps = 150
    axes = ("activation", "confidence", "generation", "mirroring")
    hits = 0
    for _ in range(reps):
        rels = axis_relations(correlated_per_set(rng, 1, 150, axes=axes, spearman=0.5))
        assert rels[0].family == 6 and rels[0].confidence == pytest.approx(1 - 0.05 / 6)
        hits += any(r.verdict == "distinct" for r in rels)
    assert hits / reps <= _mc_bound(0.05, reps)


def test_distinct_and_related_have_power_on_clear_truths():
    from tests._helpers.null_studies import correlated_per_set

    rng = np.random.default_rng(2)
    axes = ("activation", "confidence", "generation")
    # Independent axes on 400 groups: every pair distinct. Strongly related ones (0.8) on 60 groups: related.
    for _ in range(3):
        assert {r.verdict for r in axis_relations(correlated_per_set(rng, 2, 400, axes=axes, spearman=0.0))} == \
            {"distinct"}
        assert {r.verdict for r in axis_relations(correlated_per_set(rng, 2, 60, axes=axes, spearman=0.8),
                                                  n_resamples=200)} == {"related"}


def test_relations_say_not_enough_groups_when_neither_verdict_can_pass():
    # 5 groups: the exact two-sided Spearman p is at least 2/120, x 3 pairs in Holm = 0.05; and no CI on 5
    # groups fits inside |rho| < 0.5.
    x = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    rels = axis_relations({"s": {"a": x, "b": x, "c": x[::-1]}}, n_resamples=200)
    assert {r.verdict for r in rels} == {"not enough groups to test"}
    assert all(r.p_holm >= 0.05 for r in rels) and "not enough groups to test" in rels[0].sentence()


def test_evaluator_splits_groups_with_the_same_kinds_alike(byte_tokenizer, tiny_llama):
    records = []
    for i, order in enumerate([[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1], [1, 3, 0, 2]]):
        texts = [f"The number {i} is", f"What is {i}?", f"Q: {i}\nA:", f"teh number {i} is"]
        records.append({"id": f"g{i}", "variants": [texts[j] for j in order], "kinds": [KINDS[j] for j in order],
                        "canonical": order.index(0), "reference": f" {i}"})  # the kind 'canonical' is its own
    s = SAGOEvaluator(tiny_llama, byte_tokenizer, layers=[0], axes="activation", max_new_tokens=1).evaluate(
        VariantSet.from_records(records, name="k")).sets["k"]
    kind_halves = {tuple(frozenset(g.kinds[j] for j in half) for half in g.split) for g in s.groups}
    assert len(s.groups) == 4 and len(kind_halves) == 1
