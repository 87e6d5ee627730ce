"""Early stopping's run-level false-stop rate and power, measured by simulation through the real callback.

    .venv/bin/python benchmarks/sim_early_stopping.py [--runs 500] [--groups 16,64] [--evaluations 11,21,51]
        [--patience 1,2,3] [--alpha 0.05] [--shift 0.5] [--seed 0] [--no-old]

Synthetic runs of N evaluations at steps 1..N (no step-0 baseline), on G groups of one set: each group has a fixed
level (uniform in 0.2-0.4) plus fresh Gaussian noise of SD sigma = 0.02 at every evaluation. *Trendless* runs
are just that (the null: nothing changes). *Regressing* runs are the same, and from evaluation floor(N/2) + 1 on
(the second half of the run) every group's value is higher, i.e. worse for this lower-is-better axis, by
``shift`` x sigma (0.5 SD by default). Each run feeds a fresh ``SAGOEarlyStoppingCallback`` at the default
settings: ``plan(G, steps)`` as ``SAGOCallback`` calls it at train start, then one ``Evaluation`` per step through
``on_sago_evaluate``, until it sets ``should_training_stop``.

- false stops: the share of trendless runs stopped, with its Monte-Carlo standard error sqrt(r (1 - r) / runs);
  the rule promises <= alpha;
- power: the share of regressing runs stopped at or after the first shifted evaluation (a stop before it is a
  false stop, counted in the false stops' column of those runs only through the trendless runs);
- delay: the median number of evaluations from the first shifted one to the stop, among the runs stopped.

"old" is the rule before issue #24, re-implemented here for comparison on the same data (it is no longer in the
package): the window of one evaluation against the best evaluation so far (the lowest mean), each at level alpha
by the same verdict rule, ``patience`` worse evaluations in a row.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from dataclasses import dataclass

import numpy as np
from transformers import TrainerControl, TrainerState, TrainingArguments

from sago_train import SAGOEarlyStoppingCallback
from sago_train.functional import stats
from sago_train.results.evaluation import Evaluation

SIGMA = 0.02
METRIC = "sago/s/activation"


@dataclass(frozen=True)
class Cell:
    """One configuration's measured rates."""

    groups: int
    evaluations: int
    patience: int
    runs: int
    looks: int | None
    level: float
    false_stops: float
    power: float
    delay: float
    old_false_stops: float | None = None
    old_power: float | None = None

    @staticmethod
    def se(rate: float, runs: int) -> float:
        return math.sqrt(rate * (1.0 - rate) / runs)


