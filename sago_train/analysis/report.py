"""``report.md`` and PNG plots over recorded SAGO results (run and eval directories; see :mod:`sago_train.analysis.compare`).

Plots (matplotlib, drawn on :class:`matplotlib.figure.Figure` objects with the Agg canvas - pyplot's global
state is never touched, so this is safe inside notebooks and tests):

- ``steps_<set>.png``: each axis over training steps, mean over groups with its 95% bootstrap CI as a band,
  several runs overlaid (only for run directories: an eval directory has no steps);
- ``groups_<set>.png``: per-group values at the last evaluation (violin + one dot per group), per axis;
- ``axis_correlation.png``: the Spearman correlation of per-group axis values at the last evaluation (groups of
  every set pooled), one heatmap per run.

(drawn in :mod:`sago_train.analysis.report_plots`). ``report.md`` embeds them by relative path and adds the last
evaluation per set and axis (mean [CI]), accuracy, the change since the run's baseline, the findings with
their tests (:mod:`sago_train.analysis.report_findings`), and - with several runs - the paired comparison of each run
against the first on the groups both evaluated and each entry's accuracy beside the stability axes it ranks first
on (:mod:`sago_train.analysis.accuracy_beside`); a significant fall in accuracy is a warning (docs/accuracy.md).

Everything here reads the JSON files; the statistics come from :mod:`sago_train.functional.stats` and
:mod:`sago_train.functional.findings`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SagoInputError
from ..formatting import constant_line, fmt_num, fmt_p, p_text
from ..functional import stats, verdict_rule
from ..functional.axes import ACCURACY_ALL, ACCURACY_WORST_KIND
from ..io import atomic_write_text, check_output_path
from ..results.compare import ACCURACIES, VS_BASELINE, Change, Comparison, paired_change
from ..results.degenerate import degenerate_sets
from ..results.evaluation import ACCURACY, BETWEEN, INSTABILITY, Evaluation, ordered_union
from ..results.layout import HISTORY, REPORT_MD, report_files, report_plot
from ..results.store import Run
from ..results.wording import READ_BESIDE, change_words, comparison_sentence, set_context
from ..version import __version__
from .accuracy_beside import beside_markdown
from .ranking import compare_evaluations
from .report_findings import findings_markdown
from .report_plots import (
    _colors,
    _figure_class,
    constant_axes,
    plot_correlation,
    plot_groups,
    plot_steps,
    pooled_correlation,
)

__all__ = ["ALPHA", "ReportResult", "is_significant", "paired_against_first", "write_report"]

ALPHA = stats.ALPHA
#: How the report states the one verdict rule (verdict_rule.decide), beside every table that carries a verdict.
RULE = (f"'more/less stable' only when the one-sided Wilcoxon signed-rank p < {ALPHA} in that direction AND the "
        f"{1 - ALPHA:.0%} paired-bootstrap CI of the difference excludes 0 on the same side (the rule shared with "
        f"`compare`, the training callback and early stopping); 'not enough groups' below "
        f"{verdict_rule.min_groups(ALPHA)} paired groups, where no such test can reach p < {ALPHA}")


@dataclass
class ReportResult:
    """What :func:`write_report` wrote: ``markdown`` (report.md), the ``plots`` and the paired comparisons."""

    out_dir: Path
    markdown: Path
    plots: list[Path] = field(default_factory=list)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # accuracy that fell significantly (docs/accuracy.md)


# ----------------------------------------------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------------------------------------------


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def _fmt_ci(summary: stats.Summary | None) -> str:
    if summary is None or not math.isfinite(summary.mean):
        return "-"
    if not (math.isfinite(summary.ci_low) and math.isfinite(summary.ci_high)):
        return fmt_num(summary.mean)
    return f"{fmt_num(summary.mean)} [{fmt_num(summary.ci_low)}, {fmt_num(summary.ci_high)}]"


def _cell(text: Any) -> str:
    """A markdown table cell: a '|' inside a label would split the row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> list[str]:
    """A markdown table; the first ``left`` columns (names) align left, the numbers right."""
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |",
             "|" + "|".join(["---"] * left + ["---:"] * (len(header) - left)) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


