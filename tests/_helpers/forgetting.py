"""Synthetic evaluations of a model that forgets: per group a correctness list (one answer per variant kind)
drawn with a chosen accuracy, and two axes; shared by the tests of the monitor, the reporters, compare and
report (the tiny-model run is tests/integrations/test_callback_forgetting.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sago_train.results.evaluation import Evaluation, GroupRecord, SetEvaluation

SET = "capitals"
KINDS = ("canonical", "typo", "paraphrase", "reorder")


def evaluation(step: int | None, accuracy: float | Sequence[float], generation: Sequence[float], *, seed: int = 0,
               label: str = "", activation: Sequence[float] | None = None, kinds: Sequence[str] = KINDS,
               n_bootstrap: int = 200) -> Evaluation:
    """One set of ``len(generation)`` groups; each variant right with probability ``accuracy`` (one per kind
    when a sequence), drawn with ``seed``; ``activation`` defaults to ``generation`` / 2."""
    rng = np.random.default_rng(seed)
    p = np.broadcast_to(np.asarray(accuracy, dtype=float), (len(kinds),))
    act = [g / 2 for g in generation] if activation is None else list(activation)
    groups = [GroupRecord(f"g{i}", kinds=list(kinds), axes={"activation": float(a), "generation": float(g)},
                          correct=[bool(x) for x in rng.random(len(kinds)) < p])
              for i, (a, g) in enumerate(zip(act, generation))]
    s = SetEvaluation.from_groups(SET, ["activation", "generation"], groups, kinds=list(kinds),
                                  n_bootstrap=n_bootstrap)
    return Evaluation({SET: s}, step=step, label=label, source="run" if step is not None else "eval")


def forgetting_pair(n: int = 16, *, seed: int = 0) -> tuple[Evaluation, Evaluation]:
    """(before, after): accuracy 0.75 -> 0.15 (every kind), generation instability lower on every group."""
    rng = np.random.default_rng(seed)
    gen = rng.uniform(0.3, 0.5, n)
    return (evaluation(0, 0.75, gen, seed=seed + 1, label="before"),
            evaluation(40, 0.15, gen - rng.uniform(0.1, 0.2, n), seed=seed + 2, label="after"))
