"""PNG plots of ``sago-train report`` (matplotlib :class:`~matplotlib.figure.Figure` objects on the Agg canvas;
pyplot's global state is never touched, so this is safe inside notebooks and tests)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SagoInputError
from ..formatting import constant_value, fmt_num, p_text
from ..functional import relations
from ..io import atomic_write_bytes
from ..results.evaluation import ACCURACY, INSTABILITY, Evaluation, ordered_union
from ..results.store import Run

_DPI = 110
_Y_INSTABILITY = "instability (lower = more stable)"


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


# ----------------------------------------------------------------------------------------------------------------
# Plot plumbing
# ----------------------------------------------------------------------------------------------------------------


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:  # matplotlib is the optional "report" extra
        raise SagoInputError("the report's plots need matplotlib: pip install matplotlib (a sago_train dependency)") from None
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


def constant_axes(evals: Sequence[Evaluation], set_name: str) -> dict[str, float]:
    """Axes of ``set_name`` with one same value on every group of every evaluation in ``evals`` (said in one
    line instead of a column or a panel), and that value."""
    out: dict[str, float] = {}
    have = [e.sets[set_name] for e in evals if set_name in e.sets]
    for axis in ordered_union(s.axes for s in have):
        values = {constant_value(s.summaries[axis]) if axis in s.summaries else None for s in have}
        if len(values) == 1 and None not in values:
            out[axis] = values.pop()
    return out


def plot_steps(runs: Sequence[Run], set_name: str, colors: dict[str, str], path: Path) -> Path | None:
    """Each axis (and instability, accuracy) of ``set_name`` over training steps, runs overlaid."""
    runs = [r for r in runs if set_name in r.sets]
    if not runs:
        return None
    evaluations = {r.label: r.evaluations() for r in runs}
    constant = constant_axes([ev for evs in evaluations.values() for ev in evs], set_name)
    panels = ordered_union([a for a in ev.sets[set_name].axes if a not in constant]
                           for evs in evaluations.values() for ev in evs if set_name in ev.sets)
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
            # Every evaluation of the run, NaN where this one did not compute the axis (an evaluation without
            # generation): the line breaks there instead of joining evaluations across a gap.
            scores = [(int(ev.step or 0), ev.score(set_name, axis)) for ev in evaluations[run.label]]
            if all(sc is None for _, sc in scores):
                continue
            xs = np.array([st for st, _ in scores], dtype=float)
            mean = np.array([math.nan if sc is None else sc.mean for _, sc in scores])
            lo = np.array([math.nan if sc is None else sc.ci_low for _, sc in scores])
            hi = np.array([math.nan if sc is None else sc.ci_high for _, sc in scores])
            color = colors[run.label]
            ax.plot(xs, mean, marker="o", markersize=3.5, color=color, label=run.label)
            if np.isfinite(lo).any():
                if np.isfinite(mean).sum() == 1:  # a band needs two points: show the one CI as an error bar
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
    evals = [e for e in evals if set_name in e.sets and e.sets[set_name].has_records]
    if not evals:
        return None
    constant = constant_axes(evals, set_name)
    panels = [a for a in ordered_union(e.sets[set_name].axes for e in evals) if a not in constant]
    if any(np.isfinite(e.sets[set_name].values(INSTABILITY)).any() for e in evals):
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


def pooled_correlation(ev: Evaluation) -> relations.Correlation | None:
    """Spearman correlation of the axes over the per-group values of every set with records (pooled)."""
    axes = ordered_union(s.axes for s in ev.sets.values())
    pooled: dict[str, list[float]] = {a: [] for a in axes}
    for s in ev.sets.values():
        if not s.has_records:
            continue
        for a in axes:
            pooled[a].extend(s.values(a))
    if len(axes) < 2 or not pooled[axes[0]]:
        return None
    return relations.axis_correlation(pooled)


def plot_correlation(evals: Sequence[Evaluation], correlations: Sequence[relations.Correlation | None],
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
                    text = f"{fmt_num(rho[i, j])}\n{p_text(p[i, j])}"
                dark = math.isfinite(rho[i, j]) and abs(rho[i, j]) > 0.6
                ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
        ax.set_title(f"{ev.label} (n={corr.n} groups)")
    if image is not None:
        fig.colorbar(image, ax=axs, shrink=0.8, label="Spearman rho")
    fig.suptitle("axis independence: Spearman rho of per-group values\n(grey: undefined, e.g. a constant axis)")
    return _save(fig, path)
