"""How a paired change is said in words, one rule for the training log, ``report`` and ``compare``: an
instability that fell is "more stable", an accuracy that rose "more accurate"; but a drop in raw ``activation``
that comes with a drop in the between-group dispersion (unrelated prompts moved closer too) is a collapse, not
stability, and a set that became "more stable" while its accuracy fell is said to be both (a model that is
consistently wrong is perfectly stable). The training log's sentences of a comparison are said here too: one
line per set against the baseline (:func:`change_lines`), the warning that accuracy fell
(:func:`accuracy_warnings`) and the end-of-run summary (:func:`run_summary_lines`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..formatting import fmt_num, fmt_p
from ..functional.axes.registry import ACCURACY, ACCURACY_ALL, ACCURACY_WORST_KIND, BETWEEN
from ..functional.stats import BETTER, DEGENERATE, NO_DIFFERENCE, NOT_ENOUGH, WORSE
from .compare import Change, Comparison, line_quantities
from .evaluation import Evaluation

ACCURACY_QUANTITIES = frozenset({ACCURACY, ACCURACY_ALL, ACCURACY_WORST_KIND})
COLLAPSE = "lower, but so is the between-group dispersion: a collapse, not stability"
CONSISTENTLY_WRONG = "more stable but less accurate: consistently wrong?"
DEGENERATE_WORDS = "lower, but the outputs no longer depend on the question: degenerate, not stability"
#: What a warning that accuracy fell asks of the reader (the training log, ``report``).
READ_BESIDE = ("the model may be forgetting what it knew; read every stability number of this set beside it (a "
               "consistently wrong model is perfectly stable)")


LOWER_WITH_BETWEEN = "lower, with a lower between-group dispersion too: read activation_rel"


def change_words(quantity: str, verdict: str, *, collapse: bool = False, less_accurate: bool = False,
                 between_fell: bool = False) -> str:
    """The words for ``verdict`` (``better``, ``worse``, ``no significant difference``, ``not enough groups``) of
    a change in ``quantity``. ``collapse``: the set's between-group dispersion fell significantly below the
    *baseline's* (the model before training); ``between_fell``: it fell significantly against a reference that
    is not a baseline (another trained model: lower, not a collapse). Both are said for raw ``activation`` only
    (``activation_rel`` already divides by it) and for ``between_dispersion`` itself; ``less_accurate``: the
    set's accuracy fell significantly.

    Example:
        >>> change_words("activation_rel", "better"), change_words("accuracy", "worse")
        ('more stable', 'less accurate')
        >>> change_words("activation", "better", collapse=True)
        'lower, but so is the between-group dispersion: a collapse, not stability'
        >>> change_words("confidence", "better", less_accurate=True)
        'more stable but less accurate: consistently wrong?'
        >>> change_words("generation", "degenerate outputs")
        'lower, but the outputs no longer depend on the question: degenerate, not stability'
        >>> change_words("between_dispersion", "better"), change_words("between_dispersion", "better", collapse=True)
        ('less dispersed', 'less dispersed (a collapse)')
    """
    if verdict == DEGENERATE:
        return DEGENERATE_WORDS
    if verdict not in (BETTER, WORSE):
        return verdict if verdict in (NO_DIFFERENCE, NOT_ENOUGH) else str(verdict)
    if quantity in ACCURACY_QUANTITIES:
        return "more accurate" if verdict == BETTER else "less accurate"
    if quantity == BETWEEN:
        return ("less dispersed (a collapse)" if collapse else "less dispersed") if verdict == BETTER \
            else "more dispersed"
    if verdict == WORSE:
        return "less stable"
    if quantity == "activation" and (collapse or between_fell):
        return COLLAPSE if collapse else LOWER_WITH_BETWEEN
    return CONSISTENTLY_WRONG if less_accurate else "more stable"


def comparison_sentence(run: str, quantity: str, verdict: str, reference: str, **context: bool) -> str:
    """``run`` against ``reference`` on ``quantity`` as one sentence (the words of :func:`change_words`, the
    comparative where it goes); ``context`` as :func:`set_context` gives it.

    Example:
        >>> comparison_sentence("augment", "activation_rel", "better", "sft")
        'augment more stable than sft'
        >>> comparison_sentence("augment", "activation", "better", "base", collapse=True)
        'augment lower than base, but so is the between-group dispersion: a collapse, not stability'
        >>> comparison_sentence("augment", "between_dispersion", "better", "sft")
        'augment less dispersed between groups than sft'
    """
    if verdict not in (BETTER, WORSE):
        return f"{run} vs {reference}: {change_words(quantity, verdict)}"
    words = change_words(quantity, verdict, **context)
    if quantity == BETWEEN:
        head, _, tail = words.partition(" (")
        return f"{run} {head} between groups than {reference}" + (f" ({tail}" if tail else "")
    for first in ("more stable but less accurate", "lower"):
        if words.startswith(first):
            return f"{run} {first} than {reference}{words[len(first):]}"
    return f"{run} {words} than {reference}"


def set_context(verdicts: Mapping[str, str | None], *, against_baseline: bool = True) -> dict[str, bool]:
    """What the words of one set's verdicts depend on, from its verdicts by quantity (``{quantity: verdict}``):
    ``collapse`` (its between-group dispersion fell significantly, against a baseline: ``against_baseline``),
    ``between_fell`` (it fell against another reference) and ``less_accurate`` (its accuracy fell
    significantly), the keyword arguments of :func:`change_words`. The one reading, for the training log,
    ``report`` and ``compare``.

    Example:
        >>> set_context({"accuracy": "worse", "generation": "better"})
        {'collapse': False, 'between_fell': False, 'less_accurate': True}
        >>> set_context({"between_dispersion": "better"}, against_baseline=False)["collapse"]
        False
        >>> change_words("generation", "better", **set_context({"accuracy": "worse"}))
        'more stable but less accurate: consistently wrong?'
    """
    fell = verdicts.get(BETWEEN) == BETTER
    return {"collapse": fell and against_baseline, "between_fell": fell and not against_baseline,
            "less_accurate": verdicts.get(ACCURACY) == WORSE}


# ---------------------------------------------------------------------------------------------- the training log
def _move(q: str, change: Change, before: Evaluation, after: Evaluation, name: str) -> str:
    """``q <before mean> -> <after mean>``; ``accuracy_worst_kind`` names the kind compared and gives its
    accuracy in each (each evaluation's own worst kind may differ)."""
    kind = change.kind if q == ACCURACY_WORST_KIND else None
    if kind is None:
        return f"{q} {fmt_num(before.mean(name, q))} -> {fmt_num(after.mean(name, q))}"
    then, now = ((e.sets[name].correctness.get("per_kind") or {}).get(kind) for e in (before, after))
    return f"{q} ({kind}) {fmt_num(then)} -> {fmt_num(now)}"


def change_lines(ev: Evaluation, changes: Comparison, baseline: Evaluation | None) -> list[str]:
    """One line per set: each quantity's baseline and current means with the paired verdict against the
    baseline; the significant ones first, the rest summarized ("no significant change: ...")."""
    if baseline is None or baseline.step == ev.step:
        return []
    out = []
    for name, s in ev.sets.items():
        context = set_context(changes.verdicts(name))
        said, quiet = [], []
        for q in line_quantities(s):
            change = changes.get(name, q)
            if change is None:
                continue
            move = _move(q, change, baseline, ev, name)
            if change.significant:
                said.append(f"{move} {change_words(q, change.verdict, **context)} (p {fmt_p(change.p)})")
            else:
                quiet.append(move)
        if not said and not quiet:
            continue
        parts = said + ([f"no significant change: {', '.join(quiet)}"] if quiet else [])
        out.append(f"sago step {ev.step}, set '{name}' vs the baseline (step {baseline.step}): " + "; ".join(parts))
    return out


def accuracy_warnings(ev: Evaluation, changes: Comparison, baseline: Evaluation | None) -> list[str]:
    """A warning per set whose accuracy fell significantly since the baseline: stability measured on a model
    that forgot its task reads as better (a model that is consistently wrong is perfectly stable)."""
    out = []
    for name in changes.changes:
        change = changes.get(name, ACCURACY)
        if change is None or change.verdict != WORSE or baseline is None:
            continue
        out.append(f"sago step {ev.step}: accuracy on set '{name}' fell significantly since the baseline "
                   f"({fmt_num(baseline.mean(name, ACCURACY))} -> {fmt_num(ev.mean(name, ACCURACY))}, p "
                   f"{fmt_p(change.p_worse)}, {change.n} groups): {READ_BESIDE}")
    return out


def run_summary_lines(monitor: Any, changes: Comparison) -> list[str]:
    """The end of training, per set and quantity: baseline -> best -> final (with their steps) and the final
    evaluation's verdict against the baseline; ``monitor`` a :class:`~sago_train.results.monitor.MonitorState`
    (its baseline, last and best)."""
    base, last = monitor.baseline, monitor.last
    if base is None or last is None or last.step == base.step:
        return []
    out = [f"sago: summary of the run, steps {base.step} -> {last.step} (best = the best evaluation per quantity; "
           "verdict = the final evaluation against the baseline, paired by group)"]
    for name, s in last.sets.items():
        context = set_context(changes.verdicts(name))
        rows = []
        for q in line_quantities(s):
            final = last.mean(name, q)
            if not math.isfinite(final):
                continue
            best = monitor.best.get(name, q)
            change = changes.get(name, q)
            verdict = change_words(q, change.verdict, **context) if change else "not compared"
            best_text = f" -> best {fmt_num(best.mean)} (step {best.step})" if best is not None else ""
            rows.append(f"{q} {fmt_num(base.mean(name, q))}{best_text} -> final {fmt_num(final)}: {verdict}")
        if rows:
            out.append(f"  set '{name}': " + "; ".join(rows))
    return out
