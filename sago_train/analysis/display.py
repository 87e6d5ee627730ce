"""Readable console tables for SAGO results (rich). User text (set names, kinds, the model, notes made from ids
and kinds) goes through :func:`~sago_train.formatting.user_text`: never read as markup, control
characters shown as escapes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from ..formatting import constant_line, constant_value, fmt_ci, fmt_num, fmt_p, p_text, user_text
from ..functional.axes.registry import display_order
from ..functional.findings import NOT_ENOUGH_TO_TEST, Reliability
from ..functional.relations import KindEffect
from ..results.evaluation import Evaluation, SetEvaluation

ALPHA = 0.05




def constant_axes(s: SetEvaluation) -> dict[str, float]:
    """Axes of ``s`` with the same value on every group, and that value (said in one line, not tabled)."""
    out = {}
    for axis, sm in s.summaries.items():
        value = constant_value(sm)
        if value is not None:
            out[axis] = value
    return out


def set_table(s: SetEvaluation) -> Table:
    t = Table(title=f"set '{user_text(s.name)}': {s.n_groups} groups" + (f", {sum(s.skipped.values())} skipped" if s.skipped else ""),
              title_justify="left")
    t.add_column("axis")
    t.add_column("instability", justify="right")
    t.add_column("95% CI", justify="right")
    t.add_column("n", justify="right")
    for axis in display_order(list(s.summaries)):
        sm = s.summaries[axis]
        if axis not in constant_axes(s):
            t.add_row(user_text(axis), fmt_num(sm.mean), fmt_ci(sm.ci_low, sm.ci_high), str(sm.n))
    sm = s.instability
    if sm is not None:  # None: an evaluation that left axes out (a mean over fewer axes would not compare)
        t.add_row("[bold]instability[/bold]", fmt_num(sm.mean), fmt_ci(sm.ci_low, sm.ci_high), str(sm.n))
    return t


def kind_table(s: SetEvaluation) -> Table | None:
    if not s.kind_effects or s.kinds is None:
        return None
    t = Table(title=f"set '{user_text(s.name)}' per kind (per-variant share of each axis; p = Friedman across groups)",
              title_justify="left")
    t.add_column("")
    for k in s.kinds:
        t.add_column(user_text(k), justify="right")
    t.add_column("p", justify="right")
    for axis, eff in s.kind_effects.items():
        if axis in constant_axes(s):
            continue
        label = "accuracy" if axis == "correct" else axis
        t.add_row(user_text(label), *[fmt_num(eff.means.get(k)) for k in s.kinds], fmt_p(eff.p_value))
    return t


def reliability_table(s: SetEvaluation, rels: Mapping[str, Reliability] | None = None) -> Table:
    """Finding 1 on one set: split-half reliability of the per-group values of each axis (``rels``: the set's
    reliabilities as corrected over the evaluation, :meth:`Evaluation.reliability`; default: the set's own)."""
    rels = s.reliability if rels is None else rels
    t = Table(title=f"set '{user_text(s.name)}': is per-group instability noise? (split-half reliability; Holm p over every set "
              "and axis)", title_justify="left")
    for col in ("axis", "r (halves)", "Spearman-Brown", "p (permutation)", "Holm p", "n", "verdict"):
        t.add_column(col, justify="left" if col in ("axis", "verdict") else "right")
    for axis, rel in rels.items():
        if axis in constant_axes(s):
            continue
        sb = fmt_num(rel.corrected) if rel.corrected is not None else "n/a (r <= 0)"
        holm_p = "-" if rel.same_as or not math.isfinite(rel.p_holm) else fmt_p(rel.p_holm)
        t.add_row(user_text(axis), fmt_num(rel.r), sb, fmt_p(rel.p_value), holm_p, str(rel.n),
                  user_text(rel.verdict(ALPHA) + (f" ({rel.note})" if rel.note else "")))
    return t


def _kind_note(set_name: str, axis: str, eff: KindEffect) -> str | None:
    """The kind claim of one set and axis in words (None when there is nothing to claim)."""
    verdict = eff.verdict(ALPHA)
    what = "accuracy" if axis == "correct" else f"{axis} instability"
    omnibus = f"Friedman {p_text(eff.p_value)}, Holm {p_text(eff.adjusted)} over {eff.family} test(s)"
    if verdict.endswith(" moves most"):
        value = fmt_num(eff.means.get(eff.extreme))
        named = (f"lowest on '{eff.extreme}' ({value})" if axis == "correct" else
                 f"'{eff.extreme}' variants move most ({value})")
        return (f"{set_name}: {what} depends on the variant kind ({omnibus}); {named}: post-hoc paired Wilcoxon "
                f"against each other kind, Holm over every comparison of the evaluation {p_text(eff.p_extreme)}")
    if verdict == "depends on the kind":
        return (f"{set_name}: {what} depends on the variant kind ({omnibus}); no single kind stands out from every "
                f"other (post-hoc paired Wilcoxon of '{eff.extreme}', Holm {p_text(eff.p_extreme)})")
    if verdict == NOT_ENOUGH_TO_TEST:
        return (f"{set_name}: {what}: {NOT_ENOUGH_TO_TEST} whether the variant kind matters ({eff.n} groups: the "
                f"smallest Friedman p, {eff.p_min:.2g}, cannot pass alpha {ALPHA:g} after the correction)")
    return None


def findings(result: Evaluation) -> list[str]:
    """Plain-language findings, each with the test and the numbers behind it (docs/findings.md): each kind of
    claim corrected over every set and axis of the evaluation."""
    notes: list[str] = []
    reliability = result.reliability(ALPHA)
    kinds = result.kind_effects(ALPHA)
    for s in result.sets.values():
        unreachable = []
        for axis in s.reliability:
            rel = reliability[(s.name, axis)]
            if rel.verdict(ALPHA) == "not noise":
                notes.append(rel.sentence(s.name, axis, ALPHA))
            elif rel.verdict(ALPHA) == NOT_ENOUGH_TO_TEST:
                unreachable.append(axis)
        if unreachable:
            notes.append(f"{s.name}: {NOT_ENOUGH_TO_TEST} whether per-group instability is noise on "
                         f"{', '.join(unreachable)} (the permutation test's smallest p on these groups cannot pass alpha "
                         f"{ALPHA:g} after the Holm correction)")
        for axis in s.kind_effects:
            note = _kind_note(s.name, axis, kinds[(s.name, axis)])
            if note:
                notes.append(note)
        acc: dict[str, Any] = s.correctness
        if acc.get("n") and "per_kind" in acc and acc.get("spread", 0) > 0:
            notes.append(
                f"{s.name}: accuracy {fmt_num(acc['accuracy'])} overall, worst-variant "
                f"{fmt_num(acc['worst_variant_accuracy'])}, spread across kinds {fmt_num(acc['spread'])}"
            )
    undefined: dict[str, dict[str, list[bool]]] = {}
    inconclusive: dict[str, list[Any]] = {}
    short: dict[str, list[Any]] = {}
    for rel in result.axis_relations(ALPHA):
        for axis in rel.axes:
            undefined.setdefault(rel.set, {}).setdefault(axis, []).append(rel.verdict == "undefined")
        if rel.verdict == "inconclusive":
            # Said once per set: a sentence per pair buries the verdicts that say something.
            inconclusive.setdefault(rel.set, []).append(rel)
        elif rel.verdict == NOT_ENOUGH_TO_TEST:
            short.setdefault(rel.set, []).append(rel)
        elif rel.verdict != "undefined":
            notes.append(rel.sentence())
    for set_name, rels in inconclusive.items():
        pairs = ", ".join(f"{a}/{b} (rho={fmt_num(r.rho)})" for r in rels for a, b in [r.axes])
        notes.append(f"{set_name}: {len(rels)} axis pair(s) inconclusive, neither distinct nor related "
                     f"(n={rels[0].n} groups; each pair's CI and p: axis_relations in summary.json, written by "
                     f"--out): {pairs}")
    for set_name, rels in short.items():
        pairs = ", ".join(f"{a}/{b}" for r in rels for a, b in [r.axes])
        notes.append(f"{set_name}: {NOT_ENOUGH_TO_TEST} how {len(rels)} axis pair(s) relate (n={rels[0].n} groups: "
                     f"neither 'distinct' nor 'related' can pass at this family's error rate): {pairs}")
    for set_name, per_axis in undefined.items():
        # An axis whose every relation is undefined is constant on the set (or the set has < 3 groups).
        constant = [a for a, flags in per_axis.items() if all(flags)]
        if constant:
            notes.append(f"{set_name}: no relation to test for {', '.join(constant)} (constant over the groups, "
                         "or fewer than 3 groups)")
    return notes


def _ci(acc: dict[str, Any]) -> str:
    lo, hi = acc.get("accuracy_ci_low"), acc.get("accuracy_ci_high")
    return f" [{fmt_num(lo)}, {fmt_num(hi)}]" if lo is not None and hi is not None else ""


def print_result(result: Evaluation, console: Console | None = None) -> None:
    console = console or Console()
    console.print(f"[bold]SAGO evaluation[/bold] of {user_text(result.model)} (0 = perfectly stable, lower is better)")
    reliability = result.reliability(ALPHA)
    for s in result.sets.values():
        console.print(set_table(s))
        for axis, value in constant_axes(s).items():
            console.print(f"  {user_text(constant_line(axis, value))}")
        if "activation_rel" in s.set_level:
            console.print(f"  between-group activation dispersion {fmt_num(s.between_dispersion)}: activation_rel = "
                          "activation relative to it (1 = variants as far apart as unrelated prompts; a ratio, so "
                          "not in 'instability')")
        for note in s.notes:
            console.print(f"  note: {user_text(note)}")
        acc = s.correctness
        if acc.get("n"):
            console.print(
                f"  correctness ({acc['n']} groups): accuracy {fmt_num(acc['accuracy'])}{_ci(acc)}, worst-variant "
                f"{fmt_num(acc['worst_variant_accuracy'])}, all right {fmt_num(acc['all_right'])}, all wrong "
                f"{fmt_num(acc['all_wrong'])}"
            )
        kt = kind_table(s)
        if kt is not None:
            console.print(kt)
            for axis, eff in s.kind_effects.items():
                if eff.note:
                    console.print(f"  {user_text(axis)}: {user_text(eff.note)}")
        console.print(reliability_table(s, {a: reliability[(s.name, a)] for a in s.reliability}))
    notes = findings(result)
    if notes:
        console.print(f"[bold]Findings[/bold] (alpha = {ALPHA}, family-wise: each kind of claim is Holm-corrected "
                      "over every set and axis it covers; axis relations per set, 'distinct' = |rho| < 0.5 across "
                      "CIs that hold together for every pair; see docs/findings.md)")
        for n in notes:
            console.print(f"  - {user_text(n)}")
