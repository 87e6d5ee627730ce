"""``sago-train report``: report.md and PNG plots over recorded runs or evaluation directories."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import SagoInputError
from ..io import check_output_path
from ..results.layout import REPORT_MD
from ..results.store import Run


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="plots and report.md over recorded runs or evaluations",
        description="Write report.md with PNG plots from SAGO results: each axis over training steps with 95% CI "
        "bands, per-group distributions and the axis-correlation heatmap at the last evaluation, a table of the "
        "last evaluation per set and axis with accuracy, and - with several directories - the paired comparison "
        "of each against the first (paired by group id; accuracy compared beside every axis, with a warning where it "
        "fell) and each entry's accuracy beside the stability axes it ranks first on. A directory is a training run's output_dir (with "
        "sago/history.jsonl), its sago/ folder, or an evaluation directory from 'sago-train eval --out' "
        "(summary.json; no over-steps plot). RUN_DIR@STEP reports the evaluation at that step.",
    )
    p.add_argument("dirs", nargs="+", metavar="RUN_DIR", help="run or evaluation directories (the first is the "
                   "reference of the paired comparison)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output directory (default for one directory: RUN_DIR/sago/report, or DIR/report for an "
                   "evaluation directory; required for several)")
    p.set_defaults(func=run)
    return p


def default_out(source: Any) -> Path:
    """Where a single directory's report goes when --out is not given: beside the results it reads."""
    if isinstance(source, Run):
        return source.sago_dir / "report"
    if source.source == "run" and source.records_dir is not None:  # RUN_DIR@STEP
        return source.records_dir.parent / f"report-step-{source.step}"
    return Path(source.path) / "report"


def check_report_out(out: Path, inputs: dict[str, Path]) -> None:
    """The report's directory and ``report.md``: a directory, writable, no link below it, not a results file read."""
    check_output_path(out, what="--out", directory=True)
    check_output_path(out / REPORT_MD, what="--out", inputs=inputs, root=out)


def run(args: argparse.Namespace) -> int:
    if len(args.dirs) > 1 and args.out is None:
        raise SagoInputError("--out DIR is required when reporting on several directories")
    from ..analysis.compare import load_sources, parse_spec
    from ..analysis.report import is_significant, write_report
    from ..formatting import fmt_num
    from ..functional.stats import NOT_ENOUGH
    from ..results.layout import result_files
    from .console import make_console
    from .console import user_text as esc

    inputs = {label: path for d in args.dirs for label, path in result_files(parse_spec(d)[0]).items()}
    if args.out is not None:  # checked before anything is read
        check_report_out(Path(args.out), inputs)
    sources = load_sources(args.dirs)
    out = Path(args.out) if args.out is not None else default_out(sources[0])
    check_report_out(out, inputs)  # before any plot is drawn
    result = write_report(sources, out)
    console = make_console()
    console.print(f"wrote {esc(str(result.markdown))} and {len(result.plots)} plot(s):")
    for png in result.plots:
        console.print(f"  {esc(str(png))}")
    for note in result.notes:
        console.print(f"  note: {esc(note)}")
    for warning in result.warnings:  # accuracy that fell significantly (docs/accuracy.md)
        console.print(f"  [red]warning[/red]: {esc(warning)}")
    significant = [r for r in result.comparisons if is_significant(r)]
    for r in significant:
        console.print(f"  {esc(r['set'])}/{esc(r['axis'])}: {esc(r['verdict'])} "
                      f"(difference {fmt_num(r['mean_diff'])} [{fmt_num(r['ci_low'])}, {fmt_num(r['ci_high'])}])")
    # Too few groups is said, never folded into "no difference".
    untested = [r for r in result.comparisons if not r.get("n") or r.get("outcome") == NOT_ENOUGH]
    for r in untested:
        console.print(f"  {esc(r['set'])}/{esc(r['axis'])}: {esc(r['run'])} vs {esc(r['reference'])}: {esc(r['verdict'])}")
    if result.comparisons and not significant:
        where = " where it could be tested" if untested else ""
        console.print(f"  no significant stability difference from {esc(sources[0].label)}{where}")
    return 0
