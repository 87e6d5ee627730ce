"""The consistency mode's teachers: a frozen LoRA teacher is the base model, the EMA follows its formula and is
swapped in and out exactly, greedy answers are the model's argmax tokens."""

from __future__ import annotations

import pytest
import torch

from sago_train.errors import SagoInputError
from sago_train.training.collator import VariantGroupCollator
from sago_train.training.loss import group_layout, split_batch
from sago_train.training.teacher import EmaTeacherCallback, Teacher
from tests._helpers.tiny import (
    SPECIALS_FIRST,
    greedy_reference,
    make_tiny_model,
    tiny_groups,
)


def _lora(seed_b: int | None = 0):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    if seed_b is not None:
        torch.manual_seed(seed_b)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5)
    return model


def _canonical_rows(batch):
    model_inputs, groups = split_batch(batch)
    layout = group_layout(groups, model_inputs["input_ids"])
    g, k = layout.num_groups, layout.group_size
    return model_inputs, layout, layout.order.view(g, k)[torch.arange(g), layout.canonical]


def _expected_rows(logits, batch, layout, rows):
    """Plain loop: row r's logits at prompt_length - 1 + j for each target position j."""
    t = layout.max_target
    out = torch.stack([logits[i, int(batch["prompt_length"][r]) - 1 + torch.arange(t)] for i, r in enumerate(rows.tolist())])
    return out


def test_frozen_lora_teacher_gives_the_base_model_logits(tok):
    student, base = _lora(), make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST)
    items = tiny_groups(3)
    items[2] = dict(items[2], canonical=1)
    batch = VariantGroupCollator(tok)(items)
    model_inputs, layout, rows = _canonical_rows(batch)
    got = Teacher("frozen", student).logits(student, model_inputs["input_ids"], model_inputs["attention_mask"], layout)
    with torch.no_grad():
        base_logits = base(input_ids=model_inputs["input_ids"][rows], attention_mask=model_inputs["attention_mask"][rows]).logits
        student_logits = student(input_ids=model_inputs["input_ids"][rows], attention_mask=model_inputs["attention_mask"][rows]).logits
    assert torch.allclose(got, _expected_rows(base_logits, batch, layout, rows), atol=1e-6)
    # Computed after the teacher ran: the adapter is back on (the student differs from the base).
    assert not torch.allclose(got, _expected_rows(student_logits, batch, layout, rows), atol=1e-3)


def test_frozen_teacher_of_a_full_model_is_a_warned_copy(tok):
    model = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST)
    with pytest.warns(UserWarning, match="second model in memory"):
        teacher = Teacher("frozen", model)
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)  # training moves the model; the copy stays where training started
    assert not torch.equal(teacher.copy.lm_head.weight, model.lm_head.weight)
    assert not any(p.requires_grad for p in teacher.copy.parameters())


def test_ema_update_follows_the_formula_and_swaps_back_exactly(tok):
    model = _lora(seed_b=None)
    teacher = Teacher("ema", model, decay=0.9)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert len(teacher.shadow) == len(names)  # one copy of the trainable parameters, nothing else
    expected = [s.clone() for s in teacher.shadow]
    torch.manual_seed(1)
    for _ in range(3):  # three "optimizer steps", each followed by the callback
        with torch.no_grad():
            for p in teacher.params:
                p.add_(torch.randn_like(p))
        EmaTeacherCallback(teacher).on_step_end(None, None, None)
        expected = [0.9 * e + 0.1 * p.detach() for e, p in zip(expected, teacher.params)]
    assert all(torch.allclose(s, e, atol=1e-6) for s, e in zip(teacher.shadow, expected))

    batch = VariantGroupCollator(tok)(tiny_groups(2))
    model_inputs, layout, rows = _canonical_rows(batch)
    current = [p.detach().clone() for p in teacher.params]
    got = teacher.logits(model, model_inputs["input_ids"], model_inputs["attention_mask"], layout)
    assert all(torch.equal(p, c) for p, c in zip(teacher.params, current))  # swapped back exactly
    with torch.no_grad():
        for p, e in zip(teacher.params, expected):
            p.copy_(e)
        ema_logits = model(input_ids=model_inputs["input_ids"][rows], attention_mask=model_inputs["attention_mask"][rows]).logits
    assert torch.allclose(got, _expected_rows(ema_logits, batch, layout, rows), atol=1e-6)


