"""Degenerate outputs: generations that make the stability numbers meaningless however small they are.

A model fed prompts in a format it does not answer (a chat model without its template), cut by a stop
string that matches at once, or given too few new tokens, produces empty outputs or one same preamble for
every question. Every variant then "agrees", and the generation axis reads as perfectly stable. These
checks turn that into a warning that names the likely cause. Generations that reach ``max_new_tokens`` with
no stop in them were cut mid-answer, or ran on past the answer on its own line (a base model's "Paris. It is
the largest city of..."): a note says how many, a warning when they are most of a set.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ..functional.answer import answer_end, answer_span
from ..functional.text import normalize
from .evaluation import Evaluation, GroupRecord, SetEvaluation

#: Stops of one variant (the evaluator's rule, docs/definitions.md#correctness).
StopsOf = Callable[[Any], list[str]]

#: Above this share of empty generations in a set, the set's generations are flagged.
EMPTY_SHARE_LIMIT = 0.5
#: Above this share of groups whose canonical output equals an unrelated group's, the set is flagged.
IDENTICAL_SHARE_LIMIT = 0.3
#: The cross-group check needs a few groups to mean anything.
MIN_GROUPS_FOR_IDENTICAL = 4
#: Above this share of generations that reach max_new_tokens with no stop in them, the set is flagged.
RUN_ON_SHARE_LIMIT = 0.5


def _spans(g: GroupRecord, stops: StopsOf | None) -> list[str]:
    outs = g.outputs or []
    return list(outs) if stops is None else [answer_span(y, stops(v)) for y, v in zip(outs, g.variants)]


def empty_share(s: SetEvaluation, stops: StopsOf | None = None) -> float | None:
    """Share of a set's answers (the answer spans, with ``stops``; else the outputs) that are empty after
    normalization (None without any)."""
    outs = [y for g in s.groups or [] for y in _spans(g, stops)]
    return sum(not normalize(y) for y in outs) / len(outs) if outs else None


def identical_share(s: SetEvaluation, stops: StopsOf | None = None) -> float | None:
    """Share of groups whose first variant's answer (non-empty, normalized) equals the first answer of
    another group with a different reference (groups sharing a reference may share an answer)."""
    rows = [(normalize(_spans(g, stops)[0]), g.reference) for g in s.groups or [] if g.outputs]
    if len(rows) < MIN_GROUPS_FOR_IDENTICAL:
        return None
    by_output: dict[str, set] = {}
    counts = Counter(out for out, _ in rows)
    for out, ref in rows:
        key = None if ref is None else tuple(normalize(r) for r in ([ref] if isinstance(ref, str) else ref))
        by_output.setdefault(out, set()).add(key)
    flagged = sum(
        1 for out, _ in rows
        if out and counts[out] > 1 and (len(by_output[out]) > 1 or None in by_output[out])
    )
    return flagged / len(rows)


def ignores_question(s: SetEvaluation) -> bool:
    """Whether a set's outputs no longer depend on the question: most outputs empty, or most groups answering
    as an unrelated group does (the checks of :func:`degenerate_warnings`, on the recorded outputs). Its variants
    then agree because the model says one thing to everything: no stability verdict "better" and no "best"
    is given to it. False without outputs."""
    empty, identical = empty_share(s), identical_share(s)
    return bool((empty is not None and empty > EMPTY_SHARE_LIMIT)
                or (identical is not None and identical > IDENTICAL_SHARE_LIMIT))


def degenerate_sets(ev: Evaluation, reference: Evaluation | set[str] | None = None) -> set[str]:
    """The sets of ``ev`` whose outputs no longer depend on the question (:func:`ignores_question`): those of
    ``reference`` (an evaluation, or its degenerate sets) that ignored it already are left out, since nothing
    collapsed there (the warning still says so)."""
    out = {name for name, s in ev.sets.items() if s.groups and ignores_question(s)}
    if reference is not None:
        out -= reference if isinstance(reference, set) else degenerate_sets(reference)
    return out


def hit_token_limit(outputs: Sequence[str], tokenizer: Any, max_new_tokens: int) -> list[bool]:
    """Per output, whether it is ``max_new_tokens`` tokens long, i.e. generation stopped at the limit rather
    than at EOS. The evaluator keeps the decoded text only, so its tokens are counted by encoding it again
    (without special tokens); a re-encoding can merge tokens, so an output one token short counts too: an
    answer ending one token before the limit is then counted as cut, never a cut answer as complete."""
    return [len(tokenizer(y, add_special_tokens=False)["input_ids"]) >= max_new_tokens - 1 for y in outputs]


def cut_at_limit(s: SetEvaluation, stops: StopsOf, tokenizer: Any, max_new_tokens: int) -> dict[str, int] | None:
    """How many of a set's generations reached ``max_new_tokens`` with no stop in them (``variants``, ``of``
    the generations; None without any): cut mid-answer, or running on past it."""
    cut = [hit and answer_end(y, stops(v)) is None
           for g in s.groups or [] if g.outputs is not None
           for y, v, hit in zip(g.outputs, g.variants, hit_token_limit(g.outputs, tokenizer, max_new_tokens))]
    return {"variants": sum(cut), "of": len(cut)} if cut else None


#: Where a remedy is printed, and so how it names a setting: a command-line flag (``cli``), an argument of
#: ``SAGOCallback`` inside a Trainer script (``callback``), of ``SAGOConfig`` / ``SAGOEvaluator`` (``python``),
#: or a key of a ``sago-train run`` recipe (``recipe``).
REMEDY_STYLES = ("cli", "callback", "python", "recipe")
_FLAGS = {"stop_strings": "--stop"}
#: The stop that ends a base model's answer at its line.
NEWLINE_STOP = ["\n"]


def setting(name: str, value: Any, style: str) -> str:
    """A setting as a user types it where the advice is printed.

    Example:
        >>> setting("chat_template", "never", "cli"), setting("chat_template", "never", "callback")
        ('--chat-template never', "SAGOCallback(chat_template='never')")
        >>> print(setting("stop_strings", NEWLINE_STOP, "cli"), setting("stop_strings", NEWLINE_STOP, "callback"))
        --stop '\\n' SAGOCallback(stop_strings=['\\n'])
        >>> setting("max_new_tokens", 64, "recipe")
        'monitor.options.max_new_tokens: 64'
    """
    if style == "cli":
        flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
        # On a command line backslash escapes are read ('\\n' is a line break), so they are shown escaped.
        shown = (" ".join("'" + v.encode("unicode_escape").decode() + "'" for v in value) if isinstance(value, list)
                 else str(value))
        return f"{flag} {shown}"
    if style == "recipe":
        return f"monitor.options.{name}: {value}"
    owner = "SAGOCallback" if style == "callback" else "SAGOConfig"
    return f"{owner}({name}={value!r})"


def _causes(cfg: dict[str, Any], chat: Any, style: str, can_chat: bool) -> str:
    """The likely causes of degenerate outputs, each remedy named as it is set where it is printed; never a
    chat template for a tokenizer without one."""
    if chat == "always":
        fmt = f"the prompt format (chat template 'always'; try {setting('chat_template', 'never', style)})"
    elif can_chat:
        fmt = f"the prompt format (chat template 'never'; try {setting('chat_template', 'always', style)})"
    else:
        fmt = "the prompt format (string variants fed as they are: this tokenizer has no chat template)"
    limit = cfg.get("max_new_tokens")
    more = setting("max_new_tokens", 2 * limit if isinstance(limit, int) else 64, style)
    return (f"likely causes: {fmt}, stop strings {cfg.get('stop_strings') or []} matching at the start, or "
            f"max_new_tokens={limit} too small (try {more})")


def degenerate_warnings(result: Evaluation, stops: StopsOf | None = None, *, style: str = "python",
                        can_chat: bool = True) -> list[str]:
    """One line per degenerate set, naming the share and the likely causes; a note per set where some
    generations reached ``max_new_tokens`` before their answer ended (``config["resolved"]
    ["cut_at_max_new_tokens"]``). ``stops``: the stops of a variant, to read answer spans (else outputs).
    ``style`` (:data:`REMEDY_STYLES`): how a remedy names its setting; ``can_chat``: whether the tokenizer has
    a chat template (else none is suggested)."""
    cfg = result.config
    chat = (cfg.get("resolved") or {}).get("chat_template", cfg.get("chat_template"))
    causes = _causes(cfg, chat, style, can_chat)
    notes: list[str] = []
    cut_counts = (cfg.get("resolved") or {}).get("cut_at_max_new_tokens") or {}
    limit = cfg.get("max_new_tokens")
    for name, s in result.sets.items():
        cut = cut_counts.get(name)
        if cut and cut["variants"]:
            share = cut["variants"] / cut["of"]
            text = (f"set '{name}': {cut['variants']} of {cut['of']} generations ({share:.0%}) reached "
                    f"max_new_tokens={limit} with no end (EOS or a stop): cut mid-answer, or running on past the "
                    f"answer on its line")
            if share > RUN_ON_SHARE_LIMIT:
                notes.append(f"{text}, so generation stability and correctness read more (or less) than the "
                             f"answer; likely causes: max_new_tokens={limit} too small for the answers (raise it: "
                             f"{setting('max_new_tokens', 2 * limit, style)}), or a base model continuing on the "
                             f"answer's line (add a stop: {setting('stop_strings', NEWLINE_STOP, style)})")
            else:
                notes.append(f"{text}; raise max_new_tokens if answers are cut "
                             f"({setting('max_new_tokens', 2 * limit, style)})")
        share = empty_share(s, stops)
        if share is not None and share > EMPTY_SHARE_LIMIT:
            notes.append(f"set '{name}': {share:.0%} of generations are empty, so generation stability and "
                         f"correctness say little; {causes}")
        share = identical_share(s, stops)
        if share is not None and share > IDENTICAL_SHARE_LIMIT:
            notes.append(f"set '{name}': {share:.0%} of groups give the same answer as an unrelated group, so "
                         f"outputs do not depend on the question; {causes}")
    return notes
