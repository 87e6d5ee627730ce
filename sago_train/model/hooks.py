"""Forward hooks on a causal LM: :class:`BlockOutputs`, the one hook on decoder blocks' outputs (the residual
stream), used by evaluation (pooled activations) and by training (:class:`HiddenCapture`: the decoder-block
outputs and final hidden states the stability loss needs, never ``output_hidden_states=True`` for the whole
stack, and the target-predicting rows of the LM head's output), and the LM head applied to captured final
hidden states."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..errors import SagoInputError
from .layers import block_output, get_decoder_layers


def _unwrap(model: nn.Module) -> nn.Module:
    """The transformers model inside DDP/FSDP/PEFT wrappers."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def _backbone(model: nn.Module) -> nn.Module:
    inner = _unwrap(model)
    prefix = getattr(inner, "base_model_prefix", None)
    backbone = getattr(inner, prefix, None) if prefix else None
    if not isinstance(backbone, nn.Module):
        raise SagoInputError(
            f"could not find the backbone of {type(inner).__name__} (the module under base_model_prefix)",
            hint="the confidence term needs the final hidden states of a transformers causal LM",
        )
    return backbone


class BlockOutputs:
    """Context manager: a forward hook on each chosen decoder block that hands the block's output (its
    residual-stream hidden states ``[B, S, H]``, whatever the block returns around them) to
    ``on_output(layer, hidden)``; the hooks are removed on exit. ``layers`` are indices into
    :func:`~sago_train.model.layers.get_decoder_layers` (already resolved).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> m = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        ...     num_attention_heads=2, num_key_value_heads=2, vocab_size=50))
        >>> seen = {}
        >>> with BlockOutputs(m, [1], lambda layer, h: seen.__setitem__(layer, tuple(h.shape))):
        ...     _ = m(torch.tensor([[1, 2, 3]]))
        >>> seen
        {1: (1, 3, 16)}
    """

    def __init__(self, model: nn.Module, layers: Sequence[int], on_output: Any) -> None:
        self.model = model
        self.layers = list(layers)
        self.on_output = on_output
        self._handles: list[Any] = []

    def __enter__(self) -> BlockOutputs:
        if self.layers:
            blocks = get_decoder_layers(self.model)
            for layer in self.layers:
                self._handles.append(blocks[layer].register_forward_hook(
                    lambda _m, _i, out, layer=layer: self.on_output(layer, block_output(out))))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class _TapRows(torch.autograd.Function):
    """``(x, x[rows, pos])`` with one backward for both: the rows' gradient is added into the gradient of
    ``x`` that arrives from ``x``'s other consumers (the task loss), rather than autograd building a
    zero-filled ``x``-sized gradient for the selection and adding the two (an ``x``-sized buffer more at the
    task loss's backward, and a fill and an addition over ``x``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        ctx.save_for_backward(rows, pos)
        ctx.set_materialize_grads(False)
        ctx.shape, ctx.dtype = x.shape, x.dtype
        return x.view_as(x), x[rows, pos]

    @staticmethod
    def backward(ctx, grad_x: torch.Tensor | None, grad_rows: torch.Tensor | None) -> tuple[torch.Tensor | None, None, None]:  # type: ignore[override]
        if grad_rows is None:
            return grad_x, None, None
        rows, pos = ctx.saved_tensors
        if grad_x is None:
            return grad_rows.new_zeros(ctx.shape).index_put_((rows, pos), grad_rows, accumulate=True), None, None
        # Out of place: the incoming gradient may be shared with another branch of the graph (an addition
        # hands the same tensor to both operands), so it is never modified.
        return grad_x.index_put((rows, pos), grad_rows.to(grad_x.dtype), accumulate=True), None, None


class HiddenCapture:
    """Context manager: forward hooks that keep the output of the chosen decoder blocks (and, optionally,
    the backbone's final hidden state) for one forward pass.

    The first capture of each module wins; later firings inside the window (a second forward without
    gradient, a block re-run) are counted in ``repeats`` and ignored. Hooks are removed on exit, so
    activation-checkpointing recomputation during backward never reaches them.

    ``head_index`` (``(row_index, pos_index)`` into an output of ``head_shape`` ``(N, S)``, as
    :func:`~sago_train.training.batch.predicting_index` makes them) also hooks the LM head: its output goes
    on through an identity autograd function that also returns ``output[row_index, pos_index]``
    (``head_output``, ``head_rows``), selected *during* the forward. The values are those the loss would
    select from the returned logits afterwards; the difference is the backward: the rows' gradient is added
    into the task loss's logits gradient once that exists, instead of autograd building a second
    logits-sized, zero-filled gradient alive during the task loss's backward (5% of a LoRA step's peak
    memory at a 49k vocabulary, and a fill and an addition over the logits). The loss uses ``head_rows``
    only when ``head_output`` *is* the logits tensor the model returned.

    Example:
        >>> with HiddenCapture(model, [0, 3]) as cap:  # doctest: +SKIP
        ...     model(**inputs)
        >>> cap.hidden[3].shape  # doctest: +SKIP
        torch.Size([6, 20, 64])
    """

    def __init__(
        self,
        model: nn.Module,
        layers: Sequence[int],
        final_hidden: bool = False,
        head_index: tuple[torch.Tensor, torch.Tensor] | None = None,
        head_shape: tuple[int, int] | None = None,
    ) -> None:
        self.model = model
        self.layers = list(layers)
        self.final_hidden = final_hidden
        self.head_index = head_index if head_shape is not None else None
        self.head_shape = head_shape
        self.hidden: dict[int, torch.Tensor] = {}
        self.final: torch.Tensor | None = None
        self.head_output: torch.Tensor | None = None
        self.head_rows: torch.Tensor | None = None
        self.repeats = 0
        self.ran_without_grad = False
        self._handles: list[Any] = []
        self._blocks: BlockOutputs | None = None
        self._grad_expected = False

    def _record(self, key: int | str, value: torch.Tensor) -> None:
        store_has = self.final is not None if key == "final" else key in self.hidden
        if store_has:
            self.repeats += 1
            return
        if self._grad_expected and not torch.is_grad_enabled():
            # The block ran under no_grad inside a forward that expects gradients: a reentrant checkpoint
            # wraps the module call (the graph is only built on recomputation, too late for this loss).
            self.ran_without_grad = True
        if key == "final":
            self.final = value
        else:
            self.hidden[int(key)] = value

    def __enter__(self) -> HiddenCapture:
        self._grad_expected = torch.is_grad_enabled() and self.model.training
        try:
            backbone = _backbone(self.model)
        except SagoInputError:
            backbone = None
        if backbone is not None:
            # Whether a forward builds a graph is decided where it starts (the backbone is never inside a
            # checkpoint), not where the window opens: a user may run a no_grad forward inside the window.
            def start_hook(module: nn.Module, _args: Any) -> None:
                if not self.hidden and self.final is None:
                    self._grad_expected = torch.is_grad_enabled() and module.training

            self._handles.append(backbone.register_forward_pre_hook(start_hook))
        if self.layers:
            self._blocks = BlockOutputs(self.model, self.layers, self._record).__enter__()
        if self.final_hidden and backbone is not None:

            def final_hook(_m: nn.Module, _i: Any, out: Any) -> None:
                last = getattr(out, "last_hidden_state", None)
                self._record("final", last if isinstance(last, torch.Tensor) else block_output(out))

            self._handles.append(backbone.register_forward_hook(final_hook))
        head = None
        if self.head_index is not None:
            get_head = getattr(_unwrap(self.model), "get_output_embeddings", None)
            head = get_head() if callable(get_head) else None
        if isinstance(head, nn.Module):
            self._handles.append(head.register_forward_hook(self._head_hook))
        # Without a recognizable backbone the final hidden state stays None and the confidence term falls
        # back to the logits of the outputs.
        return self

    def _head_hook(self, _m: nn.Module, _i: Any, out: Any) -> torch.Tensor | None:
        if self.head_output is not None or self.head_index is None:
            if self.head_output is not None:
                self.repeats += 1
            return None
        rows, pos = self.head_index
        # Only a full-sequence output of this batch ([N, S, V] with the batch's N and S, not a logits_to_keep
        # slice) has the rows at these positions; anything else leaves the loss on its usual path.
        if not (isinstance(out, torch.Tensor) and out.dim() == 3 and tuple(out.shape[:2]) == self.head_shape):
            return None
        if torch.is_grad_enabled() and out.requires_grad:
            # The model continues with the tap's output (the same values): see _TapRows.
            self.head_output, self.head_rows = _TapRows.apply(out, rows, pos)
            return self.head_output
        self.head_output, self.head_rows = out, out[rows, pos]
        return None

    def __exit__(self, *exc: object) -> None:
        if self._blocks is not None:
            self._blocks.__exit__(*exc)
            self._blocks = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def check(self) -> None:
        """Raise when the captures cannot carry gradients or are missing."""
        if self.ran_without_grad:
            raise SagoInputError(
                "the decoder blocks ran without gradients inside a training forward, which happens when a "
                "reentrant activation checkpoint wraps the blocks' hooks; the stability loss would get no gradient",
                hint="use activation_checkpointing_kwargs={'use_reentrant': False} "
                "(gradient_checkpointing_kwargs before transformers 5)",
            )
        missing = [layer for layer in self.layers if layer not in self.hidden]
        if missing:
            raise SagoInputError(f"decoder blocks {missing} did not run during the forward pass", key="layers")


def logits_from_hidden(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Apply the model's LM head to final hidden states, with the logit scaling / soft-capping its config
    declares (as transformers' and TRL's heads do). The confidence term projects only the target-predicting
    positions this way, which works whether or not the forward built the logits (TRL's fused LM head does
    not) and keeps its memory proportional to the target length rather than the sequence length."""
    inner = _unwrap(model)
    head = inner.get_output_embeddings()
    if head is None:
        raise SagoInputError(f"{type(inner).__name__} has no output embeddings (LM head)")
    logits = head(hidden)
    config = inner.config.get_text_config() if hasattr(inner.config, "get_text_config") else inner.config
    scale = getattr(config, "logit_scale", None)
    if scale is None:
        scale = getattr(config, "output_multiplier", None)
    if scale is None:
        scale = getattr(config, "lm_head_multiplier", None)
    if scale is None and getattr(config, "logits_scaling", None) is not None:
        scale = config.logits_scaling if config.model_type == "hyperclovax" else 1 / config.logits_scaling
    if scale is not None and scale != 1.0:
        logits = logits * scale
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits
