"""SAGOCallback's cheap in-training defaults (issue 13, "Costs shown"): a bounded, seeded group subset and the
generation-based axes at every N-th evaluation only, through real Trainer runs on a tiny model."""

from __future__ import annotations

import glob
import json
import math
from pathlib import Path

import pytest

from sago_train import SAGOCallback, SAGOEarlyStoppingCallback
from sago_train.cli.main import main
from sago_train.data import VariantSet
from sago_train.errors import SagoInputError
from sago_train.eval.config import IN_TRAINING_MAX_GROUPS, SAGOConfig

from .._helpers.trainer import make_trainer, variant_set

pytestmark = pytest.mark.slow
FAST = dict(max_new_tokens=3, n_bootstrap=200, axes="activation,activation_rel,confidence,generation,mirroring")
GEN_AXES = ("confidence", "generation", "mirroring")  # confidence scores the answer in the model's own form


def _history(out):
    return [json.loads(x) for x in (out / "sago" / "history.jsonl").read_text().splitlines()]


def _ids(out, step, name="num"):
    return [json.loads(x)["id"] for x in (out / "sago" / f"step-{step}" / f"{name}.jsonl").read_text().splitlines()]


def test_max_groups_default_is_bounded_in_training_only():
    assert SAGOConfig().max_groups is None  # sago-train eval: every group
    assert SAGOCallback(variant_set()).config.max_groups == IN_TRAINING_MAX_GROUPS == 64
    assert SAGOCallback(variant_set(), max_groups=0).config.max_groups == 0  # 0 = every group
    assert SAGOCallback(variant_set(), config=SAGOConfig(max_groups=None)).config.max_groups == 64
    assert SAGOCallback(variant_set(), max_groups=8).config.max_groups == 8
    for bad in (0.5, -1, True):
        with pytest.raises(SagoInputError, match="max_groups"):
            SAGOConfig(max_groups=bad)
    for bad in (0, 1.5, True):
        with pytest.raises(SagoInputError, match="generation_every"):
            SAGOCallback(variant_set(), generation_every=bad)


def test_generation_every_values_logs_history_and_comparisons(tmp_path):
    """Steps 0 (baseline), 4 and 8 (final) are complete, 2 and 6 skip generation. Monitoring does not change
    training, so a run with every evaluation complete has the same weights at every step: the skipped
    evaluations' activation values must equal its, to the last bit."""
    runs = {}
    for every in (1, 2):
        out = tmp_path / f"every{every}"
        cb = SAGOCallback(variant_set(), eval_steps=2, generation_every=every, **FAST)
        tr = make_trainer(out, callbacks=[cb], max_steps=7)
        tr.train()
        runs[every] = (out, tr)
    (out1, _), (out2, tr2) = runs[1], runs[2]
    full, cheap = _history(out1), _history(out2)
    assert [h["step"] for h in cheap] == [0, 2, 4, 6, 7]
    partial_steps = [h["step"] for h in cheap if "skipped_axes" in h]
    assert partial_steps == [2, 6]  # 7 is the final one: complete although 4 evaluations came before it
    for h_full, h in zip(full, cheap):
        sets, sets_full = h["sets"]["num"], h_full["sets"]["num"]
        if h["step"] in partial_steps:
            assert h["skipped_axes"] == {"num": list(GEN_AXES)}
            assert set(sets) == {"activation", "activation_rel"}  # no generation, no instability
            # Compared: the axes it has, and the between-group dispersion that tells a collapse from stability;
            # neither a skipped axis nor instability, nor accuracy (it needs generation).
            assert set(h["compare"]["num"]) == {"activation", "activation_rel", "between_dispersion"}
        else:
            assert "skipped_axes" not in h and set(sets) == set(sets_full)
        for axis in ("activation", "activation_rel"):
            assert sets[axis] == sets_full[axis], (h["step"], axis)
        recs = [json.loads(x) for x in (out2 / "sago" / f"step-{h['step']}" / "num.jsonl").read_text().splitlines()]
        recs_full = [json.loads(x) for x in (out1 / "sago" / f"step-{h['step']}" / "num.jsonl").read_text().splitlines()]
        assert all((r["instability"] is None) == (h["step"] in partial_steps) for r in recs)
        for r, rf in zip(recs, recs_full):
            assert r["axes"]["activation"] == rf["axes"]["activation"]
    # A complete evaluation after a partial one compares generation with the last evaluation that had it.
    gen = cheap[2]["compare"]["num"]["generation"]
    assert gen["vs_baseline"]["step"] == 0
    # The Trainer log: absent keys, never NaN, and no instability where axes were skipped.
    logs = {h["step"]: h for h in tr2.state.log_history if "eval_sago/num/activation" in h}
    for step in partial_steps:
        keys = [k for k in logs[step] if k.startswith("eval_sago")]
        assert not any(a in k for k in keys for a in (*GEN_AXES, "instability", "accuracy")), keys
        assert all(math.isfinite(logs[step][k]) for k in keys)
    assert "eval_sago/num/generation" in logs[4] and "eval_sago/instability" in logs[4]
    # report and compare read a history with partial evaluations.
    assert main(["report", str(out2), "--out", str(tmp_path / "rep")]) == 0
    assert main(["compare", f"{out2}@2", f"{out2}@4", "--json", str(tmp_path / "cmp.json")]) == 0
    cmp = json.loads((tmp_path / "cmp.json").read_text())
    assert [e["step"] for e in cmp["entries"]] == [2, 4]
    # the partial evaluation is scored and ranked on the axes it has; on the others it is absent, not NaN
    assert set(cmp["axes"]["activation"]["scores"]["num"]) == {f"{out2.name}@2", f"{out2.name}@4"}
    for axis in (*GEN_AXES, "instability"):
        assert set(cmp["axes"][axis]["scores"]["num"]) == {f"{out2.name}@4"}


