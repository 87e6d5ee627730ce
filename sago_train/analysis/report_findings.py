"""The "Findings" section of ``report.md``: the three findings of docs/findings.md, each computed from the
recorded per-group values with the test behind it (:mod:`sago_train.functional.findings`), never from means alone,
and each corrected over the claims of its kind that the report prints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import SagoInputError
from ..formatting import fmt_num, fmt_p
from ..functional import findings
from ..results.evaluation import INSTABILITY, Evaluation, ordered_union
from .ranking import compare_evaluations, reversal_headline

__all__ = ["findings_markdown", "relations_from_records", "reliability_from_records", "reliability_of"]


def reliability_from_records(ev: Evaluation, set_name: str, *, seed: int = 0) -> dict[str, findings.Reliability]:
    """Split-half reliability per axis of one set from the records' ``halves`` (written by the evaluator), one
    test each (uncorrected: :func:`sago_train.functional.findings.reliability_family` corrects the ones printed
    together); empty when the set has no records."""
    s = ev.sets.get(set_name)
    if s is None or not s.has_records:
        return {}
    return {axis: findings.split_half_reliability(*s.half_values(axis), seed=seed) for axis in s.axes}


def reliability_of(evals: Sequence[Evaluation]) -> dict[tuple[str, str, str], findings.Reliability]:
    """Finding 1 for the runs a report prints: every run's, set's and axis's split-half test, corrected together
    (:func:`sago_train.functional.findings.reliability_family`), keyed ``(run label, set, axis)``."""
    return findings.reliability_family({(ev.label, s, axis): rel for ev in evals for s in ev.sets
                                        for axis, rel in reliability_from_records(ev, s).items()})


def relations_from_records(evals: Sequence[Evaluation], *, seed: int = 0) -> list[findings.Relation]:
    """Finding 2 for the runs a report prints: Spearman per run and set from the per-group records (never
    pooled), one family over every run, set and pair (each relation's ``set`` reads "RUN, SET")."""
    per_set = {f"{ev.label}, {name}": {a: s.values(a) for a in s.axes}
               for ev in evals for name, s in ev.sets.items() if s.has_records}
    return findings.axis_relations(per_set, seed=seed)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: int) -> list[str]:
    lines = ["| " + " | ".join(map(str, header)) + " |",
             "|" + "|".join(["---"] * left + ["---:"] * (len(header) - left)) + "|"]
    return lines + ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]


def findings_markdown(last: Sequence[Evaluation]) -> list[str]:
    """Markdown lines: reliability (finding 1), axis relations per set (finding 2), rank reversal with robust
    flips (finding 3, with several evaluations and sets)."""
    md = ["## Findings", "",
          "Each claim with the test behind it (docs/definitions.md#findings); a mean whose CI excludes 0 is no evidence, "
          "since every axis is >= 0 by construction.", "",
          "### 1. Is per-group instability noise? (split-half reliability)", "",
          "Each group's variants are split into two fixed, seeded halves (K >= 4); the axis is measured on each "
          "half; Spearman r across groups between the halves, Spearman-Brown corrected (2r/(1+r)), one-sided "
          "permutation p (one half shuffled across groups), Holm-corrected over every run, set and axis of this "
          f"table. 'not noise' = Holm p < {findings.ALPHA}, so the chance of any false 'not noise' in the table is at "
          "most that; `activation_rel` is the same finding as `activation` (on a half they differ by a per-layer "
          "constant of the set) and is not counted twice.", ""]
    rows = []
    for (run, s, axis), rel in reliability_of(last).items():
        sb = fmt_num(rel.corrected) if rel.corrected is not None else "n/a (r <= 0)"
        holm_p = "-" if rel.same_as or rel.note else fmt_p(rel.adjusted)
        rows.append([run, s, axis, fmt_num(rel.r), sb, fmt_p(rel.p_value), holm_p, rel.n,
                     rel.verdict() + (f" ({rel.note})" if rel.note else "")])
    md += _table(["run", "set", "axis", "r (halves)", "Spearman-Brown", "p", "Holm p", "groups", "verdict"], rows, 3) \
        if rows else ["(Needs per-group records with split halves, written by sago_train >= this version.)"]
    md += ["", "### 2. Are the axes distinct? (per set, never pooled)", "",
           f"Spearman rho per set with bootstrap CIs over groups that hold together for every pair of the report "
           f"(Bonferroni) and Holm-corrected p-values: 'distinct' only when |rho| < {findings.DISTINCT_BOUND} across "
           f"the CI, 'related' when the corrected p < {findings.ALPHA}, else 'inconclusive' ('not enough groups to "
           "test' where the groups could give neither).", ""]
    rels = relations_from_records(last)
    shown = [r for r in rels if r.verdict != "undefined"]
    any_rel = bool(shown)
    md += [f"- {r.sentence()}" for r in shown]
    undefined = sorted({f"{r.set}: {a}" for r in rels if r.verdict == "undefined" for a in r.axes
                        if all(x.verdict == "undefined" for x in rels if x.set == r.set and a in x.axes)})
    if undefined:
        md.append("- no relation to test (constant axis): " + ", ".join(undefined))
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
            example = (f"{f['order'][s1][0]} beats {f['order'][s1][1]} on {s1}, the reverse on {s2} (Holm p = "
                       f"{fmt_p(f['p_holm'])})")
        rows.append([axis + (" (corrected apart)" if axis == INSTABILITY else ""), c["pairs"], c["flipped"],
                     c["robust"], c["unknown"], example or "-"])
    md += ["Pairs of runs whose order differs between two sets ('flip in means'), and those whose flip is "
           "robust: the one-sided paired Wilcoxon test (groups paired by id) in the direction of each set's order, "
           f"on both sets (the larger p), Holm-corrected over every run pair x set pair x axis that could flip, below "
           f"{findings.ALPHA}, and the {1 - findings.ALPHA:.0%} paired-bootstrap CI on the same side. The chance of "
           "any robust flip among runs that do not differ is at most that. Headlines quote robust flips.", ""]
    md += [f"- {line}" for line in cmp.get("scope", [])] + [""]
    md += _table(["axis", "pairs", "flip in means", "robust flips", "untested", "example of a robust flip"], rows, 1)
    headline = reversal_headline(cmp)
    if headline:
        md += [""] + [f"- {line.strip()}" for line in headline]
    if INSTABILITY in cmp["axes"]:
        md += ["", "(`instability` is the mean of the [0, 1] axes, ranked like an axis; its flips repeat theirs, "
               "so they are corrected on their own and kept out of the headline.)"]
    return md + [""]
