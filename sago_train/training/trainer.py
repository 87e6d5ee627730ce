"""Trainers that add the stability loss to the task loss: ``StabilityTrainer`` (``transformers.Trainer``)
and ``StabilitySFTTrainer`` (``trl.SFTTrainer``, built on first access so that importing sago_train does
not import TRL).

Both share :class:`StabilityTrainerMixin`, which wraps the parent's ``compute_loss``: the parent computes
the task loss exactly as it would (same forward, same normalization by ``num_items_in_batch``), the hooks
of :class:`~sago_train.training.loss.StabilityLoss` capture what the terms need during that same forward, and
``lambda_act * L_act + lambda_conf * L_conf`` is added (``StabilityLoss.weighted``). The terms are logged raw as
``sago_task_loss``, ``sago_act_loss``, ``sago_conf_loss`` (averaged over the logging window the same way
as the Trainer's ``loss``), beside the effective weights ``sago_act_weight`` / ``sago_conf_weight`` that were
applied to those losses (averaged over the window the same way; with ``logging_steps=1``, the step's weight)
and, in a mode that trains on prompts without targets (``consistency``), ``sago_unlabeled_share``: the share of
the groups that had none, answered by the teacher.

Training data: a dataset of variant groups (one item = one group), batched by
:class:`~sago_train.training.collator.VariantGroupCollator` (the default when no collator is given). Because items
are whole groups, the Trainer's sampler, its sharding across DDP processes and gradient accumulation never
split a group.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import torch
import transformers
from torch import nn

from ..errors import SagoInputError
from ..model.tokenize import PromptRenderer
from ..threads import configure_torch_threads
from .collator import DRAWN_KEY, ITEM_COLUMNS, PENDING_KEY, VariantGroupCollator, mask_non_canonical_labels
from .fresh import configure_collator
from .loss import StabilityConfig, StabilityLoss, split_batch
from .resume import ConsistencyStateCallback, has_state, restore
from .sft import groups_as_dataset
from .teacher import EmaTeacherCallback, Teacher, check_sharding

#: In a batch answered when fetched (get_batch_samples): the share of its groups that had no target.
SHARE_KEY = "sago_unlabeled_share"


class _CanonicalOnlyLabels:
    """Collator wrapper for ``task_loss_variants='canonical'``: non-canonical rows get no labels.

    Masking at collation (not in ``compute_loss``) keeps the Trainer's label-token count, and so the
    normalization of the task loss, consistent with what the loss sees.
    """

    def __init__(self, collator: Any) -> None:
        self.collator = collator

    def __call__(self, features: Any) -> Any:
        return mask_non_canonical_labels(self.collator(features))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.collator, name)


def _outputs_logits(outputs: Any) -> torch.Tensor | None:
    if outputs is None:
        return None
    if isinstance(outputs, dict):
        return outputs.get("logits")
    return getattr(outputs, "logits", None)


def _evaluation_config(callbacks: Any) -> Any:
    """The ``SAGOConfig`` of a ``SAGOCallback`` among ``callbacks`` (duck-typed: training does not import the
    integration layer), else None."""
    for cb in callbacks:
        config = getattr(cb, "config", None)
        if callable(getattr(cb, "attach", None)) and hasattr(config, "chat_template"):
            return config
    return None


def rendering_rule(callbacks: Any, chat_template: str | None, stop_strings: Any) -> tuple[str, Any]:
    """The chat-template rule and stops the trainers' collator renders with: the ones given, else those of the
    ``SAGOCallback`` that evaluates the run, else the evaluator's defaults (``auto``, no stop)."""
    config = _evaluation_config(callbacks)
    rule = chat_template if chat_template is not None else getattr(config, "chat_template", "auto")
    stops = stop_strings if stop_strings is not None else list(getattr(config, "stop_strings", ()) or ())
    return rule, stops


def check_rendering(collator: Any, callbacks: Any, chat_template: str | None) -> None:
    """Warn when a given ``VariantGroupCollator`` renders string prompts otherwise than the run is evaluated."""
    renderer = getattr(collator, "renderer", None)
    config = _evaluation_config(callbacks)
    rule = chat_template if chat_template is not None else getattr(config, "chat_template", None)
    if renderer is None or rule is None:
        return
    wanted = PromptRenderer(renderer.tokenizer, rule).chat_template
    if wanted != renderer.chat_template:
        warnings.warn(f"the data collator renders string prompts with chat template '{renderer.chat_template}' but "
                      f"they are evaluated with '{wanted}': the model is trained on another prompt format than it is "
                      f"judged on; build it as VariantGroupCollator(tokenizer, chat_template='{rule}')", stacklevel=3)


