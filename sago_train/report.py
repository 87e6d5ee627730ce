"""``report.md`` and PNG plots over recorded SAGO results (run and eval directories; see :mod:`sago_train.compare`).

Plots (matplotlib, drawn on :class:`matplotlib.figure.Figure` objects with the Agg canvas - pyplot's global
state is never touched, so this is safe inside notebooks and tests):

- ``steps_<set>.png``: each axis over training steps, mean over groups with its 95% bootstrap CI as a band,
  several runs overlaid (only for run directories: an eval directory has no steps);
- ``groups_<set>.png``: per-group values at the last evaluation (violin + one dot per group), per axis;
- ``axis_correlation.png``: the Spearman correlation of per-group axis values at the last evaluation (groups of
  every set pooled), one heatmap per run.

``report.md`` embeds them by relative path and adds the last evaluation per set and axis (mean [CI]),
accuracy, the change since the run's baseline, and - with several runs - the paired comparison of each run
against the first on the groups both evaluated.

Everything here reads the JSON files; the statistics come from :mod:`sago_train.stats`.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import stats
from .compare import ACCURACY, INSTABILITY, Evaluation, Run, ordered_union
from .errors import SagoInputError
from .io import atomic_write_bytes
from .report_findings import findings_markdown
from .version import __version__

__all__ = ["ALPHA", "ReportResult", "paired_against_first", "write_report"]

ALPHA = 0.05
_DPI = 110
_Y_INSTABILITY = "instability (lower = more stable)"


@dataclass
class ReportResult:
    """What :func:`write_report` wrote: ``markdown`` (report.md), the ``plots`` and the paired comparisons."""

    out_dir: Path
    markdown: Path
    plots: list[Path] = field(default_factory=list)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------------------------------------------


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def _fmt(x: Any) -> str:
    """Three decimals, or scientific notation for small non-zero values (confidence can be ~1e-4)."""
    v = _num(x)
    if not math.isfinite(v):
        return "-"
    return f"{v:.3f}" if v == 0 or abs(v) >= 0.01 else f"{v:.2e}"


def _fmt_p(p: Any) -> str:
    v = _num(p)
    return "-" if not math.isfinite(v) else f"{v:.3g}"


def _fmt_ci(summary: dict[str, Any] | None) -> str:
    if summary is None or not math.isfinite(_num(summary.get("mean"))):
        return "-"
    lo, hi = summary.get("ci_low"), summary.get("ci_high")
    if not (math.isfinite(_num(lo)) and math.isfinite(_num(hi))):
        return _fmt(summary["mean"])
    return f"{_fmt(summary['mean'])} [{_fmt(lo)}, {_fmt(hi)}]"


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
# Plot plumbing
# ----------------------------------------------------------------------------------------------------------------


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:  # matplotlib is the optional "report" extra
        raise SagoInputError("the report's plots need matplotlib: pip install 'sago_train[report]'") from None
    return Figure


def _save(fig: Any, path: Path) -> Path:
    """Render to PNG in memory, then write atomically (a reader never sees a half-written image)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _grid(fig: Any, n: int, max_cols: int = 3) -> list[Any]:
    """``n`` subplots in a grid of at most ``max_cols`` columns; unused cells are hidden."""
    cols = min(max_cols, max(n, 1))
    rows = math.ceil(max(n, 1) / cols)
    axs = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel().tolist()
    for ax in axs[n:]:
        ax.set_visible(False)
    return axs[:n]


def _legend(fig: Any, labels: Sequence[str], colors: dict[str, str], extra: Sequence[tuple[Any, str]] = ()) -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colors[lab], marker="o", label=lab) for lab in labels]
    handles += [h for h, _ in extra]
    names = list(labels) + [name for _, name in extra]
    fig.legend(handles, names, loc="outside lower center", ncols=min(len(names), 4), frameon=False)


def _floor_at_zero(ax: Any) -> None:
    """Instabilities and accuracies are >= 0: do not let autoscaling show a negative range (all-zero axes)."""
    lo, hi = ax.get_ylim()
    if lo < 0:
        ax.set_ylim(-0.02 * max(hi, 1e-12), hi)


