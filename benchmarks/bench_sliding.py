"""The one-prefill engine on a sliding-window (hybrid) cache against the separate passes it used to fall back to,
side by side in one run, on the same groups.

    .venv/bin/python benchmarks/bench_sliding.py [--model sago://gemma-3-270m] [--groups 8] [--repeats 2]
                                                 [--threads 2]

Gemma 3's cache mixes sliding-window layers (512 tokens) with global ones. Before, any sliding-window layer whose
window was shorter than the model's context sent every evaluation to separate generation and scoring passes
(every prompt token computed twice, the few-shot preamble once per row); now a call that fits the window takes
the one-prefill path. Both paths run here on the bundled real sets' first ``--groups`` groups each, with every
axis; the outputs and axes must agree (the script fails otherwise), and it prints the median wall time of each
path and their ratio. The machine is shared: only the ratio measured side by side means something.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="sago://gemma-3-270m")
    ap.add_argument("--groups", type=int, default=8, help="groups per bundled real set")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from sago_train import SAGOEvaluator, load_model_and_tokenizer
    from sago_train.data import bundled_sets
    from sago_train.eval.extraction import Extractor

    model, tok = load_model_and_tokenizer(args.model, device="cpu")
    sets = {name: vs.subset(range(min(args.groups, len(vs)))) for name, vs in bundled_sets("real").items()}
    evaluator = SAGOEvaluator(model, tok, n_bootstrap=200)
    one_prefill = Extractor._prefill_unsupported

    def separate(self, *a, **k):
        return "bench: the separate passes (the fallback before sliding-window caches were served)"

    times: dict[str, list[float]] = {"one prefill": [], "separate passes": []}
    results = {}
    for _ in range(args.repeats):
        for path, unsupported in (("one prefill", one_prefill), ("separate passes", separate)):
            Extractor._prefill_unsupported = unsupported  # type: ignore[method-assign]
            start = time.perf_counter()
            results[path] = evaluator.evaluate(sets)
            times[path].append(time.perf_counter() - start)
    Extractor._prefill_unsupported = one_prefill  # type: ignore[method-assign]
    worst = 0.0
    for name in sets:
        a, b = results["one prefill"].sets[name], results["separate passes"].sets[name]
        for ga, gb in zip(a.groups, b.groups):
            if ga.outputs != gb.outputs:
                raise SystemExit(f"outputs differ on {name}/{ga.id}: {ga.outputs} vs {gb.outputs}")
            worst = max([worst, *(abs(ga.axes[x] - gb.axes[x]) for x in ga.axes if ga.axes[x] == ga.axes[x])])
    n_groups = sum(len(vs) for vs in sets.values())
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.model}: {n_groups} groups ({args.groups} per set x {len(sets)} sets), every axis, "
          f"{args.repeats} repeats, {args.threads} threads")
    for k, v in med.items():
        print(f"  {k:16s} {v:8.1f} s (median of {', '.join(f'{x:.1f}' for x in times[k])})")
    print(f"  separate / one prefill = {med['separate passes'] / med['one prefill']:.2f}x; outputs identical, largest "
          f"axis difference {worst:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
