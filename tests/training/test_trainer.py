"""StabilityTrainer / StabilitySFTTrainer on a tiny Llama: logging, LoRA, checkpointing, bf16, DDP, errors."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback, TrainingArguments

from sago_train.errors import SagoInputError
from sago_train.training.collator import VariantGroupCollator
from sago_train.training.loss import StabilityConfig, group_layout, split_batch
from sago_train.training.trainer import StabilityTrainer
from tests._helpers.proc import run as run_proc
from tests._helpers.tiny import (
    SPECIALS_FIRST,
    greedy_reference,
    make_tiny_model,
    tiny_groups,
)

TERMS = ("sago_task_loss", "sago_act_loss", "sago_conf_loss")
# transformers 5 renamed gradient_checkpointing to activation_checkpointing (the old name warns).
CHECKPOINTING = (
    "activation_checkpointing" if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
    else "gradient_checkpointing"
)


class LogRecorder(TrainerCallback):
    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def _args(tmp_path: Path, **overrides) -> TrainingArguments:
    kwargs = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    kwargs.update(overrides)
    return TrainingArguments(**kwargs)


def _train(tmp_path, tok, model=None, config=None, n_groups=4, train=True, **overrides):
    recorder = LogRecorder()
    trainer = StabilityTrainer(
        model=model if model is not None else make_tiny_model("llama", layers=4, ids=SPECIALS_FIRST, eval_mode=False),
        args=_args(tmp_path, **overrides),
        train_dataset=tiny_groups(n_groups),
        processing_class=tok,
        stability_config=config or StabilityConfig(act_weight=1.0, conf_weight=1.0),
        callbacks=[recorder],
    )
    if train:
        trainer.train()
    return trainer, [log for log in recorder.logs if "loss" in log]


def test_trainer_logs_each_term_and_the_total_adds_up(tmp_path, tok):
    # Gradient accumulation exercises the num_items_in_batch normalization of the task loss.
    _, logs = _train(tmp_path, tok, gradient_accumulation_steps=2, max_steps=2, n_groups=8)
    assert len(logs) == 2
    for log in logs:
        assert set(TERMS) <= set(log)
        assert log["sago_act_weight"] == 1.0 and log["sago_conf_weight"] == 1.0
        assert all(torch.isfinite(torch.tensor(log[k])) for k in TERMS)
        assert log["sago_act_loss"] > 0 and log["sago_conf_loss"] > 0
        assert log["loss"] == pytest.approx(log["sago_task_loss"] + log["sago_act_loss"] + log["sago_conf_loss"], rel=1e-5)


def test_default_collator_and_whole_groups_per_batch(tmp_path, tok):
    trainer, _ = _train(tmp_path, tok, train=False, per_device_train_batch_size=3, n_groups=7)
    assert isinstance(trainer.data_collator, VariantGroupCollator)
    sizes = []
    for batch in trainer.get_train_dataloader():
        _, groups = split_batch(batch)
        layout = group_layout(groups, batch["input_ids"])  # raises if a group were split
        assert layout.group_size == 3
        sizes.append(layout.num_groups)
    assert sorted(sizes) == [1, 3, 3]


def test_warmup_ramps_the_weights(tmp_path, tok):
    config = StabilityConfig(act_weight=0.5, conf_weight=0.2, warmup_steps=2)
    _, logs = _train(tmp_path, tok, config=config, max_steps=3)
    # Step k (1-based) computes its loss at global_step k - 1: weights 0, 1/2 and all of it, logged on its row.
    assert [log["sago_act_weight"] for log in logs] == pytest.approx([0.0, 0.25, 0.5])
    assert [log["sago_conf_weight"] for log in logs] == pytest.approx([0.0, 0.1, 0.2])


@pytest.mark.parametrize("ga", [1, 2])
def test_logged_weights_are_the_ones_applied_to_the_logged_losses(tmp_path, tok, ga):
    """Issue 13: the logged weight was one step ahead of the loss on the same row. With a warmup that changes the
    weights at every step, each row's loss is recomputed by hand from its own terms and logged weights."""
    config = StabilityConfig(act_weight=0.8, conf_weight=0.4, warmup_steps=4)
    _, logs = _train(tmp_path, tok, config=config, max_steps=4, gradient_accumulation_steps=ga, n_groups=4 * ga)
    assert len(logs) == 4
    for k, log in enumerate(logs):  # row k+1 is step k+1, computed at global_step k
        assert log["sago_act_weight"] == pytest.approx(0.8 * k / 4)
        assert log["sago_conf_weight"] == pytest.approx(0.4 * k / 4)
        by_hand = (log["sago_task_loss"] + log["sago_act_weight"] * log["sago_act_loss"]
                   + log["sago_conf_weight"] * log["sago_conf_loss"])
        assert log["loss"] == pytest.approx(by_hand, rel=1e-5)
    # A window of two steps logs the mean of the two steps' weights, like the losses beside it.
    _, logs = _train(tmp_path / "window", tok, config=config, max_steps=4, logging_steps=2)
    assert [log["sago_act_weight"] for log in logs] == pytest.approx([0.8 * 0.5 / 4, 0.8 * 2.5 / 4])


