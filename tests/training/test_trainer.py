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
    # Unlabeled prompts with both weights 0 and no unlabeled_task_loss have nothing to train on: said before the
    # teacher answers, whether the batch holds only them or labeled items too (not a NaN loss, not a silent skip).
    idle, _ = _train(tmp_path, tok, train=False, config=StabilityConfig(mode="consistency", act_weight=0.0,
                                                                          conf_weight=0.0))
    for batch_items in ([unlabeled], [items[0], unlabeled]):
        with pytest.raises(SagoInputError, match="unlabeled prompts.*both 0 and unlabeled_task_loss is False") as err:
            idle.compute_loss(idle.model, idle.data_collator(batch_items))
        assert err.value.key == "conf_weight" and "unlabeled_task_loss=True" in err.value.hint
    # Outside the consistency mode an item without a target stays an error, unlabeled_task_loss or not.
    for config in (None, StabilityConfig(mode="anchor", conf_weight=1.0, unlabeled_task_loss=True)):
        plain, _ = _train(tmp_path, tok, train=False, config=config)
        with pytest.raises(SagoInputError, match="missing field 'target'"):
            plain.data_collator([items[0], unlabeled])


def _hand_task_loss(model, batch) -> float:
    """The mean token cross-entropy over every labeled position, each row run alone without padding."""
    total, count = 0.0, 0
    for r in range(batch["input_ids"].shape[0]):
        n = int(batch["attention_mask"][r].sum())
        ids, labels = batch["input_ids"][r, :n], batch["labels"][r, :n]
        with torch.no_grad():
            logp = torch.log_softmax(model(ids[None]).logits[0].double(), -1)
        for j in range(1, n):
            if labels[j] != -100:
                total, count = total - float(logp[j - 1, labels[j]]), count + 1
    return total / count


