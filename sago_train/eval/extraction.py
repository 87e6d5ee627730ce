"""Model plumbing for SAGO evaluation: batched greedy generation and one scoring forward per batch.

``Extractor.run`` serves all three from one prefill per batch, the batch's shared prefix computed once
(:mod:`~sago_train.eval.shared_prefill`); ``generate`` and ``score`` below are the separate passes it falls back
to where a model's cache does not allow that.

The scoring forward runs ``x_k + r`` (prompt followed by the reference) once and yields both the pooled
hidden vectors of the chosen decoder blocks (captured by forward hooks, so only ``[B, H]`` per layer is
kept, never the whole stack) and the mean log-probability of ``r``. Because the model is causal, the
hidden state at the last prompt token does not depend on the appended reference.

Variants are sorted by length before batching (less padding); results are put back in input order, so
they do not depend on batch size, order or padding side.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import SagoInputError
from ..model.layers import block_output, get_decoder_layers
from ..model.tokenize import (
    pad_batch,
    pad_id_of,
)
from .config import DEFAULT_BATCH_SIZE


def _base_forward_params(model: nn.Module) -> set[str]:
    base = model
    if hasattr(base, "get_base_model"):
        base = base.get_base_model()
    return set(inspect.signature(base.forward).parameters)


def _batches(order: Sequence[int], batch_size: int) -> list[list[int]]:
    return [list(order[i : i + batch_size]) for i in range(0, len(order), batch_size)]


def _sync_batch_count(n: int) -> int:
    """Under torch.distributed every rank must run the same number of forwards (ZeRO-3/FSDP gather
    parameters collectively), so ranks with fewer batches repeat their last one."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return n
    if torch.distributed.get_world_size() == 1:
        return n
    t = torch.tensor([n], dtype=torch.long)
    if torch.distributed.get_backend() == "nccl":
        t = t.cuda()
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t.item())