def test_lora_trains_only_the_adapter(tmp_path, tok):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(make_tiny_model("llama", layers=4, ids=SPECIALS_FIRST, eval_mode=False), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _, logs = _train(tmp_path, tok, model=model)
    assert logs and all(set(TERMS) <= set(log) for log in logs)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_gives_the_same_losses(tmp_path, tok, lora):
    def model():
        m = make_tiny_model("llama", layers=4, seed=5, ids=SPECIALS_FIRST, eval_mode=False)
        if lora:
            from peft import LoraConfig, get_peft_model

            m = get_peft_model(m, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        return m

    _, plain = _train(tmp_path / "a", tok, model=model(), max_steps=2)
    _, ckpt = _train(tmp_path / "b", tok, model=model(), max_steps=2, **{CHECKPOINTING: True})
    for a, b in zip(plain, ckpt):
        for key in ("loss", *TERMS):
            assert b[key] == pytest.approx(a[key], abs=1e-5), key


def test_bf16_autocast_steps_are_finite(tmp_path, tok):
    _, logs = _train(tmp_path, tok, bf16=True, max_steps=2, config=StabilityConfig(act_weight=0.1, conf_weight=0.1, mode="anchor"))
    assert logs
    for log in logs:
        assert all(torch.isfinite(torch.tensor(log[k])) for k in ("loss", *TERMS))


def test_canonical_only_task_loss(tmp_path, tok):
    trainer, _ = _train(tmp_path, tok, config=StabilityConfig(task_loss_variants="canonical"), train=False)
    batch = next(iter(trainer.get_train_dataloader()))
    labelled = (batch["labels"] != -100).any(-1)
    assert torch.equal(labelled, batch["variant_index"] == batch["canonical_index"])
    trainer.train()


def test_evaluation_reports_the_terms(tmp_path, tok):
    trainer, _ = _train(tmp_path, tok, max_steps=1)
    metrics = trainer.evaluate(eval_dataset=tiny_groups(3))
    assert {"eval_loss", "eval_sago_task_loss", "eval_sago_act_loss", "eval_sago_conf_loss"} <= set(metrics)
    assert metrics["eval_loss"] == pytest.approx(
        metrics["eval_sago_task_loss"] + metrics["eval_sago_act_loss"] + metrics["eval_sago_conf_loss"], rel=1e-5
    )


def test_bad_inputs(tmp_path, tok):
    with pytest.raises(SagoInputError, match="StabilityConfig"):
        _train(tmp_path, tok, config={"act_weight": 1.0}, train=False)
    with pytest.raises(SagoInputError, match="layer 9 is out of range"):
        _train(tmp_path, tok, config=StabilityConfig(layers=[0, 9]), train=False)
    trainer, _ = _train(tmp_path, tok, train=False)
    batch = VariantGroupCollator(tok)(tiny_groups(2))
    batch["input_ids"][1, int(batch["prompt_length"][1])] += 1
    with pytest.raises(SagoInputError, match="different target tokens"):
        trainer.compute_loss(trainer.model, batch)
    with pytest.raises(SagoInputError, match="at least 2 variants"):
        trainer.data_collator([{"variants": ["a"], "target": " b"}])
    plain = {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}
    with pytest.raises(SagoInputError, match="no variant-group bookkeeping"):
        trainer.compute_loss(trainer.model.train(), plain)
    with torch.no_grad():
        assert torch.isfinite(trainer.compute_loss(trainer.model.eval(), plain))  # an ordinary eval batch
    with pytest.raises(SagoInputError, match="target is empty"):
        trainer.data_collator([{"variants": ["a", "b"], "target": ""}])


@pytest.mark.parametrize("form", ["ratio", "infonce"])
def test_relative_mode_trains_and_needs_two_groups_per_batch(tmp_path, tok, form):
    config = StabilityConfig(act_weight=1.0, conf_weight=0.5, mode="relative", relative_form=form)
    _, logs = _train(tmp_path, tok, config=config, max_steps=2, n_groups=4)
    assert len(logs) == 2 and all(log["sago_act_loss"] > 0 for log in logs)
    assert all(log["loss"] == pytest.approx(log["sago_task_loss"] + log["sago_act_loss"] + 0.5 * log["sago_conf_loss"],
                                            rel=1e-5) for log in logs)
    with pytest.raises(SagoInputError, match="per_device_train_batch_size is 1"):
        _train(tmp_path, tok, config=config, train=False, per_device_train_batch_size=1)


def test_sft_trainer_runs_and_logs_the_terms(tmp_path, tok):
    from datasets import Dataset
    from trl import SFTConfig

    from sago_train.training.trainer import StabilitySFTTrainer

    recorder = LogRecorder()
    args = SFTConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2, logging_steps=1, report_to=[],
        use_cpu=True, save_strategy="no", disable_tqdm=True, learning_rate=1e-3,
    )
    trainer = StabilitySFTTrainer(
        model=make_tiny_model("llama", layers=4, ids=SPECIALS_FIRST, eval_mode=False), args=args, train_dataset=Dataset.from_list(tiny_groups(4)),
        processing_class=tok, stability_config=StabilityConfig(act_weight=1.0, conf_weight=1.0), callbacks=[recorder],
    )
    trainer.train()
    logs = [log for log in recorder.logs if "loss" in log]
    assert len(logs) == 2
    for log in logs:
        assert set(TERMS) <= set(log) and "mean_token_accuracy" in log  # SFT's own metrics are kept
        assert log["loss"] == pytest.approx(log["sago_task_loss"] + log["sago_act_loss"] + log["sago_conf_loss"], rel=1e-5)
    with pytest.raises(SagoInputError, match="packing"):
        StabilitySFTTrainer(
            model=make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False), args=SFTConfig(output_dir=str(tmp_path), packing=True, report_to=[], use_cpu=True),
            train_dataset=Dataset.from_list(tiny_groups(2)), processing_class=tok,
        )