def _colors(labels: Sequence[str]) -> dict[str, str]:
    # One colour per run, the same in every figure.
    return {lab: f"C{i % 10}" for i, lab in enumerate(labels)}


def plot_steps(runs: Sequence[Run], set_name: str, colors: dict[str, str], path: Path) -> Path | None:
    """Each axis (and instability, accuracy) of ``set_name`` over training steps, runs overlaid."""
    runs = [r for r in runs if set_name in r.sets]
    if not runs:
        return None
    panels = ordered_union([a for a in h["sets"].get(set_name, {}) if a != INSTABILITY] for r in runs
                            for h in r.history)
    if any(r.series(set_name, INSTABILITY) for r in runs):
        panels.append(INSTABILITY)
    if any(r.series(set_name, ACCURACY) for r in runs):
        panels.append(ACCURACY)
    from matplotlib.ticker import MaxNLocator

    Figure = _figure_class()
    cols = min(3, len(panels))
    fig = Figure(figsize=(4.4 * cols, 3.3 * math.ceil(len(panels) / cols) + 0.9), layout="constrained")
    for ax, axis in zip(_grid(fig, len(panels)), panels):
        for run in runs:
            series = run.series(set_name, axis)
            if not series:
                continue
            xs = np.array([s for s, _ in series], dtype=float)
            mean = np.array([_num(v.get("mean")) for _, v in series])
            lo = np.array([_num(v.get("ci_low")) for _, v in series])
            hi = np.array([_num(v.get("ci_high")) for _, v in series])
            color = colors[run.label]
            ax.plot(xs, mean, marker="o", markersize=3.5, color=color, label=run.label)
            if np.isfinite(lo).any():
                if xs.size == 1:  # a band needs two points: show the one CI as an error bar
                    ax.errorbar(xs, mean, yerr=[mean - lo, hi - mean], color=color, capsize=4, alpha=0.6)
                else:
                    ax.fill_between(xs, lo, hi, color=color, alpha=0.2, linewidth=0)
        _floor_at_zero(ax)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are integers
        ax.set_title(axis)
        ax.set_xlabel("training step")
        ax.set_ylabel("accuracy (higher = better)" if axis == ACCURACY else _Y_INSTABILITY)
        ax.grid(alpha=0.3)
    from matplotlib.patches import Patch

    _legend(fig, [r.label for r in runs], colors, [(Patch(color="grey", alpha=0.3), "95% bootstrap CI")])
    fig.suptitle(f"set '{set_name}': SAGO over training (mean over groups)")
    return _save(fig, path)


def _group_values(ev: Evaluation, set_name: str, axis: str) -> np.ndarray | None:
    values = ev.group_values(set_name, axis)
    if values is None:
        return None
    arr = np.array(list(values.values()), dtype=float)
    return arr[np.isfinite(arr)]


