"""Tiny offline fixtures for the stability-loss tests: a byte-level tokenizer and small Llama models.

Nothing here touches the network: the tokenizer is built from the 256 byte symbols, the models from a config.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(chat_template: bool = True) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer (one token per byte), BOS added by default, EOS and PAD defined."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def make_llama(
    vocab_size: int = 259,
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=vocab_size,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(dtype)
    return model


GROUPS = [
    {"id": "g0", "variants": ["What is the capital of France?", "france capital?", "Name France's capital."], "target": " Paris"},
    {"id": "g1", "variants": ["2+2=", "two plus two is", "Compute 2 + 2:"], "target": " 4", "canonical": 1},
    {"id": "g2", "variants": ["Color of the sky?", "sky colour", "What color is the sky?"], "target": " blue"},
    {"id": "g3", "variants": ["Opposite of hot?", "hot is the opposite of", "antonym: hot"], "target": " cold"},
]


def tiny_groups(n: int = 8) -> list[dict]:
    """``n`` training groups with K=3 (cycled from a few hand-written ones)."""
    return [dict(GROUPS[i % len(GROUPS)], id=f"g{i}") for i in range(n)]
