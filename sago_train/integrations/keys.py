"""The names of SAGO's numbers in the Trainer log, spelled and parsed here only.

``eval_sago/<set>/<quantity>`` with a quantity an axis, ``instability``, ``accuracy`` (with ``accuracy_all`` and
``accuracy_worst_kind``, see :mod:`~sago_train.results.compare`) or ``between_dispersion``,
and suffixes for its CI bounds (``_ci_low``, ``_ci_high``) and its paired changes (``_vs_baseline``,
``_vs_best``, each with ``_p``); ``eval_sago/instability`` over every set and ``eval_sago/runtime``. W&B shows
them as ``eval/sago/...``. ``metric_for_best_model`` and early stopping name them ``sago/<set>/<quantity>``
(the Trainer adds ``eval_``): :func:`parse_metric` is the one parser of that grammar.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..errors import SagoInputError, did_you_mean, short_repr
from ..results.compare import Comparison, numbers, watchable
from ..results.evaluation import ACCURACY, INSTABILITY, Evaluation

PREFIX = "eval_sago"
RUNTIME = f"{PREFIX}/runtime"
OVERALL = f"{PREFIX}/{INSTABILITY}"


def key(set_name: str, quantity: str, suffix: str = "") -> str:
    """``eval_sago/<set>/<quantity><suffix>``.

    Example:
        >>> key("paraphrase", "activation_rel", "_vs_baseline_p")
        'eval_sago/paraphrase/activation_rel_vs_baseline_p'
    """
    return f"{PREFIX}/{set_name}/{quantity}{suffix}"


def parse_metric(metric: str, *, field_name: str = "metric") -> tuple[str, str]:
    """``"sago/<set>/<quantity>"`` (optionally prefixed ``eval_``) -> ``(set, quantity)``.

    Example:
        >>> parse_metric("eval_sago/paraphrase/accuracy")
        ('paraphrase', 'accuracy')
    """
    name = metric[len("eval_"):] if isinstance(metric, str) and metric.startswith("eval_") else metric
    parts = name.split("/") if isinstance(name, str) else []
    if len(parts) != 3 or parts[0] != "sago" or not parts[1] or not parts[2]:
        raise SagoInputError(f"expected a metric of the form 'sago/<set>/<axis>', got {metric!r}", key=field_name,
                             hint="e.g. 'sago/paraphrase/activation_rel' or 'sago/paraphrase/accuracy'")
    return parts[1], parts[2]


def parse_metric_or_none(metric: str | None) -> tuple[str, str] | None:
    """:func:`parse_metric`, or None for a metric that is not a SAGO one (e.g. ``eval_loss``)."""
    try:
        return parse_metric(metric or "")
    except SagoInputError:
        return None


def trainer_key(metric: str | None) -> str | None:
    """The Trainer-log key (``eval_sago/...``) that ``metric_for_best_model`` names, or None for a metric that
    is not a SAGO one.

    Example:
        >>> trainer_key("sago/s/activation"), trainer_key("eval_loss")
        ('eval_sago/s/activation', None)
    """
    if not metric or not metric.removeprefix("eval_").startswith("sago/"):
        return None
    return metric if metric.startswith("eval_") else f"eval_{metric}"


def evaluation_metrics(ev: Evaluation, changes: Comparison, seconds: float) -> dict[str, float]:
    """Every finite number of one evaluation and its changes (:func:`~sago_train.results.compare.numbers`: per
    set each quantity's mean with the CI bounds of the axes and accuracy, the paired changes against the
    baseline and the best so far with their p of "worse", the overall instability) under its Trainer-log key,
    and the runtime."""
    out = {OVERALL if not name else key(name, q, suffix): v for (name, q, suffix), v in numbers(ev, changes).items()}
    if math.isfinite(seconds):
        out[RUNTIME] = float(seconds)
    return out


def headline(metrics: dict[str, float], ev: Evaluation) -> dict[str, float]:
    """The keys of ``metrics`` the default log level sends to the Trainer log: per set the axis means,
    ``instability`` and ``accuracy``; the overall instability; the runtime. At most sets x (axes + 2) + 2."""
    keep = {OVERALL, RUNTIME}
    for name, s in ev.sets.items():
        keep.update(key(name, q) for q in (*s.axes, INSTABILITY, ACCURACY))
    return {k: v for k, v in metrics.items() if k in keep}


def fill_missing(metrics: dict[str, float], watched: str | None, greater_is_better: bool | None) -> bool:
    """Give the Trainer a value for the watched ``metric_for_best_model`` key when this step has none (a failed
    or skipped evaluation, a NaN mean): the worst possible value, so that this checkpoint is never chosen as the
    best, and never another step's value (the Trainer raises KeyError without one, and monitoring must not cost
    the run). Returns whether it filled one (the caller says so)."""
    if watched is None or watched in metrics:
        return False
    metrics[watched] = -math.inf if greater_is_better else math.inf
    return True


def check_target(set_name: str | None, quantity: str | None, sets: Iterable[str], axes: Iterable[str], *,
                 correctness: bool = True, not_in: str = "monitored") -> None:
    """Early stopping must watch a monitored set and a quantity it may watch
    (:func:`~sago_train.results.compare.watchable` of the computed ``axes``; accuracy with ``correctness``): the
    one check, run by a recipe, before training (by :class:`SAGOCallback`) and on every evaluation."""
    sets, allowed = list(sets), watchable(axes, correctness)
    if set_name is not None and set_name not in sets:
        raise SagoInputError(f"early stopping watches set {short_repr(set_name)}, which is not {not_in} "
                             f"({', '.join(sets) or 'none'}){did_you_mean(set_name, sets)}", key="metric")
    if quantity is not None and quantity not in allowed:
        raise SagoInputError(f"early stopping watches axis {short_repr(quantity)}, which is not computed (axes: "
                             f"{', '.join(allowed)})", key="metric")
