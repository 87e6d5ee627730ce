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


# ------------------------------------------------------------------ round 4 (issue 34): written atomically, read checked
def _saved_shadow(trainer) -> list[torch.Tensor]:
    return [s.detach().cpu().clone() for s in trainer._sago_teacher.shadow]


@pytest.mark.parametrize("tamper, expect", [
    ("truncated", r"sago_ema_teacher.pt: cannot read the saved EMA teacher \("),
    ("nan", r"sago_ema_teacher.pt: field 'shadow': tensor 0 of the saved EMA teacher holds NaN or infinite values"),
    ("float16", r"the first difference is at tensor 0 \(saved \(\d+, \d+\) float16, expected \(\d+, \d+\) float32\)"),
    ("not_a_list", r"sago_ema_teacher.pt: field 'shadow': expected a list of tensors, got"),
    ("no_shadow", r"sago_ema_teacher.pt: expected the saved EMA teacher: an object with 'shadow', got"),
], ids=["truncated", "nan", "float16", "not_a_list", "no_shadow"])
def test_a_tampered_ema_state_is_refused_naming_the_file(tamper, expect, tmp_path, tok):
    """A truncated state was a zip traceback; NaN values or another dtype loaded silently."""
    from sago_train.training.resume import save_atomic

    trainer = _trainer(tmp_path, tok)
    shadow = _saved_shadow(trainer)
    path = tmp_path / TEACHER_FILE
    if tamper == "truncated":
        save_atomic({"shadow": shadow}, path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif tamper == "nan":
        shadow[0][0, 0] = float("nan")
        save_atomic({"shadow": shadow}, path)
    elif tamper == "float16":
        save_atomic({"shadow": [s.half() for s in shadow]}, path)
    elif tamper == "not_a_list":
        save_atomic({"shadow": {"a": 1}}, path)
    else:
        save_atomic({"other": shadow}, path)
    before = [s.clone() for s in trainer._sago_teacher.shadow]
    with pytest.raises(SagoInputError, match=expect):
        load_state(tmp_path, trainer._sago_teacher, trainer.data_collator.fresh, rank=0)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer._sago_teacher.shadow))  # nothing half-loaded


def test_checkpoint_state_is_written_atomically(tmp_path, tok, monkeypatch):
    """torch.save wrote straight into the checkpoint: a crash or a full disk left a truncated file there. Now a
    failed save leaves the previous file and no temporary one."""
    import errno

    import sago_train.io as sio
    from sago_train.training.resume import save_atomic

    trainer = _trainer(tmp_path, tok)
    path = tmp_path / TEACHER_FILE
    save_atomic({"shadow": _saved_shadow(trainer)}, path)
    good = path.read_bytes()
    real = sio.os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sio.os, "fdopen", lambda fd, *a, **k: Full(real(fd, *a, **k)))
    with pytest.raises(OSError, match="No space left"):
        save_atomic({"shadow": [s * 2 for s in _saved_shadow(trainer)]}, path)
    assert path.read_bytes() == good and sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [TEACHER_FILE]
