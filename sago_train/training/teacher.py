"""The consistency mode's teachers (docs/stability-loss.md#consistency): whose next-token distributions the
variants are pulled towards, and who answers unlabeled prompts.

- ``self``: the model being trained (its canonical rows, detached; no extra forward for the loss);
- ``frozen``: the model as training started: a PEFT model with its adapter disabled (no second model), or for a
  full model a frozen copy made when the trainer is built (a second model in memory);
- ``ema``: an exponential moving average of the *trainable* parameters (for LoRA the adapter's: one copy of
  them), updated after each optimizer step by :class:`EmaTeacherCallback` and swapped in, under ``no_grad``,
  for the teacher's forward.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback

from ..errors import SagoInputError
from .batch import GroupLayout, predicting_index


def _is_peft(model: nn.Module) -> bool:
    return callable(getattr(model, "disable_adapter", None)) and hasattr(model, "peft_config")


def _takes_logits_to_keep(model: nn.Module) -> bool:
    """Whether the (PEFT-unwrapped) model's forward takes ``logits_to_keep`` as positions (transformers' causal
    LMs do); other modules get full logits."""
    inner = model.get_base_model() if _is_peft(model) else model  # type: ignore[operator]
    try:
        return "logits_to_keep" in inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return False


def check_sharding(kind: str, model: nn.Module, *, fsdp: bool, zero3: bool) -> None:
    """Refuse the teachers that would be silently wrong when parameters are sharded after the trainer is built:
    an EMA teacher holds the parameters as they were before FSDP / ZeRO-3 replaced them (it would average weights
    that no longer train), and a frozen copy of a full model would copy ZeRO-3's empty placeholders.

    Example:
        >>> import torch
        >>> check_sharding("self", torch.nn.Linear(2, 2), fsdp=True, zero3=False)  # nothing to refuse
    """
    if not (fsdp or zero3):
        return
    where = "FSDP" if fsdp else "DeepSpeed ZeRO-3"
    if kind == "ema" or (kind == "frozen" and not _is_peft(model)):
        what = "an EMA teacher" if kind == "ema" else "a frozen copy of a full model"
        raise SagoInputError(
            f"teacher={kind!r} is not supported under {where}: {what} is built before the parameters are sharded "
            "and would not follow them", key="teacher",
            hint="use teacher='self' (no extra state), teacher='frozen' with a PEFT adapter, or DDP / ZeRO-2")


class Teacher:
    """The teacher of the consistency mode, for one (unwrapped) model.

    Example:
        >>> import torch
        >>> net = torch.nn.Linear(2, 1)
        >>> t = Teacher("ema", net, decay=0.5)
        >>> with torch.no_grad():
        ...     _ = net.weight.add_(2.0)
        >>> before = t.shadow[0].clone()
        >>> t.update()
        >>> torch.allclose(t.shadow[0], 0.5 * before + 0.5 * net.weight)
        True
    """

    def __init__(self, kind: str, model: nn.Module, decay: float = 0.99) -> None:
        if kind not in ("self", "frozen", "ema"):
            raise SagoInputError(f"unknown teacher {kind!r}", key="teacher", hint="use 'self', 'frozen' or 'ema'")
        self.kind = kind
        self.decay = float(decay)
        self.copy: nn.Module | None = None
        self.params: list[nn.Parameter] = []
        self.shadow: list[torch.Tensor] = []
        if kind == "frozen" and not _is_peft(model):
            # Documented (docs/stability-loss.md): without an adapter to disable, "the model at the start" is a copy.
            size = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
            warnings.warn(f"teacher='frozen' on a model without a PEFT adapter keeps a frozen copy of it: a second "
                          f"model in memory ({size:.0f} MiB of parameters)", stacklevel=3)
            self.copy = copy.deepcopy(model).eval().requires_grad_(False)
        if kind == "ema":
            self.params = [p for p in model.parameters() if p.requires_grad]
            if not self.params:
                raise SagoInputError("teacher='ema' averages the trainable parameters, and the model has none",
                                     key="teacher")
            self.shadow = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        """``shadow = decay * shadow + (1 - decay) * param`` (after an optimizer step; EMA only)."""
        self._follow_device()
        for s, p in zip(self.shadow, self.params):
            s.lerp_(p.detach().to(s.dtype), 1.0 - self.decay)

    def _follow_device(self) -> None:
        # DeepSpeed (and bf16_full_eval) place the model on its device after the trainer is built, so the average
        # or the frozen copy made at construction can be on the CPU while the parameters are not.
        for i, (s, p) in enumerate(zip(self.shadow, self.params)):
            if s.device != p.device:
                self.shadow[i] = s.to(p.device)

    @torch.no_grad()
    def _swap(self) -> None:
        self._follow_device()
        for s, p in zip(self.shadow, self.params):
            tmp = p.detach().clone()  # one parameter at a time: no second copy of all of them
            p.data.copy_(s)
            s.copy_(tmp)

    @contextmanager
    def active(self, model: nn.Module) -> Iterator[nn.Module]:
        """The module to run as the teacher (call it under ``no_grad``); ``model`` is the unwrapped model."""
        if self.kind == "self":
            yield model
        elif self.kind == "frozen" and self.copy is not None:
            device = next(model.parameters()).device
            if next(self.copy.parameters()).device != device:
                self.copy.to(device)
            yield self.copy
        elif self.kind == "frozen":
            with model.disable_adapter():  # type: ignore[operator]
                yield model
        else:
            self._swap()
            try:
                yield model
            finally:
                self._swap()

    @torch.no_grad()
    def logits(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               layout: GroupLayout) -> torch.Tensor:
        """The teacher's logits ``[G, T, V]`` predicting each response token, given each group's canonical prompt
        (one forward on the canonical rows only)."""
        g, k = layout.num_groups, layout.group_size
        rows = layout.order.view(g, k)[torch.arange(g, device=layout.order.device), layout.canonical]
        mask = None if attention_mask is None else attention_mask[rows]
        row_index, pos_index, _ = predicting_index(layout, input_ids.shape[1])  # [G, T, K]
        canonical_slot = layout.canonical[:, None].expand(g, pos_index.shape[1])
        pos = pos_index.gather(2, canonical_slot[..., None]).squeeze(-1)  # [G, T]
        with self.active(model) as teacher:
            # The LM head only where a response token is predicted: over a long prompt's positions its [V]-wide
            # projection is most of the teacher's extra cost (the frozen / EMA teacher's own forward).
            keep = torch.unique(pos) if _takes_logits_to_keep(teacher) else None
            out = None
            if keep is not None:
                try:
                    out = teacher(input_ids=input_ids[rows], attention_mask=mask, logits_to_keep=keep)
                except (TypeError, IndexError, RuntimeError):  # a forward that takes only a count of last positions
                    out = None
                logits = None if out is None else (out.logits if hasattr(out, "logits") else out[0])
                if logits is None or logits.dim() != 3 or logits.shape[1] != keep.numel():
                    out, keep = None, None  # not sliced by these positions: read the full logits instead
            if out is None:
                out = teacher(input_ids=input_ids[rows], attention_mask=mask)
        logits = out.logits if hasattr(out, "logits") else out[0]
        if keep is not None:
            pos = torch.searchsorted(keep, pos)  # the kept positions' indices in the sliced logits
        return logits[torch.arange(g, device=logits.device)[:, None], pos]

    @torch.no_grad()
    def answer(self, model: nn.Module, prompts: Sequence[list[int]], *, max_new_tokens: int, pad_id: int,
               eos_id: int | None) -> list[list[int]]:
        """The teacher's greedy answers (token ids, up to and including the first EOS) to ``prompts``."""
        device = next(model.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):  # left padding: every prompt ends where generation starts
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long, device=device)
            mask[i, width - len(p):] = 1
        from transformers import GenerationConfig

        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, pad_token_id=pad_id,
                                  eos_token_id=eos_id, use_cache=True)
        was_training = model.training
        model.eval()  # greedy means no dropout
        try:
            with self.active(model) as teacher:
                out = teacher.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        finally:
            model.train(was_training)
        answers = []
        for row in out[:, width:].tolist():
            cut = next((j + 1 for j, t in enumerate(row) if eos_id is not None and t == eos_id), len(row))
            answers.append(row[:cut] or ([eos_id] if eos_id is not None else [pad_id]))
        return answers


class EmaTeacherCallback(TrainerCallback):
    """Updates an EMA teacher after each optimizer step (``on_step_end``)."""

    def __init__(self, teacher: Teacher) -> None:
        self.teacher = teacher

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.teacher.update()
