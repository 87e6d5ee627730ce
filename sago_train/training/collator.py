"""Batching variant groups for the stability loss (docs/definitions.md#stability-loss).

A training item is one whole group: K variant prompts sharing one target completion ``t``. The collator
turns B items into one flat batch of ``B*K`` sequences ``x_k + t`` (group-major: rows ``g*K .. g*K+K-1``
are group g), with labels on the target tokens only and the bookkeeping the loss needs to line the
variants of a group up.

Groups are never split across devices or gradient-accumulation steps, because the unit that the Trainer's
sampler shuffles, shards across processes and accumulates over is the *item*, and an item is a whole group:
``per_device_train_batch_size=B`` means B groups (B*K sequences) per device and micro-batch. The loss checks
this anyway, so that a setup that slices collated batches (accelerate's ``dispatch_batches``) fails loudly
rather than training on partial groups.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..data.groups import Variant, VariantGroup
from ..errors import SagoInputError, short_repr
from ..model.tokenize import PromptRenderer, pad_id_of

# The per-row tensors the collator adds beside ``input_ids``/``attention_mask``/``labels``. The trainers
# strip them before the model's forward. All are indexed by row, so a batch sliced along rows stays
# self-consistent (and the loss can tell when a slice cut a group).
GROUP_KEYS = ("group_index", "variant_index", "canonical_index", "prompt_length", "target_length", "target_mask")
# The key of a collated batch that holds groups still waiting for a target (unlabeled prompts in the
# consistency mode): :class:`PendingGroups`, completed by the trainer once the teacher has answered.
PENDING_KEY = "sago_pending"
#: The batch entry naming the groups given fresh variants (their drawer keys): bookkeeping, never a model input;
#: the trainer pops it and counts them as used (:meth:`~sago_train.training.fresh.FreshVariants.consume`).
DRAWN_KEY = "sago_drawn"
# Dataset columns an item may carry; the trainers keep them when ``remove_unused_columns`` prunes the rest.
ITEM_COLUMNS = ("id", "variants", "target", "reference", "canonical", "kinds", "meta")


def group_of(
    item: Any, index: int, label: str | None = None, *, allow_unlabeled: bool = False
) -> tuple[VariantGroup, str | None]:
    """Validate one item and return it as a group plus its target text (``label`` names it in errors).

    With ``allow_unlabeled`` an item without a target is returned with target ``None`` (a prompt whose
    response the consistency mode's teacher will give)."""
    if isinstance(item, VariantGroup):
        if item.reference is None and allow_unlabeled:
            return item, None
        if item.reference is None:
            raise SagoInputError(
                f"batch item {index} (group '{item.id}') has no reference to train on",
                key="reference",
                hint="training groups need the target completion shared by all variants",
            )
        return item, item.primary_reference  # the first alias is the one trained on
    if not isinstance(item, Mapping):
        raise SagoInputError(
            f"batch item {index}: expected a variant group (a mapping with 'variants' and 'target'), "
            f"got {type(item).__name__}"
        )
    gid = item.get("id", f"#{index}")
    where = label if label is not None else f"batch item {index} (group '{gid}')"
    target = item.get("target", item.get("reference"))
    if "variants" not in item:
        raise SagoInputError(f"{where}: missing field 'variants' (a list of at least 2 prompts)", key="variants")
    if target is None and not allow_unlabeled:
        raise SagoInputError(
            f"{where}: missing field 'target'",
            key="target",
            hint="each training group needs the completion shared by all its variants ('target' or 'reference'); "
                 "prompts without one train only in the consistency mode (stability mode: consistency)",
        )
    if target is not None and not isinstance(target, str):
        raise SagoInputError(f"{where}: expected a string target, got {type(target).__name__}", key="target")
    if target is not None and not target.strip():
        raise SagoInputError(f"{where}: the target is empty", key="target", hint="the loss is computed on the target tokens")
    canonical = item.get("canonical", 0)
    try:
        group = VariantGroup(id=str(gid), variants=item["variants"], canonical=canonical if canonical is not None else 0)
    except SagoInputError as err:
        raise SagoInputError(f"{where}: {err.message}", key=err.key, hint=err.hint) from None
    return group, target


class VariantGroupCollator:
    """Collate variant groups into one flat batch of ``B*K`` sequences ``x_k + t``.

    Each item is ``{"variants": [K prompts], "target": str, "canonical"?: int}`` (``"reference"`` is read
    when ``"target"`` is absent; a :class:`~sago_train.data.VariantGroup` with a reference works too).
    Prompts are rendered exactly as ``SAGOEvaluator`` renders them (one
    :class:`~sago_train.model.tokenize.PromptRenderer`): ``chat_template`` is the evaluator's rule (``auto``,
    the default of both, renders string variants with an instruct model's chat template and the generation
    prompt; ``never`` encodes them as they are; ``always``), and chat message lists are always rendered. Give
    the same ``chat_template`` and ``stop_strings`` as the ``SAGOConfig`` that evaluates the model (the trainers
    take them from a ``SAGOCallback`` in their callbacks). The target is encoded once per group without special
    tokens, followed by EOS once when ``add_eos`` and the tokenizer has one (a target already ending with it
    gets no second), so every variant of a group carries exactly the same target tokens; a target holding one
    of ``stop_strings`` is warned about (evaluation cuts the answer there). Padding is on the right.

    Output keys: ``input_ids``, ``attention_mask``, ``labels`` (-100 except on the target tokens), and per
    row ``group_index``, ``variant_index``, ``canonical_index`` (the canonical variant of the row's group),
    ``prompt_length`` (the last prompt token is at ``prompt_length - 1``; the target starts at
    ``prompt_length``), ``target_length`` and ``target_mask`` (True on the target tokens).

    With ``max_length``, a sequence that is too long loses prompt tokens from the left, so that the target
    stays whole and aligned across variants (the number of truncated sequences is in ``num_truncated`` and
    a warning is issued); a target that cannot fit is an error.

    ``fresh`` (a :class:`~sago_train.training.fresh.FreshVariants`) adds variants drawn afresh at each
    collation. ``allow_unlabeled`` accepts items without a target: the batch then carries their groups under
    :data:`PENDING_KEY` (:class:`PendingGroups`) beside the labeled groups' tensors, and the trainer completes
    it with the teacher's answers.

    Example:
        >>> collate = VariantGroupCollator(tokenizer)  # doctest: +SKIP
        >>> batch = collate([{"variants": ["Capital of France?", "France's capital is"], "target": " Paris"}])  # doctest: +SKIP
        >>> batch["input_ids"].shape[0]  # doctest: +SKIP
        2
    """

    def __init__(
        self,
        tokenizer: Any,
        max_length: int | None = None,
        *,
        add_eos: bool = True,
        pad_to_multiple_of: int | None = None,
        fresh: Any = None,
        allow_unlabeled: bool = False,
        chat_template: str = "auto",
        stop_strings: Sequence[str] = (),
    ) -> None:
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2):
            raise SagoInputError(f"max_length must be an integer >= 2 or None, got {max_length!r}", key="max_length")
        if pad_to_multiple_of is not None and (not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1):
            raise SagoInputError(
                f"pad_to_multiple_of must be a positive integer or None, got {pad_to_multiple_of!r}",
                key="pad_to_multiple_of",
            )
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.add_eos = add_eos
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pad_id = pad_id_of(tokenizer)
        #: The rendering shared with evaluation: the chat-template rule, resolved, and the stops.
        self.renderer = PromptRenderer(tokenizer, chat_template, stop_strings)
        self.eos_id: int | None = self.renderer.end_id
        self._warned_stops: set[str] = set()
        self.num_truncated = 0
        self.fresh = fresh
        self.allow_unlabeled = allow_unlabeled

    @property
    def chat_template(self) -> str:
        """How string variants are fed here and in evaluation under the same rule: ``always`` or ``never``."""
        return self.renderer.chat_template

    def encode_prompt(self, variant: Variant) -> list[int]:
        """Token ids of one variant prompt (the same encoding as SAGO evaluation)."""
        return self.renderer.prompt_ids(variant)

    def encode_target(self, target: str) -> list[int]:
        """Token ids of a target: no special tokens, then EOS once when ``add_eos``."""
        stop = self.renderer.stop_inside(target)
        if stop is not None and stop not in self._warned_stops:
            self._warned_stops.add(stop)
            warnings.warn(f"VariantGroupCollator: the target {target[:40]!r} holds the stop string {stop!r}, at which "
                          "evaluation ends the answer span: the model is trained past where it is judged",
                          stacklevel=3)
        return self.renderer.target_ids(target, add_end=self.add_eos)

    def __call__(self, items: Sequence[Any]) -> dict[str, Any]:
        if len(items) == 0:
            raise SagoInputError("cannot collate an empty batch of variant groups")
        resolved, drawn = [], []
        for i, item in enumerate(items):
            group, target = group_of(item, i, allow_unlabeled=self.allow_unlabeled)
            if self.fresh is not None:
                has_id = isinstance(item, VariantGroup) or (isinstance(item, Mapping) and item.get("id") is not None)
                drawn.append(self.fresh.key_of(group, has_id))
                group = self.fresh(group, has_id, key=drawn[-1])
            resolved.append((group, None if target is None else self.encode_target(target), i))
        k = resolved[0][0].k
        for group, _, i in resolved:
            if group.k != k:
                raise SagoInputError(
                    f"batch item {i} (group '{group.id}') has {group.k} variants but batch item 0 has {k}: "
                    "all groups in a batch must have the same number of variants",
                    key="variants",
                    hint="give every group the same K, or use per_device_train_batch_size=1",
                )
        labeled = [(g, t) for g, t, _ in resolved if t is not None]
        if len(labeled) == len(resolved):
            batch = self.collate_encoded(labeled)
        else:
            # The labeled groups' tensors let the Trainer count the label tokens before the teacher answers.
            batch = self.collate_encoded(labeled) if labeled else {
                "input_ids": torch.zeros((0, 1), dtype=torch.long),
                "labels": torch.full((0, 1), -100, dtype=torch.long)}
            batch[PENDING_KEY] = PendingGroups(self, [(g, t) for g, t, _ in resolved])
        if drawn:
            batch[DRAWN_KEY] = tuple(drawn)
        return batch

    def collate_encoded(
        self, groups: Sequence[tuple[VariantGroup, list[int]]], unlabeled: Sequence[bool] | None = None
    ) -> dict[str, torch.Tensor]:
        """The batch of groups whose targets are token ids already; rows of ``unlabeled`` groups get no labels."""
        k = groups[0][0].k
        for i, (group, target_ids) in enumerate(groups):
            if not target_ids:
                raise SagoInputError(f"batch item {i} (group '{group.id}'): the target encodes to no tokens",
                                     key="target")
        rows: list[tuple[list[int], list[int]]] = []
        for i, (group, target_ids) in enumerate(groups):
            for variant in group.variants:
                prompt = self.encode_prompt(variant)
                if not prompt:
                    raise SagoInputError(
                        f"batch item {i} (group '{group.id}'): a variant encodes to no tokens", key="variants"
                    )
                if self.max_length is not None and len(prompt) + len(target_ids) > self.max_length:
                    room = self.max_length - len(target_ids)
                    if room < 1:
                        raise SagoInputError(
                            f"batch item {i} (group '{group.id}'): the target has {len(target_ids)} tokens, which "
                            f"leaves no room for the prompt within max_length={self.max_length}",
                            key="target",
                            hint="raise max_length or shorten the target",
                        )
                    # Left truncation keeps the prompt tokens closest to the target, which condition it most.
                    prompt = prompt[-room:]
                    self.num_truncated += 1
                    warnings.warn(
                        f"VariantGroupCollator: truncated a prompt of group '{group.id}' from the left to fit "
                        f"max_length={self.max_length} ({self.num_truncated} truncated so far)",
                        stacklevel=2,
                    )
                rows.append((prompt, target_ids))

        n = len(rows)
        width = max(len(p) + len(t) for p, t in rows)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((n, width), dtype=torch.long)
        labels = torch.full((n, width), -100, dtype=torch.long)
        target_mask = torch.zeros((n, width), dtype=torch.bool)
        prompt_length = torch.empty(n, dtype=torch.long)
        target_length = torch.empty(n, dtype=torch.long)
        no_labels = [False] * len(groups) if unlabeled is None else list(unlabeled)
        for r, (prompt, target_ids) in enumerate(rows):
            p, t = len(prompt), len(target_ids)
            input_ids[r, : p + t] = torch.tensor(prompt + target_ids, dtype=torch.long)
            attention_mask[r, : p + t] = 1
            if not no_labels[r // k]:
                labels[r, p : p + t] = torch.tensor(target_ids, dtype=torch.long)
            target_mask[r, p : p + t] = True
            prompt_length[r] = p
            target_length[r] = t
        b = len(groups)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "group_index": torch.arange(b).repeat_interleave(k),
            "variant_index": torch.arange(k).repeat(b),
            "canonical_index": torch.tensor([g.canonical for g, _ in groups], dtype=torch.long).repeat_interleave(k),
            "prompt_length": prompt_length,
            "target_length": target_length,
            "target_mask": target_mask,
        }


