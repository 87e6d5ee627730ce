"""The kind ``accuracy_worst_kind`` compares in a paired change (results.sets.paired_worst_kind): the kind
answered worst over both evaluations, compared with a plain reference; its error rate under no change is
measured in tests/integrations/test_monitor.py."""

from __future__ import annotations

import numpy as np

from sago_train.results.sets import paired_group_values, paired_worst_kind

from .._helpers.forgetting import SET, evaluation


def test_worst_kind_is_the_lowest_over_both_evaluations():
    for seed in range(20):
        rng = np.random.default_rng(seed)
        before = evaluation(0, rng.uniform(0.2, 0.9, 4), np.full(12, 0.3), seed=seed, n_bootstrap=10).sets[SET]
        after = evaluation(5, rng.uniform(0.2, 0.9, 4), np.full(12, 0.3), seed=seed + 100, n_bootstrap=10).sets[SET]
        kinds = before.kinds

        def per_kind(s, k, kinds=kinds):  # plain reference: the share of right answers of kind k over the groups
            return np.mean([g.correct[kinds.index(k)] for g in s.groups])

        expected = min(kinds, key=lambda k: per_kind(before, k) + per_kind(after, k))
        assert paired_worst_kind(before, after) == expected
        then, now = paired_group_values(before, after, "accuracy_worst_kind")
        i = kinds.index(expected)
        assert then == {g.id: float(g.correct[i]) for g in before.groups}
        assert now == {g.id: float(g.correct[i]) for g in after.groups}


def test_without_kinds_before_the_current_worst_kind_is_used():
    after = evaluation(5, [0.9, 0.1, 0.8, 0.7], np.full(12, 0.3), seed=1, n_bootstrap=10).sets[SET]
    assert after.worst_kind == "typo"
    assert paired_worst_kind(None, after) == "typo"
    other = evaluation(0, 0.5, np.full(12, 0.3), seed=2, kinds=["x", "y", "z", "w"], n_bootstrap=10).sets[SET]
    assert paired_worst_kind(other, after) == "typo"  # no kind in common
