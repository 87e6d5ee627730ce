"""Benchmark the SAGO evaluation engine side by side, in one run, on the same groups.

    .venv/bin/python benchmarks/bench_eval.py [--model PATH] [--groups 64] [--repeats 3]

Compares, per full evaluation of G groups x 4 variants with all four axes:
- engine: ``SAGOEvaluator.evaluate`` (batched generate, one hooked forward per batch for activations and
  confidence, axes and bootstrap statistics);
- naive: one variant at a time, ``output_hidden_states=True``, separate forwards for activations and
  confidence, unbatched generate, then the same axis formulas;
- floor: the same batched generate and batched forwards with no hooks and no metric work.
Prints the ratios naive/engine (target >= 5x) and engine/floor (target <= 1.15x). Times are the median of
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
from sago_train.functional.axes import (
    activation_instability,
    confidence_instability,
    generation_instability,
    mirroring_instability,
)
from sago_train.functional.similarity import get_similarity
from sago_train.model.layers import num_decoder_layers, resolve_layers
from sago_train.model.tokenize import encode_continuation, encode_variant, pad_batch, pad_id_of


def load_groups(n: int) -> VariantSet:
    groups = [g for vs in bundled_sets().values() for g in vs]
    out = []
    for i in range(n):
        g = groups[i % len(groups)]
        out.append({**g.to_dict(), "id": f"{i}"})
    return VariantSet.from_records(out, name="bench")


def naive(model, tok, vs: VariantSet, layers: list[int], max_new: int) -> None:
    sim = get_similarity("token_f1")
    eos = tok.eos_token_id
    for g in vs:
        prompts = [encode_variant(v, tok) for v in g.variants]
        outs = []
        for p in prompts:
            ids = torch.tensor([p])
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
                hs = model(torch.tensor([p]), output_hidden_states=True).hidden_states
                hidden.append(torch.stack([hs[layer + 1][0, -1] for layer in layers]))
                if r_ids:
                    logits = model(torch.tensor([p + r_ids])).logits[0]
                    logp = torch.log_softmax(logits.float(), -1)
                    lps.append(float(torch.stack([logp[len(p) - 1 + j, t] for j, t in enumerate(r_ids)]).mean()))
        activation_instability(torch.stack(hidden).float())
        if lps:
            confidence_instability(torch.tensor(lps))
        generation_instability(sim(outs))
        mirroring_instability([str(v) for v in g.variants], outs, g.reference)


def floor(model, tok, vs: VariantSet, batch_size: int, max_new: int) -> None:
    pad = pad_id_of(tok)
    prompts = [encode_variant(v, tok) for g in vs for v in g.variants]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outs = [""] * len(prompts)
    with torch.no_grad():
        for b in range(0, len(order), batch_size):
            idx = order[b:b + batch_size]
            ids, mask = pad_batch([prompts[i] for i in idx], pad, side="left")
            w = ids.shape[1]
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                                 pad_token_id=pad, eos_token_id=tok.eos_token_id)
            for r, i in enumerate(idx):
                outs[i] = tok.decode(gen[r, w:], skip_special_tokens=True)
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
            model(input_ids=ids, attention_mask=mask, use_cache=False)


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
    args = ap.parse_args()
    from sago_train.model.loading import load_model_and_tokenizer
    from sago_train.model.tiny import tiny_model_path

    model, tok = load_model_and_tokenizer(args.model or tiny_model_path(), device=args.device, dtype=args.dtype)
    vs = load_groups(args.groups)
    layers = resolve_layers(None, num_decoder_layers(model))
    ev = SAGOEvaluator(model, tok, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)
    # Warm-up once each so that lazy initialisation is not timed.
    small = vs.subset(range(min(4, len(vs))))
    ev.evaluate(small)
    naive(model, tok, small, layers, args.max_new_tokens)
    floor(model, tok, small, args.batch_size, args.max_new_tokens)
    t = {"engine": [], "naive": [], "floor": []}
    for _ in range(args.repeats):  # interleaved, so that machine noise hits all three alike
        t["floor"].append(timed(lambda: floor(model, tok, vs, args.batch_size, args.max_new_tokens)))
        t["engine"].append(timed(lambda: ev.evaluate(vs)))
        t["naive"].append(timed(lambda: naive(model, tok, vs, layers, args.max_new_tokens)))
    med = {k: statistics.median(v) for k, v in t.items()}
    n_var = sum(g.k for g in vs)
    print(f"model={args.model or 'shipped tiny model'} device={args.device} groups={len(vs)} variants={n_var} "
          f"batch_size={args.batch_size} max_new_tokens={args.max_new_tokens} repeats={args.repeats} "
          f"threads={torch.get_num_threads()}")
    for k in ("naive", "engine", "floor"):
        print(f"  {k:7s} median {med[k]:8.3f} s   runs: {', '.join(f'{x:.3f}' for x in t[k])}")
    speedup = med["naive"] / med["engine"]
    overhead = med["engine"] / med["floor"]
    print(f"speed-up vs naive loop: {speedup:.2f}x (target >= 5x) {'OK' if speedup >= 5 else 'MISSED'}")
    print(f"overhead vs bare floor: {overhead:.3f}x (target <= 1.15x) {'OK' if overhead <= 1.15 else 'MISSED'}")
    if not math.isfinite(speedup):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
