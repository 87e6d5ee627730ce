"""The one tiny-model factory of the tests: an offline byte-level tokenizer and tiny randomly initialised causal
LMs of several architectures (the trained tiny model is :mod:`sago_train.model.tiny`, for tests that need a
model that answers). Nothing here touches the network: the tokenizer is built from the 256 byte symbols, the
models from a config.

Two token-id layouts exist because tests pin token ids: :data:`SPECIALS_LAST` (bytes 0..255, then ``<s>``
``</s>`` ``<pad>``; the default) and :data:`SPECIALS_FIRST` (``<pad>`` ``<s>`` ``</s>`` = 0, 1, 2, then the
bytes; the stability-loss tests). Model and tokenizer take the same ``ids``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import transformers as tf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

VOCAB = 259  # 256 bytes + <s> </s> <pad>


class SpecialIds(NamedTuple):
    bos: int
    eos: int
    pad: int


SPECIALS_LAST = SpecialIds(bos=256, eos=257, pad=258)
SPECIALS_FIRST = SpecialIds(bos=1, eos=2, pad=0)

#: ``role: content`` lines, then ``assistant:`` (the default).
ROLE_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
#: ``<|role|>content`` lines, then ``<|assistant|>`` (the stability-loss tests).
TAGGED_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

#: An instruct model's template: turns marked with the special tokens ``<s>`` ... ``</s>`` (as SmolLM2's
#: ``<|im_start|>`` ... ``<|im_end|>``), so that ``chat_template="auto"`` renders string variants with it.
INSTRUCT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def make_byte_tokenizer(chat_template: str | None = ROLE_TEMPLATE, ids: SpecialIds = SPECIALS_LAST
                        ) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer (one token per byte) that prepends ``<s>``; ``</s>`` and ``<pad>`` defined."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    specials = {"<s>": ids.bos, "</s>": ids.eos, "<pad>": ids.pad}
    offset = 3 if ids == SPECIALS_FIRST else 0
    vocab = {c: i + offset for i, c in enumerate(alphabet)}
    vocab.update(specials)
    tk = Tokenizer(models.BPE(vocab=dict(sorted(vocab.items(), key=lambda kv: kv[1])), merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(["<s>", "</s>", "<pad>"])
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                      special_tokens=[("<s>", ids.bos)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    if chat_template:
        tok.chat_template = chat_template
    return tok


def make_tiny_model(arch: str = "llama", seed: int = 0, layers: int = 4, hidden: int = 32, *,
                    ids: SpecialIds = SPECIALS_LAST, dtype: torch.dtype = torch.float32,
                    eval_mode: bool = True, window: int = 128) -> torch.nn.Module:
    """A tiny randomly initialised causal LM of the given architecture (CPU, ``dtype``), in eval mode unless
    ``eval_mode=False`` (as built: train mode); ``window``: the sliding window of the sliding-window ones
    (``mistral-window``, ``gemma2``, ``gemma3``)."""
    if ids not in (SPECIALS_LAST, SPECIALS_FIRST):
        raise ValueError(f"unknown token-id layout {ids}")
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, bos_token_id=ids.bos, eos_token_id=ids.eos, pad_token_id=ids.pad)
    if arch == "llama":
        cfg = tf.LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                             tie_word_embeddings=False, **common)
        model = tf.LlamaForCausalLM(cfg)
    elif arch == "mistral":
        cfg = tf.MistralConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                               num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                               head_dim=hidden // 2, **common)
        model = tf.MistralForCausalLM(cfg)
    elif arch in ("mistral-window", "gemma2", "gemma3"):
        # Sliding-window attention (Mistral's every layer; Gemma 2's alternate; Gemma 3's 3 local : 1 global
        # here), with a window of `window` tokens: a hybrid cache of DynamicSlidingWindowLayer layers.
        shape = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=hidden // 2, max_position_embeddings=256, sliding_window=window,
                     **common)
        if arch == "mistral-window":
            model = tf.MistralForCausalLM(tf.MistralConfig(**shape))
        elif arch == "gemma2":
            model = tf.Gemma2ForCausalLM(tf.Gemma2Config(**shape))
        else:
            types = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(layers)]
            model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(layer_types=types, **shape))
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
    model = model.to(dtype)
    if eval_mode:
        model.eval()
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


def greedy_reference(model: Any, prompt: list[int], max_new_tokens: int, eos_id: int | None) -> list[int]:
    """The plain greedy decode to check generation against: one full forward per token (no padding, no cache),
    up to and including the first ``eos_id``."""
    import torch

    ids, out = list(prompt), []
    for _ in range(max_new_tokens):
        with torch.no_grad():
            nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        out.append(nxt)
        ids.append(nxt)
        if nxt == eos_id:
            break
    return out
