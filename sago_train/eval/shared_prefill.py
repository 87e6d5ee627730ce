"""Each prompt token computed once: one prefill per batch serves activations, confidence and generation.

Per batch of variants (sorted by length, as the scoring and generation passes are):
1. the token prefix that every prompt of the batch shares (a chat template's system turn, a few-shot
   preamble) runs once, as a batch of one, and its KV cache is expanded (a view, not a copy) to the batch;
2. the rest of each prompt runs on top of it, padded *between* the prefix and the suffix, so that every
   prompt ends at the same column: forward hooks read the last prompt token's hidden state there, and the
   logits there give the first reference token's log-probability;
3. the reference (minus its last token) runs on top of the prompt cache, giving the rest of its
   log-probabilities; the cache is then cropped back to the prompt;
4. ``generate`` continues greedily from that cache (prefix caching: it recomputes only the last prompt
   token, because it needs that token's logits).

Positions follow the attention mask (cumulative sum, as ``generate`` computes them), so the middle padding
changes no value. Where the model's cache is not a plain ``DynamicCache`` (or a sliding-window one whose
window covers the whole context), or pooling is ``mean`` (it needs the prefix's hidden states), the
extractor falls back to its separate generation and scoring passes and says so once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..model.layers import block_output
from ..model.tokenize import context_length, pad_batch

if TYPE_CHECKING:
    from .extraction import Extractor

logger = logging.getLogger(__name__)
_warned: set[str] = set()


class PrefillUnsupported(Exception):
    """This model's cache cannot be shared and cropped; the caller falls back to separate passes."""


@dataclass
class PrefillOutput:
    """``hidden``: ``[N, L, H]`` float32 or None; ``mean_logprob``: ``[N]`` (NaN where nothing was scored) or
    None; ``outputs``: greedy continuations or None."""

    hidden: torch.Tensor | None
    mean_logprob: torch.Tensor | None
    outputs: list[str] | None


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


def fallback_reason(extractor: Extractor) -> str | None:
    """Why the shared prefill cannot serve this extractor before any forward runs, or None."""
    if extractor.pooling != "last":
        return f"pooling={extractor.pooling!r} needs every prompt token's hidden state"
    params = extractor.forward_params
    if cache_keyword(params) is None or "position_ids" not in params:
        return "the model's forward takes no cache or no position_ids"
    return None


def cache_keyword(params: set[str]) -> str | None:
    """The forward's KV-cache argument: ``cache`` (transformers >= 5.2x) or ``past_key_values``."""
    return next((k for k in ("cache", "past_key_values") if k in params), None)


def _cache_of(out: Any) -> Any:
    return getattr(out, "cache", None) if getattr(out, "cache", None) is not None else getattr(out, "past_key_values", None)