def plot_groups(evals: Sequence[Evaluation], set_name: str, colors: dict[str, str], path: Path) -> Path | None:
    """Per-group values of each axis of ``set_name`` at each run's last evaluation: a violin and the groups."""
    evals = [e for e in evals if set_name in e.summaries and e.records(set_name) is not None]
    if not evals:
        return None
    panels = ordered_union(e.axes[set_name] for e in evals)
    if any(any(r.get(INSTABILITY) is not None for r in e.records(set_name) or []) for e in evals):
        panels.append(INSTABILITY)
    Figure = _figure_class()
    cols = min(3, len(panels))
    width = max(4.4, 1.1 * len(evals) + 1.5)
    fig = Figure(figsize=(width * cols, 3.4 * math.ceil(len(panels) / cols) + 0.6), layout="constrained")
    rng = np.random.default_rng(0)  # jitter of the dots only; seeded so a report is reproducible
    positions = np.arange(1, len(evals) + 1)
    for ax, axis in zip(_grid(fig, len(panels)), panels):
        for pos, ev in zip(positions, evals):
            vals = _group_values(ev, set_name, axis)
            if vals is None or vals.size == 0:
                continue
            color = colors[ev.label]
            if np.unique(vals).size >= 2:  # a density of one repeated value is meaningless
                body = ax.violinplot([vals], positions=[pos], widths=0.8, showextrema=False)
                for b in body["bodies"]:
                    b.set_facecolor(color)
                    b.set_alpha(0.25)
            ax.scatter(pos + rng.uniform(-0.12, 0.12, vals.size), vals, s=9, color=color, alpha=0.7, linewidths=0)
            ax.hlines(vals.mean(), pos - 0.3, pos + 0.3, color="black", linewidth=1.5)
        _floor_at_zero(ax)
        ax.set_title(axis)
        ax.set_xticks(positions, [e.label for e in evals], rotation=20 if len(evals) > 2 else 0)
        ax.set_xlim(0.4, len(evals) + 0.6)
        ax.set_ylabel(_Y_INSTABILITY)
        ax.grid(alpha=0.3, axis="y")
    step = {e.step for e in evals}
    when = f"step {step.pop()}" if len(step) == 1 and None not in step else "the last evaluation"
    fig.suptitle(f"set '{set_name}': per-group values at {when} (dots: groups; bar: mean)")
    return _save(fig, path)


def pooled_correlation(ev: Evaluation) -> stats.Correlation | None:
    """Spearman correlation of the axes over the per-group values of every set with records (pooled)."""
    axes = ordered_union(ev.axes[s] for s in ev.sets)
    pooled: dict[str, list[float]] = {a: [] for a in axes}
    for s in ev.sets:
        recs = ev.records(s)
        if recs is None:
            continue
        for a in axes:
            values = ev.group_values(s, a) or {}
            pooled[a].extend(values.get(r["id"], math.nan) for r in recs)
    if len(axes) < 2 or not pooled[axes[0]]:
        return None
    return stats.axis_correlation(pooled)


def plot_correlation(evals: Sequence[Evaluation], correlations: Sequence[stats.Correlation | None],
                     path: Path) -> Path | None:
    """One heatmap of Spearman rho (annotated with rho and p) per evaluation."""
    panels = [(e, c) for e, c in zip(evals, correlations) if c is not None]
    if not panels:
        return None
    import matplotlib

    Figure = _figure_class()
    cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="#dddddd")
    cols = min(3, len(panels))
    size = max(3.6, 0.9 * max(len(c.axes) for _, c in panels) + 1.6)
    fig = Figure(figsize=(size * cols + 1.0, size * math.ceil(len(panels) / cols) + 0.6), layout="constrained")
    axs = _grid(fig, len(panels))
    image = None
    for ax, (ev, corr) in zip(axs, panels):
        rho = np.array([[_num(x) for x in row] for row in corr.rho])
        p = np.array([[_num(x) for x in row] for row in corr.p_value])
        image = ax.imshow(np.ma.masked_invalid(rho), vmin=-1, vmax=1, cmap=cmap)
        k = len(corr.axes)
        ax.set_xticks(range(k), corr.axes, rotation=30, ha="right")
        ax.set_yticks(range(k), corr.axes)
        for i in range(k):
            for j in range(k):
                if i == j:
                    text = "1"
                elif not math.isfinite(rho[i, j]):
                    text = "n/a"  # a constant axis (e.g. no mirroring at all) has no rank correlation
                else:
                    text = f"{rho[i, j]:.2f}\np={p[i, j]:.2g}"
                dark = math.isfinite(rho[i, j]) and abs(rho[i, j]) > 0.6
                ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
        ax.set_title(f"{ev.label} (n={corr.n} groups)")
    if image is not None:
        fig.colorbar(image, ax=axs, shrink=0.8, label="Spearman rho")
    fig.suptitle("axis independence: Spearman rho of per-group values\n(grey: undefined, e.g. a constant axis)")
    return _save(fig, path)


# ----------------------------------------------------------------------------------------------------------------
# Paired comparison
# ----------------------------------------------------------------------------------------------------------------


