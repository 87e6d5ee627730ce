"""Turning variants into token ids, shared by evaluation and training: the pad id, chat rendering (and when
it applies), the encoding of a prompt and of its continuation, padding a batch, a model's context length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..data.groups import Variant
from ..errors import SagoInputError, unknown_name_error

#: How string variants are fed to the model (docs/definitions.md#chat-rendering).
CHAT_TEMPLATE_MODES = ("auto", "always", "never")


def pad_id_of(tokenizer: Any) -> int:
    """The id used for padding: the tokenizer's pad token, else EOS, else 0."""
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0


def _special_tokens(tokenizer: Any) -> list[str]:
    specials = set(getattr(tokenizer, "all_special_tokens", None) or [])
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    specials |= {t.content for t in added.values() if getattr(t, "special", False)}
    return [t for t in specials if t]


def resolve_chat_template(mode: str, tokenizer: Any) -> str:
    """``always`` or ``never``: how string variants are fed (docs/definitions.md#chat-rendering).

    ``auto`` is ``always`` when the tokenizer's chat template marks turns with special tokens, as every
    instruct model's does (``<|im_start|>``, ``<|start_header_id|>``, BOS...); a template of plain text only
    (the shipped tiny model's ``User: ...\nAssistant:``) is a formatting convention rather than the format
    the model was trained to answer in, so its string variants are fed as they are.

    Example:
        >>> from sago_train.model.tiny import load_tiny_model
        >>> resolve_chat_template("auto", load_tiny_model()[1])  # doctest: +SKIP
        'never'
    """
    if mode not in CHAT_TEMPLATE_MODES:
        raise unknown_name_error("chat_template mode", mode, CHAT_TEMPLATE_MODES, key="chat_template")
    if mode == "never":
        return "never"
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if mode == "always":
        if not has_template:
            raise SagoInputError(
                "chat_template is 'always' but this tokenizer has no chat template",
                key="chat_template",
                hint="use chat_template 'never' or 'auto' (--chat-template on the command line), or a model whose "
                "tokenizer defines chat_template",
            )
        return "always"
    if not has_template:
        return "never"
    rendered = render_chat([{"role": "user", "content": "x"}], tokenizer)
    return "always" if any(t in rendered for t in _special_tokens(tokenizer)) else "never"


def render_chat(messages: list[dict[str, Any]], tokenizer: Any) -> str:
    """The chat template applied with the generation prompt, as text (docs/definitions.md#chat-rendering)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise SagoInputError(
            "chat-message variants need a tokenizer with a chat template, and this tokenizer has none",
            key="variants",
            hint="use string variants, or a model whose tokenizer defines chat_template",
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_variant(variant: Variant, tokenizer: Any, *, chat: bool = False) -> list[int]:
    """Prompt tokens (docs/definitions.md#prompt-tokens): a string variant's default encoding (special tokens as the tokenizer adds them),
    or, with ``chat`` and for every message-list variant, the chat template rendered with the generation
    prompt (a string becomes one user message).

    The rendered chat text already carries the template's special tokens, so it is encoded without adding
    more (as ``apply_chat_template(tokenize=True)`` does).
    """
    if isinstance(variant, str) and not chat:
        return list(tokenizer(variant)["input_ids"])
    messages = [{"role": "user", "content": variant}] if isinstance(variant, str) else variant
    text = render_chat(messages, tokenizer)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_continuation(text: str, tokenizer: Any) -> list[int]:
    """Tokens of a reference/continuation: encoded without special tokens (docs/definitions.md#confidence)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def end_id_of(tokenizer: Any) -> int | None:
    """The token that ends an answer: the tokenizer's EOS (the first of a list), else None."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return None if eos is None else int(eos)


class PromptRenderer:
    """The one rendering of prompts and targets into token ids, shared by evaluation (``SAGOEvaluator``) and
    training (``VariantGroupCollator``), so that a model is trained on the prompt format it is judged on.

    ``chat_template`` is the evaluator's rule (``auto`` / ``always`` / ``never``, resolved once against the
    tokenizer, :func:`resolve_chat_template`); ``stop_strings`` are the evaluator's stops, which end an answer
    span. A target is encoded without special tokens and followed by the end token (EOS) once: a target that
    already ends with it gets no second one.

    Example:
        >>> from sago_train.model.tiny import load_tiny_model
        >>> renderer = PromptRenderer(load_tiny_model()[1], "auto")  # doctest: +SKIP
        >>> renderer.chat_template  # doctest: +SKIP
        'never'
    """

    def __init__(self, tokenizer: Any, chat_template: str = "auto", stop_strings: Sequence[str] = ()) -> None:
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        self.tokenizer = tokenizer
        self.rule = chat_template
        #: ``always`` or ``never``: how string variants are fed.
        self.chat_template = resolve_chat_template(chat_template, tokenizer)
        self.stop_strings = [s for s in stop_strings if s]
        self.end_id = end_id_of(tokenizer)

    @property
    def chat(self) -> bool:
        """Whether string variants are rendered with the chat template."""
        return self.chat_template == "always"

    def prompt_ids(self, variant: Variant) -> list[int]:
        """Token ids of one variant prompt (:func:`encode_variant` under this rule)."""
        return encode_variant(variant, self.tokenizer, chat=self.chat)

    def target_ids(self, target: str, *, add_end: bool = True) -> list[int]:
        """Token ids of a target: no special tokens, then the end token once when ``add_end``."""
        ids = encode_continuation(target, self.tokenizer)
        if add_end and self.end_id is not None and (not ids or ids[-1] != self.end_id):
            ids = ids + [self.end_id]
        return ids

    def stop_inside(self, target: str) -> str | None:
        """A stop string that occurs inside ``target`` before its end (evaluation would cut the answer there),
        else None: a target that ends with a stop (" Paris." with the stop ".") is judged on all it says.

        Example:
            >>> r = PromptRenderer.__new__(PromptRenderer); r.stop_strings = (".",)
            >>> r.stop_inside(" Paris."), r.stop_inside(" St. Louis.")
            (None, '.')
        """
        body = target.strip()
        return next((s for s in self.stop_strings if s in (body[:-len(s)] if body.endswith(s) else body)), None)


def context_length(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text_config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` for token sequences padded to the longest one.

    Generation pads on the left (the new tokens follow every prompt directly); scoring pads on the right
    (positions then start at 0 for every row, so no position ids are needed).

    Example:
        >>> ids, mask = pad_batch([[5, 6], [7]], pad_id=0, side="left")
        >>> ids.tolist(), mask.tolist()
        ([[5, 6], [0, 7]], [[1, 1], [0, 1]])
    """
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, seq in enumerate(seqs):
        cols = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        ids[r, cols] = torch.tensor(list(seq), dtype=torch.long)
        mask[r, cols] = 1
    return ids, mask
