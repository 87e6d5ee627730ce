"""Finding a causal LM's decoder blocks and resolving layer indices (docs/definitions.md#prompt-tokens); the
model in eval mode for a while, and the keywords its forward takes.

Shared by the evaluation extractor and the stability loss: both hook the output of decoder blocks.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..errors import SagoInputError


def num_decoder_layers(model: nn.Module) -> int:
    return len(get_decoder_layers(model))


def get_decoder_layers(model: nn.Module) -> nn.ModuleList:
    """Return the ``ModuleList`` of decoder blocks of any decoder-only transformers model.

    Works through PEFT wrappers and DDP/FSDP wrappers because it searches sub-modules: the block list is
    the ``ModuleList`` whose length equals ``config.num_hidden_layers`` (the largest one as a fallback).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> m = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=3,
        ...     num_attention_heads=2, num_key_value_heads=2, vocab_size=50))
        >>> len(get_decoder_layers(m))
        3
    """
    config = getattr(model, "config", None)
    if config is None and hasattr(model, "module"):
        config = getattr(model.module, "config", None)
    n = None
    if config is not None:
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        n = getattr(text_config, "num_hidden_layers", None)
    candidates = [m for _, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if n is not None:
        exact = [m for m in candidates if len(m) == n]
        if exact:
            return exact[0]
    if not candidates:
        raise SagoInputError(
            f"could not find the decoder blocks of {type(model).__name__}: no nn.ModuleList in the model",
            hint="sago_train supports decoder-only causal LMs from transformers",
        )
    return max(candidates, key=len)


def default_layers(num_layers: int) -> list[int]:
    """The default (docs/definitions.md#prompt-tokens): 4 evenly spaced blocks ending with the last."""
    return sorted({round((i + 1) * num_layers / 4) - 1 for i in range(4)} & set(range(num_layers)))


def check_layer_indices(value: Any, key: str = "layers") -> list[int] | None:
    """The one check of a ``layers`` setting (``SAGOConfig.layers``, ``StabilityConfig.layers``), on
    construction: None (the default, chosen by :func:`resolve_layers` once the model is known), one integer,
    a comma-separated string or a non-empty list of integers; returns a list of ints (or None). The range,
    which needs the model, is checked by :func:`resolve_layers`."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = [int(x) for x in value.split(",") if x.strip()]
        except ValueError:
            raise SagoInputError(f"expected comma-separated integers, got {value!r}", key=key) from None
    elif isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise SagoInputError(f"expected a non-empty list of layer indices, got {value!r}", key=key)
    for layer in value:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise SagoInputError(f"layer indices must be integers, got {layer!r}", key=key)
    return list(value)


def resolve_layers(layers: Sequence[int] | None, num_layers: int) -> list[int]:
    """Resolve layer indices (as checked by :func:`check_layer_indices`; negatives count from the end) to
    sorted, unique, 0-based block indices against a model of ``num_layers`` blocks. ``None`` gives the one
    default, :func:`default_layers`.

    Example:
        >>> resolve_layers([0, -1], 4)
        [0, 3]
        >>> resolve_layers(None, 8)
        [1, 3, 5, 7]
    """
    if layers is None:
        return default_layers(num_layers)
    out = []
    for layer in layers:
        if not -num_layers <= layer < num_layers:
            raise SagoInputError(
                f"layer {layer} is out of range for a model with {num_layers} decoder blocks",
                key="layers",
                hint=f"use 0..{num_layers - 1} or -{num_layers}..-1",
            )
        out.append(layer % num_layers)
    if not out:  # a caller that skipped check_layer_indices
        raise SagoInputError("no layers given", key="layers")
    return sorted(set(out))


def block_output(output: object) -> torch.Tensor:
    """The residual-stream tensor a decoder block returns (blocks return a tensor or a tuple)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"unexpected decoder block output of type {type(output).__name__}")


def base_forward_params(model: nn.Module) -> set[str]:
    """The keyword arguments the forward of ``model`` (a PEFT model's base model) takes."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(inspect.signature(base.forward).parameters)


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put the model in eval mode for the duration and restore train/eval mode of every sub-module."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes.items():
            m.training = training
