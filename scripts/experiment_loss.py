"""The loss experiment behind `make experiment-loss` (docs/loss-experiment.md): does output-level
self-distillation on fresh variants beat augmentation on the same fresh variants?

    python scripts/experiment_loss.py [--model tiny|smollm2] [--seeds 0,1,2,3,4] [--arms a,b,...] [--steps N]
                                      [--out runs/experiment-loss/<model>] [--summary-only]

For every seed, arm and leave-one-kind-out rotation it trains the model's recipe (recipes/experiment-loss-<model>.yaml)
with the arm's stability overrides (same data, steps, LoRA config and per-seed initialization in every arm), lets
SAGO evaluate the held-out sets at the last step, and appends the per-group records the summary needs to
``<out>/records.jsonl`` (one line per arm, seed, rotation, set and group). A finished (arm, seed, rotation) is
skipped on a rerun, so an interrupted experiment resumes. Then ``<out>/summary.md`` and ``<out>/summary.json``
are computed from the records alone (scripts/experiment_loss_summary.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment_shards import balance, run_shards  # noqa: E402

KINDS = ("typo", "casing", "whitespace")
BASELINE = "augment-fresh"
#: Held-out groups per held-out fact, per model (``--draws``): 52 x 4 = 208 groups a set on the tiny model; 90 x 1
#: on SmolLM2, whose evaluation of a set takes about 40 s per run on one core.
DRAWS = {"tiny": 4, "smollm2": 1}
#: Training seeds per model (``--seeds``): the issue asks for at least 5 on the tiny model and 3 on SmolLM2.
SEEDS = {"tiny": "0,1,2,3,4", "smollm2": "0,1,2,3"}
#: The fact split and perturbation draws per model (``--data-seed``). SmolLM2's is 1: a learning-rate pilot after
#: its first run (data seed 0, docs/loss-experiment.md) looked at seed 0's held-out facts, so the run at the lower
#: learning rate holds out other facts.
DATA_SEEDS = {"tiny": 0, "smollm2": 1}
#: The consistency term's weight, fixed before running (no tuning on any set): the task loss and the KL are
#: both per-token means in nats, so 1.0 weighs them alike.
CONSISTENCY_WEIGHT = 1.0
_OFF = ["--stability.act_weight=0.0", "--stability.conf_weight=0.0"]


def _list(values: list[str]) -> str:
    return "[" + ",".join(values) + "]"


def arm_overrides(arm: str, trained: list[str]) -> list[str]:
    """Recipe overrides of ``arm`` in a rotation that trains the kinds ``trained`` (the stability section is set
    whole by every arm, so no arm inherits another's setting). ``fresh`` arms replace the item's fixed phrasings
    by as many fresh draws of the trained kinds, drawn again each time a group is collated."""
    fresh = ["--stability.fixed_variants=false", f"--stability.fresh_variants={len(trained)}",
             f"--stability.fresh_kinds={_list(trained)}"]
    consistency = ["--stability.mode=consistency", "--stability.teacher=self", "--stability.act_weight=0.0",
                   f"--stability.conf_weight={CONSISTENCY_WEIGHT}"]
    arms = {
        "canonical": ["--stability.task_loss_variants=canonical", *_OFF],
        "augment-fixed": ["--stability.task_loss_variants=all", *_OFF],
        "augment-fresh": ["--stability.task_loss_variants=all", *_OFF, *fresh],
        "consistency-kl": ["--stability.task_loss_variants=all", *fresh, *consistency, "--stability.divergence=kl"],
        "consistency-js": ["--stability.task_loss_variants=all", *fresh, *consistency, "--stability.divergence=js"],
        # The shipped relative loss at the library default (StabilityConfig() of main at ccd9dcd: relative
        # InfoNCE, temperature 0.1, act 0.1, conf 0.1, last-token pooling), on top of augment-fixed.
        "relative-default": ["--stability.task_loss_variants=all", "--stability.mode=relative",
                             "--stability.relative_form=infonce", "--stability.temperature=0.1",
                             "--stability.act_pooling=last", "--stability.act_weight=0.1",
                             "--stability.conf_weight=0.1"],
    }
    if arm not in arms:
        raise SystemExit(f"unknown arm {arm!r}; known: {', '.join(arms)}")
    return arms[arm]


ARMS = ("canonical", "augment-fixed", "augment-fresh", "consistency-kl", "consistency-js", "relative-default")
#: The canonical arm trains on the canonical phrasings only, the same in every rotation: it runs once per seed
#: and is evaluated on every rotation's sets.
ROTATION_FREE = ("canonical",)


def build_sets(model: str, out: Path, kinds: list[str], draws: int, data_seed: int,
               max_train: int | None, max_groups: int | None) -> dict[str, dict[str, Path]]:
    """Write every rotation's train / kinds / instances files under ``out/sets``; ``{held_out: paths}``."""
    from experiment_loss_sets import real_facts, rotation_sets, tiny_facts, write_rotation

    facts = tiny_facts() if model == "tiny" else real_facts()
    return {h: write_rotation(out / "sets", rotation_sets(facts, kinds, h, seed=data_seed, draws=draws,
                                                          max_train=max_train, max_groups=max_groups), h)
            for h in kinds}


def write_recipe(base: Path, path: Path, train: Path, sets: dict[str, Path]) -> Path:
    """The model's recipe with this run's training file and monitored sets (absolute paths)."""
    import yaml

    data = yaml.safe_load(base.read_text())
    data["data"]["train"] = str(train.resolve())
    data["monitor"]["sets"] = {name: str(p.resolve()) for name, p in sets.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def trim_records(run: Path, meta: dict[str, Any], step_dir: Path | None = None) -> list[dict[str, Any]]:
    """The fields the summaries read from every evaluation of the run (or from the records in ``step_dir``, step
    0), one row per step, set and group: correctness per variant, every axis's value and the per-variant
    log-probabilities of the reference (the bare and the after-the-lead-in forms). The loss summary reads each
    run's last step; the validity summary (scripts/validity.py) reads every step."""
    if step_dir is None:
        steps = sorted({int(json.loads(line)["step"]) for line in
                        (run / "sago" / "history.jsonl").read_text().splitlines() if line.strip()})
        dirs = [(step, run / "sago" / f"step-{step}") for step in steps]
    else:
        dirs = [(0, step_dir)]
    rows = []
    for step, folder in dirs:
        for path in sorted(folder.glob("*-*.jsonl")):
            part, _, held_out = path.stem.partition("-")
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                rec = json.loads(line)
                axes = {k: (None if v is None else round(float(v), 6)) for k, v in rec["axes"].items()}
                rows.append({**meta, "rotation": held_out, "set": part, "step": step, "id": rec["id"],
                             "kinds": rec["kinds"], "correct": [int(bool(c)) for c in rec["correct"]],
                             "confidence": axes.get("confidence"), "axes": axes,
                             "logprobs": _rounded(rec.get("logprobs")),
                             "answer_logprobs": _rounded(rec.get("answer_logprobs"))})
    return rows


def _rounded(values: list[float] | None) -> list[float | None] | None:
    return None if values is None else [None if v is None else round(float(v), 5) for v in values]


def _commit() -> str:
    """The checkout's commit (which code produced a record), or "" outside git."""
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:
        return ""


def eval_flags(recipe_path: Path, axes: list[str] | None) -> tuple[dict[str, Any], list[str]]:
    """The recipe (parsed) and the `sago-train eval` flags that evaluate a model as its monitor does (``axes``
    replacing the recipe's where given): the untrained model's reference evaluation."""
    import yaml

    recipe = yaml.safe_load(recipe_path.read_text())
    opts = recipe["monitor"]["options"]
    flags = ["--axes", ",".join(axes or opts["axes"]), "--max-new-tokens", str(opts["max_new_tokens"]),
             "--batch-size", str(opts["batch_size"]), "--max-groups", "0", "--n-bootstrap", str(opts["n_bootstrap"])]
    return recipe, flags + [x for stop in opts.get("stop_strings", []) for x in ("--stop", stop)]


def evaluate_base(args: argparse.Namespace, out: Path, sets: dict[str, dict[str, Path]]) -> int:
    """The untrained model on every rotation's sets, with the recipe's evaluation options: a reference level
    (arm ``base``, seed -1), not an arm the tests compare."""
    from sago_train.cli.main import main as cli

    records = out / "records.jsonl"
    if ("base", -1, "all") in recorded(args, out):
        return 0
    recipe, flags = eval_flags(ROOT / "recipes" / f"experiment-loss-{args.model}.yaml", args.axes)
    eval_dir = out / "runs" / "base"
    t0 = time.perf_counter()
    code = cli(["eval", "--model", recipe["model"]["path"], "--out", str(eval_dir), "--quiet", *flags,
                *(x for h, paths in sets.items() for part in ("kinds", "instances")
                  for x in ("--set", f"{part}-{h}={paths[part]}"))])
    if code:
        return code
    meta = {"model": args.model, "arm": "base", "seed": -1, "run": "all"}
    rows = trim_records(eval_dir, meta, step_dir=eval_dir)
    with records.open("a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    with (out / "timings.jsonl").open("a") as fh:
        fh.write(json.dumps({**meta, "wall_s": round(time.perf_counter() - t0, 1), "commit": _commit()}) + "\n")
    return 0


def done_runs(records: Path) -> set[tuple[str, int, str]]:
    if not records.exists():
        return set()
    return {(r["arm"], r["seed"], r["run"]) for r in map(json.loads, records.read_text().splitlines()) if r}


def recorded(args: argparse.Namespace, out: Path) -> set[tuple[str, int, str]]:
    """The runs already recorded in ``out`` (and, for a shard, in its parent's records)."""
    return done_runs(out / "records.jsonl") | (done_runs(Path(args.also_done)) if args.also_done else set())


def training_overrides(args: argparse.Namespace, seed: int) -> list[str]:
    """The recipe overrides every arm of a seed shares: the training seed, and ``--steps`` / ``--learning-rate``
    where given."""
    extra = [f"--training.seed={seed}"]
    extra += [f"--training.max_steps={args.steps}"] if args.steps else []
    extra += [f"--training.learning_rate={args.learning_rate}"] if args.learning_rate is not None else []
    return extra


def evaluation_overrides(args: argparse.Namespace) -> list[str]:
    """The recipe overrides of ``--axes`` and ``--eval-steps`` (the validity runs: every axis at every checkpoint;
    every evaluation complete, so that each checkpoint has the generation-based axes too)."""
    extra = [f"--monitor.options.axes={_list(args.axes)}"] if args.axes else []
    if args.eval_steps:
        extra += [f"--monitor.eval_steps={args.eval_steps}", "--monitor.generation_every=1"]
    return extra


def shard_args(args: argparse.Namespace, out: Path) -> list[str]:
    """The flags every shard process gets (without its ``--shard`` and ``--out``): the experiment's settings."""
    common = ["--model", args.model, "--seeds", ",".join(map(str, args.seeds)), "--arms", ",".join(args.arms),
              "--kinds", args.kinds, "--draws", str(args.draws), "--data-seed", str(args.data_seed),
              "--also-done", str(out / "records.jsonl"), "--no-summary"]
    for flag, value in (("--steps", args.steps), ("--learning-rate", args.learning_rate),
                        ("--max-train", args.max_train), ("--max-groups", args.max_groups),
                        ("--axes", ",".join(args.axes) if args.axes else None), ("--eval-steps", args.eval_steps)):
        if value is not None:
            common += [flag, str(value)]
    return common + ["--no-base"] * args.no_base + ["--keep-runs"] * args.keep_runs


def run_all(args: argparse.Namespace, out: Path, sets: dict[str, dict[str, Path]]) -> int:
    """Train and record this shard's share of the runs not yet recorded (:func:`experiment_shards.balance`)."""
    import yaml

    from sago_train.cli.main import main as cli

    base = ROOT / "recipes" / f"experiment-loss-{args.model}.yaml"
    records, timings = out / "records.jsonl", out / "timings.jsonl"
    done = recorded(args, out)
    kinds = list(sets)
    jobs = [(seed, arm, rot) for seed in args.seeds for arm in args.arms
            for rot in (["all"] if arm in ROTATION_FREE else kinds) if (arm, seed, rot) not in done]
    shard, shards = args.shard
    # A run's cost is the sets it evaluates (a rotation-free run evaluates every rotation's); shard 0 also
    # evaluates the untrained model on every set once, about one checkpoint of a rotation-free run.
    steps = args.steps or int(yaml.safe_load(base.read_text())["training"]["max_steps"])
    evals = max(1, steps // args.eval_steps) if args.eval_steps else 1
    costs = [2 * (len(kinds) if rot == "all" else 1) * evals + 1 for _, _, rot in jobs]
    untrained = 0 if args.no_base or ("base", -1, "all") in done else 2 * len(kinds)
    mine = [job for job, i in zip(jobs, balance(jobs, costs, shards, preload=[untrained])) if i == shard]
    for seed, arm, rot in mine:
        held = kinds if rot == "all" else [rot]
        monitored = {f"{part}-{h}": sets[h][part] for h in held for part in ("kinds", "instances")}
        trained = [k for k in kinds if k != (kinds[0] if rot == "all" else rot)]
        recipe = write_recipe(base, out / "recipes" / f"{rot}.yaml", sets[held[0]]["train"], monitored)
        run_dir = out / "runs" / arm / f"seed{seed}" / rot
        if run_dir.exists():
            shutil.rmtree(run_dir)  # an interrupted run: start it again
        extra = training_overrides(args, seed) + evaluation_overrides(args)
        print(f"=== {arm} seed {seed} rotation {rot}", flush=True)
        t0 = time.perf_counter()
        code = cli(["run", str(recipe), "--name", f"{arm}-s{seed}-{rot}", "--output-dir", str(run_dir),
                    *arm_overrides(arm, trained), *extra])
        if code:
            return code
        wall = time.perf_counter() - t0
        meta = {"model": args.model, "arm": arm, "seed": seed, "run": rot}
        rows = trim_records(run_dir, meta)
        with records.open("a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
        with timings.open("a") as fh:
            fh.write(json.dumps({**meta, "wall_s": round(wall, 1), "commit": _commit()}) + "\n")
        print(f"=== {arm} seed {seed} rotation {rot}: {wall:.0f} s", flush=True)
        if not args.keep_runs:
            shutil.rmtree(run_dir)  # the records hold what the summary needs
    return 0


def publish(out: Path, dest: Path, *, names: tuple[str, ...] = ("summary.md", "summary.json", "timings.jsonl"),
            fields: tuple[str, ...] | None = None) -> None:
    """Copy what the summary is computed from (records gzipped: a few hundred kB) and the summary files ``names``;
    with ``fields``, each record keeps only those keys (scripts/validity.py publishes a slimmer copy)."""
    import gzip

    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (out / name).exists():
            shutil.copyfile(out / name, dest / name)
    # mtime=0: the same records give the same bytes, so a re-publish does not show as a change.
    records = out / "records.jsonl"
    if records.exists():
        data = records.read_bytes()
        if fields is not None:
            rows = (json.loads(line) for line in data.decode().splitlines() if line.strip())
            data = "".join(json.dumps({k: r[k] for k in fields}, separators=(",", ":")) + "\n" for r in rows).encode()
        (dest / "records.jsonl.gz").write_bytes(gzip.compress(data, mtime=0))
    elif (out / "records.jsonl.gz").exists() and (out / "records.jsonl.gz").resolve() != (dest / "records.jsonl.gz").resolve():
        shutil.copyfile(out / "records.jsonl.gz", dest / "records.jsonl.gz")  # summarized from the committed copy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--seeds", default=None,
                    help="training seeds, shared by every arm (comma-separated); default 0-4 for tiny, 0-3 for smollm2")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {', '.join(ARMS)}")
    ap.add_argument("--kinds", default=",".join(KINDS), help="perturbation kinds (generator names), rotated")
    ap.add_argument("--draws", type=int, default=None,
                    help="held-out groups per held-out fact (own perturbation draws); default 4 for tiny (208 groups "
                         "a set), 1 for smollm2 (90 groups a set: its evaluation is about 40 s a set and run)")
    ap.add_argument("--data-seed", type=int, default=None,
                    help="seed of the fact split and the perturbation draws; default 0 for tiny, 1 for smollm2")
    ap.add_argument("--steps", type=int, default=None, help="override training.max_steps")
    ap.add_argument("--learning-rate", type=float, default=None,
                    help="override training.learning_rate (the first SmolLM2 run: 3e-3 with --data-seed 0)")
    ap.add_argument("--axes", default=None,
                    help="comma-separated axes every evaluation computes (default: the recipe's); the validity runs "
                         "record every axis")
    ap.add_argument("--eval-steps", type=int, default=None,
                    help="also evaluate every N training steps (default: only at the last step); every checkpoint "
                         "is recorded")
    ap.add_argument("--max-train", type=int, default=None, help="use only the first N training facts (tests)")
    ap.add_argument("--max-groups", type=int, default=None, help="use only the first N held-out groups (tests)")
    ap.add_argument("--shard", default="0/1", metavar="I/N",
                    help="run only the I-th (0-based) of N even shares of the runs not yet recorded (by the sets each "
                         "evaluates), e.g. two processes on two cores with 0/2 and 1/2, the same --also-done and "
                         "their own --out; their records.jsonl and timings.jsonl concatenated are the experiment's "
                         "(the untrained model is evaluated by shard 0)")
    ap.add_argument("--shards", type=int, default=1,
                    help="run in N processes at once (one thread each: on 2 cores, --shards 2 halves the wall time) "
                         "and merge their records")
    ap.add_argument("--also-done", default=None, help=argparse.SUPPRESS)  # a shard: runs its parent has recorded
    ap.add_argument("--no-summary", action="store_true", help=argparse.SUPPRESS)  # a shard: the parent summarizes
    ap.add_argument("--out", default=None, help="default runs/experiment-loss/<model>")
    ap.add_argument("--no-base", action="store_true", help="skip the untrained model's reference evaluation")
    ap.add_argument("--keep-runs", action="store_true", help="keep each run's folder (adapter, SAGO history)")
    ap.add_argument("--summary-only", action="store_true", help="recompute the summary from existing records")
    ap.add_argument("--publish", default=None, metavar="DIR",
                    help="also copy the summary, the timings and the gzipped records to DIR (what is committed under "
                         "benchmarks/results/experiment-loss/<model>/)")
    args = ap.parse_args(argv)
    args.seeds = [int(s) for s in (args.seeds or SEEDS[args.model]).split(",") if s.strip()]
    if args.draws is None:
        args.draws = DRAWS[args.model]
    if args.data_seed is None:
        args.data_seed = DATA_SEEDS[args.model]
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    args.axes = [a.strip() for a in args.axes.split(",") if a.strip()] if args.axes else None
    try:
        shard, shards = (int(x) for x in args.shard.split("/"))
    except ValueError:
        raise SystemExit(f"--shard must be I/N with integers, got {args.shard!r}") from None
    if not 0 <= shard < shards:
        raise SystemExit(f"--shard I/N needs 0 <= I < N, got {args.shard!r}")
    args.shard = (shard, shards)
    for arm in args.arms:
        arm_overrides(arm, [])  # unknown names fail before anything runs
    if BASELINE not in args.arms:
        raise SystemExit(f"--arms must include the baseline {BASELINE!r}: every test is paired against it")
    out = Path(args.out or f"runs/experiment-loss/{args.model}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.shards < 1 or (args.shards > 1 and args.shard != (0, 1)):
        raise SystemExit("--shards N needs N >= 1, and runs the --shard i/N processes itself")
    if args.shards > 1 and not args.summary_only:
        code = run_shards(args, out, script=__file__, common=shard_args(args, out))
        if code:
            return code
    elif not args.summary_only:
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        sets = build_sets(args.model, out, kinds, args.draws, args.data_seed, args.max_train, args.max_groups)
        code = run_all(args, out, sets) or (0 if args.no_base or shard else evaluate_base(args, out, sets))
        if code:
            return code
    if args.no_summary:
        return 0
    from experiment_loss_summary import write_summary

    text = write_summary(out / "records.jsonl", out, baseline=BASELINE, timings=out / "timings.jsonl")
    print(text)
    if args.publish:
        publish(out, Path(args.publish))
    print(f"experiment finished in {time.perf_counter() - t0:.0f} s; summary: {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
