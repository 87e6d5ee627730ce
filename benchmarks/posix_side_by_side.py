"""POSIX three ways on one group, and what the ``posix`` axis costs beside the generation axis, side by side.

    .venv/bin/python benchmarks/posix_side_by_side.py [--model PATH] [--repeats 3] [--threads 1]

1. sago_train's ``posix`` axis (``SAGOEvaluator(axes="posix")``);
2. Eq. 1 of Chatterjee et al. (2024) written out with plain forwards: the mean over ordered pairs i != j of
   |log P(y_j | x_i) - log P(y_j | x_j)| / L(y_j), y_j the greedy response to x_j;
3. the authors' PyPI package ``prompt-sensitivity-index`` 0.0.1 (``pip install prompt-sensitivity-index``;
   skipped when it is not installed), which in its code compares two responses under one prompt
   (|log P(y_i | x_j) - log P(y_j | x_j)|), sums over the generated tokens including the end token, and divides
   by ``max_new_tokens`` (docs/definitions.md#posix).

Then the cost: an evaluation of the bundled sets with ``generation`` against ``generation,posix`` (the same
greedy outputs; posix adds the K x K scoring), the median of the repeats, as a ratio measured in one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sago_train import SAGOEvaluator, VariantSet, bundled_sets, tiny_model_path
from sago_train.model.loading import load_model_and_tokenizer


def eq1(model, tok, prompts: list[list[int]], responses: list[str]) -> float:
    def logprob(p: list[int], y: list[int]) -> float:
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([p + y])).logits[0].double(), -1)
        return sum(float(logp[len(p) - 1 + j, t]) for j, t in enumerate(y))

    ys = [tok(y, add_special_tokens=False)["input_ids"] for y in responses]
    k = len(prompts)
    total = sum(abs(logprob(prompts[i], ys[j]) - logprob(prompts[j], ys[j])) / len(ys[j])
                for j in range(k) if ys[j] for i in range(k) if i != j)
    return total / (k * (k - 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(tiny_model_path()))
    ap.add_argument("--max-new-tokens", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model_and_tokenizer(args.model)
    sets = bundled_sets()
    group = VariantSet.from_records([{"id": "g", "variants": list(sets["paraphrase"].groups[0].variants)}], name="one")
    opts = dict(max_new_tokens=args.max_new_tokens, chat_template="never", n_bootstrap=100)
    ev = SAGOEvaluator(model, tok, axes="posix", **opts)
    rec = ev.evaluate(group).sets["one"].groups[0]
    prompts = [tok(v)["input_ids"] for v in rec.variants]
    print(f"one group of {len(prompts)} variants of bundled paraphrase, greedy up to {args.max_new_tokens} tokens")
    print(f"  sago_train posix axis:              {rec.axes['posix']:.6f}")
    print(f"  Eq. 1 with plain forwards:          {eq1(model, tok, prompts, rec.outputs):.6f}")
    try:
        from prompt_sensitivity_index.models.hf_model import HFModel
        from prompt_sensitivity_index.posix import PosixConfig, get_prompt_sensitivity
    except ImportError:
        print("  prompt-sensitivity-index 0.0.1:     not installed (pip install prompt-sensitivity-index)")
    else:
        hf = HFModel(args.model)
        value, _ = get_prompt_sensitivity(hf, [list(rec.variants)], PosixConfig(max_new_tokens=args.max_new_tokens))
        print(f"  prompt-sensitivity-index 0.0.1:     {value:.6f} (its own formula, see the module doc)")

    def timed(axes: str) -> float:
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            SAGOEvaluator(model, tok, axes=axes, **opts).evaluate(sets)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    n_groups = sum(len(s) for s in sets.values())
    gen, both = timed("generation"), timed("generation,posix")
    print(f"cost on the bundled sets ({n_groups} groups, median of {args.repeats}): generation {gen:.2f} s, "
          f"generation+posix {both:.2f} s: posix adds {both / gen - 1:.0%} "
          f"({(both - gen) / n_groups * 1000:.1f} ms per group against {gen / n_groups * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