@pytest.mark.parametrize("variants", ["all", "canonical"])
def test_unlabeled_task_loss_trains_the_teachers_answer_as_labels(tmp_path, tok, variants):
    """BCT: an unlabeled item's rows get the teacher's greedy answer as labels (every variant, or the canonical
    one only, as the labeled rows), with both weights 0; the task loss is the plain cross-entropy over both."""
    from sago_train.training.collator import PENDING_KEY

    config = StabilityConfig(mode="consistency", act_weight=0.0, conf_weight=0.0, unlabeled_task_loss=True,
                             unlabeled_max_new_tokens=6, task_loss_variants=variants)
    trainer, _ = _train(tmp_path, tok, config=config, train=False)
    model = trainer.model.eval()
    items = tiny_groups(2)
    unlabeled = dict(items[1], target=None)  # canonical 1: not the group's first row
    full = trainer._sago_answer_unlabeled(model, trainer.data_collator([items[0], unlabeled]).pop(PENDING_KEY))
    expected = greedy_reference(model, trainer.data_collator.encode_prompt(unlabeled["variants"][1]), 6,
                                tok.eos_token_id)
    target = tok(items[0]["target"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    for r in range(full["input_ids"].shape[0]):
        group, p = int(full["group_index"][r]), int(full["prompt_length"][r])
        tokens = expected if group == 1 else target
        labeled = variants == "all" or int(full["variant_index"][r]) == int(full["canonical_index"][r])
        want = torch.full_like(full["labels"][r], -100)
        if labeled:
            want[p : p + len(tokens)] = torch.tensor(tokens)
        assert full["labels"][r].tolist() == want.tolist(), (r, group)
    assert int((full["labels"][full["group_index"] == 1] != -100).sum()) == len(expected) * (3 if variants == "all"
                                                                                             else 1)
    # The trainer's task loss on that batch (compute_loss answers the pending item itself) is the cross-entropy
    # of every labeled position, computed by hand row by row.
    loss = trainer.compute_loss(model, trainer.data_collator([items[0], unlabeled]))
    assert float(loss.detach()) == pytest.approx(_hand_task_loss(model, full), rel=1e-5)
    # Without unlabeled_task_loss the same rows carry no labels.
    off, _ = _train(tmp_path, tok, train=False, config=StabilityConfig(
        mode="consistency", conf_weight=1.0, unlabeled_max_new_tokens=6, task_loss_variants=variants))
    none = off._sago_answer_unlabeled(model, off.data_collator([items[0], unlabeled]).pop(PENDING_KEY))
    assert torch.equal(none["input_ids"], full["input_ids"])
    assert (none["labels"][none["group_index"] == 1] == -100).all()
    assert torch.equal(none["labels"][none["group_index"] == 0], full["labels"][full["group_index"] == 0])


@pytest.mark.parametrize("conf_weight", [0.0, 1.0])
def test_unlabeled_task_loss_counts_the_answers_in_the_task_loss_normalization(tmp_path, tok, conf_weight):
    """In the training loop the teacher answers a step's unlabeled prompts as its micro-batches are fetched, so the
    Trainer's num_items_in_batch (gradient accumulation 2) counts the answers' label tokens too."""
    data = tiny_groups(8)
    for item in data[::2]:
        item["target"] = None  # half the groups unlabeled (the sampler shuffles them into the micro-batches)
    config = StabilityConfig(mode="consistency", conf_weight=conf_weight, unlabeled_task_loss=True,
                             unlabeled_max_new_tokens=4)
    trainer = StabilityTrainer(model=_lora_model(2), args=_args(tmp_path, gradient_accumulation_steps=2, max_steps=2),
                               train_dataset=data, processing_class=tok, stability_config=config,
                               callbacks=[recorder := LogRecorder()])
    seen, compute_loss = [], trainer.compute_loss

    def spy(model, inputs, return_outputs=False, num_items_in_batch=None):
        seen.append((inputs["labels"].clone(), inputs.get("sago_unlabeled_share"), num_items_in_batch))
        return compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

    trainer.compute_loss = spy
    trainer.train()
    assert len(seen) == 4
    # Answered when fetched: compute_loss gets the completed batch with the share of its unlabeled groups.
    assert sum(share or 0.0 for _, share, _ in seen) == 2.0
    for step in (seen[:2], seen[2:]):
        assert all(((labels != -100).sum(1) > 0).all() for labels, _, _ in step)  # every row has labels
        count = sum(int((labels[:, 1:] != -100).sum()) for labels, _, _ in step)
        assert all(int(n) == count for _, _, n in step)
    logs = [log for log in recorder.logs if "loss" in log]
    assert len(logs) == 2 and all(math.isfinite(log["loss"]) for log in logs)
    # The share and the task loss are logged with the term and without it (BCT alone: both weights 0).
    assert sum(log["sago_unlabeled_share"] for log in logs) == pytest.approx(1.0)  # 4 of 8, over 2 steps
    for log in logs:
        assert log["sago_task_loss"] > 0
        assert log["loss"] == pytest.approx(log["sago_task_loss"] + log.get("sago_conf_loss", 0.0), rel=1e-5)
    assert ("sago_conf_loss" in logs[0]) == bool(conf_weight)


def test_relative_weight_scale_in_the_trainer(tmp_path, tok):
    """weight_scale='relative': the trainer's loss is task * (1 + lambda_act + lambda_conf) in value, its gradient
    grad(task) + sum of lambda * (task / L).detach() * grad(L) (by hand from StabilityLoss's own terms); a
    micro-batch of unlabeled prompts only (task loss 0) weighs L_conf by the last labeled batch's ratio."""
    from sago_train.training.collator import PENDING_KEY

    lam_act, lam_conf = 0.3, 0.5
    config = StabilityConfig(mode="consistency", act_weight=lam_act, conf_weight=lam_conf, weight_scale="relative",
                             unlabeled_max_new_tokens=6)
    trainer, _ = _train(tmp_path, tok, config=config, train=False)
    model = trainer.model.train()
    batch = trainer.data_collator(tiny_groups(2))

    def grads():
        out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        return out

    model.zero_grad()
    loss = trainer.compute_loss(model, dict(batch))
    loss.backward()
    got = grads()
    outputs, terms = trainer._sago_loss(model, dict(batch))
    task, act, conf = outputs.loss, terms.act, terms.conf
    r_act, r_conf = (task / act).detach(), (task / conf).detach()
    (task + lam_act * r_act * act + lam_conf * r_conf * conf).backward()
    by_hand = grads()
    task_v, conf_v = float(task.detach()), float(conf.detach())
    assert float(loss.detach()) == pytest.approx(task_v * (1 + lam_act + lam_conf), rel=1e-5)
    assert conf_v != pytest.approx(task_v, rel=0.1)  # the ratio is not ~1 (a real rescaling)
    assert got.keys() == by_hand.keys() and got
    for name, g in got.items():
        scale = float(by_hand[name].abs().max())  # float32 sums in another order: 1e-6 of the largest entry
        assert float((g - by_hand[name]).abs().max()) <= 1e-5 * scale, name
    # Unlabeled prompts only: no task loss, so L_conf (and L_act) keep the ratios of the batch above.
    item = dict(tiny_groups(1)[0], target=None)
    full = trainer._sago_answer_unlabeled(model, trainer.data_collator([item, dict(item, id="u2")]).pop(PENDING_KEY))
    with torch.no_grad():
        loss = trainer.compute_loss(model, dict(full))
        _, terms = trainer._sago_loss(model, dict(full))
    assert float(loss) == pytest.approx(lam_act * float(r_act) * float(terms.act)
                                        + lam_conf * float(r_conf) * float(terms.conf), rel=1e-5)
    assert [float(r) for r in trainer._sago_loss.last_ratios] == pytest.approx([float(r_act), float(r_conf)])


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