def test_ema_needs_trainable_parameters():
    model = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST).requires_grad_(False)
    with pytest.raises(SagoInputError, match="trainable"):
        Teacher("ema", model)


def test_greedy_answers_are_the_argmax_tokens_up_to_eos(tok):
    model = _lora()
    prompts = [tok("What is the capital of France?")["input_ids"], tok("2+2=")["input_ids"]]
    got = Teacher("self", model).answer(model, prompts, max_new_tokens=5, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)
    for prompt, answer in zip(prompts, got):
        assert answer == greedy_reference(model, prompt, 5, tok.eos_token_id)
    # The frozen teacher answers with the base model's tokens.
    base = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST)
    frozen = Teacher("frozen", model).answer(model, prompts[:1], max_new_tokens=5, pad_id=tok.pad_token_id,
                                             eos_id=tok.eos_token_id)
    with torch.no_grad():
        first = int(base(torch.tensor([prompts[0]])).logits[0, -1].argmax())
    assert frozen[0][0] == first


def test_the_teachers_lm_head_runs_only_where_a_response_token_is_predicted(tok):
    """The frozen teacher's logits come from the kept positions only, and equal the full-logits reference; a model
    that does not slice by ``logits_to_keep`` positions is read in full instead."""
    student = _lora()
    batch = VariantGroupCollator(tok)(tiny_groups(3))
    model_inputs, layout, rows = _canonical_rows(batch)
    widths = []
    head = student.get_base_model().lm_head
    handle = head.register_forward_hook(lambda m, i, o: widths.append(i[0].shape[1]))
    try:
        got = Teacher("frozen", student).logits(student, model_inputs["input_ids"], model_inputs["attention_mask"],
                                                layout)
    finally:
        handle.remove()
    t = int(batch["target_length"].max())
    assert widths and widths[0] < model_inputs["input_ids"].shape[1] and widths[0] >= t
    with torch.no_grad(), student.disable_adapter():
        full = student(input_ids=model_inputs["input_ids"][rows], attention_mask=model_inputs["attention_mask"][rows]).logits
    assert torch.allclose(got, _expected_rows(full, batch, layout, rows), atol=1e-6)

    class CountOnly(torch.nn.Module):  # takes logits_to_keep but does not slice by positions: full logits back
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask=None, logits_to_keep=0):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    base = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST)
    with pytest.warns(UserWarning, match="second model"):
        teacher = Teacher("frozen", CountOnly(base))
    got = teacher.logits(CountOnly(base), model_inputs["input_ids"], model_inputs["attention_mask"], layout)
    with torch.no_grad():
        full = base(input_ids=model_inputs["input_ids"][rows], attention_mask=model_inputs["attention_mask"][rows]).logits
    assert torch.allclose(got, _expected_rows(full, batch, layout, rows), atol=1e-6)


@pytest.mark.parametrize("fsdp,zero3", [(True, False), (False, True)])
def test_teachers_that_would_not_follow_sharded_parameters_are_refused(fsdp, zero3):
    from sago_train.training.teacher import check_sharding

    lora, full = _lora(), make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST)
    with pytest.raises(SagoInputError, match="teacher='ema' is not supported under (FSDP|DeepSpeed ZeRO-3)"):
        check_sharding("ema", lora, fsdp=fsdp, zero3=zero3)
    with pytest.raises(SagoInputError, match="frozen copy of a full model"):
        check_sharding("frozen", full, fsdp=fsdp, zero3=zero3)
    check_sharding("frozen", lora, fsdp=fsdp, zero3=zero3)  # the adapter switched off: nothing copied
    check_sharding("self", full, fsdp=fsdp, zero3=zero3)
    check_sharding("ema", lora, fsdp=False, zero3=False)  # DDP / one process
