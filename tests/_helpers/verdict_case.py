"""Issue 13's disagreement, constructed: a paired change that the one-sided Wilcoxon test calls significant
(p = 0.017, the issue's figure) while the paired-bootstrap 95% CI of the mean difference spans 0 (eleven small
increases and one large decrease). Every place that says more/less stable must say "no significant difference".
"""

from __future__ import annotations

import numpy as np

N = 12
DIFF = np.r_[0.01 * np.arange(1, N), -0.6]  # after - before


def before(offset: float = 0.0) -> np.ndarray:
    """Per-group values of the reference evaluation (room for the -0.6 change: every value stays >= 0)."""
    return np.random.default_rng(0).uniform(0.65, 0.95, N) + offset


def after(offset: float = 0.0) -> np.ndarray:
    return before(offset) + DIFF
