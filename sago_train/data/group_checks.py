"""The checks of a variant group's fields that do not need the group itself (docs/definitions.md#data): chat
messages, the reference and its aliases, multiple-choice answers and the generators' choice orders. Each raises a
:class:`~sago_train.errors.SagoInputError` naming the field, without location (the reader adds file and line)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import SagoInputError, did_you_mean, short_repr, type_name

CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")

# 'answer' is the option index of a multiple-choice group; a free-text answer is a 'reference'.
ANSWER_NEEDS_CHOICES = "'answer' needs 'choices' (it is the index of the correct option)"
ANSWER_HINT = ("for a free-text answer use 'reference' (e.g. {\"question\": ..., \"reference\": \"Paris\"}); "
                "'answer' goes with 'choices'")


def check_reference(value: Any) -> None:
    """A reference is a non-empty string, or a non-empty list of them (aliases, any one right); raises a
    :class:`SagoInputError` on ``reference`` otherwise (without location; callers add it)."""
    if value is None:
        return
    aliases = value if isinstance(value, list) else [value]
    if not aliases:
        raise SagoInputError("reference is an empty list", key="reference",
                             hint='give a string, or a list of aliases such as ["Kyiv", "Kiev"]')
    for i, alias in enumerate(aliases):
        where = f"alias {i}" if isinstance(value, list) else "reference"
        if not isinstance(alias, str):
            raise SagoInputError(f"{where}: expected a string, got {type_name(alias)}", key="reference",
                                 hint='a reference is a string or a list of strings (aliases, any one right)')
        if not alias.strip():
            raise SagoInputError(f"{where} is empty", key="reference", hint="omit it to use the greedy output")


def reference_aliases(value: str | list[str] | None) -> list[str]:
    """Every accepted answer of a reference as given: ``[value]`` for a string, the list itself, ``[]``."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def check_messages(value: list[Any], i: int) -> None:
    """Variant ``i`` given as chat messages: a non-empty list of ``{role, content}`` with a known role and string
    content."""
    if not value:
        raise SagoInputError(f"variant {i} is an empty message list", key="variants")
    for j, msg in enumerate(value):
        if not isinstance(msg, Mapping):
            raise SagoInputError(
                f"variant {i}, message {j}: expected an object with 'role' and 'content', got {type_name(msg)}",
                key="variants",
            )
        role, content = msg.get("role"), msg.get("content")
        if role not in CHAT_ROLES:
            raise SagoInputError(
                f"variant {i}, message {j}: role {short_repr(role)} is not one of {', '.join(CHAT_ROLES)}."
                + (did_you_mean(role, CHAT_ROLES) if isinstance(role, str) else ""),
                key="variants",
            )
        if not isinstance(content, str):
            raise SagoInputError(
                f"variant {i}, message {j}: expected string 'content', got {type_name(content)}", key="variants"
            )


def check_choice_orders(meta: dict[str, Any], choices: list[str] | None, k: int) -> None:
    """``meta.generation`` (written by the generators) is an object; its ``choice_orders`` give, per variant, the
    order in which that variant shows the choices: one permutation of the choice indices per variant. Anything
    else (a negative, repeated or out-of-range index, a string, too few orders) would score a variant's answer
    against the wrong option."""
    gen = meta.get("generation")
    if gen is None:
        return
    if not isinstance(gen, dict):
        raise SagoInputError(f"expected an object, got {type_name(gen)}", key="meta.generation")
    orders = gen.get("choice_orders")
    if orders is None:
        return
    key = "meta.generation.choice_orders"
    if choices is None:
        raise SagoInputError("choice orders need 'choices'", key=key)
    if not isinstance(orders, list) or len(orders) != k:
        got = f"{len(orders)}" if isinstance(orders, list) else type_name(orders)
        raise SagoInputError(f"expected one order of the choices per variant ({k}), got {got}", key=key)
    n = len(choices)
    for k, order in enumerate(orders):
        ok = isinstance(order, list) and all(isinstance(j, int) and not isinstance(j, bool) for j in order)
        if not ok or sorted(order) != list(range(n)):
            raise SagoInputError(f"order {k}: expected each choice index 0..{n - 1} once, got {short_repr(order)}",
                                 key=key)


#: The kind of a group's canonical variant (the original, in a built set): reserved for it.
CANONICAL_KIND = "canonical"


def check_canonical_kind(kinds: list[str] | None, canonical: int) -> None:
    """The kind ``canonical`` names the group's canonical variant and no other: a set whose ``canonical``
    index points elsewhere would be read as two canonical phrasings."""
    if kinds is None or CANONICAL_KIND not in kinds:
        return
    at = kinds.index(CANONICAL_KIND)
    if at != canonical:
        raise SagoInputError(
            f"kind '{CANONICAL_KIND}' is reserved for the group's canonical variant (index {canonical}), but variant "
            f"{at} has it", key="kinds",
            hint=f"rename that variant's kind (e.g. 'original'), or set \"canonical\": {at}")
