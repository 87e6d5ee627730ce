"""``metric_for_best_model="sago/..."``: the Trainer's best checkpoint is always ranked on a SAGO value measured
at that very step (never another step's), or training is refused before the baseline is paid for."""

from __future__ import annotations

import json
import math

import pytest
from transformers import TrainerCallback

from sago_train import SAGOCallback, SAGOEarlyStoppingCallback, SagoInputError
from sago_train.data import VariantSet
from sago_train.eval.config import SAGOConfig
from sago_train.integrations.schedule import needs_complete

from .._helpers.trainer import make_trainer, variant_set

FAST = dict(max_new_tokens=3, n_bootstrap=200)
BEST = dict(eval_dataset=True, eval_strategy="steps", save_strategy="steps", load_best_model_at_end=True,
            greater_is_better=False)


def _history(out) -> dict[int, dict]:
    lines = (out / "sago" / "history.jsonl").read_text().splitlines()
    return {h["step"]: h for h in map(json.loads, lines)}


class Ranked(TrainerCallback):
    """What the Trainer ranks checkpoints on: the evaluation metrics after every callback's on_evaluate (added
    after SAGOCallback, so it sees what SAGOCallback put in)."""

    def __init__(self, key: str):
        self.key = key
        self.values: dict[int, float] = {}

    def on_evaluate(self, args, state, control, metrics=None, **kw):
        self.values[state.global_step] = metrics[self.key]


def _ranked(tr, key: str) -> Ranked:
    rec = Ranked(key)
    tr.add_callback(rec)
    return rec


@pytest.mark.parametrize(("key", "expected"), [
    ("eval_sago/num/activation", False), ("eval_sago/num/activation_vs_best", False),
    ("eval_sago/num/confidence_prob", False),  # every group has a reference: no greedy output needed
    ("eval_sago/num/confidence", True),  # scored after the model's own lead-in: its greedy output
    ("eval_sago/num/generation", True), ("eval_sago/num/generation_ci_low", True),
    ("eval_sago/num/accuracy", True), ("eval_sago/num/instability", True), ("eval_sago/instability", True),
    ("eval_sago/other/generation", False), ("eval_sago/runtime", False), (None, False),
])
def test_which_watched_metrics_need_a_complete_evaluation(key, expected):
    config = SAGOConfig.from_kwargs(axes="activation,confidence,confidence_prob,generation")
    assert needs_complete(key, {"num": variant_set()}, config) is expected


def test_confidence_needs_generation_on_groups_without_a_reference_and_instability_only_when_axes_are_skipped():
    no_ref = VariantSet.from_records([{"id": "g0", "variants": ["a b", "b a"]}], name="s")
    assert needs_complete("eval_sago/s/confidence_prob", {"s": no_ref}, SAGOConfig.from_kwargs(axes="confidence_prob"))
    # Nothing is skipped without generation: instability is then present in every evaluation.
    assert not needs_complete("eval_sago/s/instability", {"s": variant_set(name="s")},
                              SAGOConfig.from_kwargs(axes="activation"))


@pytest.mark.slow
@pytest.mark.parametrize(("trainer_args", "names"), [
    (dict(eval_steps=3, save_steps=3), ["SAGOCallback(eval_steps=2)", "TrainingArguments(eval_steps=3)", "multiple of 2, got 3"]),
    (dict(eval_strategy="epoch", save_strategy="epoch"), ["SAGOCallback(eval_steps=2)", "TrainingArguments(eval_strategy='epoch')", "SAGOCallback(eval_steps=None)"]),
])
def test_a_cadence_that_misses_a_trainer_evaluation_is_refused_before_the_baseline(tmp_path, trainer_args, names):
    cb = SAGOCallback(variant_set(), eval_steps=2, **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=6, metric_for_best_model="sago/num/activation",
                      **{**BEST, **trainer_args})
    with pytest.raises(SagoInputError) as err:
        tr.train()
    msg = str(err.value)
    assert "metric_for_best_model='sago/num/activation'" in msg and "SAGOCallback" in msg
    for name in names:
        assert name in msg
    assert "drop SAGOCallback's eval_steps" in msg  # how to fix
    assert tr.state.global_step == 0 and not (tmp_path / "sago" / "history.jsonl").exists()  # no baseline paid


