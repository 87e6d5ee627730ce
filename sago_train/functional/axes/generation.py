"""Generation axis: disagreement between the variants' greedy outputs (docs/definitions.md#generation)."""

from __future__ import annotations

import numpy as np

from .registry import AxisValue, GroupInputs, register_axis


def generation_instability(similarity: np.ndarray) -> AxisValue:
    """``G = 1 - mean_{i<j} sim(y_i, y_j)`` from a symmetric ``[K, K]`` similarity matrix."""
    s = np.asarray(similarity, dtype=np.float64)
    k = s.shape[0]
    iu = np.triu_indices(k, 1)
    value = 1.0 - float(s[iu].mean())
    off = s.sum(1) - np.diag(s)
    per_variant = (1.0 - off / (k - 1)).tolist()
    return AxisValue(float(np.clip(value, 0.0, 1.0)), per_variant)


@register_axis("generation", needs=["generations"], description="1 - mean pairwise similarity of greedy outputs")
def _generation(g: GroupInputs) -> AxisValue:
    if g.similarity is None or g.outputs is None:
        raise RuntimeError("the generation axis needs outputs and a similarity backend")
    return generation_instability(g.similarity(g.outputs))
