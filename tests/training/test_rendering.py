"""Training renders prompts exactly as evaluation does (one PromptRenderer): the chat-template rule of the
evaluator (auto / always / never), its stops, the end token appended once."""

from __future__ import annotations

import warnings

import pytest
from transformers import TrainingArguments

from sago_train import SAGOCallback, SAGOEvaluator, StabilityTrainer, VariantGroupCollator, VariantSet
from sago_train.model.tokenize import PromptRenderer, encode_continuation
from tests._helpers.tiny import INSTRUCT_TEMPLATE, make_byte_tokenizer, make_tiny_model


def _sets():
    return {"s": VariantSet.from_records([{"id": g["id"], "variants": g["variants"], "reference": g["target"]} for g in GROUPS], name="s")}


GROUPS = [
    {"id": "m0", "variants": ["What is the mascot of Velmora University?", "Velmora University's mascot?"],
     "target": "Heron."},
    {"id": "m1", "variants": ["What is the motto of Velmora University?", "Velmora University's motto?"],
     "target": "Onward.</s>"},  # a target already carrying the end token: it gets no second one
]


@pytest.fixture(scope="module")
def instruct_tok():
    return make_byte_tokenizer(INSTRUCT_TEMPLATE)


def _first_batch(trainer):
    return next(iter(trainer.get_train_dataloader()))


def _rows(batch):
    for r in range(batch["input_ids"].shape[0]):
        n = int(batch["attention_mask"][r].sum())
        yield r, batch["input_ids"][r, :n].tolist(), int(batch["prompt_length"][r])


def _expected(evaluator, variant, target, eos):
    ids = encode_continuation(target, evaluator.tokenizer)
    ids = ids if ids and ids[-1] == eos else ids + [eos]
    return evaluator.renderer.prompt_ids(variant) + ids


def test_string_variants_train_on_the_evaluators_chat_rendering(tmp_path, instruct_tok):
    model = make_tiny_model(eval_mode=False)
    evaluator = SAGOEvaluator(model, instruct_tok)
    assert evaluator.chat_template == "always"  # auto: an instruct template marks its turns with special tokens
    args = TrainingArguments(str(tmp_path), remove_unused_columns=False, max_steps=1, per_device_train_batch_size=2,
                             report_to=[], disable_tqdm=True, use_cpu=True, save_strategy="no")
    trainer = StabilityTrainer(model=model, args=args, train_dataset=GROUPS, processing_class=instruct_tok)
    assert trainer.data_collator.chat_template == "always"
    batch = _first_batch(trainer)
    eos = instruct_tok.eos_token_id
    seen = 0
    for r, ids, p in _rows(batch):
        group = GROUPS[int(batch["group_index"][r])]
        variant = group["variants"][int(batch["variant_index"][r])]
        assert ids == _expected(evaluator, variant, group["target"], eos)
        assert ids[:p] == evaluator.renderer.prompt_ids(variant)
        text = instruct_tok.decode(ids)
        assert text.startswith("<s>user\n") and "<s>assistant\n" in text
        assert text.count("</s>") == 2 and text.endswith("</s>")  # the user turn's and the end token: once
        seen += 1
    assert seen == 4
    trainer.train()  # and it trains on them
    assert trainer.state.global_step == 1


def test_the_rule_comes_from_the_sago_callback_or_the_trainer(tmp_path, instruct_tok):
    model = make_tiny_model(eval_mode=False)
    args = TrainingArguments(str(tmp_path), remove_unused_columns=False, max_steps=1, report_to=[],
                             use_cpu=True, save_strategy="no")
    sago = SAGOCallback(_sets(), chat_template="never",
                        stop_strings=["\n"])
    trainer = StabilityTrainer(model=model, args=args, train_dataset=GROUPS, processing_class=instruct_tok,
                               callbacks=[sago])
    assert trainer.data_collator.chat_template == "never"
    assert trainer.data_collator.renderer.stop_strings == ["\n"]
    raw = instruct_tok(GROUPS[0]["variants"][0])["input_ids"]
    assert trainer.data_collator.encode_prompt(GROUPS[0]["variants"][0]) == raw
    explicit = StabilityTrainer(model=model, args=args, train_dataset=GROUPS, processing_class=instruct_tok,
                                chat_template="always")
    assert explicit.data_collator.chat_template == "always"


def test_a_collator_rendering_otherwise_is_warned_about(tmp_path, instruct_tok):
    model = make_tiny_model(eval_mode=False)
    args = TrainingArguments(str(tmp_path), remove_unused_columns=False, max_steps=1, report_to=[],
                             use_cpu=True, save_strategy="no")
    sago = SAGOCallback(_sets())
    with pytest.warns(UserWarning, match="trained on another prompt format"):
        StabilityTrainer(model=model, args=args, train_dataset=GROUPS, processing_class=instruct_tok,
                         data_collator=VariantGroupCollator(instruct_tok, chat_template="never"), callbacks=[sago])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        StabilityTrainer(model=model, args=args, train_dataset=GROUPS, processing_class=instruct_tok,
                         data_collator=VariantGroupCollator(instruct_tok), callbacks=[sago])


def test_end_token_once_and_stops_inside_a_target_warned(instruct_tok):
    renderer = PromptRenderer(instruct_tok, "auto", ["\n"])
    eos = instruct_tok.eos_token_id
    assert renderer.target_ids("Heron.").count(eos) == 1
    assert renderer.target_ids("Heron.</s>").count(eos) == 1
    assert renderer.target_ids("Heron.", add_end=False).count(eos) == 0
    collate = VariantGroupCollator(instruct_tok, stop_strings=["\n"])
    with pytest.warns(UserWarning, match="holds the stop string"):
        collate([{"variants": ["a?", "b?"], "target": "Heron.\nMore text"}])
    with warnings.catch_warnings():  # a target that ends with the stop is judged on all it says: no warning
        warnings.simplefilter("error")
        VariantGroupCollator(instruct_tok, stop_strings=["."])([{"variants": ["a?", "b?"], "target": " Heron."}])
    plain = make_byte_tokenizer()  # a template of plain text: auto feeds strings as they are, as evaluation does
    assert VariantGroupCollator(plain).chat_template == SAGOEvaluator(make_tiny_model(), plain).chat_template == "never"


@pytest.mark.slow
def test_smollm2_trains_on_the_prompt_it_is_evaluated_on(tmp_path, real_smollm):
    model, tok = real_smollm
    evaluator = SAGOEvaluator(model, tok)
    assert evaluator.chat_template == "always"
    collate = VariantGroupCollator(tok)
    batch = collate(GROUPS[:1])
    eos = tok.eos_token_id
    for r, ids, _ in _rows(batch):
        variant = GROUPS[0]["variants"][r]
        assert ids == _expected(evaluator, variant, "Heron.", eos)
        text = tok.decode(ids)
        assert text.endswith("<|im_start|>assistant\nHeron.<|im_end|>") and not text.endswith("<|im_end|><|im_end|>")
