"""A resumed consistency run gets back its EMA teacher and its fresh draw counts: resuming from a checkpoint ends
where the uninterrupted run ends."""

from __future__ import annotations

import pytest
import torch

from sago_train import StabilityConfig, StabilityTrainer
from sago_train.errors import SagoInputError
from sago_train.training.resume import STATE_FILE, TEACHER_FILE, load_state
from tests._helpers.tiny import SPECIALS_FIRST, make_tiny_model, tiny_groups
from tests.training.test_trainer import _args

CONFIG = StabilityConfig(mode="consistency", act_weight=0.0, conf_weight=1.0, teacher="ema", ema_decay=0.5,
                         fresh_variants=2)


def _trainer(tmp_path, tok, config=CONFIG, **overrides):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    args = _args(tmp_path, **{"max_steps": 3, "save_strategy": "steps", "save_steps": 1, **overrides})
    return StabilityTrainer(model=model, args=args, train_dataset=tiny_groups(4), processing_class=tok,
                            stability_config=config)


def test_resuming_restores_the_ema_teacher_and_the_fresh_draw_counts(tmp_path, tok):
    whole = _trainer(tmp_path / "whole", tok)
    whole.train()
    saved = torch.load(tmp_path / "whole" / "checkpoint-3" / STATE_FILE.format(rank=0), weights_only=True)
    shadow = torch.load(tmp_path / "whole" / "checkpoint-3" / TEACHER_FILE, weights_only=True)["shadow"]
    for s, t in zip(shadow, whole._sago_teacher.shadow):
        assert torch.equal(s, t)  # the checkpoint holds the average after its step's update
    # The counts of the batches used (3 steps x 2 groups), not of the one the dataloader collated ahead.
    assert saved["draws"] == whole.data_collator.fresh.consumed and sum(saved["draws"].values()) == 3 * 2
    assert sum(whole.data_collator.fresh.draws.values()) > 3 * 2

    resumed = _trainer(tmp_path / "whole", tok)  # a new process: its EMA starts from the (new) weights
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-1"))
    for a, b in zip(resumed._sago_teacher.shadow, whole._sago_teacher.shadow):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert resumed.data_collator.fresh.consumed == whole.data_collator.fresh.consumed
    assert resumed.data_collator.fresh.draws == whole.data_collator.fresh.draws
    for a, b in zip(resumed._sago_teacher.params, whole._sago_teacher.params):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)

    # Without the restored state the run would differ: the check above can fail.
    fresh = _trainer(tmp_path / "other", tok)
    ckpt = tmp_path / "whole" / "checkpoint-1"
    assert not all(torch.equal(a, b) for a, b in zip(fresh._sago_teacher.shadow,
                                                     torch.load(ckpt / TEACHER_FILE, weights_only=True)["shadow"]))


def test_a_checkpoint_without_the_state_warns_and_a_wrong_one_is_refused(tmp_path, tok):
    trainer = _trainer(tmp_path, tok)
    with pytest.warns(UserWarning) as caught:
        assert load_state(tmp_path, trainer._sago_teacher, trainer.data_collator.fresh, rank=0) is False
    said = " ".join(str(w.message) for w in caught)
    assert "no sago_ema_teacher.pt" in said and "EMA teacher restarts" in said
    assert "no sago_consistency_state-rank0.pt" in said and "first draw" in said
    shapes = [tuple(s.shape) for s in trainer._sago_teacher.shadow]
    torch.save({"shadow": [torch.zeros(shapes[0]), torch.zeros(3)]}, tmp_path / TEACHER_FILE)
    with pytest.raises(SagoInputError, match=rf"{len(shapes)} trainable parameters; the first difference is at "
                                             rf"tensor 1 \(saved \(3,\), expected \({shapes[1][0]}, "):
        load_state(tmp_path, trainer._sago_teacher, trainer.data_collator.fresh, rank=0)


def test_resuming_where_draws_cannot_continue_exactly_says_so(tmp_path, tok):
    trainer = _trainer(tmp_path, tok, dataloader_num_workers=1, max_steps=1)
    trainer.train()
    with pytest.warns(UserWarning, match="dataloader_num_workers > 0 .* differ from an uninterrupted run"):
        restore_run = _trainer(tmp_path, tok, dataloader_num_workers=1, max_steps=1)
        from sago_train.training.resume import restore

        restore(str(tmp_path / "checkpoint-1"), restore_run.args, restore_run._sago_teacher,
                restore_run.data_collator.fresh, restore_run.train_dataset)


def test_runs_without_ema_or_fresh_variants_save_nothing_extra(tmp_path, tok):
    trainer = _trainer(tmp_path, tok, config=StabilityConfig(mode="consistency", act_weight=0.0, conf_weight=1.0),
                       max_steps=1)
    trainer.train()
    assert (tmp_path / "checkpoint-1").is_dir()
    assert not list(tmp_path.glob("checkpoint-1/sago_consistency_state*"))
