"""The axis registry: each axis declares its name, direction and what it needs from the model."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ...errors import SagoInputError, unknown_name_error

# What an axis can ask the extractor for.
NEEDS = ("hidden", "logprobs", "generations", "response_logprobs", "answer_logprobs")


@dataclass
class GroupInputs:
    """Everything extracted for one group, handed to each axis function."""

    prompts: list[str]  # the text of each variant (chat messages joined), for word-level axes
    reference: str | list[str] | None  # the group's gold reference (or its aliases), if any
    outputs: list[str] | None = None  # greedy continuations y_k
    hidden: Any = None  # torch.Tensor [K, L, H] float32
    # The decoder block (0-based) of each of hidden's L layers: per-layer extras are keyed ``layer_<block>``.
    # None: hidden holds blocks 0..L-1 in order.
    layers: list[int] | None = None
    logprobs: Any = None  # torch.Tensor [K] mean log-probability of r per variant
    # torch.Tensor [K, K]: at [i, j] the mean log-probability per token of variant j's greedy response after
    # variant i's prompt (NaN in column j where that response is empty).
    response_logprobs: Any = None
    # torch.Tensor [K]: the mean log-probability per token of the reference after each variant's prompt and the
    # model's own lead-in to it (logprobs where there is none, or no reference).
    answer_logprobs: Any = None
    similarity: Callable[[list[str]], Any] | None = None  # texts -> [K, K] similarity matrix


@dataclass
class AxisValue:
    """An axis's value for one group, with its per-variant decomposition (for per-kind analysis) and any
    secondary numbers.

    A set-level axis (see :class:`SetLevel`) returns a provisional value from its group function and puts in
    ``partial`` the additive statistics the set needs (summed over groups, then across ranks); ``pending``
    carries what its ``finalize`` needs from this group. Neither is written to any output.
    """

    value: float
    per_variant: list[float]
    extra: dict[str, float] = field(default_factory=dict)
    partial: dict[str, Any] | None = None
    pending: Any = None


@dataclass(frozen=True)
class SetLevel:
    """How a set-level axis turns the set's statistics into per-group values.

    ``partial`` entries of every group's :class:`AxisValue` are summed (numbers or numpy arrays) over the
    groups of the set, on every rank and then across ranks: ``finalize(value, totals)`` returns the group's
    final :class:`AxisValue`, and ``summary(totals)`` the set-level numbers recorded in the summary (with a
    ``"note"`` when the axis cannot be computed on the set). Sums are O(hidden size), never pairwise.
    """

    finalize: Callable[[AxisValue, dict[str, Any]], AxisValue]
    summary: Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Axis:
    """A registered axis. ``in_instability``: whether the convenience scalar ``instability`` (the mean of the
    axes) includes it; only axes on the common [0, 1] scale do."""

    name: str
    fn: Callable[[GroupInputs], AxisValue]
    needs: frozenset[str]
    higher_is_better: bool = False
    description: str = ""
    in_instability: bool = True
    set_level: SetLevel | None = None


AXES: dict[str, Axis] = {}


def register_axis(
    name: str,
    *,
    needs: Iterable[str],
    higher_is_better: bool = False,
    description: str = "",
    in_instability: bool = True,
    set_level: SetLevel | None = None,
) -> Callable[[Callable[[GroupInputs], AxisValue]], Callable[[GroupInputs], AxisValue]]:
    """Register an axis function ``GroupInputs -> AxisValue`` under ``name``.

    ``in_instability=False`` keeps the axis out of the ``instability`` mean (for axes not on the [0, 1]
    scale); ``set_level`` makes the group values depend on the whole set (see :class:`SetLevel`).

    Example:
        >>> @register_axis("length_spread", needs=["generations"])  # doctest: +SKIP
        ... def length_spread(g): ...
    """
    needs = frozenset(needs)
    bad = needs - set(NEEDS)
    if bad:
        raise ValueError(f"axis '{name}' needs unknown inputs {sorted(bad)}; valid: {NEEDS}")

    def deco(fn: Callable[[GroupInputs], AxisValue]) -> Callable[[GroupInputs], AxisValue]:
        doc = description or (fn.__doc__ or "").strip().split("\n")[0]
        AXES[name] = Axis(name, fn, needs, higher_is_better, doc, in_instability, set_level)
        return fn

    return deco


def add_partials(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """Element-wise sum of two :attr:`AxisValue.partial` dicts (None is the empty sum). A tuple entry is a
    label shared by every group (e.g. the block indices of the layers), kept rather than summed."""
    if a is None or b is None:
        return a if b is None else b
    return {k: a[k] if isinstance(a[k], tuple) else a[k] + b[k] for k in a}


def in_instability(name: str) -> bool:
    """Whether axis ``name`` counts in the ``instability`` mean (unknown names, e.g. a user axis recorded by
    another process, count)."""
    axis = AXES.get(name)
    return True if axis is None else axis.in_instability


#: The quantities recorded beside the axes, each with one name (the manual's "Definitions"): the mean of the
#: [0, 1] axes (a convenience scalar, ranked like an axis); correctness per group as the share of its variants
#: answered right, whether all of them are, and the variant of the kind that is worst on the set (all
#: higher-is-better, never folded into stability); each group's mean cosine distance to the other groups'
#: variants (recorded with activation_rel: lower means representations pulled together, a collapse, so it is
#: compared, never ranked).
INSTABILITY = "instability"
ACCURACY = "accuracy"
ACCURACY_ALL = "accuracy_all"
ACCURACY_WORST_KIND = "accuracy_worst_kind"
BETWEEN = "between_dispersion"
#: Recorded quantities that are not axes but carry a direction: correctness is higher-is-better.
HIGHER_IS_BETTER_EXTRA = frozenset({ACCURACY, ACCURACY_ALL, ACCURACY_WORST_KIND})


def higher_is_better(name: str) -> bool:
    """The direction of a recorded quantity, read by rankings, "best so far" and early stopping: a registered
    axis says (``Axis.higher_is_better``); ``accuracy`` is higher-is-better; ``instability`` and unknown names
    (e.g. a user axis recorded by another process) are instabilities, lower is better."""
    axis = AXES.get(name)
    return axis.higher_is_better if axis is not None else name in HIGHER_IS_BETTER_EXTRA


#: What logs and tables show first, from what predicted accuracy on a perturbation kind the fine-tune never trained
#: on (docs/validity.md, measured over the loss experiment's runs on the tiny model): monitored-set accuracy (+0.73),
#: then ``generation`` (+0.59); the axes that did not predict it follow.
LEADING = ("accuracy", "generation")


def display_order(names: Iterable[str]) -> list[str]:
    """Axes (or quantities) in the order logs and tables show them: :data:`LEADING` first, then the others as
    given, with ``activation_rel`` before raw ``activation`` (raw activation is squeezed by the shared direction
    of a model's hidden states, so it is the one to read second).

    Example:
        >>> display_order(["activation", "confidence", "activation_rel", "generation"])
        ['generation', 'activation_rel', 'activation', 'confidence']
    """
    names = list(names)
    lead = [q for q in LEADING if q in names]
    rest = [q for q in names if q not in LEADING]
    if "activation_rel" in rest and "activation" in rest:
        rest.remove("activation_rel")
        rest.insert(rest.index("activation"), "activation_rel")
    return lead + rest


def get_axis(name: str) -> Axis:
    if name not in AXES:
        raise unknown_name_error("axis", name, AXES, key="axes")
    return AXES[name]


def parse_axes(axes: str | Iterable[str]) -> list[str]:
    """Parse ``"activation,confidence"`` or a list into validated axis names (order kept, no duplicates)."""
    names = [a.strip() for a in axes.split(",")] if isinstance(axes, str) else [str(a).strip() for a in axes]
    names = [a for a in names if a]
    if not names:
        raise SagoInputError("no axes given", key="axes", hint=f"choose from {', '.join(sorted(AXES))}")
    out: list[str] = []
    for a in names:
        get_axis(a)
        if a not in out:
            out.append(a)
    return out
