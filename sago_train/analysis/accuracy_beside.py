"""Accuracy beside every stability ranking, for ``compare`` and ``report`` (docs/accuracy.md).

A model that forgot its task can be the most stable one: a model that is consistently wrong is perfectly
stable. So no entry is ranked first on stability without its accuracy beside it: :func:`accuracy_beside` gives
each entry's accuracy (and ``accuracy_all``, every variant of a group right) on the groups it is ranked on, with
their CIs, and checks every entry ranked first on a stability axis against each other entry by the one verdict
rule (``compare``'s paired test, :func:`~sago_train.analysis.ranking.paired_flip_test`, on accuracy: groups
paired by id). Where the first
one is significantly less accurate than another entry, that is said on its line, with the stability verdict of
the same pair ("more stable but less accurate: consistently wrong?" when the first is also significantly more
stable, see :mod:`sago_train.results.wording`).

``accuracy_worst_kind`` is left out here: each entry's worst kind may differ, so it pairs no quantity across
entries (the training log and ``report``'s change since the baseline compare it within one run).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..formatting import fmt_num, fmt_p
from ..functional import stats
from ..functional.axes import ACCURACY, ACCURACY_ALL
from ..results.evaluation import BETWEEN, Evaluation
from ..results.wording import ACCURACY_QUANTITIES, change_words
from .common_groups import SetScope, scores

__all__ = ["BESIDE", "accuracy_beside", "beside_markdown", "cell_text"]

#: The accuracy quantities shown beside a ranking (both pair across entries).
BESIDE = (ACCURACY, ACCURACY_ALL)


def _summary(sc: Any) -> dict[str, Any]:
    return {"mean": sc.mean, "ci_low": sc.ci_low, "ci_high": sc.ci_high, "n": sc.n}


def cell_text(score: Mapping[str, Any] | None, escape_brackets: bool = False) -> str:
    """``accuracy <mean> [<low>, <high>]`` of one entry (``-`` without it); ``escape_brackets`` for rich markup.

    Example:
        >>> cell_text({"mean": 0.1875, "ci_low": 0.0625, "ci_high": 0.375, "n": 16})
        'accuracy 0.188 [0.0625, 0.375]'
    """
    if not score or score.get("mean") is None:
        return "accuracy -"
    lo, hi = score.get("ci_low"), score.get("ci_high")
    ci = f" [{fmt_num(lo)}, {fmt_num(hi)}]" if lo is not None and hi is not None else ""
    return f"accuracy {fmt_num(score['mean'])}" + (ci.replace("[", "\\[") if escape_brackets else ci)


def _line(axis: str, set_name: str, first: str, other: str, acc: dict[str, Any], words: str,
          scores_by_label: Mapping[str, Any]) -> str:
    mine, theirs = (fmt_num((scores_by_label.get(lab) or {}).get("mean")) for lab in (first, other))
    return (f"set '{set_name}', {axis}: {first} ranks first but is less accurate than {other} (accuracy {mine} vs "
            f"{theirs}, paired difference {fmt_num(acc['mean_diff'])} [{fmt_num(acc['ci_low'])}, "
            f"{fmt_num(acc['ci_high'])}], p {fmt_p(acc['p_worse'])}, {acc['n']} groups): {words}")


PairTest = Callable[..., "dict[str, Any] | None"]


def accuracy_beside(evals: Sequence[Evaluation], sets: Sequence[str], scopes: Mapping[str, SetScope],
                    ranked: Mapping[str, Mapping[str, Any]], pair_test: PairTest, *, alpha: float = stats.ALPHA,
                    seed: int = 0) -> dict[str, Any]:
    """Accuracy beside the rankings ``ranked`` (``compare_evaluations``' ``axes``: per axis its ``ranks``);
    ``pair_test(a, b, set, quantity, alpha=, seed=, ids=)`` is ``compare``'s paired test of ``b`` against ``a``
    (:func:`~sago_train.analysis.ranking.paired_flip_test`, handed in: it lives in the module that calls this
    one).

    Returns ``{"scores": {SET: {LABEL: {"accuracy": {mean, ci_low, ci_high, n}, "accuracy_all": {...}}}},
    "checks": [{"axis", "set", "first", "other", "accuracy", "stability", "words", "line"}], "notes": [...]}``:
    a check for every (stability axis, set, entry ranked first, other entry) where the first is significantly
    less accurate than the other (``accuracy``: the other -> first paired test, ``verdict`` "worse";
    ``stability``: the same pair on the axis, "better" = the first is significantly more stable).
    """
    by_label = {e.label: e for e in evals}
    out_scores: dict[str, dict[str, dict[str, Any]]] = {}
    notes: list[str] = []
    for s in sets:
        have = [e for e in evals if s in e.sets]
        per_entry: dict[str, dict[str, Any]] = {}
        for quantity in BESIDE:
            found, _ = scores(have, scopes[s], quantity, seed=seed)
            for label, sc in found.items():
                per_entry.setdefault(label, {})[quantity] = _summary(sc)
        if per_entry:
            out_scores[s] = per_entry
        else:
            notes.append(f"set '{s}': no entry recorded accuracy (no references), so its rankings are on stability "
                         "alone: a model that is consistently wrong is perfectly stable")
    checks: list[dict[str, Any]] = []
    acc_tests: dict[tuple[str, str, str], dict[str, Any] | None] = {}
    for axis, result in ranked.items():
        if axis in ACCURACY_QUANTITIES or axis == BETWEEN:
            continue
        for s, ranks in (result.get("ranks") or {}).items():
            accuracies = {lab: v.get(ACCURACY) for lab, v in out_scores.get(s, {}).items()}
            for first in sorted(lab for lab, r in ranks.items() if r == 1):
                for other in (lab for lab in ranks if lab != first and accuracies.get(lab)):
                    if not accuracies.get(first):
                        continue
                    if (s, first, other) not in acc_tests:
                        acc_tests[(s, first, other)] = pair_test(by_label[other], by_label[first], s, ACCURACY,
                                                                        alpha=alpha, seed=seed, ids=scopes[s].ids)
                    acc = acc_tests[(s, first, other)]
                    if acc is None or acc["verdict"] != stats.WORSE:
                        continue
                    stab = pair_test(by_label[other], by_label[first], s, axis, alpha=alpha, seed=seed,
                                            ids=scopes[s].ids)
                    more_stable = stab is not None and stab["verdict"] == stats.BETTER
                    words = change_words(axis, stats.BETTER, less_accurate=True) if more_stable else \
                        "ranked first on the means (not significantly more stable), and less accurate"
                    checks.append({"axis": axis, "set": s, "first": first, "other": other, "accuracy": acc,
                                   "stability": stab, "words": words,
                                   "line": _line(axis, s, first, other, acc, words, accuracies)})
    return {"scores": out_scores, "checks": checks, "notes": notes}


def beside_markdown(comparison: Mapping[str, Any]) -> list[str]:
    """``report.md``'s section "Stability beside accuracy" from a ``compare_evaluations`` result: per set each
    entry's accuracy and ``accuracy_all`` with their CIs, the stability axes it ranks first on, and the line of
    every check (an entry ranked first that is significantly less accurate than another).

    Example:
        >>> cmp = {"axes": {"instability": {"ranks": {"s": {"a": 1, "b": 2}}}}, "accuracy": {"scores": {"s": {
        ...     "a": {"accuracy": {"mean": 0.2, "ci_low": 0.1, "ci_high": 0.3, "n": 16}},
        ...     "b": {"accuracy": {"mean": 0.7, "ci_low": 0.6, "ci_high": 0.8, "n": 16}}}}, "checks": [], "notes": []}}
        >>> [line for line in beside_markdown(cmp) if line.startswith("| s |")]
        ['| s | a | 0.200 [0.100, 0.300] | - | instability |', '| s | b | 0.700 [0.600, 0.800] | - | - |']
    """
    beside = comparison.get("accuracy") or {}
    md = ["## Stability beside accuracy", "",
          "A model that is consistently wrong is perfectly stable, so no entry is ranked first on stability "
          "without its accuracy beside it: each entry's accuracy (right answers / variants) and `accuracy_all` "
          "(groups with every variant right) with 95% bootstrap CIs, on the groups `compare` ranks it on, and the "
          "stability axes on which it ranks first. An entry ranked first that is significantly less accurate than "
          "another (the one verdict rule on accuracy, groups paired by id) is named below.", ""]
    rows = []
    for s, per_entry in (beside.get("scores") or {}).items():
        for label, sc in per_entry.items():
            first = [axis for axis, r in (comparison.get("axes") or {}).items()
                     if axis not in ACCURACY_QUANTITIES and axis != BETWEEN
                     and ((r.get("ranks") or {}).get(s) or {}).get(label) == 1]
            rows.append([s, label, *(cell_text(sc.get(q)).removeprefix("accuracy ") for q in BESIDE),
                         ", ".join(first) or "-"])
    if rows:
        md += ["| set | run | accuracy | accuracy_all | ranked first on |", "|---|---|---:|---:|---|"]
        md += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
        md.append("")
    checks = beside.get("checks") or []
    md += [f"- **less accurate**: {c['line']}" for c in checks]
    if rows and not checks:
        md.append("No entry ranked first on a stability axis is significantly less accurate than another entry.")
    md += [f"- note: {n}" for n in beside.get("notes") or []]
    return md + [""]
