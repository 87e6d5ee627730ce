"""Results of a SAGO evaluation: per-group records, per-set statistics, the summary file and log metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..functional import findings, relations, stats
from ..functional.axes import correctness_summary, in_instability
from ..version import __version__
from .store import write_eval_dir

_clean = stats.to_jsonable


@dataclass
class GroupResult:
    """Everything measured for one group."""

    id: str
    variants: list[Any]
    kinds: list[str] | None
    outputs: list[str] | None
    reference: str | None
    scored_reference: str | None  # r: the reference, or the canonical variant's greedy output
    axes: dict[str, float]
    per_variant: dict[str, list[float]]
    logprobs: list[float] | None = None
    correct: list[bool] | None = None
    extra: dict[str, float] = field(default_factory=dict)
    # Split-half reliability (SPEC "Findings"): the variant indices of each half and each axis on each half.
    split: list[list[int]] | None = None
    halves: dict[str, list[float]] = field(default_factory=dict)

    @property
    def instability(self) -> float:
        """Mean of the axes on the [0, 1] scale (``activation_rel``, a ratio, is left out; SPEC "instability")."""
        vals = [v for a, v in self.axes.items() if in_instability(a) and not math.isnan(v)]
        return float(np.mean(vals)) if vals else math.nan

    def to_record(self) -> dict[str, Any]:
        return _clean(
            {
                "id": self.id,
                "variants": self.variants,
                "kinds": self.kinds,
                "outputs": self.outputs,
                "reference": self.reference,
                "scored_reference": self.scored_reference,
                "axes": self.axes,
                "instability": self.instability,
                "per_variant": self.per_variant,
                "logprobs": self.logprobs,
                "correct": self.correct,
                "extra": self.extra,
                "split": self.split,
                "halves": self.halves,
            }
        )


@dataclass
class SetResult:
    """Statistics of one variant set."""

    name: str
    axes: list[str]
    groups: list[GroupResult]
    kinds: list[str] | None
    skipped: dict[str, int]
    seed: int = 0
    n_bootstrap: int = 2000
    # Set-level numbers of set-level axes, e.g. {"activation_rel": {"between_dispersion": {...}, "note": ...}}.
    set_level: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.summaries: dict[str, stats.Summary] = {
            a: stats.bootstrap_ci(self.values(a), n_resamples=self.n_bootstrap, seed=self.seed) for a in self.axes
        }
        self.instability = stats.bootstrap_ci(
            [g.instability for g in self.groups], n_resamples=self.n_bootstrap, seed=self.seed
        )
        correct = [g.correct for g in self.groups if g.correct is not None]
        self.correctness = correctness_summary(correct, self.kinds, n_resamples=self.n_bootstrap, seed=self.seed)
        self.kind_effects: dict[str, relations.KindEffect] = {}
        if self.kinds is not None and self.groups:
            for a in self.axes:
                per_variant = np.array([g.per_variant[a] for g in self.groups], dtype=float)
                self.kind_effects[a] = relations.kind_effect(per_variant, self.kinds)
            if correct and len(correct) == len(self.groups):
                self.kind_effects["correct"] = relations.kind_effect(np.array(correct, dtype=float), self.kinds)
        self.correlation = relations.axis_correlation({a: self.values(a) for a in self.axes})
        self.reliability = {a: findings.split_half_reliability(*self.half_values(a), n_permutations=self.n_bootstrap,
                                                               seed=self.seed) for a in self.axes}

    @property
    def n_groups(self) -> int:
        return len(self.groups)

    def values(self, axis: str) -> np.ndarray:
        return np.array([g.axes.get(axis, math.nan) for g in self.groups], dtype=float)

    def half_values(self, axis: str) -> tuple[np.ndarray, np.ndarray]:
        """Per-group values of ``axis`` on the first and on the second half of the variants (NaN for groups
        with K < 4, which have no split)."""
        pairs = [g.halves.get(axis, [math.nan, math.nan]) for g in self.groups]
        arr = np.array(pairs, dtype=float).reshape(len(pairs), 2)
        return arr[:, 0], arr[:, 1]

    @property
    def between_dispersion(self) -> float:
        """Mean over layers of the set's between-group activation dispersion (NaN unless ``activation_rel``
        was computed): it falls when a model pulls *all* representations together."""
        info = self.set_level.get("activation_rel", {}).get("between_dispersion", {})
        value = info.get("mean")
        return math.nan if value is None else float(value)

    @property
    def notes(self) -> list[str]:
        """Why something was not computed on this set (e.g. ``activation_rel`` on a single group)."""
        return [f"{axis}: {info['note']}" for axis, info in self.set_level.items() if info.get("note")]

    def summary(self) -> dict[str, Any]:
        return _clean(
            {
                "n_groups": self.n_groups,
                "skipped": self.skipped,
                "axes": {a: s.to_dict() for a, s in self.summaries.items()},
                "instability": self.instability.to_dict(),
                "correctness": self.correctness,
                "kinds": {a: k.to_dict() for a, k in self.kind_effects.items()},
                "axis_correlation": self.correlation.to_dict(),
                "reliability": {a: r.to_dict() for a, r in self.reliability.items()},
                "set_level": self.set_level,
                "notes": self.notes,
            }
        )


@dataclass
class EvalResult:
    """The outcome of :meth:`SAGOEvaluator.evaluate` on one or more sets."""

    sets: dict[str, SetResult]
    model: str
    config: dict[str, Any]
    seed: int = 0
    #: Degenerate-output warnings (empty or cross-group identical generations), naming the likely cause.
    warnings: list[str] = field(default_factory=list)

    @property
    def axes(self) -> list[str]:
        return next(iter(self.sets.values())).axes if self.sets else []

    def all_values(self, axis: str) -> np.ndarray:
        return np.concatenate([s.values(axis) for s in self.sets.values()]) if self.sets else np.array([])

    def axis_correlation(self) -> relations.Correlation:
        """Spearman correlation of per-group axis values over the groups of every set (pooled: descriptive
        only; the finding "axes are distinct" is tested per set by :meth:`axis_relations`)."""
        return relations.axis_correlation({a: self.all_values(a) for a in self.axes})

    def axis_relations(self, alpha: float = findings.ALPHA) -> list[findings.Relation]:
        """Finding 2 per set (never pooled): Spearman with a bootstrap CI, Holm-corrected over every set and
        pair, and a verdict (see :func:`sago_train.functional.findings.axis_relations`)."""
        per_set = {name: {a: s.values(a) for a in s.axes} for name, s in self.sets.items()}
        n_resamples = next(iter(self.sets.values())).n_bootstrap if self.sets else 2000
        return findings.axis_relations(per_set, alpha=alpha, n_resamples=n_resamples, seed=self.seed)

    def instability(self) -> stats.Summary:
        vals = np.concatenate([[g.instability for g in s.groups] for s in self.sets.values()])
        n_resamples = next(iter(self.sets.values())).n_bootstrap if self.sets else 2000
        return stats.bootstrap_ci(vals, n_resamples=n_resamples, seed=self.seed)

    def summary(self) -> dict[str, Any]:
        """The ``summary.json`` document."""
        return _clean(
            {
                "sago_train_version": __version__,
                "model": self.model,
                "config": self.config,
                "sets": {name: s.summary() for name, s in self.sets.items()},
                "instability": self.instability().to_dict(),
                "axis_correlation": self.axis_correlation().to_dict(),
                "axis_relations": [r.to_dict() for r in self.axis_relations()],
                "warnings": list(self.warnings),
            }
        )

    def history_sets(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{"<set>": {"<axis>": {"mean", "ci_low", "ci_high", "n"}}}`` as in SPEC's history lines."""
        out = {}
        for name, s in self.sets.items():
            entry = {a: sm.to_dict() for a, sm in s.summaries.items()}
            entry["instability"] = s.instability.to_dict()
            out[name] = entry
        return _clean(out)

    def metrics(self, prefix: str = "sago") -> dict[str, float]:
        """Flat scalars for a Trainer log: ``<prefix>/<set>/<axis>`` with ``_ci_low``/``_ci_high`` beside."""
        out: dict[str, float] = {}
        for name, s in self.sets.items():
            for a, sm in s.summaries.items():
                out[f"{prefix}/{name}/{a}"] = sm.mean
                out[f"{prefix}/{name}/{a}_ci_low"] = sm.ci_low
                out[f"{prefix}/{name}/{a}_ci_high"] = sm.ci_high
            out[f"{prefix}/{name}/instability"] = s.instability.mean
            if "activation_rel" in s.set_level:
                out[f"{prefix}/{name}/between_dispersion"] = s.between_dispersion
            if "accuracy" in s.correctness:
                out[f"{prefix}/{name}/accuracy"] = s.correctness["accuracy"]
        out[f"{prefix}/instability"] = self.instability().mean
        return out

    def group_records(self, set_name: str) -> list[dict[str, Any]]:
        return [g.to_record() for g in self.sets[set_name].groups]

    def write(self, out_dir: str | Path) -> Path:
        """Write ``summary.json`` and one ``<set>.jsonl`` of group records per set (atomically)."""
        return write_eval_dir(out_dir, self.summary(), {name: self.group_records(name) for name in self.sets})
