"""SAGOEarlyStoppingCallback: decisions on crafted snapshots, errors, the plan's levels, accuracy as a guard, and
state that survives resume. Its run-level false-stop rate is measured in tests/benchmarks/test_sim_early_stopping.py."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from scipy import stats as sps
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from sago_train import SAGOCallback, SAGOEarlyStoppingCallback, SagoInputError
from sago_train.integrations.fingerprint import set_fingerprints
from sago_train.results.evaluation import Evaluation

from .._helpers.trainer import Drift, drifting_trainer


def snap(step: int, values, set_name="s", axis="activation") -> Evaluation:
    values = [float(v) for v in values]
    return Evaluation.from_records(step, {set_name: [{"id": f"g{i}", "axes": {axis: v}} for i, v in enumerate(values)]})


def feed(cb, snapshots, args=None, best_global_step=None):
    control = TrainerControl()
    args = args or TrainingArguments(output_dir="/tmp/unused", report_to=[])
    for sn in snapshots:
        state = TrainerState(global_step=sn.step)
        state.best_global_step = best_global_step
        cb.on_sago_evaluate(args, state, control, result=None, evaluation=sn)
        if control.should_training_stop:
            return sn.step
    return None


def test_stops_when_the_window_is_worse_than_the_reference():
    """Issue #24: the rule compares the per-group mean of the latest `patience` evaluations (the window) with that
    of the first `patience` (the reference), not each evaluation with the best so far (which used to stop here at
    step 3, after two evaluations worse than step 1)."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.4, 40)
    cb = SAGOEarlyStoppingCallback("sago/s/activation", patience=2, alpha=0.05)
    stopped = feed(cb, [snap(1, base), snap(2, base + 0.05), snap(3, base + 0.08), snap(4, base + 0.1)])
    assert stopped == 4
    assert [d["verdict"] for d in cb.decisions] == ["reference (1/2)", "reference (2/2)", "window (1/2)", "worse"]
    last = cb.decisions[-1]
    assert last["delta"] == pytest.approx(0.09 - 0.025) and last["n"] == 40 and last["look"] == 1
    diff = np.mean([base + 0.08, base + 0.1], axis=0) - np.mean([base, base + 0.05], axis=0)  # window - reference
    assert last["p_value"] == pytest.approx(sps.wilcoxon(diff, alternative="greater").pvalue)
    assert last["p_value"] < last["level"] < 0.05
    assert "sago/s/activation" in cb.reason and "steps 3-4" in cb.reason and "steps 1-2" in cb.reason
    assert cb.best_step == 1  # the best is still kept (what the Trainer would pick), but not compared with


def test_noise_does_not_stop_paired_but_does_stop_threshold():
    rng = np.random.default_rng(1)
    base = rng.uniform(0.2, 0.4, 40)
    noisy = [snap(1, base)] + [snap(i, base + rng.normal(0, 0.02, 40)) for i in range(2, 13)]
    paired = SAGOEarlyStoppingCallback("sago/s/activation", patience=2, alpha=0.01)
    assert feed(paired, noisy) is None
    threshold = SAGOEarlyStoppingCallback("sago/s/activation", patience=2, mode="threshold")
    assert feed(threshold, noisy) is not None  # mean-only comparisons react to noise


def test_min_delta_guards_tiny_but_significant_changes():
    base = np.linspace(0.1, 0.5, 50)
    cb = SAGOEarlyStoppingCallback("sago/s/activation", patience=1, min_delta=0.05)
    assert feed(cb, [snap(1, base), snap(2, base + 0.01)]) is None
    assert feed(cb, [snap(3, base + 0.2)]) == 3


def test_threshold_improvement_resets_counter():
    base = np.linspace(0.2, 0.4, 30)
    cb = SAGOEarlyStoppingCallback("sago/s/activation", patience=2, mode="threshold")
    assert feed(cb, [snap(1, base), snap(2, base + 0.1), snap(3, base - 0.05), snap(4, base + 0.1 - 0.05)]) is None
    assert cb.counter == 1 and cb.best_step == 3


def test_paired_window_back_at_the_reference_level_does_not_stop():
    """A rise then a return: the window of the last two is no worse than the reference, whatever the best was."""
    base = np.linspace(0.2, 0.4, 30)
    cb = SAGOEarlyStoppingCallback("sago/s/activation", patience=2)
    assert feed(cb, [snap(1, base), snap(2, base), snap(3, base + 0.1), snap(4, base - 0.1), snap(5, base)]) is None
    assert [d["verdict"] for d in cb.decisions][3:] == ["not significantly worse"] * 2