@pytest.mark.slow
def test_ddp_two_processes(tmp_path):
    """2-process CPU DDP (gloo) through torchrun: groups stay whole per rank, terms logged, weights in sync."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(root / "tests" / "ddp_stability_worker.py"), str(tmp_path),
    ]
    proc = run_proc(cmd, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], abs=0)
    assert ranks[0]["world_size"] == 2
    for r in ranks:
        assert r["batch_rows"] and all(rows == 2 * 3 for rows in r["batch_rows"])  # 2 whole groups of K=3
    logs = [log for log in ranks[0]["logs"] if "loss" in log]
    assert logs and all(set(TERMS) <= set(log) for log in logs)
    # The consistency mode (EMA teacher, fresh variants, unlabeled prompts): weights and EMA in sync across ranks.
    runs = [r["consistency"] for r in ranks]
    assert runs[0]["checksum"] == pytest.approx(runs[1]["checksum"], abs=0)
    assert runs[0]["ema_checksum"] == pytest.approx(runs[1]["ema_checksum"], abs=0)
    assert runs[0]["ema_checksum"] != runs[0]["checksum"]
    logs = [log for log in runs[0]["logs"] if "loss" in log]
    assert logs and all(math.isfinite(log["sago_conf_loss"]) and log["sago_conf_loss"] >= 0 for log in logs)


# ------------------------------------------------------------------------------------------ consistency
def _lora_model(layers: int = 4):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(make_tiny_model("llama", layers=layers, ids=SPECIALS_FIRST, eval_mode=False),
                          LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))


def test_unlabeled_item_gets_the_teachers_greedy_tokens_and_no_labels(tmp_path, tok):
    from sago_train.training.collator import PENDING_KEY

    config = StabilityConfig(mode="consistency", act_weight=0.0, conf_weight=1.0, unlabeled_max_new_tokens=6)
    trainer, _ = _train(tmp_path, tok, config=config, train=False)
    items = tiny_groups(2)
    unlabeled = dict(items[1], target=None)
    batch = trainer.data_collator([items[0], unlabeled])
    model = trainer.model
    full = trainer._sago_answer_unlabeled(model, batch.pop(PENDING_KEY))
    prompt = trainer.data_collator.encode_prompt(unlabeled["variants"][unlabeled.get("canonical", 0)])
    model.eval()
    expected = greedy_reference(model, prompt, 6, tok.eos_token_id)
    rows = (full["group_index"] == 1).nonzero().flatten().tolist()
    for r in rows:
        p = int(full["prompt_length"][r])
        assert full["input_ids"][r, p : p + len(expected)].tolist() == expected
        assert int(full["target_length"][r]) == len(expected)
        assert (full["labels"][r] == -100).all()
    assert (full["labels"][full["group_index"] == 0] != -100).any()  # the labeled group keeps its labels
    # A teacher answer that ends at once leaves the item nothing to train toward: said, naming the item.
    pending = trainer.data_collator([items[0], unlabeled]).pop(PENDING_KEY)
    for blank in ([tok.eos_token_id], [trainer.data_collator.pad_id]):
        with pytest.raises(SagoInputError, match=f"unlabeled training item '{unlabeled['id']}'.*is empty"):
            pending.complete([blank])
    # Unlabeled prompts alone with both weights 0 have nothing to train on: said, not a NaN loss.
    idle, _ = _train(tmp_path, tok, train=False, config=StabilityConfig(mode="consistency", act_weight=0.0,
                                                                          conf_weight=0.0))
    with pytest.raises(SagoInputError, match="only unlabeled prompts.*both 0"):
        idle.compute_loss(idle.model, idle.data_collator([unlabeled]))
    # Outside the consistency mode an item without a target stays an error.
    plain, _ = _train(tmp_path, tok, train=False)
    with pytest.raises(SagoInputError, match="missing field 'target'"):
        plain.data_collator([items[0], unlabeled])


@pytest.mark.parametrize("teacher", ["self", "ema"])
def test_consistency_trains_lora_with_fresh_variants_unlabeled_items_and_accumulation(tmp_path, tok, teacher):
    config = StabilityConfig(mode="consistency", act_weight=0.1, conf_weight=1.0, teacher=teacher, fresh_variants=2,
                             teacher_temperature=1.5, ema_decay=0.5)
    data = tiny_groups(8)
    for item in data[::3]:
        item["target"] = None  # unlabeled prompts beside labeled ones
    model = _lora_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = StabilityTrainer(model=model, args=_args(tmp_path, gradient_accumulation_steps=2, max_steps=2),
                               train_dataset=data, processing_class=tok, stability_config=config,
                               callbacks=[recorder := LogRecorder()])
    trainer.train()
    logs = [log for log in recorder.logs if "loss" in log]
    assert len(logs) == 2
    for log in logs:
        assert all(torch.isfinite(torch.tensor(log[k])) for k in TERMS)
        assert log["sago_conf_loss"] > 0 and log["sago_act_loss"] > 0
        assert log["loss"] == pytest.approx(log["sago_task_loss"] + 0.1 * log["sago_act_loss"] + log["sago_conf_loss"],
                                            rel=1e-5)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    if teacher == "ema":  # updated after each of the 2 optimizer steps: between the start and the adapter now
        shadow, params = trainer._sago_teacher.shadow, trainer._sago_teacher.params
        assert any(not torch.equal(s, p) for s, p in zip(shadow, params))


def test_fresh_perturbation_augmentation_without_the_terms(tmp_path, tok):
    """The experiment's control arm: no stability terms, the task loss on every variant, fresh ones included."""
    config = StabilityConfig(act_weight=0.0, conf_weight=0.0, fresh_variants=2, fixed_variants=False)
    trainer, logs = _train(tmp_path, tok, config=config, max_steps=2)
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(log["loss"])) for log in logs)
    assert not any("sago_unlabeled_share" in log for log in logs)  # a mode that needs every target
    batch = trainer.data_collator(tiny_groups(2))
    assert batch["input_ids"].shape[0] == 2 * 3 and ((batch["labels"] != -100).sum(1) == batch["target_length"]).all()