def test_seeded_subset_same_at_every_step_and_across_resume(tmp_path):
    """80 groups, the default cap: the same 64 groups at every evaluation, before and after a resume."""
    vs = variant_set(n=80)
    out = tmp_path / "run"
    cb = SAGOCallback(vs, eval_steps=3, **{**FAST, "axes": "activation"})
    make_trainer(out, callbacks=[cb], max_steps=6, save_strategy="steps", save_steps=3).train()
    ids = {step: _ids(out, step) for step in (0, 3, 6)}
    assert len(ids[0]) == 64 and ids[0] == ids[3] == ids[6]
    cb2 = SAGOCallback(VariantSet.from_records([json.loads(json.dumps(r)) for r in _records(vs)], name="num"),
                       eval_steps=3, **{**FAST, "axes": "activation"})
    make_trainer(out, callbacks=[cb2], max_steps=6, save_strategy="steps", save_steps=3).train(
        resume_from_checkpoint=str(out / "checkpoint-3"))
    assert _ids(out, 6) == ids[0]


def _records(vs):
    return [{"id": g.id, "variants": g.variants, "kinds": g.kinds, "reference": g.reference} for g in vs.groups]


def test_generation_every_survives_resume(tmp_path):
    """The N-th-evaluation count is the history's length, so a resumed run skips generation at the same steps."""
    out = tmp_path / "run"
    kw = dict(eval_steps=2, generation_every=2, **{**FAST, "axes": "activation,generation"})
    make_trainer(out, callbacks=[SAGOCallback(variant_set(), **kw)], max_steps=8, save_strategy="steps",
                 save_steps=2).train()
    before = [(h["step"], "skipped_axes" in h) for h in _history(out)]
    assert before == [(0, False), (2, True), (4, False), (6, True), (8, False)]
    make_trainer(out, callbacks=[SAGOCallback(variant_set(), **kw)], max_steps=8, save_strategy="steps",
                 save_steps=2).train(resume_from_checkpoint=str(out / "checkpoint-4"))
    assert [(h["step"], "skipped_axes" in h) for h in _history(out)] == before


def test_early_stopping_on_a_generation_axis_counts_complete_evaluations_only(tmp_path):
    stopper = SAGOEarlyStoppingCallback("sago/num/generation", patience=5)
    cb = SAGOCallback(variant_set(), eval_steps=1, generation_every=3, **{**FAST, "axes": "activation,generation"})
    make_trainer(tmp_path, callbacks=[cb, stopper], max_steps=7).train()
    complete = [h["step"] for h in _history(tmp_path) if "skipped_axes" not in h]
    assert complete == [0, 3, 6, 7]
    assert [d["step"] for d in stopper.decisions] == complete


def test_with_only_generation_axes_every_evaluation_is_complete(tmp_path, caplog):
    """The default axes (confidence, generation) both need greedy generation: an evaluation without it would
    compute nothing, so every evaluation is complete and the log says generation_every has no effect."""
    cb = SAGOCallback(variant_set(), eval_steps=2, generation_every=2, max_new_tokens=3, n_bootstrap=200)
    with caplog.at_level("INFO", logger="sago_train"):
        make_trainer(tmp_path, callbacks=[cb], max_steps=6).train()
    history = _history(tmp_path)
    assert [h["step"] for h in history] == [0, 2, 4, 6]
    assert all("skipped_axes" not in h and {"confidence", "generation"} <= set(h["sets"]["num"]) for h in history)
    assert "generation_every=2 has no effect" in caplog.text


def test_wandb_and_tensorboard_get_absent_keys_for_skipped_axes(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from .._helpers.wandb_reader import history_rows

    wandb.finish()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "sago-test")
    cb = SAGOCallback(variant_set(), eval_steps=2, generation_every=2, **FAST)
    make_trainer(tmp_path / "out", callbacks=[cb], max_steps=4, report_to=["wandb"]).train()
    run_dir = Path(wandb.run.dir).parent
    wandb.finish()
    rows = history_rows(glob.glob(str(run_dir / "*.wandb"))[0])
    scalars = {int(r["train/global_step"]): r for r in rows if "eval/sago/num/activation" in r}
    assert sorted(scalars) == [0, 2, 4]
    for step, row in scalars.items():
        has = {k for k in row if k.startswith("eval/sago/") and not k.endswith("_hist") and "/_" not in k}
        gen = {k for k in has if any(a in k for a in (*GEN_AXES, "instability", "accuracy"))}
        assert bool(gen) == (step != 2), (step, sorted(has))
        assert all(math.isfinite(float(row[k])) for k in has)
    hist_keys = {int(r["train/global_step"]): {k for k in r if k.endswith("_hist/_type")} for r in rows
                 if any(k.endswith("_hist/_type") for k in r)}
    assert "eval/sago/num/generation_hist/_type" in hist_keys[0]
    assert "eval/sago/num/generation_hist/_type" not in hist_keys[2]
    assert "eval/sago/num/activation_hist/_type" in hist_keys[2]


def test_automatic_cadence_says_when_only_the_final_evaluation_fits(tmp_path, caplog):
    cb = SAGOCallback(variant_set(), overhead_budget=1e-6, **FAST)
    with caplog.at_level("INFO", logger="sago_train"):
        make_trainer(tmp_path, callbacks=[cb], max_steps=4).train()
    assert "(the baseline, a one-off set-up cost)" in caplog.text
    assert "(3 steps timed)" in caplog.text and "so no periodic evaluation will run" in caplog.text
    assert [h["step"] for h in _history(tmp_path)] == [0, 4]
