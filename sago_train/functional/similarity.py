"""The pure similarity backends of the generation axis, ``exact`` and ``token_f1`` (default); ``embedding``
loads a sentence encoder and lives in :mod:`sago_train.model.similarity`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..errors import SagoInputError, unknown_name_error
from .text import exact_match, token_f1

SIMILARITIES = ("exact", "token_f1", "embedding")
DEFAULT_EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

SimilarityFn = Callable[[Sequence[str]], np.ndarray]


def _pairwise(fn: Callable[[str, str], float]) -> SimilarityFn:
    def matrix(texts: Sequence[str]) -> np.ndarray:
        k = len(texts)
        s = np.eye(k)
        for i in range(k):
            for j in range(i + 1, k):
                s[i, j] = s[j, i] = fn(texts[i], texts[j])
        return s

    return matrix


def get_similarity(name: str, **_: object) -> SimilarityFn:
    """The pure backends (``exact``, ``token_f1``): a function mapping K texts to their ``[K, K]`` similarity
    matrix. ``embedding`` loads a sentence encoder, which is the model layer's
    (:func:`sago_train.model.similarity.get_similarity` serves all three).

    Example:
        >>> get_similarity("exact")(["Paris", "paris!", "Lyon"])[0].tolist()
        [1.0, 1.0, 0.0]
    """
    if name == "exact":
        return _pairwise(exact_match)
    if name == "token_f1":
        return _pairwise(token_f1)
    if name == "embedding":
        raise SagoInputError("the 'embedding' similarity loads a sentence encoder: it is not pure maths",
                             key="similarity", hint="use sago_train.model.similarity.get_similarity('embedding')")
    raise unknown_name_error("similarity", name, SIMILARITIES, key="similarity")