def paired_against_first(evals: Sequence[Evaluation], *, alpha: float = ALPHA, seed: int = 0) -> list[dict[str, Any]]:
    """Each evaluation after the first against the first, per shared set and axis, paired by group id.

    Row: ``{"run", "reference", "set", "axis", "n", "mean_diff", "ci_low", "ci_high", "p_less_stable",
    "p_more_stable", "verdict"}`` with ``mean_diff = run - reference`` (> 0: ``run`` is less stable). Both
    p-values are one-sided Wilcoxon signed-rank tests; since neither direction is chosen in advance, a
    direction is called significant when its p < ``alpha / 2`` (a two-sided test at ``alpha`` overall).
    """
    if len(evals) < 2:
        return []
    ref = evals[0]
    rows: list[dict[str, Any]] = []
    for ev in evals[1:]:
        for s in ref.sets:
            if s not in ev.summaries:
                continue
            axes = [a for a in ref.axes[s] if a in ev.axes[s]] + [INSTABILITY]
            for axis in axes:
                before_by_id, after_by_id = ref.group_values(s, axis), ev.group_values(s, axis)
                row: dict[str, Any] = {"run": ev.label, "reference": ref.label, "set": s, "axis": axis}
                if before_by_id is None or after_by_id is None:
                    rows.append({**row, "n": 0, "verdict": "no per-group records"})
                    continue
                common = [g for g in before_by_id if g in after_by_id]
                before = np.array([before_by_id[g] for g in common], dtype=float)
                after = np.array([after_by_id[g] for g in common], dtype=float)
                if not common or not np.isfinite(before).any():
                    rows.append({**row, "n": 0, "verdict": "no common groups"})
                    continue
                worse = stats.paired_comparison(before, after, alternative="greater", seed=seed)
                better = stats.paired_comparison(before, after, alternative="less", seed=seed)
                if worse.n == 0:
                    rows.append({**row, "n": 0, "verdict": "no common groups with values"})
                    continue
                if worse.p_value < alpha / 2:
                    verdict = f"{ev.label} less stable"
                elif better.p_value < alpha / 2:
                    verdict = f"{ev.label} more stable"
                else:
                    verdict = "no significant difference"
                rows.append({**row, "n": worse.n, "mean_diff": worse.mean_diff, "ci_low": worse.ci_low,
                             "ci_high": worse.ci_high, "p_less_stable": worse.p_value,
                             "p_more_stable": better.p_value, "verdict": verdict})
    return stats.to_jsonable(rows)


# ----------------------------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------------------------


def _describe(src: Run | Evaluation) -> str:
    if isinstance(src, Run):
        steps = src.steps
        return f"training run, {len(steps)} evaluation(s), steps {steps[0]}..{steps[-1]}"
    if src.kind == "run":
        return f"training run, evaluation at step {src.step}"
    return "evaluation" + (f" of {src.model}" if src.model else "")


