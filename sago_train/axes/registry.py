"""The axis registry: each axis declares its name, direction and what it needs from the model."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import SagoInputError, unknown_name_error

# What an axis can ask the extractor for.
NEEDS = ("hidden", "logprobs", "generations")


@dataclass
class GroupInputs:
    """Everything extracted for one group, handed to each axis function."""

    prompts: list[str]  # the text of each variant (chat messages joined), for word-level axes
    reference: str | None  # the group's gold reference, if any
    outputs: list[str] | None = None  # greedy continuations y_k
    hidden: Any = None  # torch.Tensor [K, L, H] float32
    logprobs: Any = None  # torch.Tensor [K] mean log-probability of r per variant
    similarity: Callable[[list[str]], Any] | None = None  # texts -> [K, K] similarity matrix
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class AxisValue:
    """An axis's value for one group, with its per-variant decomposition (for per-kind analysis) and any
    secondary numbers."""

    value: float
    per_variant: list[float]
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Axis:
    name: str
    fn: Callable[[GroupInputs], AxisValue]
    needs: frozenset[str]
    higher_is_better: bool = False
    description: str = ""


AXES: dict[str, Axis] = {}


def register_axis(
    name: str, *, needs: Iterable[str], higher_is_better: bool = False, description: str = ""
) -> Callable[[Callable[[GroupInputs], AxisValue]], Callable[[GroupInputs], AxisValue]]:
    """Register an axis function ``GroupInputs -> AxisValue`` under ``name``.

    Example:
        >>> @register_axis("length_spread", needs=["generations"])  # doctest: +SKIP
        ... def length_spread(g): ...
    """
    needs = frozenset(needs)
    bad = needs - set(NEEDS)
    if bad:
        raise ValueError(f"axis '{name}' needs unknown inputs {sorted(bad)}; valid: {NEEDS}")

    def deco(fn: Callable[[GroupInputs], AxisValue]) -> Callable[[GroupInputs], AxisValue]:
        AXES[name] = Axis(name, fn, needs, higher_is_better, description or (fn.__doc__ or "").strip().split("\n")[0])
        return fn

    return deco


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
