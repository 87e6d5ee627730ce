"""The "Findings" section of ``report.md``: the three findings of SPEC "Findings", each computed from the
recorded per-group values with the test behind it (:mod:`sago_train.functional.findings`), never from means alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import SagoInputError
from ..functional import findings
from ..functional.formatting import fmt_num, fmt_p
from ..results.evaluation import INSTABILITY, Evaluation, ordered_union
from .ranking import compare_evaluations

__all__ = ["findings_markdown", "reliability_from_records", "relations_from_records"]


def reliability_from_records(ev: Evaluation, set_name: str, *, seed: int = 0) -> dict[str, findings.Reliability]:
    """Split-half reliability per axis of one set from the records' ``halves`` (written by the evaluator);
    empty when the set has no records."""
    s = ev.sets.get(set_name)
    if s is None or not s.has_records:
        return {}
    return {axis: findings.split_half_reliability(*s.half_values(axis), seed=seed) for axis in s.axes}


def relations_from_records(ev: Evaluation, *, seed: int = 0) -> list[findings.Relation]:
    """Finding 2 for one evaluation: Spearman per set from the per-group records (never pooled), Holm over
    every set and pair of that evaluation."""
    per_set = {name: {a: s.values(a) for a in s.axes} for name, s in ev.sets.items() if s.has_records}
    return findings.axis_relations(per_set, seed=seed)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: int) -> list[str]:
    lines = ["| " + " | ".join(map(str, header)) + " |",
             "|" + "|".join(["---"] * left + ["---:"] * (len(header) - left)) + "|"]
    return lines + ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]


def findings_markdown(last: Sequence[Evaluation]) -> list[str]:
    """Markdown lines: reliability (finding 1), axis relations per set (finding 2), rank reversal with robust
    flips (finding 3, with several evaluations and sets)."""
    md = ["## Findings", "",
          "Each claim with the test behind it (SPEC \"Findings\"); a mean whose CI excludes 0 is no evidence, "
          "since every axis is >= 0 by construction.", "",
          "### 1. Is per-group instability noise? (split-half reliability)", "",
          "Each group's variants are split into two fixed, seeded halves (K >= 4); the axis is measured on each "
          "half; Spearman r across groups between the halves, Spearman-Brown corrected (2r/(1+r)), one-sided "
          f"permutation p (one half shuffled across groups). 'not noise' = p < {findings.ALPHA}.", ""]
    rows = []
    for ev in last:
        for s in ev.sets:
            for axis, rel in reliability_from_records(ev, s).items():
                sb = fmt_num(rel.corrected) if rel.corrected is not None else "n/a (r <= 0)"
                rows.append([ev.label, s, axis, fmt_num(rel.r), sb, fmt_p(rel.p_value), rel.n,
                             rel.verdict() + (f" ({rel.note})" if rel.note else "")])
    md += _table(["run", "set", "axis", "r (halves)", "Spearman-Brown", "p", "groups", "verdict"], rows, 3) if rows \
        else ["(Needs per-group records with split halves, written by sago_train >= this version.)"]
    md += ["", "### 2. Are the axes distinct? (per set, never pooled)", "",
           f"Spearman rho per set with a 95% bootstrap CI over groups and Holm-corrected p-values: 'distinct' "
           f"only when |rho| < {findings.DISTINCT_BOUND} across the CI, 'related' when the corrected p < "
           f"{findings.ALPHA}, else 'inconclusive'.", ""]
    any_rel = False
    for ev in last:
        rels = relations_from_records(ev)
        shown = [r for r in rels if r.verdict != "undefined"]
        if shown:
            any_rel = True
            md += [f"- {ev.label}, {r.sentence()}" for r in shown]
        undefined = sorted({f"{r.set}: {a}" for r in rels if r.verdict == "undefined" for a in r.axes
                            if all(x.verdict == "undefined" for x in rels if x.set == r.set and a in x.axes)})
        if undefined:
            md.append(f"- {ev.label}: no relation to test (constant axis): " + ", ".join(undefined))
    if not any_rel:
        md.append("(Needs per-group records and at least two non-constant axes.)")
    md += ["", "### 3. Do rankings reverse across sets?", ""]
    shared = [s for s in ordered_union(e.sets for e in last) if sum(s in e.sets for e in last) >= 2]
    if len(last) < 2 or len(shared) < 2:
        md.append("(Needs at least two runs or evaluations on at least two shared sets.)")
        return md + [""]
    try:
        cmp = compare_evaluations(last, allow_different_groups=True)
    except SagoInputError as err:
        return md + [f"(Not computed: {err.message})", ""]
    rows = []
    for axis, r in cmp["axes"].items():
        c = r["reversal"]
        robust = [f for f in r["flips"] if f["robust"]]
        example = ""
        if robust:
            f = robust[0]
            s1, s2 = f["sets"]
            example = (f"{f['order'][s1][0]} beats {f['order'][s1][1]} on {s1}, the reverse on {s2} (p = "
                       f"{fmt_p(f['tests'][s1]['p_value'])}, {fmt_p(f['tests'][s2]['p_value'])})")
        rows.append([axis, c["pairs"], c["flipped"], c["robust"], c["unknown"], example or "-"])
    md += ["Pairs of runs whose order differs between two sets ('flip in means'), and those whose flip is "
           f"robust: on both sets, the one-sided paired Wilcoxon p < {findings.ALPHA} (groups paired by id) and the "
           f"{1 - findings.ALPHA:.0%} paired-bootstrap CI excludes 0, in the direction of each set's order (the "
           "verdict rule of the paired comparison). Headlines quote robust flips.", ""]
    md += [f"- {line}" for line in cmp.get("scope", [])] + [""]
    md += _table(["axis", "pairs", "flip in means", "robust flips", "untested", "example of a robust flip"], rows, 1)
    if INSTABILITY in cmp["axes"]:
        md += ["", "(`instability` is the mean of the [0, 1] axes, ranked like an axis.)"]
    return md + [""]