@contextmanager
def eval_mode(model: nn.Module):
    """Put the model in eval mode for the duration and restore train/eval mode of every sub-module."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes.items():
            m.training = training


@dataclass
class ScoreOutput:
    """``hidden``: ``[N, L, H]`` float32 pooled vectors; ``mean_logprob``: ``[N]`` (NaN where the reference
    is empty)."""

    hidden: torch.Tensor | None
    mean_logprob: torch.Tensor | None


class Extractor:
    """Batched extraction from a causal LM.

    Example:
        >>> ex = Extractor(model, tokenizer, layers=[0, 3])  # doctest: +SKIP
        >>> texts = ex.generate([tokenizer("The capital of France is")["input_ids"]])  # doctest: +SKIP
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        layers: Sequence[int] = (),
        pooling: str = "last",
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_new_tokens: int = 32,
        stop_strings: Sequence[str] = (),
        progress: Callable[[int], None] | None = None,
    ) -> None:
        if pooling not in ("last", "mean"):
            raise SagoInputError(f"pooling must be 'last' or 'mean', got {pooling!r}", key="pooling")
        if batch_size < 1:
            raise SagoInputError(f"batch size must be at least 1, got {batch_size}", key="batch_size")
        self.model = model
        self.tokenizer = tokenizer
        self.layers = list(layers)
        self.pooling = pooling
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.stop_strings = [s for s in stop_strings if s]
        self.pad_id = pad_id_of(tokenizer)
        self.progress = progress
        self._blocks = get_decoder_layers(model) if self.layers else None
        self.forward_params = _base_forward_params(model)
        self._logits_to_keep = "logits_to_keep" in self.forward_params

    @property
    def device(self) -> torch.device:
        try:
            return next(self.model.parameters()).device
        except StopIteration:
            return torch.device("cpu")

    def _tick(self, n: int) -> None:
        if self.progress is not None:
            self.progress(n)

    # ------------------------------------------------------------------ all at once
    def run(
        self,
        prompts: Sequence[Sequence[int]],
        continuations: Sequence[Sequence[int] | None] | None = None,
        *,
        want_hidden: bool = True,
        want_generation: bool = False,
        tick_per_row: int = 1,
    ) -> tuple[ScoreOutput, list[str] | None]:
        """Pooled hidden vectors, continuation log-probabilities (NaN where a continuation is None or
        empty) and greedy continuations from one prefill per batch, the batch's shared prefix run once
        (``shared_prefill``); falls back to separate ``generate`` and ``score`` passes where the model's
        cache does not allow it."""
        from .shared_prefill import run_all

        return run_all(self, prompts, continuations, want_hidden=want_hidden, want_generation=want_generation,
                       tick_per_row=tick_per_row)

    # ------------------------------------------------------------------ generation
    def _generation_config(self) -> Any:
        from transformers import GenerationConfig

        eos = getattr(self.tokenizer, "eos_token_id", None)
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            num_beams=1,
            pad_token_id=self.pad_id,
            eos_token_id=gen_eos if gen_eos is not None else eos,
            use_cache=True,
            # Stop strings end a row's generation (its later tokens are padding); _truncate cuts the text.
            stop_strings=list(self.stop_strings) or None,
        )

    def _truncate(self, text: str) -> str:
        for stop in self.stop_strings:
            cut = text.find(stop)
            if cut >= 0:
                text = text[:cut]
        return text

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]]) -> list[str]:
        """Greedy continuations of tokenized prompts (left-padded batches), decoded without special tokens."""
        order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
        batches = _batches(order, self.batch_size)
        n_runs = _sync_batch_count(len(batches))
        if not batches:
            if n_runs == 0:
                return []
            # This rank has nothing to do but must join the other ranks' collective forwards.
            prompts, batches = [[self.pad_id]], [[0]]
        config = self._generation_config()
        eos_ids = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
        stop_ids = {i for i in eos_ids if i is not None}
        out: list[str] = [""] * (len(prompts) if order else 0)
        device = self.device
        with eval_mode(self.model):
            for b in range(n_runs):
                idx = batches[min(b, len(batches) - 1)]
                ids, mask = pad_batch([prompts[i] for i in idx], self.pad_id, side="left")
                width = ids.shape[1]
                extra = {"tokenizer": self.tokenizer} if self.stop_strings else {}
                gen = self.model.generate(
                    input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config, **extra
                )
                if b >= len(batches) or not out:
                    continue  # a repeat that only keeps distributed ranks in step
                new = gen[:, width:].tolist()
                for r, i in enumerate(idx):
                    toks = new[r]
                    cut = next((j for j, t in enumerate(toks) if t in stop_ids), len(toks))
                    text = self.tokenizer.decode(toks[:cut], skip_special_tokens=True)
                    out[i] = self._truncate(text)
                self._tick(len(idx))
        return out

    # ------------------------------------------------------------------ scoring
    @torch.no_grad()
    def score(
        self,
        prompts: Sequence[Sequence[int]],
        continuations: Sequence[Sequence[int]] | None = None,
        *,
        want_hidden: bool = True,
    ) -> ScoreOutput:
        """One forward per batch over ``prompt + continuation``: pooled hidden vectors at ``self.layers``
        and the mean log-probability of each continuation (NaN when it is empty)."""
        n = len(prompts)
        conts = continuations if continuations is not None else [[] for _ in range(n)]
        want_lp = continuations is not None
        want_hidden = want_hidden and bool(self.layers)
        lengths = [len(p) + len(c) for p, c in zip(prompts, conts)]
        order = sorted(range(n), key=lambda i: (lengths[i], i))
        batches = _batches(order, self.batch_size)
        n_runs = _sync_batch_count(len(batches))
        if not batches:
            if n_runs == 0:
                return ScoreOutput(None, None)
            # Nothing local, but the other ranks' collective forwards need this rank too.
            prompts, conts, lengths, batches, real = [[self.pad_id]], [[]], [1], [[0]], 0
        else:
            real = len(batches)
        hidden_out: torch.Tensor | None = None
        lp_out = torch.full((n,), math.nan, dtype=torch.float64) if want_lp else None
        device = self.device
        captured: dict[int, torch.Tensor] = {}
        pool_state: dict[str, torch.Tensor] = {}

        def make_hook(layer: int) -> Callable[..., None]:
            def hook(_module: nn.Module, _inputs: Any, output: Any) -> None:
                h = block_output(output)
                if self.pooling == "last":
                    rows = torch.arange(h.shape[0], device=h.device)
                    vec = h[rows, pool_state["last"]]
                else:
                    m = pool_state["prompt_mask"].float().unsqueeze(-1)
                    vec = (h.float() * m).sum(1) / m.sum(1).clamp_min(1)  # SPEC: float32, also under bf16
                captured[layer] = vec.float()

            return hook

        handles = []
        if want_hidden and self._blocks is not None:
            handles = [self._blocks[layer].register_forward_hook(make_hook(layer)) for layer in self.layers]
        try:
            with eval_mode(self.model):
                for b in range(n_runs):
                    idx = batches[min(b, len(batches) - 1)]
                    ids, mask = pad_batch([list(prompts[i]) + list(conts[i]) for i in idx], self.pad_id)
                    width = ids.shape[1]
                    prompt_mask = torch.zeros((len(idx), width), dtype=torch.bool)
                    for r, i in enumerate(idx):
                        prompt_mask[r, : len(prompts[i])] = True
                    last = torch.tensor([len(prompts[i]) - 1 for i in idx], dtype=torch.long)
                    pool_state["last"] = last.to(device)
                    pool_state["prompt_mask"] = prompt_mask.to(device)
                    kwargs: dict[str, Any] = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
                    kwargs["use_cache"] = False
                    # Logits are needed only from the last prompt token on; with right padding that is a
                    # suffix of the sequence, so the LM head can skip the rest.
                    keep = width - int(last.min()) if want_lp else 1
                    if self._logits_to_keep:
                        kwargs["logits_to_keep"] = keep
                    captured.clear()
                    logits = self.model(**kwargs).logits
                    if b >= real:
                        continue
                    offset = width - logits.shape[1]
                    if want_hidden:
                        stacked = torch.stack([captured[layer] for layer in self.layers], dim=1).cpu()
                        if hidden_out is None:
                            hidden_out = torch.zeros((n, len(self.layers), stacked.shape[-1]), dtype=torch.float32)
                        hidden_out[idx] = stacked
                    if want_lp and lp_out is not None:
                        for r, i in enumerate(idx):
                            c = conts[i]
                            if not c:
                                continue
                            start = len(prompts[i]) - 1 - offset
                            rows = logits[r, start : start + len(c)].float()
                            logp = torch.log_softmax(rows, dim=-1)
                            target = torch.tensor(c, dtype=torch.long, device=logp.device)
                            lp_out[i] = float(logp.gather(-1, target[:, None]).double().mean())
                    self._tick(len(idx))
        finally:
            for h in handles:
                h.remove()
        return ScoreOutput(hidden_out, lp_out)
