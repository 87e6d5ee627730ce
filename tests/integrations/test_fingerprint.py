"""Fingerprints of monitored sets: what a resume compares so that new evaluations are never paired with a baseline
measured on other prompts."""

from __future__ import annotations

from sago_train.data.groups import VariantSet
from sago_train.eval.config import SAGOConfig
from sago_train.integrations.fingerprint import FINGERPRINT_KEY, changed_sets, set_fingerprints


def _set(text: str = "What is 2+2?", n: int = 6) -> VariantSet:
    return VariantSet.from_records([{"id": f"g{i}", "variants": [f"{text} ({i})", f"two plus two {i}"]}
                                    for i in range(n)], name="s")


def test_the_text_and_the_settings_that_change_numbers_change_the_fingerprint():
    base = set_fingerprints({"s": _set()}, SAGOConfig())["s"]
    assert set_fingerprints({"s": _set()}, SAGOConfig())["s"] == base  # deterministic
    assert set_fingerprints({"s": _set("What is 2 + 2?")}, SAGOConfig())["s"] != base  # same ids, new text
    for changed in (SAGOConfig(max_new_tokens=3), SAGOConfig(axes="activation"), SAGOConfig(seed=1),
                    SAGOConfig(layers=[0])):
        assert set_fingerprints({"s": _set()}, changed)["s"] != base
    for neutral in (SAGOConfig(batch_size=2), SAGOConfig(strict=True)):  # results do not depend on them
        assert set_fingerprints({"s": _set()}, neutral)["s"] == base


def test_only_the_groups_an_evaluation_runs_count():
    """With max_groups, a group outside the seeded subset does not change the numbers, so not the fingerprint."""
    from sago_train.eval.plan import select_groups

    cfg = SAGOConfig(max_groups=2)
    vs = _set(n=6)
    outside = next(i for i in range(6) if i not in select_groups(vs, 2, 0))
    edited = _set(n=6)
    edited.groups[outside].variants[0] = "something else entirely"
    assert set_fingerprints({"s": vs}, cfg) == set_fingerprints({"s": edited}, cfg)


def test_changed_sets_names_the_set_and_the_last_step_measured():
    history = [{"step": 0, FINGERPRINT_KEY: {"s": "a", "t": "x"}}, {"step": 2, FINGERPRINT_KEY: {"s": "a"}},
               {"step": 4}]  # a line written before fingerprints were recorded is not compared
    assert changed_sets(history, {"s": "a", "t": "x"}) == {}
    assert changed_sets(history, {"s": "b", "t": "x", "new": "n"}) == {"s": 2}