def _since_baseline(run: Run) -> list[list[Any]]:
    """Rows from the last history line's paired test against the baseline (written by the callback)."""
    last = run.history[-1]
    rows = []
    for s, per_axis in (last.get("compare") or {}).items():
        for axis, entry in (per_axis or {}).items():
            res = (entry or {}).get("vs_baseline")
            if not res:
                continue
            p = _num(res.get("p_value"))
            verdict = "less stable" if math.isfinite(p) and p < ALPHA else "-"
            rows.append([run.label, s, axis, f"{res.get('step')} -> {last['step']}", res.get("n"),
                         _fmt(res.get("mean_diff")), f"[{_fmt(res.get('ci_low'))}, {_fmt(res.get('ci_high'))}]",
                         _fmt_p(p), verdict])
    return rows


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
    result = ReportResult(out_dir=out, markdown=out / "report.md")

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
        have = [e for e in last if s in e.summaries]
        axes = ordered_union(e.axes[s] for e in have)
        header = ["run", "step", *axes, INSTABILITY, ACCURACY, "groups"]
        rows = []
        for e in have:
            acc = e.score(s, ACCURACY)
            n = next((v.get("n") for v in e.summaries[s].values() if v.get("n") is not None), None)
            rows.append([e.label, "-" if e.step is None else e.step,
                         *(_fmt_ci(e.summaries[s].get(a)) for a in axes),
                         _fmt_ci(e.summaries[s].get(INSTABILITY)), _fmt(acc["mean"]) if acc else "-",
                         "-" if n is None else n])
        md += [f"### set `{s}`", "", *_table(header, rows), ""]

    # -- over training steps
    if runs:
        md += ["## Over training steps", "",
               "Mean over groups at each evaluation; the band is the 95% bootstrap CI.", ""]
        for s in sets:
            png = plot_steps(runs, s, colors, out / f"steps_{s}.png")
            if png is not None:
                result.plots.append(png)
                md += [f"![set {s} over training steps]({png.name})", ""]
        baseline_rows = [row for r in runs for row in _since_baseline(r)]
        if baseline_rows:
            md += ["### Change since the baseline", "",
                   "Last evaluation minus the baseline (the first evaluation) on the same groups; p = one-sided "
                   f"Wilcoxon signed-rank test of 'less stable' (alpha = {ALPHA}), as recorded during training.",
                   ""]
            md += _table(["run", "set", "axis", "steps", "n", "difference", "95% CI", "p (less stable)", ""],
                         baseline_rows, left=3)
            md.append("")
    else:
        md += ["(No training history: these are evaluation directories, so there is no over-steps plot.)", ""]

    # -- per-group distributions
    md += ["## Per-group distributions (last evaluation)", ""]
    for s in sets:
        png = plot_groups(last, s, colors, out / f"groups_{s}.png")
        if png is not None:
            result.plots.append(png)
            md += [f"![set {s} per-group values]({png.name})", ""]
        else:
            result.notes.append(f"set '{s}': no per-group records found, no distribution plot")
    missing = [f"{e.label}/{s}" for e in last for s in e.sets if e.records(s) is None]
    if missing:
        md += ["Per-group records missing (no distribution, correlation or paired test for): "
               + ", ".join(f"`{m}`" for m in missing), ""]

    # -- axis correlation
    correlations = [pooled_correlation(e) for e in last]
    png = plot_correlation(last, correlations, out / "axis_correlation.png")
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
               "at each one's last evaluation (> 0: the run is less stable), its 95% paired-bootstrap CI, and "
               "one-sided Wilcoxon signed-rank p-values for 'less stable' and 'more stable'. A direction is "
               f"called significant when its p < {ALPHA / 2:g} (two-sided alpha = {ALPHA}); not corrected for "
               "the number of sets and axes.", ""]
        table_rows = []
        for r in rows:
            if not r.get("n"):
                table_rows.append([r["run"], r["set"], r["axis"], 0, "-", "-", "-", "-", r["verdict"]])
                continue
            table_rows.append([r["run"], r["set"], r["axis"], r["n"], _fmt(r["mean_diff"]),
                               f"[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]", _fmt_p(r["p_less_stable"]),
                               _fmt_p(r["p_more_stable"]), r["verdict"]])
        md += _table(["run", "set", "axis", "n", "difference", "95% CI", "p (less stable)", "p (more stable)",
                      "verdict"], table_rows, left=3)
        md.append("")
        significant = [r for r in rows if r.get("n") and r["verdict"].endswith("stable")]
        if significant:
            md.append("Significant differences:")
            md += [f"- set `{r['set']}`, {r['axis']}: {r['verdict']} than `{ref}` "
                   f"(difference {_fmt(r['mean_diff'])}, p={_fmt_p(min(r['p_less_stable'], r['p_more_stable']))})"
                   for r in significant]
        else:
            md.append(f"No significant stability difference from `{ref}` on any set or axis.")
        md.append("")

    from .io import atomic_write_text

    atomic_write_text(result.markdown, "\n".join(md).rstrip() + "\n")
    return result
