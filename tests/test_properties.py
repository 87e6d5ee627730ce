"""Property tests of the whole engine: results do not depend on batch size, the order of groups, the order
of variants inside a group, or duplicated groups; every axis stays in [0, 1]."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sago_train import SAGOEvaluator
from sago_train.data import VariantSet

from ._helpers.tiny import make_byte_tokenizer, make_tiny_model

TOK = make_byte_tokenizer()
MODEL = make_tiny_model("llama", seed=5)
WORDS = ["the", "sky", "is", "blue", "what", "colour", "tell", "me", "France", "capital", "?", "Paris", "2+2"]

prompt = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)
group = st.tuples(st.lists(prompt, min_size=2, max_size=4, unique=True), st.sampled_from([None, " blue", " Paris"]))


def _evaluate(records, batch_size):
    vs = VariantSet.from_records(records, name="p")
    ev = SAGOEvaluator(MODEL, TOK, max_new_tokens=3, batch_size=batch_size, layers=[0, -1], n_bootstrap=100)
    return {g.id: g.axes for g in ev.evaluate(vs).sets["p"].groups}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(group, min_size=1, max_size=4), st.integers(1, 9), st.randoms(use_true_random=False))
def test_invariant_to_batch_size_and_orders(groups, batch_size, rnd):
    records = []
    for i, (variants, ref) in enumerate(groups):
        rec = {"id": f"g{i}", "variants": variants}
        if ref:
            rec["reference"] = ref
        records.append(rec)
    base = _evaluate(records, 4)
    shuffled = []
    for rec in records:
        order = list(range(len(rec["variants"])))
        rnd.shuffle(order)
        # The canonical variant follows its text, so r (the canonical greedy output) is the same.
        shuffled.append({**rec, "variants": [rec["variants"][i] for i in order], "canonical": order.index(0)})
    rnd.shuffle(shuffled)
    got = _evaluate(shuffled, batch_size)
    for gid, axes in base.items():
        for axis, v in axes.items():
            # Every axis is in [0, 1] except activation_rel, a ratio (SPEC), which is only >= 0.
            upper = math.inf if axis == "activation_rel" else 1.0
            assert 0.0 <= v <= upper or math.isnan(v), (axis, v)
            if math.isnan(v):
                assert math.isnan(got[gid][axis])
            else:
                assert got[gid][axis] == pytest.approx(v, abs=1e-4), (gid, axis)