# ----------------------------------------------------------------------------------------------------------------
# Paired comparison
# ----------------------------------------------------------------------------------------------------------------


def is_significant(row: dict[str, Any]) -> bool:
    """Whether a row of :func:`paired_against_first` found a significant difference (by the one rule)."""
    return bool(row.get("n")) and row.get("outcome") in (stats.BETTER, stats.WORSE)


def is_baseline(ev: Evaluation) -> bool:
    """Whether ``ev`` measured a model before training: a run's step-0 evaluation (its baseline)."""
    return ev.step == 0


def _words(change: Change, alpha: float) -> str:
    """A row's verdict before the set's context words it (a significant one is reworded by
    :func:`~sago_train.results.wording.comparison_sentence`)."""
    if change.verdict == stats.NOT_ENOUGH:
        return (f"{stats.NOT_ENOUGH} ({change.n}; a paired test at alpha {alpha:g} needs >= "
                f"{verdict_rule.min_groups(alpha)})")
    return change_words(change.quantity, change.verdict)


def paired_against_first(evals: Sequence[Evaluation], *, alpha: float = ALPHA, seed: int = 0) -> list[dict[str, Any]]:
    """Each evaluation after the first against the first, per shared set and axis, paired by group id.

    Row: ``{"run", "reference", "set", "axis", "n", "mean_diff", "ci_low", "ci_high", "p_worse",
    "p_better", "outcome", "verdict"}`` (the fields of a :class:`~sago_train.results.compare.Change`) with ``mean_diff = run - reference`` (> 0: ``run`` is less stable;
    for the accuracy quantities ``accuracy``, ``accuracy_all`` and ``accuracy_worst_kind``, compared beside the
    axes, higher is better and the p-values read "less/more accurate"),
    its ``1 - alpha`` paired-bootstrap CI and the one-sided Wilcoxon p-values of each direction. ``outcome`` is the
    one verdict rule's (:func:`sago_train.functional.verdict_rule.paired_verdict`: ``better``, ``worse``, ``no significant
    difference`` or ``not enough groups``), ``verdict`` the same in words. With ``activation_rel`` recorded, a
    ``between_dispersion`` row compares each group's distance to the other groups ("p_worse" = p of
    "higher"): "less dispersed" flags a fine-tune that pulled unrelated prompts together (a collapse).
    """
    if len(evals) < 2:
        return []
    ref = evals[0]
    rows: list[dict[str, Any]] = []
    for ev in evals[1:]:
        degenerate = degenerate_sets(ev, ref)
        for s in ref.sets:
            if s not in ev.sets:
                continue
            axes = [a for a in ref.sets[s].axes if a in ev.sets[s].axes] + [INSTABILITY]
            if all(np.isfinite(x.sets[s].values(ACCURACY)).any() for x in (ref, ev)):
                axes += [ACCURACY, ACCURACY_ALL]  # stability is never compared without accuracy beside it
                if ev.sets[s].worst_kind is not None:
                    axes.append(ACCURACY_WORST_KIND)
            if "activation_rel" in axes:
                axes.append(BETWEEN)
            first = len(rows)
            for axis in axes:
                row: dict[str, Any] = {"run": ev.label, "reference": ref.label, "set": s, "axis": axis}
                change = paired_change(ref, ev, s, axis, alpha=alpha, seed=seed)
                if change is None or change.n == 0:
                    no_records = ref.sets[s].groups is None or ev.sets[s].groups is None
                    rows.append({**row, "n": 0, "verdict": "no per-group records" if no_records else
                                 "no common groups" if change is None else "no common groups with values"})
                    continue
                if s in degenerate and change.verdict == stats.BETTER and axis not in ACCURACIES:
                    change = replace(change, verdict=stats.DEGENERATE)  # outputs that ignore the question agree
                rows.append({**row, "n": change.n, "mean_diff": change.mean_diff, "ci_low": change.ci_low,
                             "ci_high": change.ci_high, "p_worse": change.p_worse, "p_better": change.p_better,
                             "outcome": change.verdict, "verdict": _words(change, alpha)})
            # The words of a set's verdicts read its accuracy and between-group dispersion verdicts.
            # "A collapse" only against a baseline (the model before training), never against another trained one.
            context = set_context({r["axis"]: r.get("outcome", "") for r in rows[first:]},
                                  against_baseline=is_baseline(ref))
            for r in rows[first:]:
                if r.get("outcome") in (stats.BETTER, stats.WORSE, stats.DEGENERATE):
                    r["verdict"] = comparison_sentence(ev.label, r["axis"], r["outcome"], ref.label, **context)
    return stats.to_jsonable(rows)


