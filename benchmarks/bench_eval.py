"""Benchmark the SAGO evaluation engine side by side, in one run, on the same groups.

    .venv/bin/python benchmarks/bench_eval.py [--model PATH] [--groups 64] [--repeats 3] [--threads 2]

Compares, per full evaluation of G groups x 4 variants with all four axes:
- engine: ``SAGOEvaluator.evaluate`` (batched generate, one hooked forward per batch for activations and
  confidence, axes and bootstrap statistics);
- naive: one variant at a time, ``output_hidden_states=True``, separate forwards for activations and
  confidence, unbatched generate, then the same axis formulas;
- floor (today's floor): the same batched generate and one batched forward over prompt + reference, with no
  hooks and no metric work (every prompt token runs twice, the shared chat prefix once per row);
- bound (the work lower bound): plain forwards over the unique prompt tokens (each batch's shared prefix
  once, then each row's own tokens, on its KV cache), the reference tokens, and one single-token forward per
  decode step actually taken; no ``generate``, no hooks, no metric work.
Prompts are rendered as the engine renders them (``chat_template`` auto: the chat template for an instruct
model). Prints naive/engine (target >= 5x), engine/floor (target <= 0.7x on a chat model) and engine/bound. Times are the median of
the repeats; the machine is shared, so only the ratios measured side by side mean something.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from sago_train import SAGOEvaluator, VariantSet
from sago_train.data import bundled_sets
from sago_train.eval.cache import cache_keyword
from sago_train.eval.cache import cache_of as _cache_of
from sago_train.eval.cache import expand as _expand
from sago_train.eval.cache import positions as _positions
from sago_train.eval.extraction import shared_prefix_length
from sago_train.functional.axes import (
    activation_instability,
    confidence_instability,
    generation_instability,
    mirroring_instability,
)
from sago_train.functional.similarity import get_similarity
from sago_train.model.layers import num_decoder_layers, resolve_layers
from sago_train.model.tokenize import (
    encode_continuation,
    encode_variant,
    pad_batch,
    pad_id_of,
    resolve_chat_template,
)


def load_groups(n: int) -> VariantSet:
    groups = [g for vs in bundled_sets().values() for g in vs]
    out = []
    for i in range(n):
        g = groups[i % len(groups)]
        out.append({**g.to_dict(), "id": f"{i}"})
    return VariantSet.from_records(out, name="bench")


def naive(model, tok, vs: VariantSet, layers: list[int], max_new: int, chat: bool) -> None:
    sim = get_similarity("token_f1")
    dev = model.device
    eos = tok.eos_token_id
    for g in vs:
        prompts = [encode_variant(v, tok, chat=chat) for v in g.variants]
        outs = []
        for p in prompts:
            ids = torch.tensor([p], device=dev)
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                                 pad_token_id=pad_id_of(tok), eos_token_id=eos)
            new = gen[0, len(p):].tolist()
            if eos in new:
                new = new[: new.index(eos)]
            outs.append(tok.decode(new, skip_special_tokens=True))
        r = g.reference or outs[g.canonical]
        r_ids = encode_continuation(r, tok)
        hidden, lps = [], []
        with torch.no_grad():
            for p in prompts:
                hs = model(torch.tensor([p], device=dev), output_hidden_states=True).hidden_states
                hidden.append(torch.stack([hs[layer + 1][0, -1] for layer in layers]))
                if r_ids:
                    logits = model(torch.tensor([p + r_ids], device=dev)).logits[0]
                    logp = torch.log_softmax(logits.float(), -1)
                    lps.append(float(torch.stack([logp[len(p) - 1 + j, t] for j, t in enumerate(r_ids)]).mean()))
        activation_instability(torch.stack(hidden).float())
        if lps:
            confidence_instability(torch.tensor(lps))
        generation_instability(sim(outs))
        mirroring_instability([str(v) for v in g.variants], outs, g.reference)


def floor(model, tok, vs: VariantSet, batch_size: int, max_new: int, chat: bool) -> list[int]:
    """Today's floor; returns each prompt's number of decode steps (new tokens up to and with EOS)."""
    pad = pad_id_of(tok)
    prompts = [encode_variant(v, tok, chat=chat) for g in vs for v in g.variants]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outs = [""] * len(prompts)
    steps = [0] * len(prompts)
    with torch.no_grad():
        for b in range(0, len(order), batch_size):
            idx = order[b:b + batch_size]
            ids, mask = pad_batch([prompts[i] for i in idx], pad, side="left")
            w = ids.shape[1]
            gen = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device), max_new_tokens=max_new, do_sample=False,
                                 pad_token_id=pad, eos_token_id=tok.eos_token_id)
            for r, i in enumerate(idx):
                new = gen[r, w:].tolist()
                steps[i] = next((j + 1 for j, t in enumerate(new) if t == tok.eos_token_id), len(new))
                outs[i] = tok.decode(new[: steps[i]], skip_special_tokens=True)
        seqs = []
        k0 = 0
        for g in vs:
            r = encode_continuation(g.reference or outs[k0 + g.canonical], tok)
            seqs.extend(prompts[k0 + k] + r for k in range(g.k))
            k0 += g.k
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        for b in range(0, len(order), batch_size):
            idx = order[b:b + batch_size]
            ids, mask = pad_batch([seqs[i] for i in idx], pad)
            model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device), use_cache=False)
    return steps


def bound(model, tok, vs: VariantSet, batch_size: int, steps: list[int], chat: bool) -> None:
    """The work lower bound: each unique prompt token, reference token and decode step as plain forwards."""
    pad, dev = pad_id_of(tok), model.device
    kw = cache_keyword(set(__import__("inspect").signature(model.forward).parameters)) or "past_key_values"
    prompts = [encode_variant(v, tok, chat=chat) for g in vs for v in g.variants]
    refs = [encode_continuation(g.reference or "", tok) for g in vs for _ in g.variants]
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    with torch.no_grad():
        for b in range(0, len(order), batch_size):
            idx = order[b:b + batch_size]
            rows = [prompts[i] for i in idx]
            p = shared_prefix_length(rows)
            cache = None
            if p:
                cache = _cache_of(model(input_ids=torch.tensor([rows[0][:p]], device=dev), use_cache=True, logits_to_keep=1))
                _expand(cache, len(idx))
            ids, smask = pad_batch([r[p:] for r in rows], pad, side="left")
            ids = ids.to(dev)
            mask = torch.cat([torch.ones((len(idx), p), dtype=torch.long), smask], 1).to(dev)
            cache = _cache_of(model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask, p), use_cache=True,
                                    logits_to_keep=1, **{kw: cache}))
            width = mask.shape[1]
            rest = max(len(refs[i]) for i in idx) - 1
            if rest > 0:
                feed, fmask = pad_batch([refs[i][:-1] or [pad] for i in idx], pad)
                m2 = torch.cat([mask, fmask.to(dev)], 1)
                model(input_ids=feed.to(dev), attention_mask=m2, position_ids=_positions(m2, width), use_cache=True,
                      **{kw: cache})
                cache.crop(-rest)
            last = ids[:, -1:]
            for _ in range(max(steps[i] for i in idx) - 1):  # the first new token comes from the prefill
                mask = torch.cat([mask, torch.ones((len(idx), 1), dtype=torch.long, device=dev)], 1)
                out = model(input_ids=last, attention_mask=mask, position_ids=_positions(mask, mask.shape[1] - 1),
                            use_cache=True, logits_to_keep=1, **{kw: cache})
                cache = _cache_of(out)
                last = out.logits[:, -1].argmax(-1, keepdim=True)


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (use the same in every run)")
    ap.add_argument("--no-naive", action="store_true", help="skip the naive loop (slow on a real model)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from sago_train.model.loading import load_model_and_tokenizer
    from sago_train.model.tiny import tiny_model_path

    model, tok = load_model_and_tokenizer(args.model or tiny_model_path(), device=args.device, dtype=args.dtype)
    vs = load_groups(args.groups)
    layers = resolve_layers(None, num_decoder_layers(model))
    ev = SAGOEvaluator(model, tok, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)
    chat = resolve_chat_template("auto", tok) == "always"  # as the engine renders the prompts
    mx, bs = args.max_new_tokens, args.batch_size
    # Warm-up once each so that lazy initialisation is not timed.
    small = vs.subset(range(min(4, len(vs))))
    ev.evaluate(small)
    bound(model, tok, small, bs, floor(model, tok, small, bs, mx, chat), chat)
    steps: list[int] = []  # decode steps per prompt, from the floor's greedy outputs (same in every repeat)

    def run_floor() -> None:
        steps[:] = floor(model, tok, vs, bs, mx, chat)

    # The floor runs first in each repeat: the bound replays its decode steps.
    arms = {"floor": run_floor, "engine": lambda: ev.evaluate(vs), "bound": lambda: bound(model, tok, vs, bs, steps, chat)}
    if not args.no_naive:
        naive(model, tok, small, layers, mx, chat)
        arms["naive"] = lambda: naive(model, tok, vs, layers, mx, chat)
    t: dict[str, list[float]] = {k: [] for k in arms}
    for rep in range(args.repeats):  # interleaved, so that machine noise hits every arm alike
        for k, fn in arms.items():
            t[k].append(timed(fn))
            print(f"  repeat {rep + 1}: {k} {t[k][-1]:.3f} s", flush=True)
    med = {k: statistics.median(v) for k, v in t.items()}
    n_var = sum(g.k for g in vs)
    print(f"model={args.model or 'shipped tiny model'} device={args.device} chat={chat} groups={len(vs)} "
          f"variants={n_var} batch_size={bs} max_new_tokens={mx} repeats={args.repeats} "
          f"threads={torch.get_num_threads()} decode_steps={sum(steps)}")
    for k in t:
        print(f"  {k:7s} median {med[k]:8.3f} s   runs: {', '.join(f'{x:.3f}' for x in t[k])}")
    # Ratios of medians, and the median of the per-repeat ratios (each repeat's arms ran back to back).
    def ratio(a: str, b: str) -> str:
        per = statistics.median(x / y for x, y in zip(t[a], t[b]))
        return f"{med[a] / med[b]:.3f}x (median per-repeat ratio {per:.3f}x)"

    if "naive" in t:
        print(f"naive / engine: {ratio('naive', 'engine')} (target >= 5x)")
    print(f"engine / today's floor: {ratio('engine', 'floor')} (target <= 0.7x on a chat model)")
    print(f"engine / work lower bound: {ratio('engine', 'bound')}")
    if not all(math.isfinite(v) for v in med.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
