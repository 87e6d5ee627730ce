"""The Trainer-log numbers of one evaluation (keys.evaluation_metrics): every accuracy quantity has its mean
and its paired changes beside the axes' (docs/accuracy.md); the default log level keeps the headline."""

from __future__ import annotations

import pytest

from sago_train.integrations.keys import evaluation_metrics, headline, key
from sago_train.results.monitor import MonitorState

from .._helpers.forgetting import SET, forgetting_pair


def test_accuracy_quantities_are_logged_like_the_axes():
    before, after = forgetting_pair()
    monitor = MonitorState(root=None)  # type: ignore[arg-type] - observe/compare do no I/O
    monitor.observe(before)
    changes = monitor.compare(after)
    metrics = evaluation_metrics(after, changes, seconds=1.0)
    s = after.sets[SET]
    assert metrics[key(SET, "accuracy")] == s.accuracy.mean
    assert metrics[key(SET, "accuracy_all")] == pytest.approx(s.correctness["all_right"])
    assert metrics[key(SET, "accuracy_worst_kind")] == pytest.approx(s.correctness["worst_variant_accuracy"])
    for q in ("generation", "accuracy", "accuracy_all", "accuracy_worst_kind"):
        change = changes.to_dict()[SET][q]["vs_baseline"]
        assert metrics[key(SET, q, "_vs_baseline")] == change["mean_diff"]
        assert metrics[key(SET, q, "_vs_baseline_p")] == change["p_worse"]
    kept = headline(metrics, after)
    assert key(SET, "accuracy") in kept and key(SET, "accuracy_all") not in kept
    assert not any(k.endswith("_vs_baseline") for k in kept)  # changes: log_level="full" (and W&B details)