# ----------------------------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------------------------


def _describe(src: Run | Evaluation) -> str:
    if isinstance(src, Run):
        steps = src.steps
        skipped = f", {src.skipped_lines} corrupt history line(s) skipped" if src.skipped_lines else ""
        return f"training run, {len(steps)} evaluation(s), steps {steps[0]}..{steps[-1]}{skipped}"
    if src.source == "run":
        return f"training run, evaluation at step {src.step}"
    return "evaluation" + (f" of {src.model}" if src.model else "")


def _since_baseline(run: Run) -> tuple[list[list[Any]], list[str]]:
    """Rows from the last history line's paired test against the baseline (written by the callback), and a
    warning per set whose accuracy fell significantly."""
    last = run.history[-1]
    rows, warnings = [], []
    comparison = Comparison.from_dict(last.get("compare"), last["step"])
    for s in comparison.changes:
        context = set_context(comparison.verdicts(s))
        for axis, c in ((q, e[VS_BASELINE]) for q, e in comparison.of_set(s).items() if VS_BASELINE in e):
            rows.append([run.label, s, axis, f"{c.reference_step} -> {last['step']}", c.n, fmt_num(c.mean_diff),
                         f"[{fmt_num(c.ci_low)}, {fmt_num(c.ci_high)}]", fmt_p(c.p_worse),
                         change_words(axis, c.verdict, **context)])
            if axis == ACCURACY and c.verdict == stats.WORSE:
                warnings.append(_fell(run.label, s, f"since the baseline (steps {c.reference_step} -> {last['step']})",
                                      c.mean_diff, c.ci_low, c.ci_high, c.p_worse, c.n))
    return rows, warnings


def _fell(label: str, set_name: str, since: str, diff: Any, lo: Any, hi: Any, p: Any, n: Any) -> str:
    """The warning that accuracy fell significantly (as the training log says it, see docs/accuracy.md)."""
    return (f"accuracy of `{label}` on set `{set_name}` fell significantly {since}: difference {fmt_num(diff)} "
            f"[{fmt_num(lo)}, {fmt_num(hi)}], p {fmt_p(p)}, {n} groups; {READ_BESIDE}")


def _warning_lines(warnings: Sequence[str]) -> list[str]:
    return [f"**Warning**: {w}." for w in warnings] + ([""] if warnings else [])


def _beside(last: Sequence[Evaluation]) -> list[str]:
    """The section "Stability beside accuracy" (:mod:`sago_train.analysis.accuracy_beside`), on the groups
    ``compare`` scores (each entry on its own where they cannot be matched, as in the findings)."""
    try:
        cmp = compare_evaluations(last, allow_different_groups=True)
    except SagoInputError as err:
        return ["## Stability beside accuracy", "", f"(Not computed: {err.message})", ""]
    return beside_markdown(cmp)