@pytest.mark.parametrize("kwargs,match", [
    ({"metric": "activation"}, "sago/<set>/<axis>"),
    ({"metric": "sago/s/activation", "patience": 0}, "positive integer"),
    ({"metric": "sago/s/activation", "alpha": 1.5}, r"\(0, 1\)"),
    ({"metric": "sago/s/activation", "min_delta": float("nan")}, "finite"),
    ({"metric": "sago/s/activation", "mode": "pared"}, "Did you mean 'paired'"),
    ({"metric": "sago/s/activation", "exclude_baseline": "yes"}, "true or false"),
    ({"metric": "sago/s/activation", "reference_step": -1}, "integer >= 0"),
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
    cb = SAGOEarlyStoppingCallback("eval_sago/s/activation", patience=2, alpha=0.1, min_delta=0.01,
                                   reference_step=1)
    cb.plan(30, list(range(0, 11)))
    feed(cb, [snap(1, base), snap(2, base), snap(3, base + 0.1)])
    state = json.loads(json.dumps(cb.state()))
    restored = type(cb)(**state["args"])  # what Trainer._load_callback_state does
    for k, v in state["attributes"].items():
        setattr(restored, k, v)
    assert restored.reference == cb.reference and restored.window == cb.window and len(cb.window) == 1
    assert restored.looks == cb.looks == 7 and restored.reference_step == 1
    assert restored.best_values == cb.best_values and restored.metric == cb.metric
    restored.plan(30, list(range(4, 11)))  # no look has spent alpha yet: re-planned on what is left, the same 7
    assert restored.looks == 7
    assert feed(restored, [snap(4, base + 0.1)]) == 4
    assert restored.decisions[-1]["level"] == pytest.approx(0.1 / 7)


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
    reference_at_4 = cb_state["attributes"]["reference"]
    assert [e["step"] for e in reference_at_4] == [1, 2, 3, 4]  # patience 50: still building the reference
    assert cb_state["attributes"]["looks"] == 0  # 8 evaluations can never fill a reference and a window of 50

    stopper2 = SAGOEarlyStoppingCallback("sago/num/activation", patience=50)
    tr2 = drifting_trainer(out, 0.12, stopper2)
    tr2.args.save_strategy = "no"
    seen = {}

    def peek(args, state, control, **kw):
        restored = [c for c in tr2.callback_handler.callbacks if isinstance(c, SAGOEarlyStoppingCallback)]
        seen["reference"] = json.loads(json.dumps(restored[0].reference))  # a copy: the list grows afterwards
        seen["best_step"] = restored[0].best_step


    hook = TrainerCallback()
    hook.on_train_begin = peek
    tr2.add_callback(hook)
    tr2.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    assert seen == {"reference": reference_at_4, "best_step": cb_state["attributes"]["best_step"]}
    assert [e["step"] for e in stopper2.reference] == [1, 2, 3, 4, 5, 6, 7, 8]  # the resumed run went on


def test_a_new_baseline_after_resume_starts_the_stopper_over(tmp_path):
    """Issue 22: after ``--resume --new-baseline`` the stopper kept the reference, window and looks restored
    from the checkpoint, i.e. measured against the old baseline, and would pair them with the new evaluations."""
    out = tmp_path / "run"
    first = SAGOEarlyStoppingCallback("sago/num/activation", patience=50)
    tr = drifting_trainer(out, 0.12, first)
    tr.args.max_steps, tr.args.save_strategy, tr.args.save_steps = 4, "steps", 4
    tr.train()
    saved = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    old = saved["stateful_callbacks"]["SAGOEarlyStoppingCallback"]["attributes"]
    assert [e["step"] for e in old["reference"]] == [1, 2, 3, 4] and old["best_step"] is not None

    stopper = SAGOEarlyStoppingCallback("sago/num/activation", patience=50)
    tr2 = drifting_trainer(out, 0.12, stopper)
    sago = next(c for c in tr2.callback_handler.callbacks if isinstance(c, SAGOCallback))
    # Another evaluation setting (n_bootstrap) changes the set's fingerprint: the resume needs a new baseline.
    sago.config = dataclasses.replace(sago.config, n_bootstrap=300)
    sago.fingerprints = set_fingerprints(sago.sets, sago.config)
    sago.options.new_baseline = True
    tr2.args.max_steps, tr2.args.save_strategy = 6, "no"
    seen = {}

    def peek(args, state, control, **kw):  # after every on_train_begin (this hook is the last callback)
        seen["reference"] = [e["step"] for e in stopper.reference]
        seen["best_step"], seen["looks_done"] = stopper.best_step, stopper.looks_done

    hook = TrainerCallback()
    hook.on_train_begin = peek
    tr2.add_callback(hook)
    tr2.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    # At train start only the new baseline (step 4, measured there) is seen: nothing from the old run.
    assert seen == {"reference": [4], "best_step": 4, "looks_done": 0}
    assert [e["step"] for e in stopper.reference] == [4, 5, 6]
    assert [d["step"] for d in stopper.decisions] == [4, 5, 6]


def test_the_baseline_is_never_the_best_by_default():
    """Issue 13: the stopper's best was the step-0 baseline while the Trainer's best checkpoint was step 10. The
    baseline is not in the reference either, unless exclude_baseline=False (then it is the reference)."""
    base = np.linspace(0.2, 0.4, 30)
    cb = SAGOEarlyStoppingCallback("sago/s/activation", patience=1)
    assert feed(cb, [snap(0, base), snap(10, base + 0.05)]) is None  # worse than the baseline, but no stop
    assert cb.best_step == 10 and cb.decisions[0]["verdict"].startswith("baseline")
    old = SAGOEarlyStoppingCallback("sago/s/activation", patience=1, exclude_baseline=False)
    assert feed(old, [snap(0, base), snap(10, base + 0.05)]) == 10 and old.best_step == 0


def test_wilcoxon_alone_does_not_make_worse():
    """The constructed disagreement (Wilcoxon p = 0.017, CI spanning 0) is not a regression, as in report and
    compare; the decision records scipy's p and the interval."""
    from .._helpers import verdict_case as case

    cb = SAGOEarlyStoppingCallback("sago/s/activation", patience=1, alpha=0.05)
    cb.plan(case.N, [1, 2, 3])  # two looks, each at 0.025: the Wilcoxon p (0.017) alone would pass
    assert feed(cb, [snap(1, case.before()), snap(2, case.after())]) is None
    d = cb.decisions[-1]
    assert d["verdict"] == "not significantly worse" and cb.counter == 0
    assert d["p_value"] == pytest.approx(sps.wilcoxon(case.DIFF, alternative="greater").pvalue)
    assert d["p_value"] < d["level"] == 0.025 and d["ci_low"] < 0 < d["ci_high"]
    # The same change moved up so that the CI clears 0 does stop.
    assert feed(cb, [snap(3, case.before() + 0.1)]) == 3


def test_too_few_groups_is_said_not_taken_for_no_change(caplog):
    base = np.linspace(0.2, 0.4, 4)
    cb = SAGOEarlyStoppingCallback("sago/s/activation", patience=1)
    with caplog.at_level("WARNING", logger="sago_train"):
        assert feed(cb, [snap(1, base), snap(2, base + 0.3), snap(3, base + 0.3)]) is None
    assert cb.decisions[-1]["verdict"].startswith("not enough groups (4; ")
    assert caplog.text.count("can never be called worse") == 1


def test_follows_the_trainers_best_with_load_best_model_at_end():
    """With the Trainer picking its best checkpoint on this metric, an improvement becomes the best only once
    the Trainer has made it its best (best_global_step); a SAGO-only evaluation never does."""
    args = TrainingArguments(output_dir="/tmp/unused", report_to=[], load_best_model_at_end=True,
                             metric_for_best_model="sago/s/activation", greater_is_better=False,
                             eval_strategy="steps", save_strategy="steps")
    base = np.linspace(0.2, 0.4, 30)
    cb = SAGOEarlyStoppingCallback("sago/s/activation", patience=5)
    assert cb.follows_trainer(args)
    feed(cb, [snap(0, base - 0.1), snap(2, base)], args=args, best_global_step=None)
    assert cb.best_step is None and cb.candidate["step"] == 2
    feed(cb, [snap(3, base - 0.05)], args=args, best_global_step=2)  # the Trainer saved 2; 3 is SAGO-only
    assert cb.best_step == 2 and cb.candidate["step"] == 3
    feed(cb, [snap(4, base + 0.05)], args=args, best_global_step=2)  # the Trainer never made 3 its best
    assert cb.best_step == 2
    # The paired rule does not compare with the best: steps 2, 3 and 4 build its reference (the baseline is not in it).
    assert [d["verdict"] for d in cb.decisions][1:] == ["reference (1/5)", "reference (2/5)", "reference (3/5)"]
    other = TrainingArguments(output_dir="/tmp/unused", report_to=[], load_best_model_at_end=True,
                              metric_for_best_model="eval_loss", eval_strategy="steps", save_strategy="steps")
    assert not cb.follows_trainer(other)


def test_state_saved_before_exclude_baseline_and_candidate_restores():
    """A checkpoint written by the previous version (no exclude_baseline arg, no candidate attribute)."""
    saved = {"args": {"metric": "sago/s/activation", "patience": 3, "alpha": 0.05, "min_delta": 0.0,
                      "mode": "paired"},
             "attributes": {"best_step": 4, "best_mean": 0.3, "best_ids": ["g0", "g1"], "best_values": [0.2, 0.4],
                            "counter": 1, "stopped_step": None, "reason": None, "decisions": []}}
    restored = SAGOEarlyStoppingCallback(**saved["args"])  # what Trainer._load_callback_state does
    for k, v in saved["attributes"].items():
        setattr(restored, k, v)
    assert restored.exclude_baseline is True and restored.candidate is None and restored.best_step == 4
    assert json.loads(json.dumps(restored.state()))["attributes"]["candidate"] is None


class _Schedule(Drift):
    """Like :class:`Drift`, but the shared vector's weight follows ``weights[step]`` for the evaluations at
    ``step`` (set when the step begins): a larger weight = variants more alike = lower activation instability."""

    def __init__(self, model, weights):
        super().__init__(model, shrink_per_step=0.0)
        self.weights, self.weight = weights, weights[0]

    def on_step_begin(self, args, state, control, **kw):
        self.weight = self.weights[state.global_step + 1]

    def on_step_end(self, args, state, control, **kw):
        pass  # the schedule alone sets the weight


@pytest.mark.slow
@pytest.mark.parametrize("case", ["baseline", "sago_only"])
def test_best_step_is_the_trainers_best_checkpoint(tmp_path, case):
    """A real Trainer with load_best_model_at_end on the watched metric (it evaluates and saves at 2, 4, 6 and
    the last step, 7). "baseline": instability rises, so the step-0 baseline has the lowest mean (the issue's
    case). "sago_only": SAGO also evaluates at every step in between, and step 3, which the Trainer neither
    evaluates nor checkpoints, has the lowest mean. Either way the stopper's best is the Trainer's checkpoint."""
    from sago_train import SAGOCallback

    from .._helpers.trainer import Drift, make_trainer, variant_set

    stopper = SAGOEarlyStoppingCallback("sago/num/activation", patience=50)
    cb = SAGOCallback(variant_set(n=16), axes="activation", layers=[0], max_new_tokens=3, n_bootstrap=200,
                      eval_steps=None if case == "baseline" else 1)
    tr = make_trainer(tmp_path, callbacks=[cb, stopper], max_steps=7, learning_rate=0.0, eval_dataset=True,
                      eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
                      load_best_model_at_end=True, metric_for_best_model="sago/num/activation",
                      greater_is_better=False)
    if case == "baseline":
        tr.add_callback(Drift(tr.model, 0.1))
    else:
        tr.add_callback(_Schedule(tr.model, [1.0, 0.95, 0.9, 2.0, 0.8, 0.75, 0.7, 0.65]))
    tr.train()
    means = {d["step"]: d["mean"] for d in stopper.decisions}
    assert sorted(means) == ([0, 2, 4, 6, 7] if case == "baseline" else list(range(8)))
    lowest = min(means, key=means.get)
    assert lowest == (0 if case == "baseline" else 3)  # an evaluation without a checkpoint has the best mean
    trainer_best = int(tr.state.best_model_checkpoint.rsplit("-", 1)[1])
    assert trainer_best == 2
    assert stopper.best_step == trainer_best
    assert stopper.best_mean == pytest.approx(tr.state.best_metric)


def test_following_the_trainer_refuses_a_trainer_that_ranks_the_other_way():
    """transformers defaults greater_is_better to True for a metric not ending in "loss": the Trainer would keep
    the least stable checkpoint as its best and the stopper, waiting for it to confirm the most stable one, would
    silently disagree. Refused at train start, naming the setting and what it should be."""
    kwargs = dict(output_dir="/tmp/unused", report_to=[], load_best_model_at_end=True,
                  metric_for_best_model="sago/s/activation", eval_strategy="steps", save_strategy="steps")
    unset = TrainingArguments(**kwargs)
    assert unset.greater_is_better is True  # what transformers picks by default
    cb = SAGOEarlyStoppingCallback("sago/s/activation")
    with pytest.raises(SagoInputError) as err:
        cb.on_train_begin(unset, TrainerState(), TrainerControl())
    assert err.value.key == "greater_is_better" and "greater_is_better=False" in str(err.value)
    cb.on_train_begin(TrainingArguments(**kwargs, greater_is_better=False), TrainerState(), TrainerControl())
    # Refused as soon as a SAGOCallback bound to that Trainer connects (before its baseline evaluation).
    from types import SimpleNamespace

    with pytest.raises(SagoInputError, match="greater_is_better"):
        SAGOEarlyStoppingCallback("sago/s/activation").connect(SimpleNamespace(trainer=SimpleNamespace(args=unset)))
    SAGOEarlyStoppingCallback("sago/s/activation").connect(SimpleNamespace(trainer=None))  # unbound: later
    # Not following the Trainer (no load_best_model_at_end): nothing to agree with, nothing refused.
    no_follow = {**kwargs, "load_best_model_at_end": False}
    cb.on_train_begin(TrainingArguments(**no_follow), TrainerState(), TrainerControl())


def test_evaluations_without_the_watched_axis_do_not_count():
    """With generation_every > 1, an evaluation that skipped the watched generation axis makes no decision: the
    reference and the window hold only evaluations that have the axis (here the window fills at step 8)."""

    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.4, 40)
    partial, complete = ["generation", "mirroring"], []  # the axes an evaluation left out
    cb = SAGOEarlyStoppingCallback("sago/s/generation", patience=2, alpha=0.05)
    control = TrainerControl()
    args = TrainingArguments(output_dir="/tmp/unused", report_to=[])
    # From step 1: a step-0 evaluation is the baseline, never the best (exclude_baseline).
    feed_seq = [(1, base, "generation", complete), (2, base, "activation", partial),
                (3, base + 0.1, "generation", complete), (4, base, "activation", partial),
                (5, base, "activation", partial), (6, base + 0.1, "generation", complete),
                (7, base, "activation", partial), (8, base + 0.1, "generation", complete)]
    stopped = None
    for step, values, axis, skipped in feed_seq:
        ev = snap(step, values, axis=axis)
        ev.sets["s"].skipped_axes = skipped
        cb.on_sago_evaluate(args, TrainerState(global_step=step), control, result=ev, evaluation=ev)
        if control.should_training_stop:
            stopped = step
            break
    assert stopped == 8
    assert [d["step"] for d in cb.decisions] == [1, 3, 6, 8]
    assert [d["verdict"] for d in cb.decisions] == ["reference (1/2)", "reference (2/2)", "window (1/2)", "worse"]
    assert cb.decisions[-1]["delta"] == pytest.approx(0.05)  # the window (0.1, 0.1) against the reference (0, 0.1)
    # an axis missing from a complete evaluation is still an error, never skipped silently
    with pytest.raises(SagoInputError, match="not computed"):
        cb.on_sago_evaluate(args, TrainerState(global_step=9), TrainerControl(), result=complete,
                            evaluation=snap(9, base, axis="activation"))


def _planned(size: int, cap: int, stopper, max_steps: int = 10):
    """What SAGOCallback.on_train_begin runs before its baseline: its listeners' checks, with the plan of a
    run that evaluates every step up to max_steps."""
    from sago_train import SAGOCallback
    from sago_train.data import VariantSet

    sago = SAGOCallback({"s": VariantSet.from_records(
        [{"id": f"g{i}", "variants": [f"q {i}", f"Q {i}?"]} for i in range(size)], "s")}, eval_steps=1, max_groups=cap,
        axes="activation")
    sago.add_listener(stopper)
    sago._check_listeners(TrainingArguments(output_dir="/tmp/unused", report_to=[]), TrainerState(max_steps=max_steps))
    return stopper


def test_a_level_the_groups_cannot_reach_is_refused_at_train_start(caplog):
    """Issue #24: each look is tested at alpha / looks; a one-sided Wilcoxon p on n groups is at least 2^-n, so a
    level below it could never stop training. Refused before any evaluation, with the number of groups needed."""
    # 10 evaluations after the baseline, patience 1: the first is the reference, 9 looks at 0.0056 (8 groups).
    assert _planned(8, 0, SAGOEarlyStoppingCallback("sago/s/activation", patience=1)).looks == 9
    with pytest.raises(SagoInputError, match=r"level 0.00556 .* on 7 group\(s\) can never reach .* needs >= 8 groups") as err:
        _planned(8, 7, SAGOEarlyStoppingCallback("sago/s/activation", patience=1))  # max_groups=7
    assert err.value.key == "max_groups"
    with pytest.raises(SagoInputError, match="needs >= 11 groups"):  # 99 looks at 0.000505
        _planned(8, 0, SAGOEarlyStoppingCallback("sago/s/activation", patience=1), max_steps=100)
    # patience 3 on the same run: the reference and the window take 6 evaluations, 5 looks at 0.01 (7 groups).
    assert _planned(7, 0, SAGOEarlyStoppingCallback("sago/s/activation", patience=3)).looks == 5
    # Too few evaluations for any look: said, not refused.
    caplog.clear()
    with caplog.at_level("WARNING", logger="sago_train"):
        assert _planned(8, 0, SAGOEarlyStoppingCallback("sago/s/activation", patience=6)).looks == 0
    assert "can never stop training" in caplog.text and "need 12" in caplog.text
    # threshold mode has no paired test to refuse, but says once that it has no error control.
    caplog.clear()
    with caplog.at_level("WARNING", logger="sago_train"):
        stop = _planned(2, 0, SAGOEarlyStoppingCallback("sago/s/activation", mode="threshold"))
        stop.on_train_begin(TrainingArguments(output_dir="/tmp/unused", report_to=[]), TrainerState(), TrainerControl())
    assert caplog.text.count("no error control") == 1


def test_without_a_plan_the_levels_spend_alpha_over_any_number_of_looks(caplog):
    """The automatic cadence plans no number of evaluations: look k gets alpha * 10 / ((k + 9)(k + 10)), whose sum
    over every look is alpha; a group count that reaches only the first looks is said at train start."""
    from sago_train import SAGOCallback
    from sago_train.data import VariantSet

    sago = SAGOCallback({"s": VariantSet.from_records(
        [{"id": f"g{i}", "variants": [f"q {i}", f"Q {i}?"]} for i in range(8)], "s")}, max_groups=0, axes="activation")
    stop = SAGOEarlyStoppingCallback("sago/s/activation", patience=1)
    sago.add_listener(stop)
    with caplog.at_level("WARNING", logger="sago_train"):
        sago._check_listeners(TrainingArguments(output_dir="/tmp/unused", report_to=[]), TrainerState(max_steps=10))
    assert stop.looks is None and "from look 2 on" in caplog.text
    assert [round(stop.level(k), 6) for k in (1, 2, 10)] == [round(0.05 * 10 / ((k + 9) * (k + 10)), 6)
                                                            for k in (1, 2, 10)]
    assert sum(stop.level(k) for k in range(1, 200_000)) == pytest.approx(0.05, rel=1e-4)
    with pytest.raises(SagoInputError, match="needs >= 8 groups"):
        stop.plan(7, None)


def test_plan_counts_only_the_evaluations_the_rule_uses():
    """The baseline (exclude_baseline), evaluations before reference_step, and those without the watched
    quantity (generation_every) are no looks."""
    steps = list(range(0, 11))  # the baseline and 10 evaluations
    cases = [({}, 7), ({"exclude_baseline": False}, 8), ({"reference_step": 5}, 3), ({"reference_step": 9}, 0)]
    for kwargs, looks in cases:
        stop = SAGOEarlyStoppingCallback("sago/s/activation", patience=2, **kwargs)
        stop.plan(64, steps)
        assert stop.looks == looks, kwargs
    from sago_train.integrations.options import MonitorOptions
    from sago_train.integrations.schedule import Schedule

    schedule = Schedule(MonitorOptions(eval_steps=10, generation_every=4))
    args = TrainingArguments(output_dir="/tmp/unused", report_to=[])
    state = TrainerState(max_steps=95)
    assert schedule.planned_steps(args, state, done=0) == [0, *range(10, 91, 10), 95]
    assert schedule.planned_steps(args, state, done=0, complete_only=True) == [0, 40, 80, 95]
    assert schedule.planned_steps(args, TrainerState(max_steps=95, global_step=40), done=5) == [50, 60, 70, 80, 90, 95]
    assert Schedule(MonitorOptions()).planned_steps(args, state, done=0) is None  # the automatic cadence
    # Following the Trainer's evaluations: every eval_steps (a fraction of max_steps too), or each epoch's end.
    follow = Schedule(MonitorOptions())
    for targs in (TrainingArguments(output_dir="/tmp/unused", report_to=[], eval_strategy="steps", eval_steps=25),
                  TrainingArguments(output_dir="/tmp/unused", report_to=[], eval_strategy="steps", eval_steps=0.25),
                  TrainingArguments(output_dir="/tmp/unused", report_to=[], eval_strategy="epoch")):
        state = TrainerState(max_steps=100, num_train_epochs=4)
        assert follow.planned_steps(targs, state, done=0) == [0, 25, 50, 75, 100], targs.eval_strategy


def test_reference_step_leaves_earlier_evaluations_out():
    base = np.linspace(0.2, 0.4, 30)
    cb = SAGOEarlyStoppingCallback("sago/s/activation", patience=1, reference_step=3)
    assert feed(cb, [snap(1, base + 0.5), snap(2, base + 0.5), snap(3, base), snap(4, base + 0.1)]) == 4
    assert [d["verdict"] for d in cb.decisions][:3] == ["before the reference step (3)"] * 2 + ["reference (1/1)"]


def _accuracy_snap(step: int, p_right, rng, k: int = 4):
    """An evaluation whose groups answer each of their k variants right with probability p_right (per group)."""
    from sago_train.results.group import GroupRecord
    from sago_train.results.sets import SetEvaluation

    groups = [GroupRecord(f"g{i}", axes={"activation": 0.3}, correct=[bool(x) for x in rng.random(k) < p])
              for i, p in enumerate(p_right)]
    return Evaluation({"s": SetEvaluation.from_groups("s", ["activation"], groups, n_bootstrap=20)}, step=step)


def test_accuracy_is_watched_higher_is_better():
    """Accuracy as a guard against forgetting: falling accuracy stops, flat or rising accuracy does not (its
    direction comes from the axis registry). A stability stopper beside it, on the same evaluations, does not
    stop: two instances, each with its own metric."""
    rng = np.random.default_rng(3)
    p_right = rng.uniform(0.6, 0.95, 48)
    shifts = {"falling": [0.0] * 4 + [-0.3] * 6, "flat": [0.0] * 10, "rising": [0.0] * 4 + [0.3] * 6}
    for name, shift in shifts.items():
        guard = SAGOEarlyStoppingCallback("sago/s/accuracy", patience=2)
        stability = SAGOEarlyStoppingCallback("sago/s/activation", patience=2)
        for stop in (guard, stability):
            stop.plan(48, list(range(1, 11)))
        evs = [_accuracy_snap(t + 1, np.clip(p_right + shift[t], 0, 1), rng) for t in range(10)]
        stopped = feed(guard, evs)
        assert (stopped is not None) == (name == "falling"), (name, guard.decisions[-1])
        assert feed(stability, evs) is None
        if name == "falling":
            assert stopped >= 5 and guard.decisions[-1]["delta"] > 0.1 and "accuracy" in guard.reason


def test_accuracy_target_is_checked_at_train_start():
    """sago/<set>/accuracy is accepted before training on a set with references, refused on one without."""
    from sago_train import SAGOCallback
    from sago_train.data import VariantSet

    from .._helpers.trainer import variant_set

    args, state = TrainingArguments(output_dir="/tmp/unused", report_to=[]), TrainerState(max_steps=10)
    sago = SAGOCallback(variant_set(n=16), eval_steps=1)
    stop = SAGOEarlyStoppingCallback("sago/num/accuracy", patience=1)
    sago.add_listener(stop)
    sago._check_listeners(args, state)
    assert stop.looks == 2  # accuracy needs generation: complete evaluations are 0, 4, 8 and 10 (generation_every=4)
    bare = SAGOCallback({"s": VariantSet.from_records([{"id": f"g{i}", "variants": [f"q {i}", f"Q {i}?"]}
                                                       for i in range(16)], "s")}, eval_steps=1)
    bare.add_listener(SAGOEarlyStoppingCallback("sago/s/accuracy"))
    with pytest.raises(SagoInputError, match="not computed"):
        bare._check_listeners(args, state)
