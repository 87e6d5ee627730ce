"""How a paired change is said in words, one rule for the training log, ``report`` and ``compare``: an
instability that fell is "more stable", an accuracy that rose "more accurate"; but a drop in raw ``activation``
that comes with a drop in the between-group dispersion (unrelated prompts moved closer too) is a collapse, not
stability, and a set that became "more stable" while its accuracy fell is said to be both (a model that is
consistently wrong is perfectly stable)."""

from __future__ import annotations

from collections.abc import Mapping

from ..functional.axes.registry import ACCURACY, ACCURACY_ALL, ACCURACY_WORST_KIND, BETWEEN
from ..functional.stats import BETTER, DEGENERATE, NO_DIFFERENCE, NOT_ENOUGH, WORSE

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
