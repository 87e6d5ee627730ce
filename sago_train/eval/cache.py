"""What the extractor's one-prefill pass asks of a model's KV cache: that it can be expanded along the batch
(the shared prefix computed once serves every row) and cropped back (after scoring the reference, before
generating) without losing a state. transformers' ``DynamicCache`` of full-attention layers allows both. A
sliding-window layer (Mistral, Gemma 2/3 and other hybrid caches) keeps only the last ``window - 1`` states,
so it allows both exactly when the longest sequence of the call never reaches its window: then nothing is
evicted and its attention mask sees every state, as a full layer's does. Anything else (a static or quantized
cache, a window a call would overflow) is served by separate generation and scoring passes, said once."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..formatting import printable

logger = logging.getLogger("sago_train.eval.extraction")
_warned: set[str] = set()


class PrefillUnsupported(Exception):
    """This model's cache cannot be shared and cropped for this call; the caller uses separate passes."""


def cache_keyword(params: set[str]) -> str | None:
    """The forward's KV-cache argument: ``cache`` (transformers >= 5.2x) or ``past_key_values``."""
    return next((k for k in ("cache", "past_key_values") if k in params), None)


def cache_of(out: Any) -> Any:
    """The cache a forward returned."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def sliding_windows(model: nn.Module) -> list[int]:
    """The sliding-window sizes the model's attention layers use (empty when every layer is full attention).

    Example:
        >>> from transformers import MistralConfig, MistralForCausalLM
        >>> m = MistralForCausalLM(MistralConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...     num_attention_heads=2, num_key_value_heads=1, vocab_size=50, sliding_window=64))
        >>> sliding_windows(m)
        [64]
    """
    config = getattr(model, "config", None)
    if config is None:
        return []
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    if not isinstance(window, int) or window <= 0:
        return []
    types = getattr(text, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return []
    return [window]


def check_cache(cache: Any, longest: int) -> None:
    """Raise :class:`PrefillUnsupported` unless ``cache`` can be expanded and cropped without losing a state for
    sequences of up to ``longest`` tokens (prefix, padded prompt, reference and new tokens)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    if not isinstance(cache, DynamicCache):
        raise PrefillUnsupported(f"its cache is {type(cache).__name__}, not DynamicCache")
    for layer in cache.layers:
        if type(layer) is DynamicLayer:
            continue
        if type(layer) is DynamicSlidingWindowLayer:
            if longest <= layer.sliding_window - 1:  # never full: no state evicted, every state visible
                continue
            raise PrefillUnsupported(f"a call of {longest} tokens overflows its sliding window of "
                                     f"{layer.sliding_window}")
        raise PrefillUnsupported(f"its cache has {type(layer).__name__} layers")


def expand(cache: Any, batch: int) -> None:
    """The shared prefix's states for every row: a view along the batch (the first update concatenates the
    new states onto it anyway)."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys.expand(batch, -1, -1, -1)
            layer.values = layer.values.expand(batch, -1, -1, -1)


def positions(mask: torch.Tensor, start: int) -> torch.Tensor:
    """Position ids from the attention mask (its cumulative sum, as ``generate`` computes them), from column
    ``start`` on: padding between the prefix and a prompt changes no position."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)[:, start:]


def warn_fallback(model: nn.Module, reason: str) -> None:
    """Say once per model class that its prompts are computed twice, and why."""
    name = type(model).__name__
    if name not in _warned:
        _warned.add(name)
        logger.warning("sago_train: %s: prompts are computed twice (separate generation and scoring passes): %s",
                       name, printable(reason))


def shared_prefix_length(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest common token prefix, leaving every sequence at least one token of its own (the
    last prompt token must run in the batched forward, where the hooks and the logits read it).

    Example:
        >>> shared_prefix_length([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]])
        2
        >>> shared_prefix_length([[1, 2], [1, 2]])
        1
    """
    if not seqs:
        return 0
    limit = min(len(s) for s in seqs) - 1
    first = seqs[0]
    n = 0
    while n < limit and all(s[n] == first[n] for s in seqs):
        n += 1
    return max(n, 0)
