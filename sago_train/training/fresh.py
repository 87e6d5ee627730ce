"""Variants drawn afresh every time a group is collated (docs/stability-loss.md#fresh-variants).

Text noise (the free-text kinds of :data:`~sago_train.data.generators.FREE_TEXT_KINDS`) rewrites a group's
canonical prompt. A draw depends only on (training seed, group, kind, how many times this drawer has drawn that
group, the variant's slot), hashed as the dataset builder hashes its draws, so a run is reproducible and a group
gets new variants each epoch. The count lives in the drawer (one per process; the collator runs in the main
process with ``dataloader_num_workers=0``, the default; a worker process counts on its own copy).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Sequence
from typing import Any

from ..data.build import draw_rng
from ..data.generators import FREE_TEXT_KINDS, make_generator
from ..data.generators.noise import CASING_MODES, CasingGenerator
from ..data.groups import Variant, VariantGroup
from ..errors import SagoInputError


def _perturb(kind: str, text: str, rng: random.Random) -> str:
    if kind == "casing":
        # The casing generator's default (lower) is one fixed rewrite; a fresh draw picks the style too.
        return CasingGenerator(rng.choice(CASING_MODES)).perturb(text, rng)
    return make_generator(kind).perturb(text, rng)  # type: ignore[attr-defined]


def _rewrite(variant: Variant, kind: str, rng: random.Random) -> Variant:
    """A string prompt is rewritten; a chat prompt has its last user message rewritten."""
    if isinstance(variant, str):
        return _perturb(kind, variant, rng)
    messages = [dict(m) for m in variant]
    for m in reversed(messages):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            m["content"] = _perturb(kind, m["content"], rng)
            break
    return messages


class FreshVariants:
    """Draw ``n`` fresh variants of a group's canonical prompt per call.

    Example:
        >>> from sago_train.data import VariantGroup
        >>> drawer = FreshVariants(2, ["typo", "whitespace"], seed=0)
        >>> g = VariantGroup(id="q1", variants=["What is the capital of France?", "France's capital?"])
        >>> first, second = drawer(g), drawer(g)
        >>> first.k, first.variants[:2] == g.variants
        (4, True)
        >>> first.variants[2:] != second.variants[2:]  # a new draw each time the group comes back
        True
        >>> FreshVariants(2, ["typo", "whitespace"], seed=0)(g).variants == first.variants  # reproducible
        True
    """

    def __init__(self, n: int, kinds: Sequence[str], seed: int = 0, *, keep_fixed: bool = True) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SagoInputError(f"expected an integer >= 1, got {n!r}", key="fresh_variants")
        bad = [k for k in kinds if k not in FREE_TEXT_KINDS]
        if not kinds or bad:
            raise SagoInputError(f"cannot draw fresh variants of kinds {bad or list(kinds)}",
                                 key="fresh_kinds", hint=f"use some of {', '.join(FREE_TEXT_KINDS)}")
        self.n = n
        self.kinds = list(kinds)
        self.seed = int(seed)
        self.keep_fixed = keep_fixed
        self.draws: dict[str, int] = {}
        #: Draws per group of the batches training has used (``consume``): the dataloader collates a batch ahead,
        #: so a checkpoint saves these, not ``draws``, and a resumed run draws exactly what the whole run drew.
        self.consumed: dict[str, int] = {}

    def consume(self, keys: Sequence[str]) -> None:
        """Count the groups of a batch the trainer used (their keys, as the collator put them in the batch)."""
        for key in keys:
            self.consumed[key] = self.consumed.get(key, 0) + 1

    def restore(self, counts: dict[str, int]) -> None:
        """Continue from a checkpoint's counts: the next draw of each group is the one after them."""
        self.draws = {str(k): int(v) for k, v in counts.items()}
        self.consumed = dict(self.draws)

    def key_of(self, group: VariantGroup, has_id: bool) -> str:
        """The group's identity for the seed: its id when the item had one, and its canonical prompt."""
        return json.dumps([group.id if has_id else None, group.variants[group.canonical]], ensure_ascii=True)

    def __call__(self, group: VariantGroup, has_id: bool = True, key: str | None = None) -> VariantGroup:
        """The group with its fresh variants (``key``: :meth:`key_of`, when the caller has it already)."""
        key = self.key_of(group, has_id) if key is None else key
        draw = self.draws.get(key, 0)
        self.draws[key] = draw + 1
        canonical = group.variants[group.canonical]
        fresh: list[Any] = []
        for j in range(self.n):
            # Kinds rotate with the draw, so every kind appears even with fewer slots than kinds.
            kind = self.kinds[(draw * self.n + j) % len(self.kinds)]
            fresh.append(_rewrite(canonical, kind, draw_rng(self.seed, key, kind, draw * self.n + j)))
        if self.keep_fixed:
            return VariantGroup(id=group.id, variants=[*group.variants, *fresh], canonical=group.canonical)
        return VariantGroup(id=group.id, variants=[canonical, *fresh], canonical=0)


def configure_collator(collator: Any, config: Any, seed: int) -> Any:
    """The trainers' collator for ``config``: a copy of a
    :class:`~sago_train.training.collator.VariantGroupCollator` drawing ``config.fresh_variants`` fresh variants,
    and accepting unlabeled items in the consistency mode; any other collator is returned as it is (an error when
    fresh variants are asked for, which only the library's collator draws)."""
    from .collator import VariantGroupCollator

    unlabeled = config.stability_mode.unlabeled
    if not config.fresh_variants and not unlabeled:
        return collator
    if not isinstance(collator, VariantGroupCollator):
        if config.fresh_variants:
            raise SagoInputError(
                f"fresh_variants={config.fresh_variants} needs sago_train's VariantGroupCollator, got "
                f"{type(collator).__name__}", key="fresh_variants",
                hint="pass a VariantGroupCollator (or none: the trainer builds one), or set fresh_variants=0")
        return collator
    collator = copy.copy(collator)
    if config.fresh_variants:
        collator.fresh = FreshVariants(config.fresh_variants, config.kinds_to_draw, seed,
                                       keep_fixed=config.fixed_variants)
    collator.allow_unlabeled = unlabeled
    return collator