def write_report(sources: Sequence[Run | Evaluation], out_dir: str | os.PathLike[str]) -> ReportResult:
    """Write ``report.md`` and its PNG plots for one or more runs/evaluations (labels must be unique).

    The first source is the reference of the paired comparison.
    """
    if not sources:
        raise SagoInputError("nothing to report: give at least one run or evaluation directory")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise SagoInputError(f"--out {out} is a file, expected a directory")
    _figure_class()  # fail early, before any work, when matplotlib is missing
    out.mkdir(parents=True, exist_ok=True)
    labels = [s.label for s in sources]
    colors = _colors(labels)
    runs = [s for s in sources if isinstance(s, Run)]
    last = [s.evaluation() if isinstance(s, Run) else s for s in sources]
    for ev, lab in zip(last, labels):
        ev.label = lab
    sets = ordered_union(e.sets for e in last)
    for path in report_files(out, sets):  # every file, before any plot is drawn: a directory or link is refused
        check_output_path(path, what="--out", root=out)
    result = ReportResult(out_dir=out, markdown=out / REPORT_MD)
    result.notes += [f"{r.label}: skipped {r.skipped_lines} corrupt line(s) of {r.sago_dir / HISTORY} (each logged "
                     "with its line number)" for r in runs if r.skipped_lines]

    md: list[str] = [
        "# SAGO report",
        "",
        f"Generated by sago_train {__version__}. Every axis is an instability, in [0, 1] except `activation_rel` "
        "(activation over the set's between-group dispersion: 1 = variants as far apart as unrelated prompts): "
        "0 = the model behaves the same on every variant of a group; lower is better. Means are over groups with 95% percentile-"
        "bootstrap CIs; accuracy is reported beside stability, never folded into it.",
        "",
    ]
    md += _table(["run", "source", "directory"], [[s.label, _describe(s), str(s.path)] for s in sources], left=3)
    md.append("")

    # -- last evaluation tables
    md += ["## Last evaluation", ""]
    for s in sets:
        have = [e for e in last if s in e.sets]
        constant = constant_axes(have, s)
        axes = [a for a in ordered_union(e.sets[s].axes for e in have) if a not in constant]
        header = ["run", "step", *axes, INSTABILITY, ACCURACY, "groups"]
        rows = []
        for e in have:
            acc = e.score(s, ACCURACY)
            n = e.sets[s].n_groups or None
            rows.append([e.label, "-" if e.step is None else e.step,
                         *(_fmt_ci(e.sets[s].summaries.get(a)) for a in axes),
                         _fmt_ci(e.sets[s].instability), _fmt_ci(acc), "-" if n is None else n])
        md += [f"### set `{s}`", "", *_table(header, rows), ""]
        md += [f"- {constant_line(a, v)}" for a, v in constant.items()] + ([""] if constant else [])

    # -- over training steps
    if runs:
        md += ["## Over training steps", "",
               "Mean over groups at each evaluation; the band is the 95% bootstrap CI.", ""]
        for s in sets:
            png = plot_steps(runs, s, colors, report_plot(out, "steps", s))
            if png is not None:
                result.plots.append(png)
                md += [f"![set {s} over training steps]({png.name})", ""]
        since = [_since_baseline(r) for r in runs]
        baseline_rows = [row for rows, _ in since for row in rows]
        if baseline_rows:
            md += ["### Change since the baseline", "",
                   "Last evaluation minus the baseline (the first evaluation) on the same groups; p = one-sided "
                   "Wilcoxon signed-rank test of 'less stable' (of 'less accurate' for the accuracy quantities), as "
                   f"recorded during training. Verdict: {RULE}.", ""]
            md += _table(["run", "set", "axis", "steps", "n", "difference", "95% CI", "p (less stable)", ""],
                         baseline_rows, left=3)
            md.append("")
            result.warnings += [w for _, warnings in since for w in warnings]
            md += _warning_lines([w for _, warnings in since for w in warnings])
    else:
        md += ["(No training history: these are evaluation directories, so there is no over-steps plot.)", ""]

    # -- per-group distributions
    md += ["## Per-group distributions (last evaluation)", ""]
    for s in sets:
        png = plot_groups(last, s, colors, report_plot(out, "groups", s))
        if png is not None:
            result.plots.append(png)
            md += [f"![set {s} per-group values]({png.name})", ""]
        else:
            result.notes.append(f"set '{s}': no per-group records found, no distribution plot")
    missing = [f"{e.label}/{s}" for e in last for s in e.sets if not e.sets[s].has_records]
    if missing:
        md += ["Per-group records missing (no distribution, correlation or paired test for): "
               + ", ".join(f"`{m}`" for m in missing), ""]

    # -- axis correlation
    correlations = [pooled_correlation(e) for e in last]
    png = plot_correlation(last, correlations, report_plot(out, "correlation"))
    md += ["## Axis independence", ""]
    if png is not None:
        result.plots.append(png)
        md += ["Spearman correlation of per-group axis values at the last evaluation (groups of every set "
               "pooled: a description only; whether axes are distinct is tested per set under Findings).", "",
               f"![axis correlation]({png.name})", ""]
        md.append("")
    else:
        md += ["(Needs per-group records and at least two axes.)", ""]

    md += findings_markdown(last)

    # -- paired comparison
    if len(last) > 1:
        rows = paired_against_first(last)
        result.comparisons = rows
        ref = last[0].label
        md += [f"## Paired comparison against `{ref}`", "",
               f"Per set and axis, on the groups both evaluated (paired by group id): difference = run - `{ref}` "
               f"at each one's last evaluation (> 0: the run is less stable), its {1 - ALPHA:.0%} paired-bootstrap CI, "
               "and one-sided Wilcoxon signed-rank p-values for 'less stable' and 'more stable'. Verdict: "
               f"{RULE}; not corrected for the number of sets and axes. The `between_dispersion` rows (each group's distance to the other groups, "
               "recorded with `activation_rel`) read 'p (less stable)' as 'higher': a significant drop means the run "
               "pulled unrelated prompts together, which lowers raw activation without any stability.", ""]
        table_rows = []
        for r in rows:
            if not r.get("n"):
                table_rows.append([r["run"], r["set"], r["axis"], 0, "-", "-", "-", "-", r["verdict"]])
                continue
            table_rows.append([r["run"], r["set"], r["axis"], r["n"], fmt_num(r["mean_diff"]),
                               f"[{fmt_num(r['ci_low'])}, {fmt_num(r['ci_high'])}]", fmt_p(r["p_worse"]),
                               fmt_p(r["p_better"]), r["verdict"]])
        md += _table(["run", "set", "axis", "n", "difference", "95% CI", "p (less stable)", "p (more stable)",
                      "verdict"], table_rows, left=3)
        md.append("")
        significant = [r for r in rows if is_significant(r)]
        untested = [f"`{r['set']}`/{r['axis']}" for r in rows if not r.get("n") or r.get("outcome") == stats.NOT_ENOUGH]
        if significant:
            md.append("Significant differences:")
            md += [f"- set `{r['set']}`, {r['axis']}: {r['verdict']} "
                   f"(difference {fmt_num(r['mean_diff'])} [{fmt_num(r['ci_low'])}, {fmt_num(r['ci_high'])}], "
                   f"{p_text(r['p_worse'] if r['outcome'] == stats.WORSE else r['p_better'])})"
                   for r in significant]
        else:
            where = "where it could be tested" if untested else "on any set or axis"
            md.append(f"No significant stability difference from `{ref}` {where}.")
        if untested:
            md.append(f"Not tested (too few paired groups or no records): {', '.join(untested)}.")
        md.append("")
        fell = [_fell(r["run"], r["set"], f"against `{ref}`", r["mean_diff"], r["ci_low"], r["ci_high"],
                      r["p_worse"], r["n"]) for r in rows if r["axis"] == ACCURACY and r.get("outcome") == stats.WORSE]
        result.warnings += fell
        md += _warning_lines(fell)
        md += _beside(last)


    atomic_write_text(result.markdown, "\n".join(md).rstrip() + "\n")
    return result
