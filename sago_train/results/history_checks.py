"""The parts of a ``history.jsonl`` line that readers use as they are written (not through an
:class:`~sago_train.results.evaluation.Evaluation`): the ``compare`` block of paired changes, checked here so
that a hand-edited or foreign block is a corrupt line (skipped and counted, or an error naming file, line and key),
never a traceback inside ``report``."""

from __future__ import annotations

import math
from typing import Any

from ..errors import SagoInputError, short_repr, type_name
from ..limits import MAX_RECORDED_VALUE

#: The numbers of one ``vs_baseline`` / ``vs_best`` entry (each a number or null).
CHANGE_NUMBERS = ("mean_diff", "ci_low", "ci_high", "p_value", "p_better", "n", "step")


def check_compare_block(line: dict[str, Any], *, source: str, lineno: int | None) -> None:
    """``compare``: absent, or ``{set: {quantity: {"vs_baseline" | "vs_best": {number fields, verdict, kind}}}}``
    with numbers of size at most ``MAX_RECORDED_VALUE``.

    Example:
        >>> check_compare_block({"compare": {"s": {"activation": {"vs_baseline": {"n": 3, "step": 0}}}}},
        ...                     source="h.jsonl", lineno=2)
        >>> check_compare_block({"compare": {"s": [1]}}, source="h.jsonl", lineno=2)
        Traceback (most recent call last):
        ...
        sago_train.errors.SagoInputError: h.jsonl:2: field 'compare.s': expected an object of quantity -> changes, got list [1]
    """
    block = line.get("compare")
    if block is None:
        return

    def bad(key: str, expected: str, value: Any) -> SagoInputError:
        return SagoInputError(f"expected {expected}, got {type_name(value)} {short_repr(value, 40)}", source=source,
                              line=lineno, key=key)

    if not isinstance(block, dict):
        raise bad("compare", "an object of set -> quantity -> changes", block)
    for set_name, per_quantity in block.items():
        key = f"compare.{str(set_name)[:60]}"
        if not isinstance(per_quantity, dict):
            raise bad(key, "an object of quantity -> changes", per_quantity)
        for quantity, entry in per_quantity.items():
            qkey = f"{key}.{str(quantity)[:60]}"
            if not isinstance(entry, dict):
                raise bad(qkey, "an object with vs_baseline / vs_best", entry)
            for label, change in entry.items():
                ckey = f"{qkey}.{str(label)[:20]}"
                if not isinstance(change, dict):
                    raise bad(ckey, "an object of the paired change's numbers", change)
                for name in CHANGE_NUMBERS:
                    value = change.get(name)
                    if value is None:
                        continue
                    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                            or abs(value) > MAX_RECORDED_VALUE:
                        raise bad(f"{ckey}.{name}", f"a number of size at most {MAX_RECORDED_VALUE:g} or null", value)
                for name in ("verdict", "kind"):
                    if change.get(name) is not None and not isinstance(change[name], str):
                        raise bad(f"{ckey}.{name}", "a string", change[name])
