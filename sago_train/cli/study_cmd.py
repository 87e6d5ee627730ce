"""``sago-train study``: the paper's findings across models, in one command: every model (or checkpoint, or
adapter) evaluated on the same variant sets, then per model the split-half reliability of each axis and set, per
set the axis relations, and across sets each set's ranking of the models, Kendall's tau between sets and the
robust rank flips (``compare``), with ``report.md`` and its plots (``report``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ..errors import SagoInputError
from ..eval.config import SAGOConfig
from ..formatting import printable
from ..io import (
    acquire_run_lock,
    atomic_write_json,
    check_output_dir,
    check_output_path,
    is_safe_name,
    release_run_lock,
)
from ..results.layout import SUMMARY, report_files
from .dataclass_args import add_dataclass_arguments

COMPARISON = "comparison.json"  # OUT/report/: what sago-train compare --json writes
DEFAULT_MODELS = ("smollm2=sago://smollm2-135m-instruct", "gemma=sago://gemma-3-270m")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "study",
        help="evaluate several models on the same sets: reliability, axis relations, rankings and rank flips",
        description="Evaluate several models, checkpoints or adapters on the same variant sets (each into "
        "OUT/NAME, as 'sago-train eval --out' writes it), then compare them: each set's ranking of the models per "
        "axis, Kendall's tau between the sets' rankings and the robust rank flips (as 'sago-train compare'), and "
        "OUT/report/report.md with the per-model split-half reliability, the per-set axis relations and the plots "
        "(as 'sago-train report'), and OUT/report/comparison.json (as 'sago-train compare --json'); the findings are "
        "printed as report.md states them. --reuse keeps the evaluations and recomputes the rest (about 2 minutes "
        "for `make study`). Default models: the two real models (" + ", ".join(DEFAULT_MODELS) + ").",
    )
    p.add_argument("--model", dest="models", action="append", metavar="NAME=PATH",
                   help="a model folder (full model or PEFT adapter) or sago:// model, named NAME in the output; "
                   "repeat for several (at least 2)")
    p.add_argument("--set", dest="sets", action="append", metavar="NAME=FILE",
                   help="a variant set (JSONL), 'real' / 'tiny' for a bundled collection, or one of its sets "
                   "('real/capitals'); repeat for several (default: real)")
    add_dataclass_arguments(p, SAGOConfig, flags={"stop_strings": "--stop"})
    p.add_argument("--out", required=True, metavar="DIR", help="one evaluation directory per model, and report/")
    p.add_argument("--reuse", action="store_true",
                   help="keep a model's evaluation already in OUT/NAME (evaluated with the same options) instead of "
                   "evaluating it again")
    p.add_argument("--dtype", default=None, help="float32|bfloat16|float16 (default: the model's)")
    p.set_defaults(func=run)
    return p


def parse_models(values: list[str] | None) -> list[tuple[str, str]]:
    """``NAME=PATH`` (or a bare PATH, named after its last part) -> ``[(name, path)]``; names are unique and
    become folder names.

    Example:
        >>> parse_models(["a=sago://smollm2-135m-instruct", "runs/demo-real/augment"])
        [('a', 'sago://smollm2-135m-instruct'), ('augment', 'runs/demo-real/augment')]
    """
    out: list[tuple[str, str]] = []
    for value in values or list(DEFAULT_MODELS):
        name, sep, path = value.partition("=")
        if not sep or "://" in name:
            name, path = Path(value.rstrip("/")).name or value, value
        if not is_safe_name(name):
            raise SagoInputError(f"model name {name!r} cannot be a folder name", key="model",
                                 hint="use letters, digits, '_', '-', '+' or '.' (NAME=PATH)")
        if name in (n for n, _ in out):
            raise SagoInputError(f"two models named {name!r}", key="model", hint="give each a NAME=PATH")
        out.append((name, path))
    if len(out) < 2:
        raise SagoInputError(f"a study compares at least 2 models, got {len(out)}", key="model")
    return out


def _reusable(path: Path, config: SAGOConfig, model: str, fingerprints: dict[str, str]) -> str | None:
    """None when ``OUT/NAME`` holds an evaluation of this model with these options on these very sets (their
    fingerprints: the groups and the settings that change the numbers), else why not ("" when it holds none). A summary that is not
    JSON, or not an object, is refused naming the file (it is no evaluation to reuse or to set aside)."""
    import json

    from ..errors import type_name
    from ..integrations.fingerprint import FINGERPRINT_KEY

    src = path / SUMMARY
    if not src.is_file():
        return ""
    try:
        data = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise SagoInputError(f"cannot reuse: not a summary written by sago-train ({type(err).__name__})",
                             source=str(src), hint="remove the file, or run the study without --reuse") from None
    if not isinstance(data, dict) or not isinstance(data.get("config", {}), dict):
        raise SagoInputError(f"cannot reuse: expected an object with 'config', got {type_name(data)}",
                             source=str(src), hint="remove the file, or run the study without --reuse")
    config_seen = data.get("config") or {}
    recorded = {k: v for k, v in config_seen.items() if k not in ("resolved", "generation", FINGERPRINT_KEY)}
    if data.get("model") != model:
        return "another model was evaluated there"
    if recorded != config.to_dict():
        return "it was evaluated with other options"
    seen = config_seen.get(FINGERPRINT_KEY)
    if not isinstance(seen, dict):
        return "it records no fingerprints of its sets"
    changed = sorted(n for n in fingerprints if seen.get(n) != fingerprints[n]) or sorted(set(seen) - set(fingerprints))
    if changed:
        return f"the set '{changed[0]}' differs from the one it was evaluated on (other groups or prompts)"
    return None


def check_study_outputs(out: Path, models: list[tuple[str, str]], sets: dict[str, Any]) -> None:
    """Every path the study will write, before any model loads: each evaluation directory ``OUT/NAME`` and its
    files (as ``sago-train eval --out`` checks them), ``OUT/report`` with report.md, every plot and
    comparison.json. A directory or a link (below OUT) where a file goes, an input set, or an unwritable place is
    refused now, not after the evaluations."""
    from .eval_cmd import check_outputs

    check_output_dir(out, what="--out")
    for name, _ in models:
        check_outputs(out / name, sets, root=out)
    report = out / "report"
    check_output_path(report, what="--out", directory=True, root=out)
    for path in [*report_files(report, list(sets)), report / COMPARISON]:
        check_output_path(path, what="--out", root=out)


def run(args: argparse.Namespace) -> int:
    from .eval_cmd import config_from_args

    config = config_from_args(args)
    from ..distributed import launch_env

    launch_env()  # a WORLD_SIZE that is not a count, or one left from another launch: one line now
    models = parse_models(args.models)
    out = Path(args.out)
    check_output_dir(out, what="--out")  # before the sets are read
    from ..data.sources import sets_from_specs
    from .console import make_console

    console = make_console()
    sets = sets_from_specs(args.sets or ["real"], key="set")
    check_study_outputs(out, models, sets)
    acquire_run_lock(out)  # one process per study directory, as a run's
    try:
        return _study(args, config, models, sets, out, console)
    finally:
        release_run_lock(out)


def _study(args: argparse.Namespace, config: SAGOConfig, models: list[tuple[str, str]], sets: Any, out: Path,
           console: Any) -> int:
    from ..analysis.compare import compare_evaluations, load_sources
    from ..analysis.report import write_report
    from ..analysis.report_findings import findings_markdown
    from ..eval.evaluator import SAGOEvaluator
    from ..formatting import fmt_num
    from ..integrations.fingerprint import FINGERPRINT_KEY, set_fingerprints
    from .compare_cmd import print_comparison
    from .console import user_text

    fingerprints = set_fingerprints(sets, config)
    timings = {}
    for name, path in models:
        target = out / name
        if args.reuse:
            why = _reusable(target, config, path, fingerprints)
            if why is None:
                console.print(f"study: {name}: reusing {user_text(target)}")
                continue
            if why:
                console.print(f"study: {name}: not reusing {user_text(target)}: {user_text(why)}")
        start = time.perf_counter()
        evaluator = SAGOEvaluator.from_pretrained(path, dtype=args.dtype, config=config)
        evaluator.remedy_style = "cli"  # warnings name flags
        result = evaluator.evaluate(sets)
        result.model = path
        result.config[FINGERPRINT_KEY] = fingerprints
        result.write(target)
        if result.kept_previous:
            console.print(f"study: {name}: kept the evaluation that was in {user_text(target)}: its "
                          f"{result.kept_previous[1]} files moved to {user_text(result.kept_previous[0])}")
        timings[name] = time.perf_counter() - start
        accuracy = ", ".join(f"{s}: {fmt_num(v.accuracy.mean) if v.accuracy else '-'}" for s, v in result.sets.items())
        console.print(f"study: {name} ({user_text(path)}) evaluated in {timings[name]:.0f} s; accuracy {accuracy}")
        for note in result.warnings:
            console.print(f"study: {name}: warning: {user_text(note)}")
    evals = load_sources([str(out / name) for name, _ in models], last_only=True)
    for ev, (name, _) in zip(evals, models):
        ev.label = name
    comparison = compare_evaluations(evals)
    print_comparison(comparison, console)
    report = write_report(evals, out / "report")
    atomic_write_json(out / "report" / COMPARISON, comparison)
    # The findings as report.md states them (per model: reliability per set and axis, axis relations per set;
    # across models: rank reversal), printed from the recorded evaluations, so a --reuse run prints them too.
    for line in findings_markdown(evals):  # markup off; control characters in names and kinds escaped
        console.print(printable(line), markup=False, highlight=False)
    console.print(f"study: wrote {user_text(report.markdown)} (reliability per model, axis relations per set, rank "
                  f"reversal, plots), {user_text(out / 'report' / COMPARISON)} (the rankings, Kendall's tau and flips "
                  f"above) and {len(models)} evaluation directories under {user_text(out)}"
                  + (f"; evaluations took {sum(timings.values()):.0f} s" if timings else ""))
    return 0
