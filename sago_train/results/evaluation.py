"""The one record of a SAGO evaluation of one model (:class:`Evaluation`), the same type whether it comes from
:meth:`SAGOEvaluator.evaluate <sago_train.SAGOEvaluator.evaluate>`, from a training run's evaluation at one
step, or from disk, and its two documents: ``summary.json`` (an evaluation directory, with one ``<set>.jsonl``
of group records per set) and a ``history.jsonl`` line (one evaluation of a training run), each written and
read here side by side. Paths are spelled in :mod:`~sago_train.results.layout`; a run's history file in
:mod:`~sago_train.results.store`. Plain JSON and numpy, no torch."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SagoInputError, type_name
from ..functional import findings, relations, stats
from ..functional.stats import Summary
from ..io import atomic_write_files, check_output_path, json_bytes, jsonl_bytes, read_jsonl
from ..limits import read_bounded_text
from ..version import __version__
from .group import ACCURACY, BETWEEN, INSTABILITY, GroupRecord, is_number, to_float
from .layout import SUMMARY, records_name, records_path
from .sets import IDS_KEY, SetEvaluation, _mean_summary, ids_digest

__all__ = ["ACCURACY", "BETWEEN", "INSTABILITY", "Evaluation", "GroupRecord", "SetEvaluation", "ordered_union",
           "read_group_records"]


def ordered_union(lists: Iterable[Iterable[str]]) -> list[str]:
    """The names of several lists, each once, in first-seen order.

    Example:
        >>> ordered_union([["a", "b"], ["c", "a"]])
        ['a', 'b', 'c']
    """
    return list(dict.fromkeys(n for names in lists for n in names))


def read_group_records(path: Path) -> list[GroupRecord]:
    """The group records of one ``<set>.jsonl`` (validated, with file:line errors; a repeated id is refused,
    since paired comparisons match groups by id)."""
    out: list[GroupRecord] = []
    seen: dict[str, int] = {}
    for lineno, rec in read_jsonl(path, what="group records"):
        group = GroupRecord.from_dict(rec, source=str(path), line=lineno)
        if group.id in seen:
            raise SagoInputError(f"duplicate id '{group.id}' (first on line {seen[group.id]})", source=str(path),
                                 line=lineno, key="id")
        seen[group.id] = lineno
        out.append(group)
    return out


def records_loader(directory: Path, set_name: str) -> Any:
    """A loader of ``<directory>/<set>.jsonl`` for :class:`SetEvaluation` (None when the file is not there)."""
    def load() -> list[GroupRecord] | None:
        try:
            path = records_path(directory, set_name)
        except SagoInputError:  # a set name that is no file name has no records file
            return None
        return read_group_records(path) if path.is_file() else None
    return load


def checked_records_loader(directory: Path, set_name: str, given: SetEvaluation, source: str) -> Any:
    """:func:`records_loader`, whose records are checked against the set's ``summary.json`` entry when read:
    as many groups as ``n_groups`` says, and per axis as many values as its ``n`` with the mean it states
    (``compare``, ``study`` and ``report`` took a hand-edited or mismatched summary's means as given)."""
    import math

    load = records_loader(directory, set_name)

    def checked() -> list[GroupRecord] | None:
        groups = load()
        if groups is None:
            return None
        where = f"{source} against {directory / records_name(set_name)}"
        if given.n_groups != len(groups):
            raise SagoInputError(f"the summary says {given.n_groups} groups, the group records hold {len(groups)}",
                                 source=where, key=f"sets.{set_name}.n_groups",
                                 hint="the two files are not from one evaluation: evaluate again")
        if given.ids_sha256 is not None and given.ids_sha256 != ids_digest([g.id for g in groups]):
            raise SagoInputError("the group ids of the records are not those the summary was computed on",
                                 source=where, key=f"sets.{set_name}.{IDS_KEY}",
                                 hint="the two files are not from one evaluation: evaluate again")
        for axis, summary in given.summaries.items():
            values = [v for v in (g.value(axis) for g in groups) if math.isfinite(v)]
            mean = sum(values) / len(values) if values else math.nan
            same_mean = (math.isnan(mean) and math.isnan(summary.mean)) or math.isclose(
                mean, summary.mean, rel_tol=1e-6, abs_tol=1e-9)
            if len(values) != summary.n or not same_mean:
                raise SagoInputError(f"the summary says n={summary.n}, mean={summary.mean:.6g}; the group records "
                                     f"give n={len(values)}, mean={mean:.6g}", source=where,
                                     key=f"sets.{set_name}.axes.{axis}",
                                     hint="the two files are not from one evaluation: evaluate again")
        return groups
    return checked


@dataclass
class Evaluation:
    """One SAGO evaluation of one model on one or more variant sets.

    ``sets[name]`` is a :class:`SetEvaluation` (summaries with CIs, instability, correctness, group records);
    ``step`` / ``epoch`` are set for an evaluation during training; ``label`` and ``path`` name it when it was
    read from disk (``source``: ``"eval"`` for an evaluation directory or an in-memory evaluation, ``"run"`` for
    a training run's evaluation at one step).

    Example:
        >>> ev = Evaluation.from_records(3, {"s": [{"id": "g0", "axes": {"activation": 0.2}},
        ...                                         {"id": "g1", "axes": {"activation": 0.4}}]})
        >>> round(ev.mean("s", "activation"), 6), ev.group_values("s", "activation")
        (0.3, {'g0': 0.2, 'g1': 0.4})
    """

    sets: dict[str, SetEvaluation]
    model: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    seed: int = 0
    step: int | None = None
    epoch: float | None = None
    label: str = ""
    path: Path | None = None
    source: str = "eval"
    records_dir: Path | None = None  # where the group records were read from (None: in memory)
    # set by write(): the folder the directory's previous evaluation moved to, and how many files it holds
    kept_previous: tuple[Path, int] | None = field(default=None, compare=False, repr=False)

    # ------------------------------------------------------------------ per set
    def score(self, set_name: str, name: str) -> Summary | None:
        """``name`` (an axis, ``instability`` or ``accuracy``) on ``set_name``, or None."""
        s = self.sets.get(set_name)
        return None if s is None else s.score(name)

    def mean(self, set_name: str, name: str) -> float:
        """The mean of :meth:`score` (NaN when not recorded or undefined)."""
        s = self.sets.get(set_name)
        return math.nan if s is None else s.mean(name)

    def group_values(self, set_name: str, name: str) -> dict[str, float] | None:
        """``{group id: value}`` of ``name`` on ``set_name`` (NaN where undefined), or None without records."""
        s = self.sets.get(set_name)
        return None if s is None else s.group_values(name)

    def groups(self, set_name: str) -> list[GroupRecord] | None:
        """The group records of a set, or None when there are none."""
        s = self.sets.get(set_name)
        return None if s is None else s.groups

    @property
    def skipped_axes(self) -> dict[str, list[str]]:
        """Per set, the axes this evaluation left out (empty for a complete evaluation)."""
        return {n: list(s.skipped_axes) for n, s in self.sets.items() if s.skipped_axes}

    @property
    def partial(self) -> bool:
        """Whether this evaluation left axes out (``SAGOCallback(generation_every=...)``): it has no
        ``instability``, whose mean over fewer axes would not compare with a complete evaluation's."""
        return bool(self.skipped_axes)

    # ------------------------------------------------------------------ across sets
    def overall_instability(self) -> Summary | None:
        """``instability`` over the groups of every set (None when axes were left out)."""
        if self.partial or not self.sets:
            return None
        values = np.concatenate([s.values(INSTABILITY) for s in self.sets.values()])
        return stats.bootstrap_ci(values, n_resamples=self._n_bootstrap, seed=self.seed)

    @property
    def _n_bootstrap(self) -> int:
        return next(iter(self.sets.values())).n_bootstrap if self.sets else 2000

    def axis_correlation(self) -> relations.Correlation:
        """Spearman correlation of per-group axis values over the groups of every set (pooled: descriptive only;
        the finding "axes are distinct" is tested per set by :meth:`axis_relations`)."""
        axes = ordered_union(s.axes for s in self.sets.values())
        with_records = [s for s in self.sets.values() if s.has_records]
        return relations.axis_correlation({a: np.concatenate([s.values(a) for s in with_records]) if with_records
                                           else np.array([]) for a in axes})

    def axis_relations(self, alpha: float = findings.ALPHA) -> list[findings.Relation]:
        """Finding 2 per set (never pooled): Spearman with a bootstrap CI, corrected over every set and pair of
        the evaluation, and a verdict (see :func:`sago_train.functional.findings.axis_relations`)."""
        per_set = {name: {a: s.values(a) for a in s.axes} for name, s in self.sets.items() if s.has_records}
        return findings.axis_relations(per_set, alpha=alpha, n_resamples=self._n_bootstrap, seed=self.seed)

    def reliability(self, alpha: float = findings.ALPHA) -> dict[tuple[str, str], findings.Reliability]:
        """Finding 1 over the whole evaluation, keyed ``(set, axis)``: every set's split-half reliabilities,
        Holm-corrected over every (set, axis) together, ``activation_rel`` counted with ``activation`` (see
        :func:`sago_train.functional.findings.reliability_family`)."""
        return findings.reliability_family({(name, a): r for name, s in self.sets.items()
                                            for a, r in s.reliability.items()}, alpha=alpha)

    def kind_effects(self, alpha: float = findings.ALPHA) -> dict[tuple[str, str], relations.KindEffect]:
        """Every set's variant-kind tests, keyed ``(set, axis)`` (``correct`` for accuracy), Holm-corrected over
        the whole evaluation (see :func:`sago_train.functional.relations.kind_family`)."""
        return relations.kind_family({(name, a): e for name, s in self.sets.items()
                                      for a, e in s.kind_effects.items()}, alpha=alpha)

    def slim(self) -> Evaluation:
        """The same evaluation with group records reduced to what paired comparisons need (no variants or
        outputs): what a training run keeps in memory for its baseline and best evaluations."""
        sets = {}
        for name, s in self.sets.items():
            groups = s.groups
            sets[name] = SetEvaluation(s.name, list(s.axes), dict(s.summaries), s.instability, dict(s.correctness),
                                       s.n_groups, s.kinds, dict(s.skipped), list(s.skipped_axes), dict(s.set_level),
                                       s.seed, s.n_bootstrap, _groups=None if groups is None else [g.slim() for g in groups])
        return Evaluation(sets, self.model, dict(self.config), list(self.warnings), self.seed, self.step, self.epoch,
                          self.label, self.path, self.source, self.records_dir)

    @classmethod
    def from_records(cls, step: int | None, records: Mapping[str, Sequence[Mapping[str, Any] | GroupRecord]], *,
                     summaries: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None) -> Evaluation:
        """An evaluation from group records (``{set: [{"id", "axes", ...}, ...]}`` or :class:`GroupRecord`\\ s),
        for tests and scripts: the means are computed from them (no CIs) unless ``summaries`` are given."""
        sets = {}
        for name, recs in records.items():
            # Plain records carry instability only where given (a test of one axis has no instability).
            with_inst = any(isinstance(r, GroupRecord) or INSTABILITY in r for r in recs)
            groups = [r if isinstance(r, GroupRecord) else
                      GroupRecord.from_dict({**r, INSTABILITY: r.get(INSTABILITY)} if not with_inst else dict(r))
                      for r in recs]
            axes = ordered_union(g.axes for g in groups)
            if summaries is not None and name in summaries:
                given = {a: Summary(to_float(v.get("mean")), to_float(v.get("ci_low")), to_float(v.get("ci_high")),
                                    int(v.get("n") or 0)) for a, v in summaries[name].items()}
                inst = given.pop(INSTABILITY, None)
            else:
                given = {a: _mean_summary([g.value(a) for g in groups]) for a in axes}
                inst = _mean_summary([g.value(INSTABILITY) for g in groups]) if with_inst else None
            sets[name] = SetEvaluation(name, list(given), given, instability=inst, n_groups=len(groups),
                                       _groups=groups)
        return cls(sets, step=step, source="run")

    # ------------------------------------------------------------------ summary.json and <set>.jsonl
    def to_summary(self) -> dict[str, Any]:
        """The ``summary.json`` document."""
        overall = self.overall_instability()
        return stats.to_jsonable({
            "sago_train_version": __version__,
            "model": self.model,
            "config": self.config,
            "sets": self._sets_summary(),
            INSTABILITY: None if overall is None else overall.to_dict(),
            "axis_correlation": self.axis_correlation().to_dict(),
            "axis_relations": [r.to_dict() for r in self.axis_relations()],
            "warnings": list(self.warnings),
        })

    def _sets_summary(self) -> dict[str, Any]:
        """Each set's summary entry, its reliability and kind tests as corrected over the whole evaluation."""
        out = {name: s.to_summary() for name, s in self.sets.items()}
        for (name, axis), rel in self.reliability().items():
            out[name]["reliability"][axis] = rel.to_dict()
        for (name, axis), eff in self.kind_effects().items():
            out[name]["kinds"][axis] = eff.to_dict()
        return out

    def write(self, out_dir: str | Path) -> Path:
        """Write ``summary.json`` and one ``<set>.jsonl`` of group records per set, all or nothing (every file is
        written to a temporary name first). An evaluation already in ``out_dir`` is never replaced: once the new
        files are on disk its files move into ``out_dir/previous-<time>`` (named in :attr:`kept_previous`), so
        none of them is lost or orphaned. Returns the directory; a write that fails (a full disk) is a
        :class:`~sago_train.errors.SagoInputError` that says the previous files are as they were.

        Example:
            >>> ev = Evaluation.from_records(None, {"s": [{"id": "g0", "axes": {"activation": 0.2}}]})
            >>> import tempfile; d = ev.write(tempfile.mkdtemp())
            >>> sorted(p.name for p in d.iterdir()), Evaluation.read(d).mean("s", "activation")
            (['s.jsonl', 'summary.json'], 0.2)
        """
        from .layout import set_aside_evaluation

        out = Path(out_dir)
        paths = self.output_files(out, list(self.sets))
        for path in paths:  # a link or a directory in a file's place is refused before anything is written
            check_output_path(path, what="evaluation output", root=out)
        summary = self.to_summary()  # computed first: a failure leaves no half-written directory
        data = [jsonl_bytes([g.to_dict() for g in s.groups or []]) for s in self.sets.values()] + [json_bytes(summary)]
        kept: list[tuple[Path, int] | None] = []
        try:  # all or nothing: a full disk leaves the previous files
            atomic_write_files(dict(zip(paths, data)), before_replace=lambda: kept.append(set_aside_evaluation(out)))
        except OSError as err:
            raise SagoInputError(f"cannot write the evaluation: {err.strerror or err} ({err.filename or out}); "
                                 "nothing was replaced, the previous files are as they were",
                                 source=str(out), hint="free some space, or choose another --out") from None
        self.kept_previous = kept[0] if kept else None
        return out

    @staticmethod
    def output_files(out_dir: str | Path, set_names: Sequence[str]) -> list[Path]:
        """The files :meth:`write` writes into ``out_dir``: one ``<set>.jsonl`` per set, then ``summary.json``
        (the CLI checks each before the evaluation runs).

        Example:
            >>> [p.name for p in Evaluation.output_files("out", ["a"])]
            ['a.jsonl', 'summary.json']
        """
        out = Path(out_dir)
        return [out / records_name(name) for name in set_names] + [out / SUMMARY]

    @classmethod
    def read(cls, path: str | Path) -> Evaluation:
        """An evaluation directory (``summary.json`` + ``<set>.jsonl``), validated; group records are read on
        first use. Raises :class:`~sago_train.errors.SagoInputError` naming the file and key."""
        path = Path(path)
        src = path / SUMMARY
        try:
            data = json.loads(read_bounded_text(src, what="summary.json"))  # a regular file within the set limit
        except json.JSONDecodeError as err:
            raise SagoInputError(f"malformed JSON: {err.msg} (column {err.colno})", source=str(src),
                                 line=err.lineno) from None
        except UnicodeDecodeError:
            raise SagoInputError("not valid UTF-8", source=str(src)) from None
        if not isinstance(data, dict) or not isinstance(data.get("sets"), dict):
            raise SagoInputError("expected an object with 'sets' (written by 'sago-train eval --out')",
                                 source=str(src), key="sets")
        if not data["sets"]:
            raise SagoInputError("no sets in the summary", source=str(src), key="sets")
        sets = {name: SetEvaluation.from_summary(name, entry, source=str(src)) for name, entry in data["sets"].items()}
        for name, s in sets.items():
            s._load = checked_records_loader(path, name, s, str(src))
        config = data.get("config") if isinstance(data.get("config"), dict) else {}
        return cls(sets, model=data["model"] if isinstance(data.get("model"), str) else "", config=config,
                   warnings=[w for w in data.get("warnings") or [] if isinstance(w, str)], label=path.name,
                   path=path, source="eval", records_dir=path)

    # ------------------------------------------------------------------ one history.jsonl line
    def to_history_line(self, **extra: Any) -> dict[str, Any]:
        """The ``history.jsonl`` line of this evaluation (the manual's "Results on disk": ``step``, ``epoch``,
        ``sets`` with each axis' ``{"mean", "ci_low", "ci_high", "n"}``, then correctness, skipped axes,
        set-level numbers, what ``auto`` settings resolved to and the warnings), plus ``extra`` entries (the
        monitor's paired changes, the runtime)."""
        line = {
            "step": int(self.step or 0),
            "epoch": float(self.epoch or 0.0),
            "sets": {name: s.to_history() for name, s in self.sets.items()},
            **({"skipped_axes": self.skipped_axes} if self.partial else {}),
            "correctness": {name: s.correctness for name, s in self.sets.items()},
            "resolved": self.config.get("resolved"),
            "warnings": list(self.warnings),
            "set_level": {name: s.set_level for name, s in self.sets.items() if s.set_level},
            **extra,
        }
        return stats.to_jsonable(line)

    @classmethod
    def from_history_line(cls, line: Any, *, source: str, lineno: int | None = None,
                          records_dir: Path | None = None, label: str = "", path: Path | None = None) -> Evaluation:
        """A ``history.jsonl`` line back as an evaluation (validated: a located error for a corrupt line);
        group records are read from ``records_dir`` on first use."""
        if not isinstance(line, dict):
            raise SagoInputError(f"expected an evaluation (an object), got {type_name(line)}", source=source,
                                 line=lineno)
        step = line.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            raise SagoInputError(f"expected an integer step, got {step!r}", source=source, line=lineno, key="step")
        if not isinstance(line.get("sets"), dict) or not line["sets"]:
            raise SagoInputError(f"expected a non-empty object of set -> axes, got {line.get('sets')!r}"[:300],
                                 source=source, line=lineno, key="sets")
        from .history_checks import check_compare_block

        check_compare_block(line, source=source, lineno=lineno)
        sets = {name: SetEvaluation.from_history(name, line, source=source, lineno=lineno,
                                                 load=None if records_dir is None else records_loader(records_dir, name))
                for name in line["sets"]}
        epoch = line.get("epoch")
        resolved = line.get("resolved")
        return cls(sets, config={"resolved": resolved} if isinstance(resolved, dict) else {},
                   warnings=[w for w in line.get("warnings") or [] if isinstance(w, str)], step=step,
                   epoch=float(epoch) if is_number(epoch) else None, label=label, path=path, source="run",
                   records_dir=records_dir)
