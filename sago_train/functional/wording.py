"""How a paired change is said in words, one rule for the training log, ``report`` and ``compare``: an
instability that fell is "more stable", an accuracy that rose "more accurate"; but a drop in raw ``activation``
that comes with a drop in the between-group dispersion (unrelated prompts moved closer too) is a collapse, not
stability, and a set that became "more stable" while its accuracy fell is said to be both (a model that is
consistently wrong is perfectly stable)."""

from __future__ import annotations

from collections.abc import Mapping

from .axes.registry import ACCURACY, ACCURACY_ALL, ACCURACY_WORST_KIND, BETWEEN
from .stats import BETTER, DEGENERATE, NO_DIFFERENCE, NOT_ENOUGH, WORSE

ACCURACY_QUANTITIES = frozenset({ACCURACY, ACCURACY_ALL, ACCURACY_WORST_KIND})
COLLAPSE = "lower, but so is the between-group dispersion: a collapse, not stability"
CONSISTENTLY_WRONG = "more stable but less accurate: consistently wrong?"
DEGENERATE_WORDS = "lower, but the outputs no longer depend on the question: degenerate, not stability"
#: What a warning that accuracy fell asks of the reader (the training log, ``report``).
READ_BESIDE = ("the model may be forgetting what it knew; read every stability number of this set beside it (a "
               "consistently wrong model is perfectly stable)")


def change_words(quantity: str, verdict: str, *, collapse: bool = False, less_accurate: bool = False) -> str:
    """The words for ``verdict`` (``better``, ``worse``, ``no significant difference``, ``not enough groups``) of
    a change in ``quantity``. ``collapse``: the set's between-group dispersion fell significantly too (said
    for raw ``activation`` only: ``activation_rel`` already divides by it); ``less_accurate``: the set's
    accuracy fell significantly.

    Example:
        >>> change_words("activation_rel", "better"), change_words("accuracy", "worse")
        ('more stable', 'less accurate')
        >>> change_words("activation", "better", collapse=True)
        'lower, but so is the between-group dispersion: a collapse, not stability'
        >>> change_words("confidence", "better", less_accurate=True)
        'more stable but less accurate: consistently wrong?'
        >>> change_words("generation", "degenerate outputs")
        'lower, but the outputs no longer depend on the question: degenerate, not stability'
    """
    if verdict == DEGENERATE:
        return DEGENERATE_WORDS
    if verdict not in (BETTER, WORSE):
        return verdict if verdict in (NO_DIFFERENCE, NOT_ENOUGH) else str(verdict)
    if quantity in ACCURACY_QUANTITIES:
        return "more accurate" if verdict == BETTER else "less accurate"
    if quantity == BETWEEN:
        return "less dispersed (collapse)" if verdict == BETTER else "more dispersed"
    if verdict == WORSE:
        return "less stable"
    if collapse and quantity == "activation":
        return COLLAPSE
    return CONSISTENTLY_WRONG if less_accurate else "more stable"


def set_context(verdicts: Mapping[str, str | None]) -> dict[str, bool]:
    """What the words of one set's verdicts depend on, from its verdicts by quantity (``{quantity: verdict}``):
    ``collapse`` (its between-group dispersion fell significantly) and ``less_accurate`` (its accuracy fell
    significantly), the keyword arguments of :func:`change_words`. The one reading of both, for the training
    log, ``report`` and ``compare``.

    Example:
        >>> set_context({"accuracy": "worse", "generation": "better"})
        {'collapse': False, 'less_accurate': True}
        >>> change_words("generation", "better", **set_context({"accuracy": "worse"}))
        'more stable but less accurate: consistently wrong?'
    """
    return {"collapse": verdicts.get(BETWEEN) == BETTER, "less_accurate": verdicts.get(ACCURACY) == WORSE}