def test_sft_trainer_with_the_consistency_mode_and_unlabeled_prompts(tmp_path, tok):
    from trl import SFTConfig

    from sago_train.training.trainer import StabilitySFTTrainer

    data = tiny_groups(2)
    data[0]["target"] = None  # one micro-batch (of one group) per step: both items come up in the 2 steps
    args = SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=1, max_steps=2, logging_steps=1,
                     report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True, learning_rate=1e-3)
    recorder = LogRecorder()
    trainer = StabilitySFTTrainer(
        model=_lora_model(2), args=args, train_dataset=data, processing_class=tok, callbacks=[recorder],
        stability_config=StabilityConfig(mode="consistency", act_weight=0.0, conf_weight=1.0, teacher="frozen"))
    trainer.train()
    logs = [log for log in recorder.logs if "loss" in log]
    assert len(logs) == 2 and all(log["sago_conf_loss"] >= 0 for log in logs)
    # The unlabeled prompt's step has no task loss, the consistency term only; the labeled one has both.
    unlabeled = [log for log in logs if log["sago_task_loss"] == 0.0]
    assert len(unlabeled) == 1 and unlabeled[0]["loss"] == pytest.approx(unlabeled[0]["sago_conf_loss"], rel=1e-5)
    # The share of the step's groups without a target: 1 on that step, 0 on the labeled one.
    assert unlabeled[0]["sago_unlabeled_share"] == 1.0
    assert [log["sago_unlabeled_share"] for log in logs if log["sago_task_loss"] != 0.0] == [0.0]
