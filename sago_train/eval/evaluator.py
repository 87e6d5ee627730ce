"""``SAGOEvaluator``: compute the SAGO axes of a model on variant sets (the Python entry point; the CLI and
the Trainer callback use it). It moves data only: maths lives in ``axes``/``functional``/``stats``."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import distributed
from ..data.groups import VariantGroup, VariantSet, too_long_variant
from ..data.sources import SetsLike, resolve_sets
from ..errors import SagoInputError, short_repr
from ..functional.answer import answer_span, answer_stops
from ..functional.axes import Axis, GroupInputs, add_partials, get_axis, variant_correct
from ..functional.axes.correctness import resolve_match_mode
from ..functional.findings import split_halves
from ..limits import MAX_VARIANT_CHARS, MAX_VARIANT_TOKENS
from ..model.layers import num_decoder_layers, resolve_layers
from ..model.loading import load_model_and_tokenizer
from ..model.similarity import get_similarity
from ..model.tokenize import PromptRenderer, context_length, encode_continuation
from ..results.degenerate import cut_at_limit, degenerate_warnings
from ..results.evaluation import Evaluation
from ..results.group import GroupRecord, mean_instability
from ..results.sets import SetEvaluation
from ..threads import configure_torch_threads
from .axis_values import axis_values
from .config import SAGOConfig
from .extraction import Extractor
from .plan import axes_computed, encode_within, needs_generation, select_groups, variant_text
from .responses import answer_parts, check_posix_groups, response_tokens, score_answers, score_responses

SKIP_TOO_LONG = "prompt longer than the model's context"
SKIP_NON_FINITE = "non-finite hidden states or log-probabilities"
SKIP_TOO_MANY_CHARS = f"a variant longer than {MAX_VARIANT_CHARS:,} characters"


class SAGOEvaluator:
    """Measures SAGO on variant sets.

    Example:
        >>> from sago_train import SAGOEvaluator, bundled_sets, tiny_model_path
        >>> ev = SAGOEvaluator.from_pretrained(tiny_model_path(), axes="activation,confidence")  # doctest: +SKIP
        >>> result = ev.evaluate(bundled_sets())  # doctest: +SKIP
        >>> result.sets["paraphrase"].summaries["activation"].mean  # doctest: +SKIP
    """

    #: How warnings name a remedy (degenerate.REMEDY_STYLES): "cli" flags, "callback" SAGOCallback arguments...
    remedy_style = "python"

    def __init__(self, model: nn.Module, tokenizer: Any, config: SAGOConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise SagoInputError("pass either config= or keyword options, not both")
        self.config = config if config is not None else SAGOConfig.from_kwargs(**options)
        self.model = model
        self.tokenizer = tokenizer
        self.axes = [get_axis(a) for a in self.config.axes]
        self.needs = set().union(*(a.needs for a in self.axes))
        self._layers: list[int] | None = None
        self._similarity: Callable | None = None
        self.model_name = str(getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__)
        #: The one rendering of prompts, shared with training; chat_template: how string variants are fed (resolved).
        self.renderer = PromptRenderer(tokenizer, self.config.chat_template, self.config.stop_strings)
        self.chat_template = self.renderer.chat_template

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: str | torch.dtype | None = None, device: str | None = None,
                        trust_remote_code: bool = False, **options: Any) -> SAGOEvaluator:
        """Load a model (a full model or a PEFT adapter folder) and its tokenizer, then build an evaluator."""
        model, tokenizer = load_model_and_tokenizer(
            path, dtype=dtype, device=device, trust_remote_code=trust_remote_code
        )
        ev = cls(model, tokenizer, **options)
        ev.model_name = str(path)
        return ev

    # ------------------------------------------------------------------ helpers
    @property
    def layers(self) -> list[int]:
        if self._layers is None:
            self._layers = resolve_layers(self.config.layers, num_decoder_layers(self.model))
        return self._layers

    @property
    def similarity(self) -> Callable:
        if self._similarity is None:
            self._similarity = get_similarity(self.config.similarity, embedding_model=self.config.embedding_model)
        return self._similarity

    def _needs_generation(self, groups: list[VariantGroup], generation: bool = True) -> bool:
        return needs_generation(self.needs, groups, generation)

    def set_axes(self, groups: list[VariantGroup], generation: bool = True) -> list[Axis]:
        """The axes computed on ``groups`` (:func:`~sago_train.eval.plan.axes_computed`): all of them, or with
        ``generation=False`` those that need no greedy output."""
        return axes_computed(self.axes, groups, generation)

    # ------------------------------------------------------------------ evaluation
    def evaluate(
        self, sets: SetsLike, *, progress: Callable[[int], None] | None = None, generation: bool = True
    ) -> Evaluation:
        """Evaluate every set; under ``torch.distributed`` groups are sharded across ranks and gathered, so
        every rank returns the same full result.

        ``generation=False`` (the Trainer callback's cheaper evaluations) runs no greedy decoding: only the axes
        of :meth:`set_axes` are computed, with values identical to a full evaluation's, and no accuracy; the
        axes left out are each set's ``skipped_axes``, and such an evaluation has no ``instability`` (a mean over
        fewer axes would not compare with a complete evaluation's)."""
        configure_torch_threads()
        resolved = resolve_sets(sets)
        results = {name: self._evaluate_set(vs, progress, generation) for name, vs in resolved.items()}
        config = self.config.to_dict()
        if not generation:  # a complete evaluation's config stays as it was
            config["generation"] = False
        # What "auto" became, so that every output says how prompts were fed and answers matched.
        config["resolved"] = {
            "chat_template": self.chat_template,
            "correctness": {n: r.correctness.get("mode") for n, r in results.items() if r.correctness.get("n")},
            # The stops that end an answer span (docs/definitions.md#correctness), and per set how many generations reached
            # max_new_tokens before any end (EOS or a stop): cut mid-answer, or running on.
            "answer_stops": {n: self._set_stops(resolved[n]) for n in results},
            "cut_at_max_new_tokens": {
                n: c for n, r in results.items()
                if (c := cut_at_limit(r, self.stops_for, self.tokenizer, self.config.max_new_tokens)) is not None},
        }
        result = Evaluation(results, model=self.model_name, config=config, seed=self.config.seed)
        result.warnings = degenerate_warnings(result, self.stops_for, style=self.remedy_style,
                                              can_chat=getattr(self.tokenizer, "chat_template", None) is not None)
        return result

    def count_sequences(self, sets: SetsLike, generation: bool = True) -> int:
        """How many sequences (variants x passes) an evaluation processes on this rank, for progress bars."""
        total = 0
        for vs in resolve_sets(sets).values():
            idx = select_groups(vs, self.config.max_groups, self.config.seed)
            mine = [idx[i] for i in distributed.shard_indices(len(idx))]
            k = sum(vs[i].k for i in mine)
            needs = set().union(*(a.needs for a in self.set_axes([vs[i] for i in idx], generation)))
            passes = int(self._needs_generation([vs[i] for i in mine], generation)) + int(
                bool(needs & {"hidden", "logprobs"})
            )
            total += k * passes
        return total

    def _evaluate_set(self, vs: VariantSet, progress: Callable[[int], None] | None, generation: bool) -> SetEvaluation:
        cfg = self.config
        chosen = select_groups(vs, cfg.max_groups, cfg.seed)
        mine = [chosen[i] for i in distributed.shard_indices(len(chosen))]
        # Decided on the whole selection, not the shard, so every rank makes the same collective calls.
        need_generation = self._needs_generation([vs[i] for i in chosen], generation)
        axes = self.set_axes([vs[i] for i in chosen], generation)
        if any("response_logprobs" in a.needs for a in axes):
            check_posix_groups([vs[i] for i in chosen], vs.source)
        local, skipped, totals = self._evaluate_groups(vs, mine, need_generation, progress, axes)
        gathered = distributed.gather_objects(local)
        skipped_all = distributed.gather_objects([skipped])
        # Set-level axes: each rank sums its groups' statistics; the per-rank sums are gathered here (the
        # same collective calls on every rank, whatever its share), so every rank finalizes the same values.
        totals_all = distributed.gather_objects([totals])
        gathered.sort(key=lambda item: item[0])
        skip_counts: dict[str, int] = {}
        for part in skipped_all:
            for reason, count in part.items():
                skip_counts[reason] = skip_counts.get(reason, 0) + count
        set_level: dict[str, dict[str, Any]] = {}
        for axis in axes:
            if axis.set_level is None:
                continue
            total = None
            for part in totals_all:
                total = add_partials(total, part.get(axis.name))
            total = total or {}
            set_level[axis.name] = axis.set_level.summary(total)
            for _, g, pending in gathered:
                full, half_values = pending[axis.name]
                value = axis.set_level.finalize(full, total)
                g.axes[axis.name] = value.value
                g.per_variant[axis.name] = value.per_variant
                g.extra.update({f"{axis.name}_{k}": v for k, v in value.extra.items()})
                if half_values:
                    g.halves[axis.name] = [axis.set_level.finalize(h, total).value for h in half_values]
        groups = [g for _, g, _ in gathered]
        for g in groups:  # the set-level axes' final values are in: the group's mean of the [0, 1] axes
            g.instability = mean_instability(g.axes)
        names = [a.name for a in axes]
        out = SetEvaluation.from_groups(vs.name, names, groups, vs.kinds, skip_counts, seed=cfg.seed,
                                        n_bootstrap=cfg.n_bootstrap, set_level=set_level,
                                        skipped_axes=[a for a in cfg.axes if a not in names])
        if out.correctness.get("n"):
            out.correctness["mode"] = resolve_match_mode(cfg.correctness)
            out.correctness["stops"] = self._set_stops(vs)
        return out

    def stops_for(self, variant: Any) -> list[str]:
        """What ends the answer span of one variant's output (docs/definitions.md#correctness)."""
        chat = self.chat_template == "always" or not isinstance(variant, str)
        return answer_stops(variant_text(variant), chat=chat, configured=self.config.stop_strings)

    def _set_stops(self, vs: VariantSet) -> list[str]:
        return list(dict.fromkeys(s for g in vs.groups for v in g.variants for s in self.stops_for(v)))

    def _evaluate_groups(
        self,
        vs: VariantSet,
        indices: list[int],
        need_generation: bool,
        progress: Callable[[int], None] | None,
        axes: list[Axis],
    ) -> tuple[list[tuple[int, GroupRecord, dict[str, Any]]], dict[str, int], dict[str, Any]]:
        cfg = self.config
        needs = set().union(*(a.needs for a in axes))
        tok = self.tokenizer
        ctx = context_length(self.model) or MAX_VARIANT_TOKENS
        groups: list[tuple[int, VariantGroup, list[list[int]]]] = []
        skipped: dict[str, int] = {}
        gen_budget = cfg.max_new_tokens
        for i in indices:
            g = vs[i]
            long_variant = too_long_variant(g)
            if long_variant is not None:  # counted before tokenizing: megabytes of text can exhaust memory
                if cfg.strict:
                    raise SagoInputError(
                        f"group {short_repr(g.id)}: variant {long_variant} is longer than {MAX_VARIANT_CHARS:,} "
                        "characters (MAX_VARIANT_CHARS)", source=vs.source,
                        hint="shorten it, or drop --strict to skip and count the group")
                skipped[SKIP_TOO_MANY_CHARS] = skipped.get(SKIP_TOO_MANY_CHARS, 0) + 1
                continue
            ref_len = len(encode_continuation(g.primary_reference, tok)) if g.reference else 0
            try:  # one variant at a time: the first too long skips the group before the rest is tokenized
                prompts = encode_within(g.variants, self.renderer.prompt_ids, ctx - max(gen_budget, ref_len))
            except SagoInputError as err:
                raise SagoInputError(err.message, source=vs.source, key=err.key, hint=f"group {short_repr(g.id)}") from None
            longest = (prompts if isinstance(prompts, int) else max(len(p) for p in prompts)) + max(gen_budget, ref_len)
            if isinstance(prompts, int):
                if cfg.strict:
                    raise SagoInputError(
                        f"group {short_repr(g.id)} needs {longest} tokens (prompt + continuation) but the model's context "
                        f"is {ctx}",
                        source=vs.source,
                        hint="shorten the prompt, lower --max-new-tokens, or drop --strict to skip and count it",
                    )
                skipped[SKIP_TOO_LONG] = skipped.get(SKIP_TOO_LONG, 0) + 1
                continue
            groups.append((i, g, prompts))

        extractor = Extractor(
            self.model,
            tok,
            layers=self.layers if "hidden" in needs else [],
            pooling=cfg.prompt_pooling,
            batch_size=cfg.batch_size,
            max_new_tokens=cfg.max_new_tokens,
            stop_strings=cfg.stop_strings,
            progress=progress,
        )
        flat_prompts = [p for _, _, ps in groups for p in ps]
        offsets = []
        pos = 0
        for _, g, _ in groups:
            offsets.append(pos)
            pos += g.k

        # One prefill per batch serves generation, activations and the confidence of every group whose
        # reference is known; r = the canonical variant's greedy output needs generation first, so those
        # groups' continuations are scored in a second, scoring-only pass.
        want_hidden = "hidden" in needs
        want_lp = "logprobs" in needs
        known: list[list[int] | None] | None = None
        if want_lp:
            known = []
            for _, g, _ in groups:
                ids = encode_continuation(g.primary_reference, tok) if g.reference else []
                known.extend([ids if g.reference is not None else None] * g.k)
        outputs: list[str] | None = None
        hidden = logprobs = None
        if need_generation or want_hidden or want_lp:
            scored, outputs = extractor.run(
                flat_prompts, known, want_hidden=want_hidden, want_generation=need_generation,
                tick_per_row=int(need_generation) + int(want_hidden or want_lp),
            )
            hidden, logprobs = scored.hidden, scored.mean_logprob

        # r: the reference when given, else the canonical variant's greedy output.
        scored_refs: list[str | None] = []
        for (_, g, _), off in zip(groups, offsets):
            if g.reference is not None:  # of a list of aliases, the first
                scored_refs.append(g.primary_reference)
            elif outputs is not None:
                scored_refs.append(outputs[off + g.canonical])
            else:
                scored_refs.append(None)

        has_ref = [False] * len(flat_prompts)  # per variant: is there a continuation to score?
        if want_lp:
            conts: list[list[int]] = []
            for (_, g, _), r in zip(groups, scored_refs):
                ids = encode_continuation(r, tok) if r else []
                conts.extend([ids] * g.k)
            has_ref = [bool(c) for c in conts]
            late = [j for j, c in enumerate(known or []) if c is None]
            # Under torch.distributed every rank runs this pass (maybe empty), in step with the others.
            if late or distributed.world_size() > 1:
                extra, _ = extractor.run([flat_prompts[j] for j in late], [conts[j] for j in late],
                                         want_hidden=False, tick_per_row=0)
                if logprobs is None:
                    logprobs = torch.full((len(flat_prompts),), math.nan, dtype=torch.float64)
                if late and extra.mean_logprob is not None:
                    logprobs[late] = extra.mean_logprob

        responses: list[Any] = [None] * len(groups)
        answers: list[Any] = [None] * len(groups)
        leads: list[str | None] = [None] * len(groups)
        if outputs is not None and needs & {"response_logprobs", "answer_logprobs"}:
            group_prompts = [ps for _, _, ps in groups]
            group_spans = [[answer_span(y, self.stops_for(v)) for y, v in zip(outputs[off: off + g.k], g.variants)]
                           for (_, g, _), off in zip(groups, offsets)]
            if "response_logprobs" in needs:
                responses = score_responses(extractor, group_prompts, [
                    response_tokens(spans, tok) for spans in group_spans]) or responses
            if "answer_logprobs" in needs:
                leads, parts = answer_parts([g for _, g, _ in groups], group_spans, tok)
                answers = score_answers(extractor, group_prompts, parts)

        results: list[tuple[int, GroupRecord, dict[str, Any]]] = []
        totals: dict[str, Any] = {}  # set-level axes: this rank's sum of the groups' partial statistics
        for (i, g, _), off, r, resp, ans, lead in zip(groups, offsets, scored_refs, responses, answers, leads):
            sl = slice(off, off + g.k)
            # A broken model (NaN/inf activations) must not poison the statistics: skip and count the group.
            bad_hidden = hidden is not None and not bool(torch.isfinite(hidden[sl]).all())
            bad_lp = logprobs is not None and has_ref[off] and not bool(torch.isfinite(logprobs[sl]).all())
            if bad_hidden or bad_lp:
                skipped[SKIP_NON_FINITE] = skipped.get(SKIP_NON_FINITE, 0) + 1
                continue
            outs = outputs[sl] if outputs is not None else None
            # Generation, mirroring and correctness read the answer span; the raw output is recorded.
            spans = [answer_span(y, self.stops_for(v)) for y, v in zip(outs, g.variants)] if outs is not None else None
            inputs = GroupInputs(
                prompts=[variant_text(v) for v in g.variants],
                reference=g.references or None,
                outputs=spans,
                hidden=hidden[sl] if hidden is not None else None,
                layers=self.layers if hidden is not None else None,
                logprobs=logprobs[sl] if logprobs is not None else None,
                response_logprobs=resp,
                answer_logprobs=(ans if ans is not None else logprobs[sl]) if "answer_logprobs" in needs else None,
                similarity=self.similarity if "generations" in needs else None,
            )
            split = split_halves(g.k, g.id, cfg.seed, kinds=g.kinds)
            values, per_variant, extra, halves, pending = axis_values(inputs, split, totals, axes)
            correct = None
            if outs is not None and (g.reference is not None or g.choices is not None):
                per = [
                    variant_correct(y, reference=g.references or None, choices=g.choices_for(k),
                                    answer=g.answer_for(k), mode=resolve_match_mode(cfg.correctness))
                    for k, y in enumerate(spans)
                ]
                # A group with choices but no answer has no correctness (docs/definitions.md#correctness), never "wrong".
                correct = None if any(c is None for c in per) else [bool(c) for c in per]
            lp = [float(x) for x in logprobs[sl].tolist()] if logprobs is not None else None
            if lp is not None and any(math.isnan(x) for x in lp):
                lp = None
            results.append(
                (
                    i,
                    GroupRecord(
                        id=g.id,
                        variants=g.variants,
                        kinds=g.kinds,
                        outputs=outs,
                        reference=g.reference,  # as given: a string, or the list of aliases
                        scored_reference=r,
                        axes=values,
                        per_variant=per_variant,
                        logprobs=lp,
                        answer_lead=lead if "answer_logprobs" in needs else None,
                        answer_logprobs=[float(x) for x in ans.tolist()] if ans is not None else None,
                        correct=correct,
                        extra=extra,
                        split=[list(h) for h in split] if split is not None else None,
                        halves=halves,
                    ),
                    pending,
                )
            )
        return results, skipped, totals
