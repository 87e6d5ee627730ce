"""The real instruct model ``sago://smollm2-135m-instruct`` end to end (slow: converted once per machine
into the cache, then loaded in about a second). Kept cheap: a few groups, a few new tokens."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from sago_train import SAGOEvaluator
from sago_train.data import VariantSet
from sago_train.model.tokenize import encode_continuation, encode_variant, resolve_chat_template

from .._helpers.evaluator_ref import TOL, reference_group

pytestmark = pytest.mark.slow

OUTPUTS = Path(__file__).resolve().parents[1] / "fixtures" / "real_outputs.jsonl"
GROUPS = [
    {"id": "fr", "variants": ["What is the capital of France?", "Which city is the capital city of France?",
                              "Question: What is the capital of France?\nAnswer:"], "reference": "Paris"},
    {"id": "tr", "variants": ["What is the capital of Turkey?", "Wht is the capitl of Turkey?",
                              "Which city is the capital city of Turkey?"], "reference": "Ankara"},
    {"id": "add", "variants": ["What is 7 + 5?", "If you add 7 and 5, what do you get?",
                               "Question: What is 7 + 5?\nAnswer:"]},
]


def _template_ids(tok, variant) -> list[int]:
    messages = [{"role": "user", "content": variant}] if isinstance(variant, str) else variant
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])


def test_chat_rendering_equals_apply_chat_template(real_smollm):
    _, tok = real_smollm
    assert resolve_chat_template("auto", tok) == "always"
    assert resolve_chat_template("never", tok) == "never"
    for variant in ["What is the capital of France?", "Question: 2 + 2?\nAnswer:",
                    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of Peru?"}]]:
        ids = encode_variant(variant, tok, chat=True)
        assert ids == _template_ids(tok, variant)
        cue = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
        assert ids[-len(cue):] == cue
    # the reference continues the assistant turn: no special tokens of its own
    assert encode_continuation("Paris", tok) == tok("Paris", add_special_tokens=False)["input_ids"]
    assert not set(encode_continuation("Paris", tok)) & set(tok.all_special_ids)


def test_batched_evaluation_matches_one_variant_at_a_time(real_smollm):
    model, tok = real_smollm
    layers = [0, 14, 28]  # the reference reads hidden_states, whose last entry is after the final norm
    vs = VariantSet.from_records(GROUPS, name="real")
    axes = "activation,confidence,confidence_prob,generation,mirroring"
    ev = SAGOEvaluator(model, tok, layers=layers, max_new_tokens=8, batch_size=9, axes=axes)
    result = ev.evaluate(vs)
    resolved = result.config["resolved"]
    assert (resolved["chat_template"], resolved["correctness"]) == ("always", {"real": "contains"})
    assert resolved["answer_stops"] == {"real": []}  # a chat answer ends at EOS: the raw output is the span
    for rec, g in zip(GROUPS, result.sets["real"].groups):
        ref = reference_group(model, tok, rec, layers, 8, encode=lambda v: _template_ids(tok, v),
                              eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
        assert g.outputs == ref["_outputs"], rec["id"]
        for axis in ("activation", "confidence", "confidence_prob", "generation", "mirroring"):
            want, got = ref[axis], g.axes[axis]
            assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=TOL), (rec["id"], axis)
    # one group at a time through the evaluator gives the same numbers as the batch
    single = SAGOEvaluator(model, tok, layers=layers, max_new_tokens=8, batch_size=1, axes=axes).evaluate(vs)
    for a, b in zip(result.sets["real"].groups, single.sets["real"].groups):
        for axis, value in a.axes.items():
            assert b.axes[axis] == pytest.approx(value, abs=TOL)


def _recorded() -> list[dict]:
    return [json.loads(line) for line in OUTPUTS.read_text().splitlines() if line.strip()]


def test_recorded_outputs_are_what_the_model_says(real_smollm):
    """The correctness fixtures (tests/fixtures/real_outputs.jsonl) are real outputs of this model."""
    model, tok = real_smollm
    rows = _recorded()[:3]
    vs = VariantSet.from_records(
        [{"id": f"r{i}", "variants": [r["question"], r["question"]], "reference": r["reference"]}
         for i, r in enumerate(rows)], name="rec")
    ev = SAGOEvaluator(model, tok, axes="generation", max_new_tokens=32)
    for g, row in zip(ev.evaluate(vs).sets["rec"].groups, rows):
        assert g.outputs[0] == row["output"]
        assert g.correct[0] is row["correct"]


def test_stability_sft_trainer_and_callback_on_the_real_model(real_smollm, tmp_path):
    """A few LoRA steps of StabilitySFTTrainer on a plain list of groups, monitored by SAGOCallback."""
    from peft import LoraConfig, get_peft_model
    from trl import SFTConfig

    from sago_train import SAGOCallback, StabilityConfig
    from sago_train.training.trainer import StabilitySFTTrainer

    base, tok = real_smollm
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    try:
        groups = [
            {"variants": ["What is the capital of Peru?", "Which city is the capital city of Peru?"], "target": "Lima"},
            {"variants": ["What is the opposite of hot?", "Which word means the reverse of hot?"], "target": "cold"},
        ]
        monitor = VariantSet.from_records(GROUPS[:2], name="caps")
        callback = SAGOCallback(monitor, eval_steps=2, max_new_tokens=4, layers=[0, -1], raise_on_error=True,
                                axes="activation,confidence,generation")
        args = SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2, logging_steps=1,
                         report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True, learning_rate=1e-3)
        trainer = StabilitySFTTrainer(model=model, args=args, train_dataset=groups, processing_class=tok,
                                      stability_config=StabilityConfig(act_weight=1.0, conf_weight=1.0),
                                      callbacks=[callback])
        trainer.train()
        logs = [h for h in trainer.state.log_history if "loss" in h]
        assert logs and all(math.isfinite(h["sago_act_loss"]) and math.isfinite(h["sago_conf_loss"]) for h in logs)
        metrics = callback.last_metrics
        assert metrics and math.isfinite(metrics["eval_sago/caps/activation"]) and "eval_sago/caps/accuracy" in metrics
        assert callback.last_result.config["resolved"]["chat_template"] == "always"
    finally:
        model.unload()  # the session's base model stays as it was for the other tests
    with torch.no_grad():
        assert not any("lora" in name for name, _ in base.named_parameters())

