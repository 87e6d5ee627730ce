"""How many new tokens the bundled real-model sets' answers need: the measurement behind the default
``max_new_tokens`` (``SAGOConfig``).

Generates with a generous budget on a seeded subset of every bundled real set and counts, per output, the
tokens up to the end of its answer: the first stop of its answer span (SPEC "correctness") plus the stop's
first token, or EOS (the decoded output plus EOS). Outputs that reach the budget with neither are "not
ended". Prints percentiles and the share of answers complete within each candidate budget.

    OMP_NUM_THREADS=2 python scripts/measure_answer_lengths.py --model sago://smollm2-135m-instruct
    OMP_NUM_THREADS=2 python scripts/measure_answer_lengths.py --model sago://gemma-3-270m
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sago_train import SAGOEvaluator
from sago_train.data.sources import bundled_sets
from sago_train.functional.answer import answer_end
from sago_train.results.degenerate import hit_token_limit

CANDIDATES = (16, 24, 32, 48, 64, 96)


def tokens_to_answer_end(ev: SAGOEvaluator, output: str, variant: object, budget: int) -> float:
    tok = ev.tokenizer
    end = answer_end(output, ev.stops_for(variant))
    if end is not None:
        return len(tok(output[:end], add_special_tokens=False)["input_ids"]) + 1
    if hit_token_limit([output], tok, budget)[0]:
        return float("inf")
    return len(tok(output, add_special_tokens=False)["input_ids"]) + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--budget", type=int, default=96, help="max_new_tokens of the measurement")
    parser.add_argument("--max-groups", type=int, default=12, help="seeded subset per set")
    args = parser.parse_args()
    ev = SAGOEvaluator.from_pretrained(args.model, device="cpu", axes="generation", max_new_tokens=args.budget,
                                       max_groups=args.max_groups)
    start = time.perf_counter()
    result = ev.evaluate(bundled_sets("real"))
    needed = np.array([tokens_to_answer_end(ev, y, v, args.budget)
                       for s in result.sets.values() for g in s.groups for y, v in zip(g.outputs, g.variants)])
    ended = needed[np.isfinite(needed)]
    print(f"{args.model}: {len(needed)} answers ({args.max_groups} groups x 4 sets x 4 variants), budget "
          f"{args.budget}, {time.perf_counter() - start:.0f} s; chat template {ev.chat_template}")
    print(f"  not ended within {args.budget}: {np.mean(~np.isfinite(needed)):.1%}")
    if len(ended):
        q = np.percentile(ended, [50, 90, 95, 99])
        print(f"  tokens to the answer's end: median {q[0]:.0f}, p90 {q[1]:.0f}, p95 {q[2]:.0f}, p99 {q[3]:.0f}, "
              f"max {ended.max():.0f}")
    for c in CANDIDATES:
        if c <= args.budget:
            print(f"  complete within {c:>3} new tokens: {np.mean(needed <= c):.1%}")


if __name__ == "__main__":
    main()
