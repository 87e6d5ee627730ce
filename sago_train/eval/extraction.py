"""The extraction engine: from a causal LM, for tokenized prompts, the pooled hidden vectors of chosen decoder
blocks (activations), the mean log-probability of a continuation (confidence), and greedy continuations
(generation), each prompt token computed once.

:meth:`Extractor.run` serves all three from one prefill per batch of variants (sorted by length, so results
are put back in input order and do not depend on batch size, order or padding side):

1. the token prefix every prompt of the batch shares (a chat template's system turn, a few-shot preamble) runs
   once, as a batch of one, and its KV cache is expanded (a view, not a copy) to the batch;
2. the rest of each prompt runs on top of it, padded *between* the prefix and the suffix so that every prompt
   ends at the same column: the block-output hook reads the last prompt token's hidden state there, and the
   logits there give the first reference token's log-probability;
3. the reference (minus its last token) runs on top of the prompt cache, giving the rest of its
   log-probabilities; the cache is then cropped back to the prompt;
4. ``generate`` continues greedily from that cache (it recomputes only the last prompt token, for its logits).

Positions follow the attention mask, so the middle padding changes no value. Where the cache does not allow
this (see :mod:`~sago_train.eval.cache`), or pooling is ``mean`` (it needs the prefix's hidden states), the
separate passes :meth:`Extractor.generate` and :meth:`Extractor.score` serve instead, said once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import distributed
from ..errors import SagoInputError
from ..model.hooks import BlockOutputs
from ..model.layers import base_forward_params, eval_mode, get_decoder_layers
from ..model.tokenize import pad_batch, pad_id_of
from .cache import (
    PrefillUnsupported,
    cache_keyword,
    cache_of,
    check_cache,
    expand,
    positions,
    shared_prefix_length,
    sliding_windows,
    warn_fallback,
)
from .config import DEFAULT_BATCH_SIZE


def _batches(order: Sequence[int], batch_size: int) -> list[list[int]]:
    return [list(order[i: i + batch_size]) for i in range(0, len(order), batch_size)]


@dataclass
class ScoreOutput:
    """``hidden``: ``[N, L, H]`` float32 pooled vectors; ``mean_logprob``: ``[N]`` (NaN where the continuation
    is missing or empty)."""

    hidden: torch.Tensor | None
    mean_logprob: torch.Tensor | None


class Extractor:
    """Batched extraction from a causal LM (see the module doc).

    Example:
        >>> ex = Extractor(model, tokenizer, layers=[0, 3])  # doctest: +SKIP
        >>> scored, texts = ex.run([tokenizer("The capital of France is")["input_ids"]], want_generation=True)  # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, tokenizer: Any, *, layers: Sequence[int] = (), pooling: str = "last",
                 batch_size: int = DEFAULT_BATCH_SIZE, max_new_tokens: int = 32, stop_strings: Sequence[str] = (),
                 progress: Callable[[int], None] | None = None) -> None:
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
        if self.layers:
            get_decoder_layers(model)  # a model without decoder blocks fails here, before any forward
        self.forward_params = base_forward_params(model)
        self._logits_to_keep = "logits_to_keep" in self.forward_params
        # Sharded parameters (FSDP, ZeRO-3) are gathered inside every forward: then every rank must run the
        # same forwards, including decoding steps after its own rows have ended (see docs/distributed.md).
        self.collective = distributed.forward_is_collective(model)

    @property
    def device(self) -> torch.device:
        try:
            return next(self.model.parameters()).device
        except StopIteration:
            return torch.device("cpu")

    def _tick(self, n: int) -> None:
        if self.progress is not None:
            self.progress(n)

    # ------------------------------------------------------------------ generation settings and decoding
    def generation_config(self) -> Any:
        """Greedy decoding, ``max_new_tokens``, the model's EOS (else the tokenizer's), the stop strings."""
        from transformers import GenerationConfig

        eos = getattr(self.tokenizer, "eos_token_id", None)
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        return GenerationConfig(max_new_tokens=self.max_new_tokens, do_sample=False, num_beams=1,
                                pad_token_id=self.pad_id, eos_token_id=gen_eos if gen_eos is not None else eos,
                                use_cache=True,
                                # Stop strings end a row's generation (its later tokens are padding); decode cuts.
                                stop_strings=list(self.stop_strings) or None)

    def _generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: Any, **extra: Any) -> Any:
        stop = {"tokenizer": self.tokenizer} if self.stop_strings else {}
        # synced_gpus: decoding goes on (its rows already ended) until every rank's rows have ended. transformers
        # infers it from torch's FSDP markers or its own ZeRO-3 config; said here, it does not depend on them.
        synced = {"synced_gpus": True} if self.collective else {}
        return self.model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
                                   **stop, **synced, **extra)

    def decode(self, new_tokens: list[list[int]], config: Any) -> list[str]:
        """The one decoding of greedy continuations: each row up to its first EOS, without special tokens, cut
        before the first stop string."""
        eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
        stop_ids = {i for i in eos if i is not None}
        out = []
        for toks in new_tokens:
            cut = next((j for j, t in enumerate(toks) if t in stop_ids), len(toks))
            text = self.tokenizer.decode(toks[:cut], skip_special_tokens=True)
            for stop in self.stop_strings:
                at = text.find(stop)
                if at >= 0:
                    text = text[:at]
            out.append(text)
        return out

    # ------------------------------------------------------------------ all at once
    def run(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int] | None] | None = None, *,
            want_hidden: bool = True, want_generation: bool = False,
            tick_per_row: int = 1) -> tuple[ScoreOutput, list[str] | None]:
        """Pooled hidden vectors, continuation log-probabilities (NaN where a continuation is None or empty) and
        greedy continuations, from one prefill per batch; the separate passes where the cache does not allow
        it (said once)."""
        reason = self._prefill_unsupported(prompts, continuations, want_generation)
        if reason is None:
            try:
                return self._prefilled(prompts, continuations, want_hidden=want_hidden,
                                       want_generation=want_generation, tick_per_row=tick_per_row)
            except PrefillUnsupported as err:  # raised at the first batch, before any result is kept
                reason = str(err)
        warn_fallback(self.model, reason)
        outputs = self.generate(prompts) if want_generation else None
        scored = ScoreOutput(None, None)
        if want_hidden or continuations is not None:
            conts = None if continuations is None else [list(c or []) for c in continuations]
            scored = self.score(prompts, conts, want_hidden=want_hidden)
        return scored, outputs

    def _prefill_unsupported(self, prompts: Sequence[Sequence[int]],
                             continuations: Sequence[Sequence[int] | None] | None, want_generation: bool) -> str | None:
        """Why the one-prefill pass cannot serve this call, decided before any forward (the same on every rank),
        or None."""
        if self.pooling != "last":
            return f"pooling={self.pooling!r} needs every prompt token's hidden state"
        if cache_keyword(self.forward_params) is None or "position_ids" not in self.forward_params:
            return "the model's forward takes no cache or no position_ids"
        windows = sliding_windows(self.model)
        if windows:
            longest_prompt = max((len(p) for p in prompts), default=0)
            longest_cont = max((len(c or []) for c in continuations or []), default=0)
            longest = longest_prompt + max(longest_cont, self.max_new_tokens if want_generation else 0)
            (longest,) = distributed.max_over_ranks([longest])
            if longest > min(windows) - 1:
                return f"a call of {longest} tokens overflows its sliding window of {min(windows)}"
        return None

    @torch.no_grad()
    def _prefilled(self, prompts: Sequence[Sequence[int]], conts: Sequence[Sequence[int] | None] | None, *,
                   want_hidden: bool, want_generation: bool, tick_per_row: int) -> tuple[ScoreOutput, list[str] | None]:
        model, pad, device = self.model, self.pad_id, self.device
        n = len(prompts)
        want_hidden = want_hidden and bool(self.layers)
        want_lp = conts is not None
        order = sorted(range(n), key=lambda i: (len(prompts[i]), i))
        batches = _batches(order, self.batch_size)
        (n_runs,) = distributed.max_over_ranks([len(batches)])
        real = len(batches)
        if not batches:
            if n_runs == 0:
                return ScoreOutput(None, None), ([] if want_generation else None)
            # Nothing local, but the other ranks' collective forwards need this rank too.
            prompts, conts, batches = [[pad, pad]], ([[]] if want_lp else None), [[0]]
        hidden_out: torch.Tensor | None = None
        lp_out = torch.full((n,), math.nan, dtype=torch.float64) if want_lp else None
        outputs: list[str] | None = [""] * n if want_generation else None
        captured: dict[int, torch.Tensor] = {}
        active = [False]

        def last_token(layer: int, h: torch.Tensor) -> None:  # every prompt ends at the last column
            if active[0]:
                captured[layer] = h[:, -1].float()

        config = self.generation_config() if want_generation else None
        kw = cache_keyword(self.forward_params)
        keep = {"logits_to_keep": 1} if self._logits_to_keep else {}
        with BlockOutputs(model, self.layers if want_hidden else [], last_token), eval_mode(model):
            for b in range(n_runs):
                idx = batches[min(b, len(batches) - 1)]
                rows = [list(prompts[i]) for i in idx]
                bsz = len(rows)
                longest = max(len(r) for r in rows) + max(
                    max((len(conts[i] or []) for i in idx), default=0) if want_lp else 0,
                    self.max_new_tokens if want_generation else 0)
                p = shared_prefix_length(rows)
                rest = max(max((len(conts[i] or []) for i in idx), default=0) - 1, 0) if want_lp else 0
                if self.collective:  # the same forwards on every rank: a prefix pass if any rank has one
                    any_prefix, rest = distributed.max_over_ranks([int(p > 0), rest])
                    if any_prefix and not p:
                        model(input_ids=torch.tensor([[pad]], device=device), use_cache=False, **keep)
                cache = None
                if p:
                    prefix = torch.tensor([rows[0][:p]], dtype=torch.long, device=device)
                    cache = cache_of(model(input_ids=prefix, attention_mask=torch.ones_like(prefix), use_cache=True,
                                           **keep))
                    check_cache(cache, longest)
                    expand(cache, bsz)
                ids, smask = pad_batch([r[p:] for r in rows], pad, side="left")
                mask = torch.cat([torch.ones((bsz, p), dtype=torch.long), smask], dim=1).to(device)
                ids = ids.to(device)
                captured.clear()
                active[0] = True
                out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask, p), **{kw: cache},
                            use_cache=True, **keep)
                active[0] = False
                cache = cache_of(out)
                if not p:
                    check_cache(cache, longest)
                width = mask.shape[1]
                collect = b < real
                if want_hidden and collect:
                    stacked = torch.stack([captured[layer] for layer in self.layers], dim=1).cpu()
                    if hidden_out is None:
                        hidden_out = torch.zeros((n, len(self.layers), stacked.shape[-1]), dtype=torch.float32)
                    hidden_out[idx] = stacked
                if want_lp:
                    sums, lengths = self._score_continuations(out, cache, mask, [list(conts[i] or []) for i in idx],
                                                              kw, width, rest)
                    if collect and lp_out is not None:
                        for r, i in enumerate(idx):
                            if lengths[r]:
                                lp_out[i] = sums[r] / lengths[r]
                if want_generation:
                    cache.crop(-1)  # generate() needs the last prompt token's logits: it recomputes that token
                    full = torch.cat([torch.tensor(rows[0][:p], dtype=torch.long, device=device).expand(bsz, p),
                                      ids], dim=1)
                    gen = self._generate(full, mask, config, **{kw: cache})
                    if collect and outputs is not None:
                        for i, text in zip(idx, self.decode(gen[:, width:].tolist(), config)):
                            outputs[i] = text
                del cache
                if collect:
                    self._tick(len(idx) * tick_per_row)
        return ScoreOutput(hidden_out, lp_out), outputs

    def _score_continuations(self, out: Any, cache: Any, mask: torch.Tensor, cs: list[list[int]], kw: str,
                             width: int, rest: int) -> tuple[list[float], list[int]]:
        """Summed log-probabilities of each row's continuation on top of the prompt cache (the first token from
        the prompt's last logits, the rest from one more forward of ``rest`` columns: the longest continuation
        but one, or more to keep ranks in step, the extra columns masked), the cache cropped back to the
        prompt."""
        first = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        sums = [float(first[r, c[0]]) if c else 0.0 for r, c in enumerate(cs)]
        if rest > 0:
            feed, fmask = pad_batch([c[:-1] for c in cs], self.pad_id, side="right")
            if feed.shape[1] < rest:  # columns another rank needs, masked here
                feed = torch.nn.functional.pad(feed, (0, rest - feed.shape[1]), value=self.pad_id)
                fmask = torch.nn.functional.pad(fmask, (0, rest - fmask.shape[1]), value=0)
            fmask = torch.where(torch.tensor([len(c) > 1 for c in cs])[:, None], fmask, 0)
            mask2 = torch.cat([mask, fmask.to(mask.device)], dim=1)
            logits = self.model(input_ids=feed.to(mask.device), attention_mask=mask2, position_ids=positions(mask2, width),
                                **{kw: cache}, use_cache=True).logits
            logp = torch.log_softmax(logits.float(), dim=-1)
            for r, c in enumerate(cs):
                if len(c) > 1:
                    tgt = torch.tensor(c[1:], dtype=torch.long, device=logp.device)
                    sums[r] += float(logp[r, : len(c) - 1].gather(-1, tgt[:, None]).double().sum())
            cache.crop(-rest)
        return sums, [len(c) for c in cs]

    # ------------------------------------------------------------------ the separate passes
    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]]) -> list[str]:
        """Greedy continuations of tokenized prompts (left-padded batches), decoded without special tokens."""
        order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
        batches = _batches(order, self.batch_size)
        (n_runs,) = distributed.max_over_ranks([len(batches)])
        if not batches:
            if n_runs == 0:
                return []
            # This rank has nothing to do but must join the other ranks' collective forwards.
            prompts, batches = [[self.pad_id]], [[0]]
        config = self.generation_config()
        out: list[str] = [""] * (len(prompts) if order else 0)
        device = self.device
        with eval_mode(self.model):
            for b in range(n_runs):
                idx = batches[min(b, len(batches) - 1)]
                ids, mask = pad_batch([prompts[i] for i in idx], self.pad_id, side="left")
                gen = self._generate(ids.to(device), mask.to(device), config)
                if b >= len(batches) or not out:
                    continue  # a repeat that only keeps distributed ranks in step
                for i, text in zip(idx, self.decode(gen[:, ids.shape[1]:].tolist(), config)):
                    out[i] = text
                self._tick(len(idx))
        return out

    @torch.no_grad()
    def score(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]] | None = None, *,
              want_hidden: bool = True) -> ScoreOutput:
        """One forward per batch over ``prompt + continuation``: pooled hidden vectors at ``self.layers`` and the
        mean log-probability of each continuation (NaN when it is empty)."""
        n = len(prompts)
        conts = continuations if continuations is not None else [[] for _ in range(n)]
        want_lp = continuations is not None
        want_hidden = want_hidden and bool(self.layers)
        lengths = [len(p) + len(c) for p, c in zip(prompts, conts)]
        order = sorted(range(n), key=lambda i: (lengths[i], i))
        batches = _batches(order, self.batch_size)
        (n_runs,) = distributed.max_over_ranks([len(batches)])
        if not batches:
            if n_runs == 0:
                return ScoreOutput(None, None)
            # Nothing local, but the other ranks' collective forwards need this rank too.
            prompts, conts, batches, real = [[self.pad_id]], [[]], [[0]], 0
        else:
            real = len(batches)
        hidden_out: torch.Tensor | None = None
        lp_out = torch.full((n,), math.nan, dtype=torch.float64) if want_lp else None
        device = self.device
        captured: dict[int, torch.Tensor] = {}
        pool: dict[str, torch.Tensor] = {}

        def pooled(layer: int, h: torch.Tensor) -> None:
            if self.pooling == "last":
                captured[layer] = h[torch.arange(h.shape[0], device=h.device), pool["last"]].float()
            else:
                m = pool["prompt_mask"].float().unsqueeze(-1)
                captured[layer] = ((h.float() * m).sum(1) / m.sum(1).clamp_min(1)).float()  # float32, also under bf16

        with BlockOutputs(self.model, self.layers if want_hidden else [], pooled), eval_mode(self.model):
            for b in range(n_runs):
                idx = batches[min(b, len(batches) - 1)]
                ids, mask = pad_batch([list(prompts[i]) + list(conts[i]) for i in idx], self.pad_id)
                width = ids.shape[1]
                prompt_mask = torch.zeros((len(idx), width), dtype=torch.bool)
                for r, i in enumerate(idx):
                    prompt_mask[r, : len(prompts[i])] = True
                last = torch.tensor([len(prompts[i]) - 1 for i in idx], dtype=torch.long)
                pool["last"], pool["prompt_mask"] = last.to(device), prompt_mask.to(device)
                kwargs: dict[str, Any] = {"input_ids": ids.to(device), "attention_mask": mask.to(device),
                                          "use_cache": False}
                if self._logits_to_keep:
                    # Logits are needed only from the last prompt token on; with right padding that is a suffix
                    # of the sequence, so the LM head can skip the rest.
                    kwargs["logits_to_keep"] = width - int(last.min()) if want_lp else 1
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
                        logp = torch.log_softmax(logits[r, start: start + len(c)].float(), dim=-1)
                        target = torch.tensor(c, dtype=torch.long, device=logp.device)
                        lp_out[i] = float(logp.gather(-1, target[:, None]).double().mean())
                self._tick(len(idx))
        return ScoreOutput(hidden_out, lp_out)