class PendingGroups:
    """Groups of a batch, some without a target yet (``None``): :meth:`prompts` gives the canonical prompts
    to answer, :meth:`complete` the whole batch once answered (those groups' rows carry no labels).

    Not a list or a mapping, so the Trainer moves the batch to its device without looking inside."""

    def __init__(self, collator: VariantGroupCollator, groups: list[tuple[VariantGroup, list[int] | None]]) -> None:
        self.collator = collator
        self.groups = groups

    @property
    def missing(self) -> list[int]:
        """Positions of the groups without a target."""
        return [i for i, (_, t) in enumerate(self.groups) if t is None]

    @property
    def share(self) -> float:
        """The share of the groups without a target."""
        return len(self.missing) / max(len(self.groups), 1)

    def prompts(self) -> list[list[int]]:
        """Token ids of the canonical prompt of each group without a target (in :attr:`missing` order)."""
        return [self.collator.encode_prompt(self.groups[i][0].variants[self.groups[i][0].canonical])
                for i in self.missing]

    def complete(self, answers: Sequence[list[int]], *, labeled: bool = False) -> dict[str, torch.Tensor]:
        """The batch with ``answers`` (token ids, one per missing group) as those groups' targets: without labels,
        or with ``labeled`` labeled like any target (``unlabeled_task_loss``)."""
        missing = self.missing
        if len(answers) != len(missing):
            raise SagoInputError(f"expected {len(missing)} answers for the unlabeled groups, got {len(answers)}")
        filled = dict(zip(missing, answers))
        blank = {self.collator.eos_id, self.collator.pad_id}
        for i, answer in filled.items():
            if not any(t not in blank for t in answer):
                group = self.groups[i][0]
                raise SagoInputError(
                    f"the teacher's greedy answer to unlabeled training item {short_repr(group.id, 60)} (canonical "
                    f"prompt {short_repr(group.variants[group.canonical], 80)}) is empty: it ended at once, so the "
                    "item has no target to train its variants toward",
                    hint="give the item a target, drop it from the training file, or check that its prompt renders "
                         "as the model expects (chat template, a prompt that invites an answer)")
        groups = [(g, filled[i] if t is None else t) for i, (g, t) in enumerate(self.groups)]
        return self.collator.collate_encoded(groups, [t is None and not labeled for _, t in self.groups])


def mask_non_canonical_labels(batch: dict[str, Any]) -> dict[str, Any]:
    """Set the labels of non-canonical rows to -100, so that the task loss sees the canonical phrasing only.

    Done on the collated batch, before the Trainer counts the label tokens for loss normalization.
    """
    if "labels" in batch and "variant_index" in batch and "canonical_index" in batch:
        keep = (batch["variant_index"] == batch["canonical_index"]).unsqueeze(-1)
        batch["labels"] = batch["labels"].masked_fill(~keep, -100)
    return batch
