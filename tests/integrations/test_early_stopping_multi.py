"""Early stopping that explains itself: one line at train start, a p_value in every decision, one stopper over
several metrics (a stability axis and accuracy) with alpha split by the union bound, and the accuracy metric
accepted through the ``--sago_*`` flags."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import transformers
from transformers import TrainerControl, TrainerState, TrainingArguments
from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser

from sago_train import SAGOArguments, SAGOCallback, SAGOEarlyStoppingCallback, SagoInputError
from sago_train.integrations.early_stopping import MultiMetricEarlyStopping

from .._helpers.trainer import make_trainer, variant_set
from .test_early_stopping import _accuracy_snap, feed, snap

ARGS = TrainingArguments(output_dir="/tmp/unused", report_to=[])


def _start_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("sago early stopping: sago/")]


def test_one_line_at_train_start_says_metric_direction_reference_looks_and_level(caplog):
    sago = SAGOCallback(variant_set(n=16), eval_steps=1, axes="activation")
    stop = SAGOEarlyStoppingCallback("sago/num/activation", patience=2, alpha=0.05)
    sago.add_listener(stop)
    with caplog.at_level(logging.INFO, logger="sago_train"):
        sago._check_listeners(ARGS, TrainerState(max_steps=10))
    (line,) = _start_lines(caplog)
    assert stop.looks == 7  # steps 1..10: 2 in the reference, the window full from the 4th
    assert line == ("sago early stopping: sago/num/activation (lower is better, paired): reference = the first 2 "
                    "evaluation(s) from step 0 (steps 1, 2), window = the latest 2; 7 planned look(s), each at "
                    f"level {0.05 / 7:.3g} (alpha 0.05 / 7)")
    guard = SAGOEarlyStoppingCallback("sago/num/accuracy", mode="threshold")
    sago.add_listener(guard)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sago_train"):
        sago._check_listeners(ARGS, TrainerState(max_steps=10))
    assert any(x.startswith("sago early stopping: sago/num/accuracy (higher is better, threshold)")
               for x in _start_lines(caplog))


def test_every_decision_has_a_p_value():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.4, 40)
    stop = SAGOEarlyStoppingCallback("sago/s/activation", patience=2)
    feed(stop, [snap(0, base), snap(1, base), snap(2, base + 0.01), snap(3, base), snap(4, base + 0.1)])
    assert len(stop.decisions) == 5
    assert all(isinstance(d["p_value"], float) for d in stop.decisions)
    assert [d.get("tested", True) for d in stop.decisions] == [False, False, False, False, True]
    few = SAGOEarlyStoppingCallback("sago/s/activation", patience=1)  # 2 groups: no test can run, still a p_value
    feed(few, [snap(1, [0.1, 0.2]), snap(2, [0.3, 0.4])])
    assert few.decisions[-1]["p_value"] == 1.0


def test_one_stopper_over_stability_and_accuracy_splits_alpha():
    stop = SAGOEarlyStoppingCallback(["sago/s/activation", "sago/s/accuracy"], patience=2, alpha=0.05)
    assert isinstance(stop, MultiMetricEarlyStopping) and isinstance(stop, SAGOEarlyStoppingCallback)
    assert [(w.metric, w.alpha) for w in stop.watchers] == [("sago/s/activation", 0.025), ("sago/s/accuracy", 0.025)]
    assert SAGOEarlyStoppingCallback("sago/s/activation,sago/s/accuracy").metric == "sago/s/activation,sago/s/accuracy"
    stop.plan(48, list(range(1, 11)))
    assert [w.level(1) for w in stop.watchers] == [0.025 / 7] * 2  # each metric: its share over its looks
    rng = np.random.default_rng(3)
    p_right = rng.uniform(0.6, 0.95, 48)
    shift = [0.0] * 4 + [-0.3] * 6  # accuracy falls; activation stays flat
    stopped = feed(stop, [_accuracy_snap(t + 1, np.clip(p_right + shift[t], 0, 1), rng) for t in range(10)])
    assert stopped is not None and stop.stopped is stop.watchers[1] and "accuracy" in stop.reason
    assert {d["metric"] for d in stop.decisions} == {"sago/s/activation", "sago/s/accuracy"}
    assert all(isinstance(d["p_value"], float) for d in stop.decisions)
    with pytest.raises(SagoInputError, match="twice"):
        SAGOEarlyStoppingCallback("sago/s/activation,sago/s/activation")


def test_the_state_of_every_metric_round_trips_as_transformers_restores_it():
    import json

    rng = np.random.default_rng(3)
    stop = SAGOEarlyStoppingCallback("sago/s/activation,sago/s/accuracy", patience=2)
    feed(stop, [_accuracy_snap(t + 1, rng.uniform(0.6, 0.9, 24), rng) for t in range(3)])
    saved = json.loads(json.dumps(stop.state()))
    back = type(stop).from_state(saved)
    assert isinstance(back, MultiMetricEarlyStopping)
    assert [w.reference for w in back.watchers] == [w.reference for w in stop.watchers]
    assert [len(w.reference) for w in back.watchers] == [2, 2] and back.decisions == stop.decisions
    # A resume restores it at train start, as the single-metric stopper is restored.
    resumed = SAGOEarlyStoppingCallback("sago/s/activation,sago/s/accuracy", patience=2)
    state = TrainerState(global_step=3)
    state.stateful_callbacks = {"MultiMetricEarlyStopping": saved}
    resumed.on_train_begin(ARGS, state, TrainerControl())
    assert resumed.decisions == stop.decisions and [w.looks_done for w in resumed.watchers] == [0, 0]


def test_the_manuals_recipe_needs_one_callback_in_a_trainer(tmp_path, caplog):
    """Stability and accuracy watched by one stopper: transformers never says "there is already one"."""
    stop = SAGOEarlyStoppingCallback("sago/num/confidence,sago/num/accuracy", patience=1)
    sago = SAGOCallback(variant_set(n=16), eval_steps=2, generation_every=1, max_new_tokens=3, n_bootstrap=200)
    transformers.logging.enable_propagation()
    try:
        with caplog.at_level(logging.INFO):
            tr = make_trainer(tmp_path, callbacks=[sago, stop], max_steps=8, learning_rate=0.0)
            tr.train()
    finally:
        transformers.logging.disable_propagation()
    assert "already one" not in caplog.text
    lines = _start_lines(caplog)
    assert [x.split(" (")[0] for x in lines] == ["sago early stopping: sago/num/confidence",
                                                 "sago early stopping: sago/num/accuracy"]
    assert all("alpha 0.025 its share of 2 metrics" in x for x in lines)
    assert {d["metric"] for d in stop.decisions} == {"sago/num/confidence", "sago/num/accuracy"}
    assert all(isinstance(d["p_value"], float) for d in stop.decisions)


def _parse(argv):
    base = ["--output_dir", "out", "--bf16", "false"]
    return TrlParser((ScriptArguments, SFTConfig, ModelConfig, SAGOArguments)).parse_args_and_config([*base, *argv])[-1]


def test_the_accuracy_metric_is_accepted_through_sago_flags():
    args = _parse(["--sago_sets", "tiny", "--sago_early_stopping_metric", "sago/paraphrase/accuracy"])
    assert SAGOEarlyStoppingCallback.from_args(args).metric == "sago/paraphrase/accuracy"
    both = _parse(["--sago_sets", "tiny", "--sago_early_stopping_metric",
                   "sago/paraphrase/confidence,sago/paraphrase/accuracy", "--sago_early_stopping_alpha", "0.1"])
    stop = SAGOEarlyStoppingCallback.from_args(both)
    assert [(w.metric, w.alpha) for w in stop.watchers] == [("sago/paraphrase/confidence", 0.05),
                                                            ("sago/paraphrase/accuracy", 0.05)]
    with pytest.raises(SagoInputError, match="--sago_early_stopping_metric"):
        _parse(["--sago_sets", "tiny", "--sago_early_stopping_metric", "sago/paraphrase/acuracy"])
