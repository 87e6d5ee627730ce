"""SAGOEarlyStoppingCallback: decisions on crafted snapshots, errors, and state that survives resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from sago_train import SAGOEarlyStoppingCallback, SagoInputError
from sago_train.results.evaluation import Evaluation

from .._helpers.trainer import drifting_trainer


def snap(step: int, values, set_name="s", axis="activation") -> Evaluation:
    values = [float(v) for v in values]
    return Evaluation.from_records(step, {set_name: [{"id": f"g{i}", "axes": {axis: v}} for i, v in enumerate(values)]})


def feed(cb, snapshots):
    control = TrainerControl()
    args = TrainingArguments(output_dir="/tmp/unused", report_to=[])
    for sn in snapshots:
        state = TrainerState(global_step=sn.step)
        cb.on_sago_evaluate(args, state, control, result=None, evaluation=sn)
        if control.should_training_stop:
            return sn.step
    return None


def test_stops_after_patience_significant_regressions():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.4, 40)
    cb = SAGOEarlyStoppingCallback("sago/s/activation", patience=2, alpha=0.05)
    stopped = feed(cb, [snap(0, base), snap(1, base + 0.05), snap(2, base + 0.08), snap(3, base + 0.1)])
    assert stopped == 2
    assert [d["verdict"] for d in cb.decisions] == ["best", "worse (1/2)", "worse (2/2)"]
    assert "sago/s/activation" in cb.reason and "step 0" in cb.reason


def test_noise_does_not_stop_paired_but_does_stop_threshold():
    rng = np.random.default_rng(1)
    base = rng.uniform(0.2, 0.4, 40)
    noisy = [snap(0, base)] + [snap(i, base + rng.normal(0, 0.02, 40)) for i in range(1, 12)]
    paired = SAGOEarlyStoppingCallback("sago/s/activation", patience=2, alpha=0.01)
    assert feed(paired, noisy) is None
    threshold = SAGOEarlyStoppingCallback("sago/s/activation", patience=2, mode="threshold")
    assert feed(threshold, noisy) is not None  # mean-only comparisons react to noise


def test_min_delta_guards_tiny_but_significant_changes():
    base = np.linspace(0.1, 0.5, 50)
    cb = SAGOEarlyStoppingCallback("sago/s/activation", patience=1, min_delta=0.05)
    assert feed(cb, [snap(0, base), snap(1, base + 0.01)]) is None
    assert feed(cb, [snap(2, base + 0.2)]) == 2


def test_improvement_resets_counter():
    base = np.linspace(0.2, 0.4, 30)
    cb = SAGOEarlyStoppingCallback("sago/s/activation", patience=2)
    assert feed(cb, [snap(0, base), snap(1, base + 0.1), snap(2, base - 0.05), snap(3, base + 0.1 - 0.05)]) is None
    assert cb.counter == 1 and cb.best_step == 2


@pytest.mark.parametrize("kwargs,match", [
    ({"metric": "activation"}, "sago/<set>/<axis>"),
    ({"metric": "sago/s/activation", "patience": 0}, "positive integer"),
    ({"metric": "sago/s/activation", "alpha": 1.5}, r"\(0, 1\)"),
    ({"metric": "sago/s/activation", "min_delta": float("nan")}, "finite"),
    ({"metric": "sago/s/activation", "mode": "pared"}, "Did you mean 'paired'"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(SagoInputError, match=match):
        SAGOEarlyStoppingCallback(**kwargs)


def test_unknown_set_or_axis_is_clear():
    cb = SAGOEarlyStoppingCallback("sago/other/activation")
    with pytest.raises(SagoInputError, match="not monitored"):
        feed(cb, [snap(0, [0.1, 0.2])])
    cb = SAGOEarlyStoppingCallback("sago/s/mirroring")
    with pytest.raises(SagoInputError, match="not computed"):
        feed(cb, [snap(0, [0.1, 0.2])])


def test_state_round_trips_through_json_like_transformers_restores_it():
    base = np.linspace(0.2, 0.4, 30)
    cb = SAGOEarlyStoppingCallback("eval_sago/s/activation", patience=3, alpha=0.1, min_delta=0.01)
    feed(cb, [snap(0, base), snap(1, base + 0.1)])
    state = json.loads(json.dumps(cb.state()))
    restored = type(cb)(**state["args"])  # what Trainer._load_callback_state does
    for k, v in state["attributes"].items():
        setattr(restored, k, v)
    assert restored.counter == cb.counter == 1
    assert restored.best_values == cb.best_values and restored.metric == cb.metric
    assert feed(restored, [snap(2, base + 0.1), snap(3, base + 0.1)]) == 3


@pytest.mark.slow
def test_state_survives_trainer_checkpoint_and_resume(tmp_path):
    out = tmp_path / "run"
    stopper = SAGOEarlyStoppingCallback("sago/num/activation", patience=50)
    tr = drifting_trainer(out, 0.12, stopper)
    tr.args.save_strategy = "steps"
    tr.args.save_steps = 4
    tr.train()
    saved = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    cb_state = saved["stateful_callbacks"]["SAGOEarlyStoppingCallback"]
    assert cb_state["args"]["metric"] == "sago/num/activation"
    counter_at_4 = cb_state["attributes"]["counter"]
    assert counter_at_4 >= 2  # the drift made steps 1..4 worse than the best

    stopper2 = SAGOEarlyStoppingCallback("sago/num/activation", patience=50)
    tr2 = drifting_trainer(out, 0.12, stopper2)
    tr2.args.save_strategy = "no"
    seen = {}

    def peek(args, state, control, **kw):
        restored = [c for c in tr2.callback_handler.callbacks if isinstance(c, SAGOEarlyStoppingCallback)]
        seen["counter"] = restored[0].counter
        seen["best_step"] = restored[0].best_step

    from transformers import TrainerCallback

    hook = TrainerCallback()
    hook.on_train_begin = peek
    tr2.add_callback(hook)
    tr2.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    assert seen == {"counter": counter_at_4, "best_step": cb_state["attributes"]["best_step"]}


def test_evaluations_without_the_watched_axis_do_not_count():
    """With generation_every > 1, an evaluation that skipped the watched generation axis makes no decision: the
    worse-counter only counts the evaluations that have the axis (here it stops on the 2nd worse one)."""
    from types import SimpleNamespace

    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.4, 40)
    partial = SimpleNamespace(config={"skipped_axes": {"s": ["generation", "mirroring"]}})
    complete = SimpleNamespace(config={"skipped_axes": {"s": []}})
    cb = SAGOEarlyStoppingCallback("sago/s/generation", patience=2, alpha=0.05)
    control = TrainerControl()
    args = TrainingArguments(output_dir="/tmp/unused", report_to=[])
    feed_seq = [(0, base, "generation", complete), (1, base, "activation", partial), (2, base + 0.1, "generation", complete),
                (3, base, "activation", partial), (4, base, "activation", partial), (5, base + 0.1, "generation", complete)]
    stopped = None
    for step, values, axis, result in feed_seq:
        cb.on_sago_evaluate(args, TrainerState(global_step=step), control, result=result,
                            evaluation=snap(step, values, axis=axis))
        if control.should_training_stop:
            stopped = step
            break
    assert stopped == 5
    assert [d["step"] for d in cb.decisions] == [0, 2, 5]
    assert [d["verdict"] for d in cb.decisions] == ["best", "worse (1/2)", "worse (2/2)"]
    # an axis missing from a complete evaluation is still an error, never skipped silently
    with pytest.raises(SagoInputError, match="not computed"):
        cb.on_sago_evaluate(args, TrainerState(global_step=6), TrainerControl(), result=complete,
                            evaluation=snap(6, base, axis="activation"))
