"""TRL's side of the trainers: ``StabilitySFTTrainer`` (built lazily on ``trl.SFTTrainer``) and
:func:`groups_as_dataset`, which wraps a plain list of variant groups for TRL."""

from __future__ import annotations

from typing import Any

from ..data.groups import VariantGroup
from ..errors import SagoInputError


def groups_as_dataset(data: Any) -> Any:
    """A list or tuple of variant groups (dicts or :class:`~sago_train.data.VariantGroup`) as a
    ``datasets.Dataset``; anything else (a Dataset, a dict of eval sets, None) is returned as it is."""
    if not isinstance(data, (list, tuple)):
        return data
    import datasets


    rows = []
    for i, item in enumerate(data):
        if isinstance(item, VariantGroup):
            row = item.to_dict()
        elif isinstance(item, dict):
            row = dict(item)
        else:
            raise SagoInputError(f"group {i}: expected a dict or a VariantGroup, got {type(item).__name__}",
                                 key="train_dataset")
        if row.get("target") is None and row.get("reference") is not None:
            row["target"] = row["reference"]  # one column for the shared completion in every row
        rows.append(row)
    try:
        return datasets.Dataset.from_list(rows)
    except (TypeError, ValueError) as err:  # pyarrow's errors derive from these
        raise SagoInputError(
            f"could not turn the list of groups into a datasets.Dataset: {str(err).splitlines()[0]}",
            key="train_dataset",
            hint="give every group the same fields with the same types (e.g. all string variants)",
        ) from err


def build_sft_trainer(mixin: type) -> type:
    """The ``StabilitySFTTrainer`` class: ``mixin`` (:class:`~sago_train.training.trainer.StabilityTrainerMixin`)
    on ``trl.SFTTrainer``, built on first use so that importing sago_train does not import TRL."""
    try:
        from trl import SFTTrainer
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("StabilitySFTTrainer needs TRL: pip install trl (a sago_train dependency)") from err

    class StabilitySFTTrainer(mixin, SFTTrainer):  # type: ignore[valid-type,misc]
        """``trl.SFTTrainer`` with the stability loss.

        Items are variant groups, tokenized by the collator, so SFT's dataset preparation (tokenization,
        packing) is skipped; packing and padding-free batches are refused because they would merge groups.
        TRL's fused LM head builds no logits; the confidence term projects the target-predicting final hidden
        states through the LM head, as it does with the plain Trainer.

        Example:
            >>> trainer = StabilitySFTTrainer(model=model, args=SFTConfig("out"), train_dataset=groups,  # doctest: +SKIP
            ...     processing_class=tokenizer, stability_config=StabilityConfig(conf_weight=0.2))
            >>> trainer.train()  # doctest: +SKIP
        """

        _sago_logits_in_outputs = False

        def __init__(self, *args: Any, stability_config: Any = None, **kwargs: Any) -> None:
            # TRL accepts only datasets.Dataset objects; a plain list of groups (as in docs/stability-loss.md) is wrapped.
            for key in ("train_dataset", "eval_dataset"):
                if key in kwargs:
                    kwargs[key] = groups_as_dataset(kwargs[key])
            if len(args) > 3:
                args = (*args[:3], groups_as_dataset(args[3]), *args[4:])
            super().__init__(*args, stability_config=stability_config, **kwargs)
            if getattr(self.args, "packing", False) or getattr(self, "padding_free", False):
                raise SagoInputError(
                    "packing / padding_free would merge the sequences of different variants into one row",
                    hint="set packing=False and padding_free=False in SFTConfig",
                )

        def _prepare_dataset(self, dataset: Any, *args: Any, **kwargs: Any) -> Any:
            # The collator encodes groups (K prompts + a shared target) itself; SFT's text pipeline does not apply.
            return dataset

    StabilitySFTTrainer.__module__ = "sago_train.training.trainer"
    StabilitySFTTrainer.__qualname__ = "StabilitySFTTrainer"
    return StabilitySFTTrainer
