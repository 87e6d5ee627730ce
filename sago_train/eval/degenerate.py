"""Degenerate outputs: generations that make the stability numbers meaningless however small they are.

A model fed prompts in a format it does not answer (a chat model without its template), cut by a stop
string that matches at once, or given too few new tokens, produces empty outputs or one same preamble for
every question. Every variant then "agrees", and the generation axis reads as perfectly stable. These
checks turn that into a warning that names the likely cause.
"""

from __future__ import annotations

from collections import Counter

from ..functional.text import normalize
from ..results.evaluation import Evaluation, SetEvaluation

#: Above this share of empty generations in a set, the set's generations are flagged.
EMPTY_SHARE_LIMIT = 0.5
#: Above this share of groups whose canonical output equals an unrelated group's, the set is flagged.
IDENTICAL_SHARE_LIMIT = 0.3
#: The cross-group check needs a few groups to mean anything.
MIN_GROUPS_FOR_IDENTICAL = 4


def empty_share(s: SetEvaluation) -> float | None:
    """Share of all generated outputs of a set that are empty after normalization (None without any)."""
    outs = [y for g in s.groups or [] for y in (g.outputs or [])]
    return sum(not normalize(y) for y in outs) / len(outs) if outs else None


def identical_share(s: SetEvaluation) -> float | None:
    """Share of groups whose first variant's output (non-empty, normalized) equals the first output of
    another group with a different reference (groups sharing a reference may share an answer)."""
    rows = [(normalize(g.outputs[0]), g.reference) for g in s.groups or [] if g.outputs]
    if len(rows) < MIN_GROUPS_FOR_IDENTICAL:
        return None
    by_output: dict[str, set] = {}
    counts = Counter(out for out, _ in rows)
    for out, ref in rows:
        by_output.setdefault(out, set()).add(normalize(ref) if ref is not None else None)
    flagged = sum(
        1 for out, _ in rows
        if out and counts[out] > 1 and (len(by_output[out]) > 1 or None in by_output[out])
    )
    return flagged / len(rows)


def degenerate_warnings(result: Evaluation) -> list[str]:
    """One line per degenerate set, naming the share and the likely causes."""
    cfg = result.config
    chat = (cfg.get("resolved") or {}).get("chat_template", cfg.get("chat_template"))
    causes = (
        f"likely causes: the prompt format (chat template {chat!r}; try --chat-template "
        f"{'never' if chat == 'always' else 'always'}), stop strings {cfg.get('stop_strings') or []} "
        f"matching at the start, or max_new_tokens={cfg.get('max_new_tokens')} too small"
    )
    notes: list[str] = []
    for name, s in result.sets.items():
        share = empty_share(s)
        if share is not None and share > EMPTY_SHARE_LIMIT:
            notes.append(f"set '{name}': {share:.0%} of generations are empty, so generation stability and "
                         f"correctness say little; {causes}")
        share = identical_share(s)
        if share is not None and share > IDENTICAL_SHARE_LIMIT:
            notes.append(f"set '{name}': {share:.0%} of groups give the same answer as an unrelated group, so "
                         f"outputs do not depend on the question; {causes}")
    return notes