def synthetic_runs(rng: np.random.Generator, runs: int, evaluations: int, groups: int, shift: float) -> np.ndarray:
    """``[runs, evaluations, groups]`` per-group values: a fixed level per group plus fresh noise at every
    evaluation, and from evaluation ``evaluations // 2`` (0-based) on ``shift`` x sigma added (worse)."""
    level = rng.uniform(0.2, 0.4, size=(runs, 1, groups))
    values = level + rng.normal(0.0, SIGMA, size=(runs, evaluations, groups))
    values[:, evaluations // 2:, :] += shift * SIGMA
    return values


_ARGS: TrainingArguments | None = None


def _args() -> TrainingArguments:
    global _ARGS
    if _ARGS is None:  # building TrainingArguments is slow: once per process
        _ARGS = TrainingArguments(output_dir="/tmp/sago-sim-unused", report_to=[])
    return _ARGS


def stop_index(run: np.ndarray, patience: int, alpha: float) -> tuple[int | None, SAGOEarlyStoppingCallback]:
    """Feed one run to a fresh callback, as :class:`SAGOCallback` does; the 0-based evaluation it stops at."""
    cb = SAGOEarlyStoppingCallback(METRIC, patience=patience, alpha=alpha)
    n_evals, n_groups = run.shape
    cb.plan(n_groups, list(range(1, n_evals + 1)))
    ids = [f"g{g}" for g in range(n_groups)]
    control, args = TrainerControl(), _args()
    for t in range(n_evals):
        ev = Evaluation.from_records(t + 1, {"s": [{"id": i, "axes": {"activation": float(v)}}
                                                   for i, v in zip(ids, run[t])]})
        cb.on_sago_evaluate(args, TrainerState(global_step=t + 1), control, result=None, evaluation=ev)
        if control.should_training_stop:
            return t, cb
    return None, cb


def old_stop_index(run: np.ndarray, patience: int, alpha: float) -> int | None:
    """The rule before issue #24: each evaluation against the best so far at level alpha, ``patience`` worse in
    a row (the same verdict rule; an improvement becomes the best and resets the count)."""
    best, counter = run[0], 0
    for t in range(1, run.shape[0]):
        if run[t].mean() < best.mean():
            best, counter = run[t], 0
            continue
        worse = stats.worse_verdict(best, run[t], alpha=alpha).verdict == stats.WORSE
        counter = counter + 1 if worse else 0
        if counter >= patience:
            return t
    return None


def measure(groups: int, evaluations: int, patience: int, runs: int, *, alpha: float = 0.05, shift: float = 0.5,
            seed: int = 0, old: bool = True) -> Cell:
    """One cell: ``runs`` trendless and ``runs`` regressing runs through the callback (and the old rule)."""
    rng = np.random.default_rng([seed, groups, evaluations, patience])
    null = synthetic_runs(rng, runs, evaluations, groups, 0.0)
    regress = synthetic_runs(rng, runs, evaluations, groups, shift)
    onset = evaluations // 2
    false_stops = sum(stop_index(r, patience, alpha)[0] is not None for r in null)
    stops = [stop_index(r, patience, alpha)[0] for r in regress]
    after = [t - onset for t in stops if t is not None and t >= onset]
    cb = SAGOEarlyStoppingCallback(METRIC, patience=patience, alpha=alpha)  # the plan's numbers, for the table
    cb.plan(groups, list(range(1, evaluations + 1)))
    cell = dict(groups=groups, evaluations=evaluations, patience=patience, runs=runs, looks=cb.looks,
                level=cb.level(1) if cb.looks != 0 else 0.0, false_stops=false_stops / runs,
                power=len(after) / runs, delay=float(np.median(after)) if after else math.nan)
    if old:
        cell["old_false_stops"] = sum(old_stop_index(r, patience, alpha) is not None for r in null) / runs
        cell["old_power"] = sum((t := old_stop_index(r, patience, alpha)) is not None and t >= onset
                                for r in regress) / runs
    return Cell(**cell)


def table(cells: list[Cell], alpha: float) -> str:
    """Markdown table of the cells."""
    old = any(c.old_false_stops is not None for c in cells)
    head = ["groups", "evaluations", "patience", "looks", "level per look", "false stops (SE)", "power", "delay"]
    head += ["old: false stops (SE)", "old: power"] if old else []
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        flag = " **over alpha**" if c.false_stops > alpha + 2 * Cell.se(c.false_stops, c.runs) else ""
        row = [str(c.groups), str(c.evaluations), str(c.patience), str(c.looks), f"{c.level:.2g}",
               f"{100 * c.false_stops:.1f}% ({100 * Cell.se(c.false_stops, c.runs):.1f}){flag}",
               f"{100 * c.power:.1f}%", "-" if math.isnan(c.delay) else f"{c.delay:g}"]
        if old:
            rate = c.old_false_stops or 0.0
            row += [f"{100 * rate:.1f}% ({100 * Cell.se(rate, c.runs):.1f})", f"{100 * (c.old_power or 0.0):.1f}%"]
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731 - a one-line parser
    ap.add_argument("--runs", type=int, default=500, help="trendless and regressing runs per cell (each)")
    ap.add_argument("--groups", type=ints, default=[16, 64])
    ap.add_argument("--evaluations", type=ints, default=[11, 21, 51])
    ap.add_argument("--patience", type=ints, default=[1, 2, 3])
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--shift", type=float, default=0.5, help="the regression, in noise SDs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-old", dest="old", action="store_false", help="skip the old rule")
    a = ap.parse_args(argv)
    logging.getLogger("sago_train").setLevel(logging.ERROR)  # each stop is logged as a warning: thousands here
    cells, start = [], time.perf_counter()
    for groups in a.groups:
        for evaluations in a.evaluations:
            for patience in a.patience:
                cells.append(measure(groups, evaluations, patience, a.runs, alpha=a.alpha, shift=a.shift,
                                     seed=a.seed, old=a.old))
                print(f"  done groups={groups} evaluations={evaluations} patience={patience} "
                      f"({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"\nalpha={a.alpha}, shift={a.shift} SD from evaluation floor(N/2)+1, {a.runs} runs per cell and "
          f"scenario, seed {a.seed}\n")
    print(table(cells, a.alpha))


if __name__ == "__main__":
    main()
