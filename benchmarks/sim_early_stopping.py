"""Early stopping's run-level false-stop rate and power, measured by simulation through the real callback.

    .venv/bin/python benchmarks/sim_early_stopping.py [--runs 500] [--groups 16,64] [--evaluations 11,21,51]
        [--patience 1,2,3] [--alpha 0.05] [--shift 0.5] [--seed 0] [--no-old] [--quantity activation|accuracy]

Synthetic runs of N evaluations at steps 1..N (no step-0 baseline), on G groups of one set: each group has a fixed
level (uniform in 0.2-0.4) plus fresh Gaussian noise of SD sigma = 0.02 at every evaluation. *Trendless* runs
are just that (the null: nothing changes). *Regressing* runs are the same, and from evaluation floor(N/2) + 1 on
(the second half of the run) every group's value is higher, i.e. worse for this lower-is-better axis, by
``shift`` x sigma (0.5 SD by default). With ``--quantity accuracy`` each group has K = 4 variants answered right
each with a fixed probability (uniform in 0.5-0.95), drawn afresh at every evaluation (a group's accuracy is its
share of right answers), and a regression lowers every probability by ``shift`` x 0.2 (0.2 is about the SD of a
group's accuracy at p = 0.8). Each run feeds a fresh ``SAGOEarlyStoppingCallback`` at the default
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
from sago_train.functional import stats, verdict_rule
from sago_train.functional.stats import Summary
from sago_train.results.evaluation import Evaluation
from sago_train.results.group import GroupRecord
from sago_train.results.sets import SetEvaluation

SIGMA = 0.02
ACCURACY_SD, VARIANTS = 0.2, 4
METRIC = {"activation": "sago/s/activation", "accuracy": "sago/s/accuracy"}


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


def synthetic_runs(rng: np.random.Generator, runs: int, evaluations: int, groups: int, shift: float,
                   quantity: str = "activation") -> np.ndarray:
    """Activation: ``[runs, evaluations, groups]`` per-group values, a fixed level per group plus fresh noise at
    every evaluation, and from evaluation ``evaluations // 2`` (0-based) on ``shift`` x sigma added (worse).
    Accuracy: ``[runs, evaluations, groups, VARIANTS]`` right/wrong answers, each right with the group's fixed
    probability, lowered by ``shift`` x 0.2 from the same evaluation on."""
    onset = evaluations // 2
    if quantity == "accuracy":
        p_right = np.repeat(rng.uniform(0.5, 0.95, size=(runs, 1, groups, 1)), evaluations, axis=1)
        p_right[:, onset:] -= shift * ACCURACY_SD
        return rng.random(size=(runs, evaluations, groups, VARIANTS)) < p_right
    level = rng.uniform(0.2, 0.4, size=(runs, 1, groups))
    values = level + rng.normal(0.0, SIGMA, size=(runs, evaluations, groups))
    values[:, onset:, :] += shift * SIGMA
    return values


def evaluation(step: int, values: np.ndarray) -> Evaluation:
    """One evaluation of set ``s`` from one row of :func:`synthetic_runs` (per-group values, or answers)."""
    ids = [f"g{g}" for g in range(values.shape[0])]
    if values.dtype == bool:
        groups = [GroupRecord(i, axes={"activation": 0.3}, correct=row.tolist()) for i, row in zip(ids, values)]
        return Evaluation({"s": SetEvaluation.from_groups("s", ["activation"], groups, n_bootstrap=10)}, step=step)
    # Built directly rather than by Evaluation.from_records, five times faster: the records carry no
    # instability (one axis), and the callback reads only the per-group values.
    groups = [GroupRecord(i, axes={"activation": v}, instability=math.nan) for i, v in zip(ids, values.tolist())]
    summary = Summary(float(values.mean()), math.nan, math.nan, len(ids))
    return Evaluation({"s": SetEvaluation("s", ["activation"], {"activation": summary}, n_groups=len(ids),
                                          _groups=groups)}, step=step)


_ARGS: TrainingArguments | None = None


def _args() -> TrainingArguments:
    global _ARGS
    if _ARGS is None:  # building TrainingArguments is slow: once per process
        _ARGS = TrainingArguments(output_dir="/tmp/sago-sim-unused", report_to=[])
    return _ARGS


def stop_index(run: np.ndarray, patience: int, alpha: float) -> int | None:
    """Feed one run to a fresh callback, as :class:`SAGOCallback` does; the 0-based evaluation it stops at."""
    quantity = "accuracy" if run.dtype == bool else "activation"
    cb = SAGOEarlyStoppingCallback(METRIC[quantity], patience=patience, alpha=alpha)
    cb.plan(run.shape[1], list(range(1, run.shape[0] + 1)))
    control, args = TrainerControl(), _args()
    for t in range(run.shape[0]):
        cb.on_sago_evaluate(args, TrainerState(global_step=t + 1), control, result=None,
                            evaluation=evaluation(t + 1, run[t]))
        if control.should_training_stop:
            return t
    return None


def old_stop_index(run: np.ndarray, patience: int, alpha: float) -> int | None:
    """The rule before issue #24: each evaluation against the best so far at level alpha, ``patience`` worse in
    a row (the same verdict rule; an improvement becomes the best and resets the count)."""
    best, counter = run[0], 0
    for t in range(1, run.shape[0]):
        if run[t].mean() < best.mean():
            best, counter = run[t], 0
            continue
        worse = verdict_rule.worse_verdict(best, run[t], alpha=alpha).verdict == stats.WORSE
        counter = counter + 1 if worse else 0
        if counter >= patience:
            return t
    return None


def false_stop_rate(groups: int, evaluations: int, patience: int, runs: int, *, alpha: float = 0.05, seed: int = 0,
                    quantity: str = "activation", old: bool = False) -> float:
    """The share of ``runs`` trendless runs that the callback (``old``: the old rule) stops."""
    rng = np.random.default_rng([seed, groups, evaluations, patience, 0])
    null = synthetic_runs(rng, runs, evaluations, groups, 0.0, quantity)
    rule = old_stop_index if old else stop_index
    return sum(rule(r, patience, alpha) is not None for r in null) / runs


def power(groups: int, evaluations: int, patience: int, runs: int, *, alpha: float = 0.05, shift: float = 0.5,
          seed: int = 0, quantity: str = "activation", old: bool = False) -> tuple[float, list[int]]:
    """The share of ``runs`` regressing runs stopped at or after the shift, and each such stop's delay."""
    rng = np.random.default_rng([seed, groups, evaluations, patience, 1])
    regress = synthetic_runs(rng, runs, evaluations, groups, shift, quantity)
    rule, onset = old_stop_index if old else stop_index, evaluations // 2
    stops = [rule(r, patience, alpha) for r in regress]
    after = [t - onset for t in stops if t is not None and t >= onset]
    return len(after) / runs, after


