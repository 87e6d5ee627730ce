"""The demo behind `make demo`: train the same recipe in several arms (same steps, seed and LoRA
initialization), monitored by SAGO on held-out variant sets, then compare every arm with paired tests.

    python scripts/run_demo.py [--recipe recipes/demo.yaml] [--out runs/demo] [--arms canonical,augment,...]
                               [--arm NAME="--stability.x=1 --training.y=2"] [--baseline augment] [--steps N]
                               [--override "--monitor.options.max_groups=4 ..."]

The default arms (issue 10's fair comparison; each fixes every stability setting it depends on):

- ``canonical``: task loss on the canonical phrasing only, no stability terms;
- ``augment``: task loss on all training phrasings, no stability terms (plain data augmentation);
- ``stability``: canonical task loss + the stability loss as first shipped (anchor mode);
- ``augment+stability``: augmentation + the same stability loss;
- ``relative`` / ``augment+relative``: the same with mode ``relative`` (InfoNCE form, chosen on the tuning
  split of recipes/demo-tune.yaml).

``--arm NAME=OVERRIDES`` defines (or redefines) an arm from recipe overrides, so any recipe (another model)
can reuse the script. Writes ``<out>/<arm>/`` per arm (history, per-group records, TensorBoard and offline
W&B logs, the adapter), ``<out>/report/report.md`` with its plots, and ``<out>/headline.md`` with the tables
docs/demos.md quotes. No network and no account are needed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

_OFF = ["--stability.act_weight=0.0", "--stability.conf_weight=0.0"]
_ANCHOR = ["--stability.act_weight=1.0", "--stability.conf_weight=0.5", "--stability.mode=anchor"]
# The relative form was chosen on the tuning split (recipes/demo-tune.yaml, docs/demo_tuning.md), never on
# the monitoring sets: infonce at temperature 0.1 lowered activation_rel as much as the ratio form and, unlike
# it, confidence instability too.
_RELATIVE = ["--stability.act_weight=1.0", "--stability.conf_weight=0.5", "--stability.mode=relative",
             "--stability.relative_form=infonce", "--stability.temperature=0.1"]
_CANON = ["--stability.task_loss_variants=canonical"]
_ALL = ["--stability.task_loss_variants=all"]
DEFAULT_ARMS: dict[str, list[str]] = {
    "canonical": _CANON + _OFF,
    "augment": _ALL + _OFF,
    "stability": _CANON + _ANCHOR,
    "augment+stability": _ALL + _ANCHOR,
    "relative": _CANON + _RELATIVE,
    "augment+relative": _ALL + _RELATIVE,
}


def parse_arms(names: str | None, definitions: list[str]) -> dict[str, list[str]]:
    """The arms to run, in order: ``names`` (comma-separated) from the defaults or ``definitions``
    (``NAME=OVERRIDES``, shell-quoted recipe overrides); with no ``names``, the defaults then the definitions."""
    custom: dict[str, list[str]] = {}
    for item in definitions:
        name, sep, overrides = item.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"--arm expects NAME=OVERRIDES, got {item!r}")
        custom[name.strip()] = shlex.split(overrides)
    known = {**DEFAULT_ARMS, **custom}
    if names is None:
        order = list(DEFAULT_ARMS) + [n for n in custom if n not in DEFAULT_ARMS]
    else:
        order = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in order if n not in known]
    if unknown:
        raise SystemExit(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(known)} (define one with --arm)")
    return {n: known[n] for n in order}


def analyse(recipe_path: Path, out: Path, arms: list[str], baseline: str, steps: int, seed: int) -> str:
    from demo_analysis import arm_set_values, headline_tables

    from sago_train.cli.recipe import load_recipe
    from sago_train.data import VariantSet
    from sago_train.eval.config import SAGOConfig

    recipe = load_recipe(recipe_path)
    cfg = SAGOConfig.from_kwargs(**recipe.monitor.options)
    sets = {name: VariantSet.from_jsonl(recipe.resolve_path(p), name=name) for name, p in recipe.monitor.sets.items()}
    results = {arm: {s: arm_set_values(out / arm, s, vs, cfg.layers, cfg.prompt_pooling, chat_template=cfg.chat_template)
                     for s, vs in sets.items()} for arm in arms}
    text = headline_tables(results, baseline, steps, seed)
    return text + "\n" + findings(out, arms, baseline)


def findings(out: Path, arms: list[str], baseline: str) -> str:
    """SPEC "Findings" as the report computes them, one heading down: reliability and axis relations of the
    baseline arm (the report has them for every arm), rank reversal across every arm."""
    from demo_analysis import last_step

    from sago_train.analysis.compare import load_evaluation
    from sago_train.analysis.report_findings import findings_markdown

    evals = {}
    for arm in arms:
        ev = load_evaluation(f"{out / arm}@{last_step(out / arm)}")
        ev.label = arm
        evals[arm] = ev
    one = findings_markdown([evals[baseline]])
    every = findings_markdown(list(evals.values()))
    cut_one = next(i for i, line in enumerate(one) if line.startswith("### 3."))
    cut_every = next(i for i, line in enumerate(every) if line.startswith("### 3."))
    lines = one[:cut_one] + every[cut_every:]
    return "\n".join(("#" + line) if line.startswith("#") else line for line in lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "demo.yaml"))
    ap.add_argument("--out", default="runs/demo")
    ap.add_argument("--arms", default=None, help="comma-separated arm names (default: all default arms)")
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=OVERRIDES",
                    help="define an arm from recipe overrides, e.g. 'mine=--stability.act_weight=2 ...'")
    ap.add_argument("--baseline", default="augment", help="the arm every other arm is tested against")
    ap.add_argument("--steps", type=int, default=None, help="override training.max_steps in every arm")
    ap.add_argument("--override", action="append", default=[], metavar="OVERRIDES",
                    help="recipe overrides for every arm (shell-quoted), e.g. '--monitor.options.max_groups=4'")
    ap.add_argument("--no-report", action="store_true", help="skip `sago-train report` over the arms")
    ap.add_argument("--analysis-only", action="store_true", help="rewrite headline.md from existing runs")
    ap.add_argument("--figure", default=None, help="copy the report's first set-over-steps plot here")
    args = ap.parse_args(argv)
    arms = parse_arms(args.arms, args.arm)
    if args.baseline not in arms:
        raise SystemExit(f"--baseline {args.baseline!r} is not among the arms {', '.join(arms)}")
    from sago_train.cli.main import main as cli
    from sago_train.cli.recipe import load_recipe

    recipe_path, out = Path(args.recipe), Path(args.out)
    extra = [f"--training.max_steps={args.steps}"] if args.steps else []
    extra += [token for item in args.override for token in shlex.split(item)]
    recipe = load_recipe(recipe_path, extra)
    steps, seed = int(recipe.training["max_steps"]), int(recipe.training.get("seed", 42))
    t0 = time.perf_counter()
    if not args.analysis_only:
        for name, overrides in arms.items():
            print(f"\n=== arm '{name}': {' '.join(overrides)}", flush=True)
            t_arm = time.perf_counter()
            code = cli(["run", str(recipe_path), "--name", name, "--output-dir", str(out / name), *overrides, *extra])
            if code:
                return code
            print(f"=== arm '{name}' took {time.perf_counter() - t_arm:.0f} s", flush=True)
        if not args.no_report:
            code = cli(["report", *(str(out / a) for a in arms), "--out", str(out / "report")])
            if code:
                return code
            first_set = next(iter(recipe.monitor.sets), None)
            plot = out / "report" / f"steps_{first_set}.png"
            if args.figure and plot.exists():
                shutil.copyfile(plot, args.figure)
    text = f"## Demo result ({recipe.name}, LoRA, {steps} steps)\n\n" + analyse(
        recipe_path, out, list(arms), args.baseline, steps, seed)
    (out / "headline.md").write_text(text)
    print("\n" + text)
    print(f"demo finished in {time.perf_counter() - t0:.0f} s; report: {out / 'report' / 'report.md'}; "
          f"TensorBoard: tensorboard --logdir {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
