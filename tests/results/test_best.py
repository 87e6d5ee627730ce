"""The one best so far (issue #31): the monitor's, the end-of-run summary's and early stopping's."""

from __future__ import annotations

from sago_train.integrations.early_stopping import SAGOEarlyStoppingCallback
from sago_train.results.best import Best, BestEntry
from sago_train.results.compare import VS_BASELINE, VS_BEST, Comparison


def test_one_best_for_the_monitor_and_the_stopper():
    best = Best()
    assert not best.offer("s", "accuracy", 0, 0.9)  # the untrained step 0 is never the best
    assert best.offer("s", "accuracy", 5, 0.5) and not best.offer("s", "accuracy", 6, 0.4)
    assert best.step("s", "accuracy") == 5 and ("s", "accuracy") in best and best.get("s", "x") is None
    assert Best(untrained=True).offer("s", "accuracy", 0, 0.9)
    assert Comparison().get("s", "accuracy", VS_BEST) is None and not Comparison() and VS_BASELINE == "vs_baseline"


def test_the_stopper_keeps_its_best_in_a_best_and_restores_the_old_attributes():
    stop = SAGOEarlyStoppingCallback("sago/s/accuracy", mode="threshold")
    assert stop.best_step is None and stop.best_ids == [] and stop.best.get("s", "accuracy") is None
    # A checkpoint's state (written before the Best existed) sets the four attributes one by one.
    for name, value in {"best_step": 7, "best_mean": 0.8, "best_ids": ["a", "b"], "best_values": [1.0, 0.6]}.items():
        setattr(stop, name, value)
    assert stop.best.get("s", "accuracy") == BestEntry(7, 0.8, None, ("a", "b"), (1.0, 0.6))
    assert (stop.best_step, stop.best_mean, stop.best_ids, stop.best_values) == (7, 0.8, ["a", "b"], [1.0, 0.6])
    assert stop.state()["attributes"]["best_values"] == [1.0, 0.6] and stop.quantity == stop.axis == "accuracy"
    stop.best_step = None
    assert stop.best.get("s", "accuracy") is None and stop.best_mean is None