def check_cache(cache: Any, model: nn.Module) -> None:
    """Raise PrefillUnsupported unless ``cache`` can be expanded and cropped without losing states."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer


    if not isinstance(cache, DynamicCache):
        raise PrefillUnsupported(f"its cache is {type(cache).__name__}, not DynamicCache")
    ctx = context_length(model)
    for layer in cache.layers:
        if type(layer) is DynamicLayer:
            continue
        # A window at least as long as the context never evicts a state, so cropping stays exact.
        if type(layer) is DynamicSlidingWindowLayer and ctx is not None and layer.sliding_window > ctx:
            continue
        raise PrefillUnsupported(f"its cache has {type(layer).__name__} layers")


def warn_fallback(model: nn.Module, reason: str) -> None:
    name = type(model).__name__
    if name not in _warned:
        _warned.add(name)
        logger.warning("sago_train: %s: prompts are computed twice (separate generation and scoring passes): %s",
                       name, reason)


def _expand(cache: Any, batch: int) -> None:
    # A view along the batch: the first update concatenates the new states onto it anyway.
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys.expand(batch, -1, -1, -1)
            layer.values = layer.values.expand(batch, -1, -1, -1)


def _positions(mask: torch.Tensor, start: int) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp_min(0)[:, start:]


@torch.no_grad()
def run_prefilled(
    ex: Extractor,
    prompts: Sequence[Sequence[int]],
    conts: Sequence[Sequence[int] | None] | None,
    *,
    want_hidden: bool,
    want_generation: bool,
    tick_per_row: int,
) -> PrefillOutput:
    """Activations, reference log-probabilities (rows whose continuation is None or empty get NaN) and
    greedy continuations, each prompt token computed once per batch (see the module docstring)."""
    from .extraction import _batches, _sync_batch_count, eval_mode

    model, pad, device = ex.model, ex.pad_id, ex.device
    n = len(prompts)
    want_hidden = want_hidden and bool(ex.layers) and ex._blocks is not None
    want_lp = conts is not None
    order = sorted(range(n), key=lambda i: (len(prompts[i]), i))
    batches = _batches(order, ex.batch_size)
    n_runs = _sync_batch_count(len(batches))
    real = len(batches)
    if not batches:
        if n_runs == 0:
            return PrefillOutput(None, None, [] if want_generation else None)
        # Nothing local, but the other ranks' collective forwards need this rank too.
        prompts, conts, batches = [[pad, pad]], ([[]] if want_lp else None), [[0]]
    hidden_out: torch.Tensor | None = None
    lp_out = torch.full((n,), math.nan, dtype=torch.float64) if want_lp else None
    outputs: list[str] | None = [""] * n if want_generation else None
    captured: dict[int, torch.Tensor] = {}
    active = [False]

    def make_hook(layer: int):
        def hook(_module: nn.Module, _inputs: Any, output: Any) -> None:
            if active[0]:
                captured[layer] = block_output(output)[:, -1].float()

        return hook

    config = ex._generation_config() if want_generation else None
    stop_ids: set[int] = set()
    if config is not None:
        eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
        stop_ids = {i for i in eos if i is not None}
    handles = [ex._blocks[layer].register_forward_hook(make_hook(layer)) for layer in ex.layers] if want_hidden else []
    kw = cache_keyword(ex.forward_params)
    keep = {"logits_to_keep": 1} if ex._logits_to_keep else {}
    try:
        with eval_mode(model):
            for b in range(n_runs):
                idx = batches[min(b, len(batches) - 1)]
                rows = [list(prompts[i]) for i in idx]
                bsz = len(rows)
                p = shared_prefix_length(rows)
                cache = None
                if p:
                    prefix = torch.tensor([rows[0][:p]], dtype=torch.long, device=device)
                    out = model(input_ids=prefix, attention_mask=torch.ones_like(prefix), use_cache=True, **keep)
                    cache = _cache_of(out)
                    check_cache(cache, model)
                    _expand(cache, bsz)
                ids, smask = pad_batch([r[p:] for r in rows], pad, side="left")
                mask = torch.cat([torch.ones((bsz, p), dtype=torch.long), smask], dim=1).to(device)
                ids = ids.to(device)
                captured.clear()
                active[0] = True
                out = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask, p),
                            **{kw: cache}, use_cache=True, **keep)
                active[0] = False
                cache = _cache_of(out)
                if not p:
                    check_cache(cache, model)
                width = mask.shape[1]
                collect = b < real
                if want_hidden and collect:
                    stacked = torch.stack([captured[layer] for layer in ex.layers], dim=1).cpu()
                    if hidden_out is None:
                        hidden_out = torch.zeros((n, len(ex.layers), stacked.shape[-1]), dtype=torch.float32)
                    hidden_out[idx] = stacked
                if want_lp:
                    cs = [list(conts[i] or []) for i in idx]
                    first = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
                    sums = [float(first[r, c[0]]) if c else 0.0 for r, c in enumerate(cs)]
                    rest = max(len(c) for c in cs) - 1
                    if rest > 0:
                        feed, fmask = pad_batch([c[:-1] for c in cs], pad, side="right")
                        fmask = torch.where(torch.tensor([len(c) > 1 for c in cs])[:, None], fmask, 0)
                        mask2 = torch.cat([mask, fmask.to(device)], dim=1)
                        logits = model(input_ids=feed.to(device), attention_mask=mask2,
                                       position_ids=_positions(mask2, width), **{kw: cache},
                                       use_cache=True).logits
                        logp = torch.log_softmax(logits.float(), dim=-1)
                        for r, c in enumerate(cs):
                            if len(c) > 1:
                                tgt = torch.tensor(c[1:], dtype=torch.long, device=logp.device)
                                sums[r] += float(logp[r, : len(c) - 1].gather(-1, tgt[:, None]).double().sum())
                        cache.crop(-rest)
                    if collect and lp_out is not None:
                        for r, (i, c) in enumerate(zip(idx, cs)):
                            if c:
                                lp_out[i] = sums[r] / len(c)
                if want_generation:
                    # generate() needs the last prompt token's logits, so it recomputes that one token.
                    cache.crop(-1)
                    full = torch.cat([torch.tensor(rows[0][:p], dtype=torch.long, device=device).expand(bsz, p),
                                      ids], dim=1)
                    extra = {"tokenizer": ex.tokenizer} if ex.stop_strings else {}
                    gen = model.generate(input_ids=full, attention_mask=mask, **{kw: cache},
                                         generation_config=config, **extra)
                    if collect and outputs is not None:
                        new = gen[:, width:].tolist()
                        for r, i in enumerate(idx):
                            toks = new[r]
                            cut = next((j for j, t in enumerate(toks) if t in stop_ids), len(toks))
                            outputs[i] = ex._truncate(ex.tokenizer.decode(toks[:cut], skip_special_tokens=True))
                del cache
                if collect:
                    ex._tick(len(idx) * tick_per_row)
    finally:
        for h in handles:
            h.remove()
    return PrefillOutput(hidden_out, lp_out, outputs)


def run_all(
    ex: Extractor,
    prompts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int] | None] | None,
    *,
    want_hidden: bool,
    want_generation: bool,
    tick_per_row: int,
) -> tuple[Any, list[str] | None]:
    """``Extractor.run``: the shared prefill, or the separate passes where it cannot serve (said once)."""
    from .extraction import ScoreOutput

    reason = fallback_reason(ex)
    if reason is None:
        try:
            got = run_prefilled(ex, prompts, continuations, want_hidden=want_hidden,
                                want_generation=want_generation, tick_per_row=tick_per_row)
            return ScoreOutput(got.hidden, got.mean_logprob), got.outputs
        except PrefillUnsupported as err:  # raised at the first batch, before any result is kept
            reason = str(err)
    warn_fallback(ex.model, reason)
    outputs = ex.generate(prompts) if want_generation else None
    scored = ScoreOutput(None, None)
    if want_hidden or continuations is not None:
        conts = None if continuations is None else [list(c or []) for c in continuations]
        scored = ex.score(prompts, conts, want_hidden=want_hidden)
    return scored, outputs