@pytest.mark.slow
def test_a_cadence_that_covers_every_trainer_evaluation_is_accepted_and_measures_each(tmp_path):
    cb = SAGOCallback(variant_set(), eval_steps=2, axes="activation", layers=[0], **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=8, eval_steps=4, save_steps=4,
                      metric_for_best_model="sago/num/activation", **BEST)
    rec = _ranked(tr, "eval_sago/num/activation")
    tr.train()
    hist = _history(tmp_path)
    assert sorted(hist) == [0, 2, 4, 6, 8]
    ranked = rec.values
    assert ranked == {s: pytest.approx(hist[s]["sets"]["num"]["activation"]["mean"]) for s in (4, 8)}
    assert tr.state.best_global_step in (4, 8)


@pytest.mark.slow
def test_a_watched_generation_metric_is_measured_at_every_trainer_evaluation(tmp_path):
    """generation_every=4 would skip generation at steps 2 and 4; the Trainer would then rank those checkpoints
    on the baseline's value (and the stopper, following the Trainer's best, would wait on a step it never saw)."""
    stopper = SAGOEarlyStoppingCallback("sago/num/generation", patience=50, mode="threshold")
    cb = SAGOCallback(variant_set(), generation_every=4, axes="activation,generation", layers=[0], **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb, stopper], max_steps=6, eval_steps=2, save_steps=2,
                      learning_rate=5e-2, metric_for_best_model="sago/num/generation", **BEST)
    rec = _ranked(tr, "eval_sago/num/generation")
    tr.train()
    hist = _history(tmp_path)
    assert sorted(hist) == [0, 2, 4, 6]
    assert all("skipped_axes" not in h for h in hist.values())  # every evaluation feeding the Trainer is complete
    ranked = rec.values
    assert ranked == {s: pytest.approx(hist[s]["sets"]["num"]["generation"]["mean"]) for s in (2, 4, 6)}
    best = tr.state.best_global_step
    assert best == min((2, 4, 6), key=lambda s: (hist[s]["sets"]["num"]["generation"]["mean"], s))
    assert stopper.best_step == best


@pytest.mark.slow
def test_generation_every_still_applies_to_evaluations_that_do_not_feed_the_trainer(tmp_path):
    cb = SAGOCallback(variant_set(), eval_steps=1, generation_every=4, axes="activation,generation", layers=[0],
                      **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=4, eval_steps=2, save_steps=2,
                      metric_for_best_model="sago/num/generation", **BEST)
    tr.train()
    hist = _history(tmp_path)
    assert sorted(hist) == [0, 1, 2, 3, 4]
    assert [s for s, h in hist.items() if "skipped_axes" in h] == [1, 3]  # the steps the Trainer did not evaluate


@pytest.mark.slow
def test_a_failed_evaluation_gets_the_worst_value_never_a_stale_one(tmp_path, monkeypatch, caplog):
    from .test_callback import fail_nth_evaluation

    fail_nth_evaluation(monkeypatch, 2)  # the step-2 evaluation (after the baseline) raises
    cb = SAGOCallback(variant_set(), axes="activation", layers=[0], **FAST)
    tr = make_trainer(tmp_path, callbacks=[cb], max_steps=4, eval_steps=2, save_steps=2,
                      metric_for_best_model="sago/num/activation", **BEST)
    rec = _ranked(tr, "eval_sago/num/activation")
    with caplog.at_level("WARNING"):
        tr.train()
    hist = _history(tmp_path)
    assert sorted(hist) == [0, 4]
    ranked = rec.values
    assert ranked[2] == math.inf  # not the baseline's value
    assert ranked[4] == pytest.approx(hist[4]["sets"]["num"]["activation"]["mean"])
    assert tr.state.best_global_step == 4
    assert "no value for eval_sago/num/activation at step 2" in caplog.text
