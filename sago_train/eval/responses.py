"""Scoring in the form the model answers, from the greedy outputs the evaluation already decoded (no second
decode) and the extractor's shared-prefix scoring: every variant's own response after every variant's prompt
(the ``posix`` axis, docs/definitions.md#posix: K x K continuations per group), and the reference after the
model's own lead-in to it (the ``confidence`` axis, docs/definitions.md#confidence)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .. import distributed
from ..errors import SagoInputError, short_repr
from ..model.tokenize import encode_continuation
from .extraction import Extractor

#: The most variants a group may have for ``posix``: its cost grows with K^2 scored continuations per group.
MAX_POSIX_VARIANTS = 64


def check_posix_groups(groups: Sequence[Any], source: Any = None) -> None:
    """Refuse, before any forward, a group with more variants than :data:`MAX_POSIX_VARIANTS`."""
    for g in groups:
        if g.k > MAX_POSIX_VARIANTS:
            raise SagoInputError(
                f"group {short_repr(g.id)} has {g.k} variants; the posix axis scores K x K responses and takes at "
                f"most {MAX_POSIX_VARIANTS} (MAX_POSIX_VARIANTS)", source=source, key="axes",
                hint="leave posix out of --axes for this set, or split the group")


def response_tokens(spans: Sequence[str], tokenizer: Any) -> list[list[int]]:
    """The tokens of each variant's response y_k: its greedy output's answer span (what the generation axis
    reads), encoded as a continuation (no special tokens)."""
    return [encode_continuation(y, tokenizer) for y in spans]


def score_responses(extractor: Extractor, prompts: Sequence[Sequence[Sequence[int]]],
                    responses: Sequence[Sequence[Sequence[int]]]) -> list[torch.Tensor]:
    """For each group (its variants' prompt tokens and response tokens), the ``[K, K]`` matrix whose ``[i, j]`` is
    the mean log-probability per token of response j after prompt i (NaN where response j is empty). Under
    torch.distributed every rank runs the pass, maybe empty, in step with the others."""
    rows: list[Sequence[int]] = []
    conts: list[list[int]] = []
    for ps, ys in zip(prompts, responses):
        for p in ps:
            for y in ys:
                rows.append(p)
                conts.append(list(y))
    if not rows and distributed.world_size() == 1:
        return []
    scored, _ = extractor.run(rows, conts, want_hidden=False, tick_per_row=0)
    lp = scored.mean_logprob
    out, pos = [], 0
    for ps in prompts:
        k = len(ps)
        out.append(lp[pos: pos + k * k].reshape(k, k).clone())
        pos += k * k
    return out


def lead_in(spans: Sequence[str], reference: str, canonical: int = 0) -> str | None:
    """The model's own lead-in to ``reference``: the first answer span that contains it (case-insensitive; the
    canonical variant's first, then the others in order), up to where it starts; None when no span contains it.

    Example:
        >>> lead_in(["The capital is Paris.", "Paris."], "paris")
        'The capital is '
        >>> lead_in(["Lyon.", "It is Paris."], "Paris"), lead_in(["Lyon."], "Paris") is None
        ('It is ', True)
    """
    target = reference.strip().lower()
    if not target:
        return None
    order = [canonical] + [k for k in range(len(spans)) if k != canonical]
    for k in order:
        at = spans[k].lower().find(target)
        if at >= 0:
            return spans[k][:at]
    return None


def answer_continuation(lead: str, reference: str, tokenizer: Any) -> tuple[list[int], list[int]]:
    """The tokens of the lead-in and of the reference that follows it, encoded apart (so that the lead-in's tokens
    are a prefix of the whole, whatever the tokenizer merges): a lead-in that ends in whitespace gives that space
    to the reference, as a mid-sentence word is written."""
    spaced = bool(lead) and lead[-1].isspace()
    return (encode_continuation(lead.rstrip(), tokenizer),
            encode_continuation((" " if spaced else "") + reference.strip(), tokenizer))


def answer_parts(groups: Sequence[Any], spans: Sequence[Sequence[str]], tokenizer: Any
                 ) -> tuple[list[str | None], list[tuple[list[int], list[int]] | None]]:
    """Per group, the lead-in the confidence axis scores the reference after ("" where no answer span contains
    the reference: the bare reference is scored; None for a group without a reference, whose r is the canonical
    output) and the tokens to score (None where the bare-reference values serve)."""
    leads: list[str | None] = []
    parts: list[tuple[list[int], list[int]] | None] = []
    for g, sp in zip(groups, spans):
        if g.reference is None:
            leads.append(None)
            parts.append(None)
            continue
        lead = lead_in(sp, g.primary_reference, g.canonical)
        lead_ids, ref_ids = answer_continuation(lead or "", g.primary_reference, tokenizer)
        leads.append(lead or "")
        parts.append((lead_ids, ref_ids) if lead_ids and ref_ids else None)
    return leads, parts


def score_answers(extractor: Extractor, prompts: Sequence[Sequence[Sequence[int]]],
                  parts: Sequence[tuple[list[int], list[int]] | None]) -> list[torch.Tensor | None]:
    """Per group, the mean log-probability per token of the reference after each variant's prompt and the
    lead-in (``parts[g]`` = the lead-in's and the reference's tokens; None: nothing to score, the group keeps its
    bare-reference values): the lead-in plus reference, less the lead-in alone, over the reference's tokens.
    Under torch.distributed every rank runs the pass, maybe empty."""
    rows: list[Sequence[int]] = []
    conts: list[list[int]] = []
    for ps, part in zip(prompts, parts):
        if part is None:
            continue
        lead, ref = part
        for p in ps:
            rows += [p, p]
            conts += [lead + ref, lead]
    if not rows and distributed.world_size() == 1:
        return [None] * len(parts)
    lp = extractor.run(rows, conts, want_hidden=False, tick_per_row=0)[0].mean_logprob
    out: list[torch.Tensor | None] = []
    pos = 0
    for ps, part in zip(prompts, parts):
        if part is None:
            out.append(None)
            continue
        n_lead, n_ref = len(part[0]), len(part[1])
        both, lead_only = lp[pos: pos + 2 * len(ps): 2], lp[pos + 1: pos + 2 * len(ps): 2]
        lead_sum = lead_only * n_lead if n_lead else torch.zeros_like(both)
        out.append((both * (n_lead + n_ref) - lead_sum) / n_ref)
        pos += 2 * len(ps)
    return out
