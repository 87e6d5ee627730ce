"""The best evaluation so far per (set, quantity) (:class:`Best`): the one tracker the monitor, the end-of-run
summary and early stopping read, by mean in the axis registry's direction, as the Trainer picks its best
checkpoint."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..functional.axes import BETWEEN
from ..functional.axes.registry import higher_is_better
from .compare import quantities
from .evaluation import Evaluation


def is_improvement(quantity: str, mean: float, best_mean: float | None) -> bool:
    """Whether ``mean`` beats ``best_mean`` on ``quantity`` (its direction from the axis registry).

    Example:
        >>> is_improvement("activation", 0.1, 0.2), is_improvement("accuracy", 0.1, 0.2)
        (True, False)
    """
    if best_mean is None:
        return True
    return mean > best_mean if higher_is_better(quantity) else mean < best_mean


def is_untrained(step: int | None) -> bool:
    """An evaluation at step 0 measures the model before any training step (the callback's baseline, or the
    Trainer's ``eval_on_start``): there is no checkpoint of it to go back to, so it is never the "best"."""
    return step == 0


@dataclass(frozen=True)
class BestEntry:
    """The best evaluation of one (set, quantity): its step and mean, the evaluation when kept (the monitor's,
    to compare with), the per-group values when kept (early stopping's, saved in checkpoints)."""

    step: int
    mean: float
    evaluation: Evaluation | None = field(default=None, compare=False, repr=False)
    ids: tuple[str, ...] = ()
    values: tuple[float, ...] = ()


@dataclass
class Best:
    """The best evaluation so far per (set, quantity), by mean in the registry's direction (as the Trainer
    picks its best checkpoint), never the untrained step 0 unless ``untrained``: the one tracker the monitor,
    the end-of-run summary and early stopping read.

    Example:
        >>> best = Best()
        >>> best.offer("s", "activation", 0, 0.1), best.offer("s", "activation", 10, 0.3)
        (False, True)
        >>> best.offer("s", "activation", 20, 0.2), best.step("s", "activation"), best.mean("s", "activation")
        (True, 20, 0.2)
    """

    entries: dict[tuple[str, str], BestEntry] = field(default_factory=dict)
    untrained: bool = False

    def get(self, set_name: str, quantity: str) -> BestEntry | None:
        return self.entries.get((set_name, quantity))

    def __getitem__(self, key: tuple[str, str]) -> BestEntry:
        return self.entries[key]

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def evaluation(self, set_name: str, quantity: str) -> Evaluation | None:
        entry = self.get(set_name, quantity)
        return None if entry is None else entry.evaluation

    def step(self, set_name: str, quantity: str) -> int | None:
        entry = self.get(set_name, quantity)
        return None if entry is None else entry.step

    def mean(self, set_name: str, quantity: str) -> float | None:
        entry = self.get(set_name, quantity)
        return None if entry is None else entry.mean

    def improves(self, set_name: str, quantity: str, step: int | None, mean: float) -> bool:
        """Whether an evaluation at ``step`` with ``mean`` would be the new best."""
        if not math.isfinite(mean) or (is_untrained(step) and not self.untrained):
            return False
        return is_improvement(quantity, mean, self.mean(set_name, quantity))

    def offer(self, set_name: str, quantity: str, step: int | None, mean: float, *,
              evaluation: Evaluation | None = None, ids: Iterable[str] = (), values: Iterable[float] = ()) -> bool:
        """Keep the evaluation when it :meth:`improves` on the best; returns whether it did."""
        if not self.improves(set_name, quantity, step, mean):
            return False
        self.set(set_name, quantity, BestEntry(int(step or 0), float(mean), evaluation, tuple(ids),
                                               tuple(float(v) for v in values)))
        return True

    def set(self, set_name: str, quantity: str, entry: BestEntry | None) -> None:
        if entry is None:
            self.entries.pop((set_name, quantity), None)
        else:
            self.entries[(set_name, quantity)] = entry

    def observe(self, ev: Evaluation, *, skip: Iterable[str] = ()) -> None:
        """Offer every (set, quantity) of ``ev`` but the sets in ``skip`` (``between_dispersion`` is compared,
        never ranked)."""
        skip = set(skip)
        for name in ev.sets:
            if name in skip:
                continue
            for quantity in quantities(ev, name):
                if quantity != BETWEEN:
                    self.offer(name, quantity, ev.step, ev.mean(name, quantity), evaluation=ev)

    def clear(self) -> None:
        self.entries.clear()
