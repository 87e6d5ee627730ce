"""Fresh variants: deterministic given (seed, group, draw count), new at each draw, in the collator."""

from __future__ import annotations

import pytest

from sago_train.data import VariantGroup
from sago_train.errors import SagoInputError
from sago_train.training.collator import VariantGroupCollator
from sago_train.training.config import StabilityConfig
from sago_train.training.fresh import FreshVariants, configure_collator
from tests._helpers.tiny import tiny_groups

GROUP = VariantGroup(id="q1", variants=["What is the capital of France today?", "France's capital?"])


def test_draws_are_reproducible_and_differ_between_draws_and_seeds():
    runs = []
    for _ in range(2):
        drawer = FreshVariants(3, ["typo", "casing", "whitespace"], seed=7)
        runs.append([drawer(GROUP).variants for _ in range(4)])
    assert runs[0] == runs[1]  # same seed, group and draw counts: the same variants
    draws = runs[0]
    assert all(d[:2] == GROUP.variants for d in draws)  # the item's own phrasings kept, canonical first
    fresh = [tuple(d[2:]) for d in draws]
    assert len(set(fresh)) == 4  # every draw of the group is new
    assert all(v != GROUP.variants[0] for f in fresh for v in f if v)  # every fresh variant is perturbed
    other_seed = FreshVariants(3, ["typo", "casing", "whitespace"], seed=8)(GROUP).variants[2:]
    assert other_seed != draws[0][2:]
    # A draw does not depend on what else was drawn before (another group in between).
    drawer = FreshVariants(3, ["typo", "casing", "whitespace"], seed=7)
    drawer(VariantGroup(id="other", variants=["a b c", "c b a"]))
    assert drawer(GROUP).variants == draws[0]


def test_kinds_rotate_and_without_fixed_variants_only_the_canonical_stays():
    drawer = FreshVariants(1, ["whitespace", "casing"], seed=0, keep_fixed=False)
    g = VariantGroup(id="x", variants=["keep this text", "other phrasing here"], canonical=1)
    first, second = drawer(g), drawer(g)
    assert first.variants[0] == "other phrasing here" and first.canonical == 0 and first.k == 2
    assert first.variants[1].split() == "other phrasing here".split()  # whitespace only, words unchanged
    assert second.variants[1].lower() == "other phrasing here"  # then casing
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "name the capital of france"}]
    out = FreshVariants(1, ["typo"], seed=0)(VariantGroup(id="c", variants=[chat, chat]))
    assert out.variants[2][0] == chat[0] and out.variants[2][1]["content"] != chat[1]["content"]


def test_collator_draws_per_collation_with_one_k_per_batch(tok):
    cfg = StabilityConfig(fresh_variants=2, act_weight=0.0, conf_weight=0.0)
    collate = configure_collator(VariantGroupCollator(tok), cfg, seed=0)
    items = tiny_groups(2)  # K=3 each
    first, second = collate(items), collate(items)
    assert first["input_ids"].shape[0] == 2 * 5 and first["variant_index"].tolist() == [0, 1, 2, 3, 4] * 2
    assert not (first["input_ids"].shape == second["input_ids"].shape and (first["input_ids"] == second["input_ids"]).all())
    again = configure_collator(VariantGroupCollator(tok), cfg, seed=0)(items)
    assert (again["input_ids"] == first["input_ids"]).all()
    # Augmentation on fresh perturbations: every row, fresh ones included, carries the target's labels.
    assert ((first["labels"] != -100).sum(1) == first["target_length"]).all()


def test_configure_collator_leaves_plain_runs_alone_and_refuses_foreign_collators(tok):
    base = VariantGroupCollator(tok)
    assert configure_collator(base, StabilityConfig(), 0) is base
    configured = configure_collator(base, StabilityConfig(mode="consistency"), 0)
    assert configured is not base and configured.allow_unlabeled and not base.allow_unlabeled
    with pytest.raises(SagoInputError, match="fresh_variants.*VariantGroupCollator"):
        configure_collator(lambda items: items, StabilityConfig(fresh_variants=1), 0)
    with pytest.raises(SagoInputError, match="fresh_kinds"):
        FreshVariants(1, ["format"])
