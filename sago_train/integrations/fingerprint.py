"""What a monitored set's numbers depend on, as one hash per set (its *fingerprint*), recorded in every
``history.jsonl`` line, so that a resumed run never compares new evaluations with a baseline measured on other
data.

A resume reloads the baseline and the best evaluations from the history and pairs the new evaluations with them
by group id. If the set's file was edited in between (same ids, new text), the pairs compare different prompts:
a fake regression or improvement, with a tiny p-value, that early stopping would act on. The fingerprint covers
the groups an evaluation runs (the seeded ``max_groups`` subset, in order, each group as written in the set)
and the evaluation settings that change the numbers (every :class:`~sago_train.SAGOConfig` field except
``batch_size`` and ``strict``, which do not).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ..data.groups import VariantSet
from ..eval.config import SAGOConfig
from ..eval.plan import select_groups

#: The key of a history line that holds ``{set: fingerprint}``.
FINGERPRINT_KEY = "fingerprints"
#: Settings that do not change any number (results do not depend on the batch size; ``strict`` only decides
#: between skipping and failing).
NEUTRAL_SETTINGS = ("batch_size", "strict")


def set_fingerprints(sets: Mapping[str, VariantSet], config: SAGOConfig) -> dict[str, str]:
    """``{set: sha256 hex}`` of the groups each evaluation of the set runs and of the settings that change its
    numbers (see the module doc).

    Example:
        >>> vs = VariantSet.from_records([{"id": "a", "variants": ["2+2=", "two plus two is"]}], name="s")
        >>> one = set_fingerprints({"s": vs}, SAGOConfig())
        >>> edited = VariantSet.from_records([{"id": "a", "variants": ["2+3=", "two plus two is"]}], name="s")
        >>> one == set_fingerprints({"s": vs}, SAGOConfig(batch_size=4)), one == set_fingerprints({"s": edited},
        ...                                                                                        SAGOConfig())
        (True, False)
    """
    settings = {k: v for k, v in sorted(config.to_dict().items()) if k not in NEUTRAL_SETTINGS}
    out = {}
    for name, vs in sets.items():
        digest = hashlib.sha256()
        digest.update(_canonical(settings).encode("utf-8"))
        for i in select_groups(vs, config.max_groups, config.seed):
            digest.update(b"\n")
            digest.update(_canonical(vs.groups[i].to_dict()).encode("utf-8", "surrogatepass"))
        out[name] = digest.hexdigest()
    return out


def _canonical(value: Any) -> str:
    """One text per value: JSON with sorted keys; a group built in Python with values JSON cannot hold (numpy
    numbers from a dataset row, non-string keys in ``meta``) by their repr."""
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)
    except TypeError:  # keys of mixed types cannot be sorted
        return repr(value)


def changed_sets(history: list[dict[str, Any]], current: Mapping[str, str]) -> dict[str, int]:
    """``{set: step}`` for each set whose fingerprint recorded in ``history`` (at that step, the last such line)
    differs from ``current``. Lines without fingerprints (written before they were recorded) and sets not in
    ``current`` are not compared.

    Example:
        >>> changed_sets([{"step": 0, "fingerprints": {"s": "aa"}}, {"step": 2, "fingerprints": {"s": "aa"}}],
        ...              {"s": "bb"})
        {'s': 2}
    """
    out: dict[str, int] = {}
    for line in history:
        recorded = line.get(FINGERPRINT_KEY)
        if not isinstance(recorded, dict):
            continue
        for name, value in recorded.items():
            if name in current and value != current[name]:
                out[name] = int(line.get("step", 0))
    return out