def measure(groups: int, evaluations: int, patience: int, runs: int, *, alpha: float = 0.05, shift: float = 0.5,
            seed: int = 0, old: bool = True, quantity: str = "activation") -> Cell:
    """One cell: ``runs`` trendless and ``runs`` regressing runs through the callback (and the old rule)."""
    kw = dict(alpha=alpha, seed=seed, quantity=quantity)
    rate = false_stop_rate(groups, evaluations, patience, runs, **kw)
    hit, delays = power(groups, evaluations, patience, runs, shift=shift, **kw)
    cb = SAGOEarlyStoppingCallback(METRIC[quantity], patience=patience, alpha=alpha)  # the plan, for the table
    cb.plan(groups, list(range(1, evaluations + 1)))
    cell = dict(groups=groups, evaluations=evaluations, patience=patience, runs=runs, looks=cb.looks,
                level=cb.level(1) if cb.looks != 0 else 0.0, false_stops=rate, power=hit,
                delay=float(np.median(delays)) if delays else math.nan)
    if old and quantity == "activation":
        cell["old_false_stops"] = false_stop_rate(groups, evaluations, patience, runs, old=True, **kw)
        cell["old_power"] = power(groups, evaluations, patience, runs, shift=shift, old=True, **kw)[0]
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
    ap.add_argument("--quantity", choices=sorted(METRIC), default="activation")
    a = ap.parse_args(argv)
    logging.getLogger("sago_train").setLevel(logging.ERROR)  # each stop is logged as a warning: thousands here
    cells, start = [], time.perf_counter()
    for groups in a.groups:
        for evaluations in a.evaluations:
            for patience in a.patience:
                cells.append(measure(groups, evaluations, patience, a.runs, alpha=a.alpha, shift=a.shift,
                                     seed=a.seed, old=a.old, quantity=a.quantity))
                print(f"  done groups={groups} evaluations={evaluations} patience={patience} "
                      f"({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"\n{a.quantity}: alpha={a.alpha}, shift={a.shift} SD from evaluation floor(N/2)+1, {a.runs} runs per "
          f"cell and scenario, seed {a.seed}\n")
    print(table(cells, a.alpha))


if __name__ == "__main__":
    main()
