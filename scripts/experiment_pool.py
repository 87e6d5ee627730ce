"""The pool experiment behind `make experiment-loss` (docs/loss-experiment.md#the-pool-experiment): does a
consistency term on an **unlabeled pool** of the task's prompts, where augmentation cannot act, beat augmentation
of the labeled set?

    python scripts/experiment_pool.py [--model tiny|smollm2] [--seeds 0,...,19] [--arms a,b,...] [--shards 2]
                                      [--out runs/experiment-pool/<model>] [--summary-only] [--publish DIR]

The tiny model learns an answer format it lacks (``" Paris, indeed."``, scripts/experiment_pool_sets.py) from 16
labeled facts; the prompts of 48 more facts are the unlabeled pool; 40 facts are held out. Every arm trains
``recipes/experiment-pool-tiny.yaml`` with the same labeled data, steps, LoRA config and per-seed initialization
and data order, and differs only in its stability section (and, for the arms that read the pool, in the training
file and a batch 4x as large, so that each step still has 8 labeled items on average: UDA's 3 unlabeled per
labeled). SAGO evaluates the held-out and the training facts at the last step; per-group records (every axis,
correctness and log-probabilities per variant) go to ``<out>/records.jsonl``, the training log (task and term
losses, the unlabeled share, per logging step) to ``<out>/losses.jsonl``, its wall time and peak memory to
``<out>/timings.jsonl`` (each run in a process of its own). A finished (arm, seed) is skipped on a rerun. The
summary (scripts/experiment_pool_summary.py) is computed from the records alone.

``--model smollm2`` runs the same design on SmolLM2-135M-Instruct (``recipes/experiment-pool-smollm2.yaml``: the
real sets' templated facts as chat questions, :func:`experiment_pool_sets.real_facts`) with the arms the design
names for it: ``canonical``, ``augment`` and the tiny model's best term arm (:func:`best_term_arm`, read from the
tiny model's published summary).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from experiment_loss import (  # noqa: E402
    _commit,
    done_runs,
    eval_flags,
    publish,
    trim_records,
    write_recipe,
)
from experiment_pool_sets import FRESH_KINDS  # noqa: E402
from experiment_shards import balance, run_shards  # noqa: E402

RECIPES = {"tiny": ROOT / "recipes" / "experiment-pool-tiny.yaml",
           "smollm2": ROOT / "recipes" / "experiment-pool-smollm2.yaml"}
BASELINE = "augment"
#: Training seeds per model: 20 on the tiny model (the pilot's power analysis); 6 on SmolLM2, fixed on cost before
#: any pool-arm result was read (a pool run there is about 24 min on 2 threads, docs/loss-experiment.md).
SEEDS = {"tiny": ",".join(map(str, range(20))), "smollm2": ",".join(map(str, range(6)))}
#: Held-out groups per held-out fact: 40 x 2 on the tiny model, 71 x 1 on SmolLM2 (its evaluation is the cost).
DRAWS = {"tiny": 2, "smollm2": 1}
#: Where the tiny model's summary is published; SmolLM2's default arms read its best term arm from it.
TINY_SUMMARY = ROOT / "benchmarks" / "results" / "experiment-pool" / "tiny" / "summary.json"
#: The evaluated sets: held-out facts (``instances``: the trained kinds; ``kinds``: kinds never trained) and the
#: training facts themselves (``labeled``, ``pool``).
EVAL_SETS = ("instances", "kinds", "labeled", "pool")
#: Fixed before any arm ran (docs/loss-experiment.md#the-pool-experiment): an EMA teacher with a 10-step
#: horizon (the frozen start lacks the format; 60 steps), KL only where the teacher's top token has p >= 0.5, the
#: term's weight relative to the task loss (1 = as large as it).
TEACHER = ["--stability.mode=consistency", "--stability.teacher=ema", "--stability.ema_decay=0.9",
           "--stability.confidence_threshold=0.5", "--stability.divergence=kl", "--stability.weight_scale=relative",
           "--stability.act_weight=0.0"]
DOSES = (0.3, 1.0, 3.0, 10.0)
MAIN_WEIGHT = 1.0
_FRESH = [f"--stability.fresh_variants={len(FRESH_KINDS)}", f"--stability.fresh_kinds=[{','.join(FRESH_KINDS)}]"]
_OFF = ["--stability.act_weight=0.0", "--stability.conf_weight=0.0"]


def _dose(w: float) -> str:
    return f"{w:g}"


def arms(batch: int = 8) -> dict[str, tuple[str, list[str]]]:
    """``{arm: (training file, overrides)}``; ``labeled`` trains the 16 labeled groups (the recipe's ``batch``),
    ``mixed`` them and the unlabeled pool (4 x ``batch``: the same labeled items a step on average)."""
    pool = [f"--training.per_device_train_batch_size={4 * batch}"]
    table: dict[str, tuple[str, list[str]]] = {
        "canonical": ("labeled", ["--stability.task_loss_variants=canonical", *_OFF, *_FRESH]),
        BASELINE: ("labeled", ["--stability.task_loss_variants=all", *_OFF, *_FRESH]),
        # The positive control: the task loss sees the canonical phrasing only, the term is the one signal that
        # reaches the other phrasings (compare with `canonical`).
        "control-kl": ("labeled", ["--stability.task_loss_variants=canonical", *_FRESH, *TEACHER,
                                   f"--stability.conf_weight={MAIN_WEIGHT}"]),
        # BCT: cross-entropy on the teacher's own greedy answer to the clean prompt, on every phrasing.
        "pool-bct": ("mixed", ["--stability.task_loss_variants=all", *_FRESH, *TEACHER, *pool,
                               "--stability.conf_weight=0.0", "--stability.unlabeled_task_loss=true"]),
    }
    for w in DOSES:
        table[f"pool-kl-{_dose(w)}"] = ("mixed", ["--stability.task_loss_variants=all", *_FRESH, *TEACHER, *pool,
                                                  f"--stability.conf_weight={w:g}"])
    return table


ARMS = tuple(arms())


def best_term_arm(summary: Path = TINY_SUMMARY) -> str:
    """The term arm (neither ``canonical`` nor the baseline) with the largest primary-endpoint difference against
    ``augment`` in a published summary: the one SmolLM2 runs, fixed by the tiny model's result, win or not."""
    if not summary.exists():
        raise SystemExit(f"{summary}: the tiny model's summary is not published; run `make experiment-loss` first "
                         f"or pass --arms")
    tests = json.loads(summary.read_text())["tests"]["instances/accuracy"]
    terms = {arm: t["diff"] for arm, t in tests.items() if arm not in ("canonical", BASELINE, "base")}
    if not terms:
        raise SystemExit(f"{summary}: no term arm in tests['instances/accuracy']; pass --arms")
    return max(terms, key=lambda arm: terms[arm])


def recipe_batch(model: str) -> int:
    import yaml

    return int(yaml.safe_load(RECIPES[model].read_text())["training"]["per_device_train_batch_size"])


def build_sets(out: Path, data_seed: int, draws: int, model: str = "tiny") -> dict[str, Path]:
    """The experiment's files under ``out/sets`` (deterministic), plus ``train-mixed`` (labeled + pool)."""
    from experiment_pool_sets import write

    paths = write(out / "sets", data_seed, draws, model)
    mixed = out / "sets" / "train-mixed.jsonl"
    mixed.write_text(paths["train-labeled"].read_text() + paths["train-pool"].read_text())
    return {**paths, "train-mixed": mixed}


def training_log(run_dir: Path, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's logged losses per logging step (trainer_state.json's log_history, written by `sago-train run`)."""
    state = json.loads((run_dir / "trainer_state.json").read_text())
    keys = ("loss", "sago_task_loss", "sago_conf_loss", "sago_act_loss", "sago_conf_weight", "sago_unlabeled_share")
    return [{**meta, "step": int(e["step"]), **{k: e[k] for k in keys if k in e}}
            for e in state["log_history"] if "sago_task_loss" in e]


def _append(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


def evaluate_base(args: argparse.Namespace, out: Path, sets: dict[str, Path]) -> int:
    """The untrained model on every set (arm ``base``, seed -1): a reference level, never tested."""
    if ("base", -1, "all") in done_runs(out / "records.jsonl") | _also_done(args):
        return 0
    recipe, flags = eval_flags(RECIPES[args.model], args.axes)
    eval_dir = out / "runs" / "base"
    code, wall, rss = run_child(["eval", "--model", recipe["model"]["path"], "--out", str(eval_dir), "--quiet", *flags,
                                 *(x for name in EVAL_SETS for x in ("--set", f"{name}-all={sets[name]}"))])
    if code:
        return code
    meta = {"model": args.model, "arm": "base", "seed": -1, "run": "all"}
    _append(out / "records.jsonl", [_with_fact(r) for r in trim_records(eval_dir, meta, step_dir=eval_dir)])
    _append(out / "timings.jsonl", [{**meta, "wall_s": round(wall, 1), "peak_rss_mb": rss, "threads": run_threads(),
                                     "commit": _commit()}])
    return 0


#: How a run's process starts: this interpreter, this checkout's sago_train.
SAGO_TRAIN = (sys.executable, "-m", "sago_train.cli.main")


def run_child(argv: list[str], command: Sequence[str] = SAGO_TRAIN) -> tuple[int, float, float | None]:
    """``sago-train ARGV`` (``command`` + ARGV) in a process of its own: (exit code, wall seconds, its peak resident
    set in MiB).

    A process per run: in one process, the runs after a pool run inherited its allocator's memory (9 GB held at
    the next run's start) and their first steps ran several times slower, half their CPU in the kernel. The peak
    is the child's own ``VmHWM``, read from /proc every 0.2 s while it runs (a run's peak lasts its training steps;
    Linux carries the parent's high-water mark into ``ru_maxrss`` across exec, tests/_helpers/limited.py);
    ``ru_maxrss`` where /proc does not say (None: neither)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    proc = subprocess.Popen([*command, *argv], cwd=ROOT, env=env)
    hwm = 0
    while True:
        hwm = max(hwm, _vm_hwm_kib(proc.pid))
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
    kib = hwm or (usage.ru_maxrss // (1024 if sys.platform == "darwin" else 1))
    return proc.returncode, time.perf_counter() - t0, (round(kib / 1024, 1) if kib else None)


def _vm_hwm_kib(pid: int) -> int:
    """A process's own peak resident set in KiB (``VmHWM``), or 0 where /proc does not say."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def run_threads() -> int:
    """The intra-op threads a run's process uses (its timings depend on it): OMP_NUM_THREADS, else torch's
    default."""
    import torch

    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else torch.get_num_threads()


def _with_fact(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "fact": row["id"].split("#", 1)[0]}


def _also_done(args: argparse.Namespace) -> set[tuple[str, int, str]]:
    return done_runs(Path(args.also_done)) if args.also_done else set()


def run_all(args: argparse.Namespace, out: Path, sets: dict[str, Path]) -> int:
    table = arms(recipe_batch(args.model))
    done = done_runs(out / "records.jsonl") | _also_done(args)
    monitored = {f"{name}-all": sets[name] for name in EVAL_SETS}
    shard, shards = args.shard
    jobs = [(seed, arm) for seed in args.seeds for arm in args.arms if (arm, seed, "all") not in done]
    for (seed, arm), i in zip(jobs, balance(jobs, [1.0] * len(jobs), shards)):  # the pending runs, in turn
        if i != shard:
            continue
        data, overrides = table[arm]
        recipe = write_recipe(RECIPES[args.model], out / "recipes" / f"{data}.yaml", sets[f"train-{data}"], monitored)
        run_dir = out / "runs" / arm / f"seed{seed}"
        if run_dir.exists():
            shutil.rmtree(run_dir)  # an interrupted run: start it again
        extra = [f"--training.seed={seed}", *(["--training.use_cpu=false"] * args.accelerator)]
        if args.steps:  # a short run (tests) still logs its losses
            extra += [f"--training.max_steps={args.steps}", f"--training.logging_steps={min(args.steps, 10)}"]
        extra += [f"--monitor.options.axes=[{','.join(args.axes)}]"] if args.axes else []
        print(f"=== {arm} seed {seed}", flush=True)
        code, wall, rss = run_child(["run", str(recipe), "--name", f"{arm}-s{seed}", "--output-dir", str(run_dir),
                                     *overrides, *extra])
        if code:
            return code
        meta = {"model": args.model, "arm": arm, "seed": seed, "run": "all"}
        _append(out / "losses.jsonl", training_log(run_dir, meta))
        _append(out / "records.jsonl", [_with_fact(r) for r in trim_records(run_dir, meta)])
        threads = run_threads()
        _append(out / "timings.jsonl", [{**meta, "wall_s": round(wall, 1), "peak_rss_mb": rss, "threads": threads,
                                         "commit": _commit()}])
        print(f"=== {arm} seed {seed}: {wall:.0f} s, peak RSS {rss} MiB on {threads} thread(s)", flush=True)
        if not args.keep_runs:
            shutil.rmtree(run_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=tuple(RECIPES), default="tiny")
    ap.add_argument("--seeds", default=None, help="training seeds, shared by every arm (default 0-19 on tiny, 0-5 on "
                    "smollm2)")
    ap.add_argument("--arms", default=None, help=f"comma-separated, from {', '.join(ARMS)} (default: all on tiny; "
                    "canonical, augment and the tiny model's best term arm on smollm2)")
    ap.add_argument("--data-seed", type=int, default=0, help="seed of the fact split and the perturbation draws")
    ap.add_argument("--draws", type=int, default=None, help="held-out groups per held-out fact (their own noise "
                    "draws; default 2 on tiny, 1 on smollm2)")
    ap.add_argument("--accelerator", action="store_true", help="train on the accelerator (the recipes say use_cpu)")
    ap.add_argument("--steps", type=int, default=None, help="override training.max_steps (tests)")
    ap.add_argument("--axes", default=None, help="comma-separated axes every evaluation computes (default: the "
                    "recipe's)")
    ap.add_argument("--shard", default="0/1", metavar="I/N", help="run only the I-th of N shares of the (seed, arm) runs not yet recorded, in turn")
    ap.add_argument("--shards", type=int, default=1, help="run in N processes of one thread each, then merge")
    ap.add_argument("--also-done", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-summary", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="default runs/experiment-pool/<model>")
    ap.add_argument("--no-base", action="store_true", help="skip the untrained model's reference evaluation")
    ap.add_argument("--keep-runs", action="store_true", help="keep each run's folder")
    ap.add_argument("--summary-only", action="store_true", help="recompute the summary from existing records")
    ap.add_argument("--plan-seeds", type=int, default=None,
                    help="project the primary test's power to this many seeds (a pilot's records planning the run)")
    ap.add_argument("--publish", default=None, metavar="DIR", help="also copy the summary and the gzipped records")
    args = ap.parse_args(argv)
    args.seeds = [int(s) for s in (args.seeds or SEEDS[args.model]).split(",") if s.strip()]
    args.draws = DRAWS[args.model] if args.draws is None else args.draws
    if args.arms is None:
        args.arms = ",".join(ARMS if args.model == "tiny" else ("canonical", BASELINE, best_term_arm()))
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    args.axes = [a.strip() for a in args.axes.split(",") if a.strip()] if args.axes else None
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arm(s) {unknown}; known: {', '.join(ARMS)}")
    if BASELINE not in args.arms:
        raise SystemExit(f"--arms must include the baseline {BASELINE!r}: every test is paired against it")
    shard, shards = (int(x) for x in args.shard.split("/"))
    args.shard = (shard, shards)
    out = Path(args.out or f"runs/experiment-pool/{args.model}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.shards > 1 and not args.summary_only:
        common = ["--model", args.model, "--seeds", ",".join(map(str, args.seeds)), "--arms", ",".join(args.arms), "--data-seed",
                  str(args.data_seed), "--draws", str(args.draws), "--also-done", str(out / "records.jsonl"),
                  "--no-summary", *(["--steps", str(args.steps)] if args.steps else []),
                  *(["--axes", ",".join(args.axes)] if args.axes else []), *(["--no-base"] * args.no_base),
                  *(["--keep-runs"] * args.keep_runs), *(["--accelerator"] * args.accelerator)]
        code = run_shards(args, out, script=__file__, common=common,
                          extra=("records.jsonl", "timings.jsonl", "losses.jsonl"))
        if code:
            return code
    elif not args.summary_only:
        sets = build_sets(out, args.data_seed, args.draws, args.model)
        code = run_all(args, out, sets) or (0 if args.no_base or shard else evaluate_base(args, out, sets))
        if code:
            return code
    if args.no_summary:
        return 0
    from experiment_pool_summary import write_summary

    text = write_summary(out, baseline=BASELINE, planned_seeds=args.plan_seeds, order=ARMS)
    print(text)
    if args.publish:
        publish(out, Path(args.publish), names=("summary.md", "summary.json", "timings.jsonl", "losses.jsonl"))
    print(f"experiment finished in {time.perf_counter() - t0:.0f} s; summary: {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