class StabilityTrainerMixin:
    """Adds the stability loss to a ``transformers.Trainer`` subclass (put it first in the bases).

    The confidence term projects the captured final hidden states of the target-predicting positions
    through the LM head. Subclasses set ``_sago_logits_in_outputs`` to False when the parent's forward does
    not build the logits (TRL's fused LM head), so that they are not asked for.
    """

    _sago_logits_in_outputs: bool = True

    def __init__(self, *args: Any, stability_config: StabilityConfig | None = None, chat_template: str | None = None,
                 stop_strings: Any = None, **kwargs: Any) -> None:
        if stability_config is None:
            stability_config = StabilityConfig()
        if not isinstance(stability_config, StabilityConfig):
            raise SagoInputError(
                f"stability_config must be a StabilityConfig, got {type(stability_config).__name__}",
                hint="build it with sago_train.StabilityConfig(...)",
            )
        self.stability_config = stability_config

        configure_torch_threads()
        user_collator = kwargs.get("data_collator", args[2] if len(args) > 2 else None)
        super().__init__(*args, **kwargs)
        # Bind the SAGO callbacks passed in callbacks=[...] (they log through the Trainer once bound); duck-typed
        # so that training does not import the integration layer.
        for cb in list(self.callback_handler.callbacks):
            if callable(getattr(cb, "attach", None)) and getattr(cb, "trainer", False) is None:
                cb.attach(self)
        if self.args.n_gpu > 1:
            raise SagoInputError(
                f"the stability loss does not support torch.nn.DataParallel ({self.args.n_gpu} GPUs in one process)",
                hint="launch one process per GPU with torchrun or accelerate launch (DDP)",
            )
        mode = stability_config.stability_mode
        if stability_config.act_weight > 0 and self.args.per_device_train_batch_size < mode.min_groups:
            raise SagoInputError(
                f"stability mode '{mode.name}' compares each group with the other groups of its micro-batch, but "
                f"per_device_train_batch_size is {self.args.per_device_train_batch_size} (one group per batch)",
                key="per_device_train_batch_size",
                hint="use per_device_train_batch_size >= 2 (items are groups), or mode 'centroid'/'anchor'",
            )
        if user_collator is None:
            tokenizer = getattr(self, "processing_class", None)
            tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
            if tokenizer is None:
                raise SagoInputError(
                    "give a data_collator (VariantGroupCollator) or a processing_class (tokenizer) to build one"
                )
            rule, stops = rendering_rule(self.callback_handler.callbacks, chat_template, stop_strings)
            self.data_collator = VariantGroupCollator(tokenizer, max_length=getattr(self.args, "max_length", None),
                                                      chat_template=rule, stop_strings=stops)
        else:
            check_rendering(user_collator, self.callback_handler.callbacks, chat_template)
        self.data_collator = configure_collator(self.data_collator, stability_config, self.args.seed)
        if stability_config.task_loss_variants == "canonical":
            self.data_collator = _CanonicalOnlyLabels(self.data_collator)
        # Built now, as training starts from this model: the frozen copy or the EMA's first value.
        self._sago_teacher = None
        if mode.needs_teacher:
            zero3 = getattr(getattr(self.accelerator.state, "deepspeed_plugin", None), "zero_stage", 0) == 3
            check_sharding(stability_config.teacher, self.model, fsdp=self.is_fsdp_enabled, zero3=zero3)
            self._sago_teacher = Teacher(stability_config.teacher, self.model, stability_config.ema_decay)
            if stability_config.teacher == "ema":
                self.add_callback(EmaTeacherCallback(self._sago_teacher))
        self._sago_drawer = getattr(self.data_collator, "fresh", None)  # fresh variants' drawer, or None
        if has_state(self._sago_teacher, self._sago_drawer):
            self.add_callback(ConsistencyStateCallback(self._sago_teacher, self._sago_drawer))
        # Resolves the layers against the model now, so an out-of-range layer fails at construction.
        self._sago_loss = StabilityLoss(stability_config, self.model)
        self._sago_train_sums: dict[str, torch.Tensor] = {}
        self._sago_eval_values: dict[str, list[torch.Tensor]] = defaultdict(list)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; a resumed run also gets back the EMA teacher and the fresh draw counts."""
        if resume_from_checkpoint:
            restore(resume_from_checkpoint, self.args, self._sago_teacher, self._sago_drawer, self.train_dataset)
        return super().train(resume_from_checkpoint, *args, **kwargs)  # type: ignore[misc]

    # ------------------------------------------------------------------------------------------- data
    def _set_signature_columns_if_needed(self) -> None:
        # Items are groups: keep their columns when `remove_unused_columns` prunes what the model's
        # forward does not take (the collator, not the model, consumes them).
        super()._set_signature_columns_if_needed()  # type: ignore[misc]
        self._signature_columns = list(dict.fromkeys([*self._signature_columns, *ITEM_COLUMNS]))

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
        """``Trainer.get_batch_samples``. With ``unlabeled_task_loss`` the teacher answers the step's unlabeled
        prompts as their micro-batches are fetched (the model does not change within a step, so the answers are
        those ``compute_loss`` would get), so that the label-token count normalizing the task loss includes them."""
        if self.stability_config.unlabeled_task_loss and self._sago_teacher is not None:
            epoch_iterator = (self._sago_answered(batch) for batch in epoch_iterator)
        return super().get_batch_samples(epoch_iterator, num_batches, device)  # type: ignore[misc]

    def _sago_answered(self, batch: Any) -> Any:
        if not isinstance(batch, dict) or PENDING_KEY not in batch:
            return batch
        pending = batch.pop(PENDING_KEY)
        answered = self._sago_answer_unlabeled(self.model, pending)
        return {**answered, **{k: batch[k] for k in (DRAWN_KEY,) if k in batch}, SHARE_KEY: pending.share}

    # ------------------------------------------------------------------------------------------- loss
    def _sago_accumulation(self, training: bool, num_items_in_batch: Any) -> tuple[int, bool]:
        """``(accumulation steps, scaled)``, mirroring ``Trainer.training_step``: is the task loss already
        normalized over the whole accumulated batch (so that the Trainer will not divide it by the steps)?
        Outside training: ``(1, False)``."""
        if not training:
            return 1, False
        ga = max(int(getattr(self, "current_gradient_accumulation_steps", 1) or 1), 1)
        explicit = getattr(self, "loss_is_scaled_for_ga", None)
        if explicit is not None:
            return ga, bool(explicit)
        return ga, bool(
            (self.model_accepts_loss_kwargs and num_items_in_batch is not None) or self.compute_loss_func is not None
        )

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """The parent's task loss plus ``lambda_act * L_act + lambda_conf * L_conf`` on group batches.

        Evaluation batches without group bookkeeping (an ordinary eval set) get the parent's loss unchanged;
        a training batch without it is an error (it would silently train without the stability loss).
        """
        pending = inputs.pop(PENDING_KEY, None) if isinstance(inputs, dict) else None
        if isinstance(inputs, dict) and DRAWN_KEY in inputs:
            self._sago_drawer.consume(inputs.pop(DRAWN_KEY))
        # The share of this micro-batch's groups that had no target (logged as sago_unlabeled_share); their
        # teacher answers come here, or came when the step's batches were fetched (get_batch_samples).
        unlabeled = inputs.pop(SHARE_KEY, 0.0) if isinstance(inputs, dict) else 0.0
        if pending is not None:
            unlabeled, inputs = pending.share, self._sago_answer_unlabeled(model, pending)
        model_inputs, groups = split_batch(inputs)
        cfg = self.stability_config
        if groups is None and cfg.enabled and model.training:
            raise SagoInputError(
                "a training batch has no variant-group bookkeeping (group_index, ...), so the stability loss "
                "cannot be computed",
                hint="train on variant groups batched by sago_train.VariantGroupCollator",
            )
        labels = model_inputs.get("labels")
        no_task = labels is not None and not bool((labels != -100).any())  # unlabeled prompts only
        if groups is None or not cfg.enabled:
            out = super().compute_loss(  # type: ignore[misc]
                model, model_inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
            if groups is not None:  # variant groups with no term (augmentation, BCT): the task loss and share
                self._sago_record(model.training, out[0] if return_outputs else out, None, None,
                                  *self._sago_accumulation(model.training, num_items_in_batch), (0.0, 0.0), unlabeled)
            return out
        # The plain Trainer has the outputs anyway: their logits let the loss check, once, that projecting
        # the captured final hidden states reproduces them (and fall back to them otherwise).
        from_outputs = self._sago_logits_in_outputs and self._sago_loss.wants_logits
        want_outputs = return_outputs or from_outputs
        # With the logits coming back, the capture also selects their target-predicting rows in the forward.
        tap = (groups, model_inputs.get("input_ids")) if from_outputs else (None, None)
        # The frozen / EMA teacher runs first, outside the capture (its forward is not the student's).
        teacher_logits = self._sago_loss.teacher_logits(
            self.accelerator.unwrap_model(model), self._sago_teacher, model_inputs, groups)
        with self._sago_loss.capture(model, *tap) as capture:
            if no_task:
                # No target token to fit: the parent's loss would be 0/0; the terms alone train this micro-batch.
                outputs = model(**{k: v for k, v in model_inputs.items() if k != "labels"})
                result = (torch.zeros((), device=labels.device), outputs)
            else:
                result = super().compute_loss(  # type: ignore[misc]
                    model, model_inputs, return_outputs=want_outputs, num_items_in_batch=num_items_in_batch
                )
        task_loss, outputs = result if (want_outputs or no_task) else (result, None)
        logits = _outputs_logits(outputs) if from_outputs else None
        terms = self._sago_loss.terms(
            groups, capture, input_ids=model_inputs.get("input_ids"), logits=logits, model=model,
            teacher_logits=teacher_logits,
        )
        act_weight, conf_weight = cfg.weights_at(self.state.global_step)
        training = model.training
        ga, scaled = self._sago_accumulation(training, num_items_in_batch)
        # weight_scale 'relative' compares each term with the micro-batch's task loss, in the units of a
        # per-micro-batch mean (a loss normalized over the accumulated batch is its 1/ga share).
        extra = self._sago_loss.weighted(terms, task_loss * ga if scaled else task_loss, act_weight, conf_weight,
                                         update=training)
        # The terms are per-micro-batch means. When the task loss is already normalized over the whole
        # accumulated batch, the Trainer does not divide by the accumulation steps, so they are divided here;
        # DDP then averages the gradients over processes, which averages the terms over all groups.
        loss = task_loss if extra is None else task_loss + (extra / ga if scaled else extra).to(task_loss.dtype)
        self._sago_record(training, task_loss, terms.act, terms.conf, ga, scaled, (act_weight, conf_weight),
                          unlabeled)
        return (loss, outputs) if return_outputs else loss

    def _sago_answer_unlabeled(self, model: nn.Module, pending: Any) -> dict[str, Any]:
        """Complete a batch with unlabeled prompts: the teacher's greedy answer to each one's canonical prompt
        becomes its group's target, with no labels, or with ``unlabeled_task_loss`` the answer as labels (as
        ``task_loss_variants`` says: every variant, or the canonical one) (consistency mode, before the forward)."""
        cfg = self.stability_config
        cfg.check_unlabeled_trains()
        collator = pending.collator
        answers = self._sago_teacher.answer(  # type: ignore[union-attr]
            self.accelerator.unwrap_model(model), pending.prompts(), max_new_tokens=cfg.unlabeled_max_new_tokens,
            pad_id=collator.pad_id, eos_id=collator.eos_id)
        batch = pending.complete(answers, labeled=cfg.unlabeled_task_loss)
        if cfg.task_loss_variants == "canonical":
            batch = mask_non_canonical_labels(batch)
        return self._prepare_inputs(batch)

    # ---------------------------------------------------------------------------------------- logging
    def _sago_record(
        self,
        training: bool,
        task: torch.Tensor,
        act: torch.Tensor | None,
        conf: torch.Tensor | None,
        ga: int,
        scaled: bool,
        weights: tuple[float, float],
        unlabeled: float = 0.0,
    ) -> None:
        values = {"sago_task_loss": task, "sago_act_loss": act, "sago_conf_loss": conf}
        if not training:
            for key, value in values.items():
                if value is not None:
                    self._sago_eval_values[key].append(value.detach().float().reshape(()))
            return
        # Accumulate exactly as the Trainer accumulates its loss: each micro-batch adds its share of the
        # optimizer step, and `steps` counts optimizer steps (1/ga per micro-batch).
        shares = {
            "sago_task_loss": (task, 1 if scaled else ga),
            "sago_act_loss": (act, ga),
            "sago_conf_loss": (conf, ga),
        }
        # The weights this micro-batch applied (a warmup changes them every step), accumulated like the terms so
        # that the logged weight is the one used for the losses on the same log row, not the next step's.
        cfg = self.stability_config
        for key, weight, on in (("sago_act_weight", weights[0], cfg.act_weight > 0),
                                ("sago_conf_weight", weights[1], cfg.conf_weight > 0)):
            if on:
                shares[key] = (torch.tensor(float(weight), device=task.device), ga)
        if cfg.stability_mode.unlabeled:  # a mode that trains on prompts without targets: how many there were
            shares["sago_unlabeled_share"] = (torch.tensor(float(unlabeled), device=task.device), ga)
        sums = self._sago_train_sums
        for key, (value, div) in shares.items():
            if value is not None:
                share = value.detach().float().reshape(()) / div
                sums[key] = sums[key] + share if key in sums else share
        step_share = torch.tensor(1.0 / ga, device=task.device)
        sums["_steps"] = sums["_steps"] + step_share if "_steps" in sums else step_share

    def _sago_gather_mean(self, values: dict[str, torch.Tensor]) -> dict[str, float]:
        """Mean over processes (every process calls ``log``, like the Trainer's own loss gather)."""
        keys = sorted(values)
        stacked = torch.stack([values[k] for k in keys])
        gathered = self.accelerator.gather(stacked).reshape(-1, len(keys)).mean(0)
        return {k: float(v) for k, v in zip(keys, gathered.tolist())}

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add the stability terms to the Trainer's training log (``loss`` present) and evaluation log."""
        if "loss" in logs and self._sago_train_sums:
            sums = self._sago_train_sums
            steps = sums["_steps"].clamp_min(1e-12)
            logs.update(self._sago_gather_mean({k: v / steps for k, v in sums.items() if k != "_steps"}))
            self._sago_train_sums = {}
        elif self._sago_eval_values and not self.model.training:
            prefix = next((k[: -len("loss")] for k in logs if k.endswith("_loss")), "eval_")
            means = {k: torch.stack(v).mean() for k, v in self._sago_eval_values.items()}
            logs.update({f"{prefix}{k}": v for k, v in self._sago_gather_mean(means).items()})
            self._sago_eval_values = defaultdict(list)
        super().log(logs, start_time)  # type: ignore[misc]


class StabilityTrainer(StabilityTrainerMixin, transformers.Trainer):
    """``transformers.Trainer`` with the stability loss.

    Example:
        >>> from sago_train import StabilityConfig, StabilityTrainer, VariantGroupCollator  # doctest: +SKIP
        >>> groups = [{"variants": ["Capital of France?", "france capital?"], "target": " Paris"}, ...]  # doctest: +SKIP
        >>> trainer = StabilityTrainer(
        ...     model=model, args=TrainingArguments("out", remove_unused_columns=False),
        ...     train_dataset=groups, data_collator=VariantGroupCollator(tokenizer),
        ...     stability_config=StabilityConfig(act_weight=0.1, conf_weight=0.1, mode="anchor"),
        ... )  # doctest: +SKIP
        >>> trainer.train()  # doctest: +SKIP
    """


if TYPE_CHECKING:  # the real class is built lazily by the module __getattr__ below
    from trl import SFTTrainer

    class StabilitySFTTrainer(StabilityTrainerMixin, SFTTrainer): ...


def __getattr__(name: str) -> Any:
    if name == "StabilitySFTTrainer":
        from .sft import build_sft_trainer

        cls = build_sft_trainer(StabilityTrainerMixin)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["StabilitySFTTrainer", "StabilityTrainer", "StabilityTrainerMixin", "groups_as_dataset"]
