"""Loading a model: a config whose block count cannot be read, or a checkpoint that leaves weights newly
initialized, is an error naming the file, never a model measured with random blocks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sago_train.errors import SagoInputError
from sago_train.model.loading import check_block_count, load_model_and_tokenizer
from sago_train.model.tiny import tiny_model_path


def _copy_with_config(tmp_path: Path, edit) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path(), folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_config_without_its_block_count_is_refused(tmp_path):
    """transformers built Llama's default 32 blocks, 28 of them random, and every number was measured on them."""
    folder = _copy_with_config(tmp_path, lambda c: c.pop("num_hidden_layers"))
    with pytest.raises(SagoInputError, match=r"config\.json: field 'num_hidden_layers': the model config gives no "
                                             r"number of decoder blocks"):
        load_model_and_tokenizer(folder, device="cpu")


def test_a_checkpoint_that_leaves_weights_newly_initialized_is_refused(tmp_path):
    folder = _copy_with_config(tmp_path, lambda c: c.update(num_hidden_layers=6))  # the checkpoint has 4
    with pytest.raises(SagoInputError, match=r"18 weight\(s\) are not in its checkpoint .* would be newly "
                                             r"initialized, e\.g\. model\.layers\.4\."):
        load_model_and_tokenizer(folder, device="cpu")


def test_the_block_count_under_another_name_is_read(tmp_path):
    """GPT-2 spells it n_layer (its config's attribute_map); a multimodal config nests it in text_config."""
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    check_block_count(gpt2)
    gemma = tmp_path / "gemma3"
    gemma.mkdir()
    (gemma / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": {"num_hidden_layers": 2}}))
    check_block_count(gemma)
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_head": 2}))
    with pytest.raises(SagoInputError, match="no number of decoder blocks"):
        check_block_count(gpt2)
    model, _ = load_model_and_tokenizer(tiny_model_path(), device="cpu")  # the shipped model loads as before
    assert model.config.num_hidden_layers == 4


def test_loading_an_adapter_says_none_of_the_other_libraries_deprecations(tmp_path):
    """PEFT's PeftModel.from_pretrained reads transformers' deprecated ``is_gradient_checkpointing``: `sago-train
    eval --model ADAPTER` printed that FutureWarning, which is not the user's to fix. The adapter still loads."""
    import warnings

    import peft
    import transformers as tf

    base = tf.AutoModelForCausalLM.from_pretrained(tiny_model_path())
    lora = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tiny_model_path())
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _ = load_model_and_tokenizer(str(tmp_path / "adapter"))
    assert isinstance(model, peft.PeftModel)
    assert not [w for w in caught if "gradient_checkpointing" in str(w.message)], [str(w.message) for w in caught]
