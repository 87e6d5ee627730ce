"""``SAGOConfig``: the options of a SAGO evaluation, shared by ``sago-train eval``, the evaluator and the
Trainer callback. Documented once, here."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..errors import SagoInputError, short_repr, type_name, unknown_name_error
from ..functional.axes import AXES, DEFAULT_AXES, parse_axes
from ..functional.axes.correctness import MATCH_MODES
from ..functional.similarity import DEFAULT_EMBEDDING_MODEL, SIMILARITIES
from ..limits import MAX_BATCH_SIZE, MAX_BOOTSTRAP, MAX_NEW_TOKENS, check_int_range, check_seed
from ..model.layers import check_layer_indices
from ..model.tokenize import CHAT_TEMPLATE_MODES

#: Where the activation axes read a prompt's hidden state (docs/definitions.md#activation).
PROMPT_POOLINGS = ("last", "mean")
#: Sequences per forward/generate batch, the one default (the extractor's too).
DEFAULT_BATCH_SIZE = 32
#: What ``max_groups=None`` means inside training (SAGOCallback): 64 groups per set. Cost is linear in groups,
#: a mean's CI half-width about 1.96 s / sqrt(n) (s the per-group spread): 64 groups give 0.245 s; 32 would be
#: 1.41x wider, 128 1.41x narrower at twice the cost. On the real model (docs/real-models.md, 45 groups: generation 0.370
#: [0.313, 0.428], so s = 0.20) that is +-0.048 on the generation axis at 64 groups, +-0.068 at 32; paired
#: comparisons between evaluations (the same groups every time) are narrower still.
IN_TRAINING_MAX_GROUPS = 64
#: Greedy generation length. Measured by scripts/measure_answer_lengths.py on the bundled real sets (12 groups
#: per set, budget 96): SmolLM2-135M-Instruct's chat answers end (EOS) within 32 new tokens for 82.3% of
#: variants, 48 for 92.2%, 64 for 94.8%, 96 for 95.3% (the rest ramble on); Gemma-3-270M's few-shot answers
#: end (a stop) within 10. 64 covers every answer that ends at all; 32, the former default, cut 1 in 6.
DEFAULT_MAX_NEW_TOKENS = 64


@dataclass
class SAGOConfig:
    """Options of a SAGO evaluation.

    Example:
        >>> SAGOConfig(axes="activation,confidence", layers=[0, -1]).axes
        ['activation', 'confidence']
    """

    axes: list[str] = field(
        default_factory=lambda: list(DEFAULT_AXES),
        # Written from the registry, so that the CLI's help names every built-in axis and the real default.
        metadata={"help": f"Axes to compute, comma-separated: {', '.join(AXES)} (default: {','.join(DEFAULT_AXES)})."},
    )
    layers: list[int] | None = field(
        default=None,
        metadata={"help": "Decoder blocks for the activation axis (0-based, negatives from the end). "
                  "Default: 4 evenly spaced blocks ending with the last."},
    )
    prompt_pooling: str = field(
        default="last",
        metadata={"help": "Hidden-state pooling for the activation axes: the 'last' prompt token or the 'mean' over "
                  "prompt tokens.", "choices": PROMPT_POOLINGS},
    )
    pooling: str | None = field(
        default=None, metadata={"help": "Deprecated name of prompt_pooling."}
    )
    similarity: str = field(
        default="token_f1", metadata={"help": "Similarity for the generation axis: exact, token_f1 or embedding."}
    )
    embedding_model: str = field(
        default=DEFAULT_EMBEDDING_MODEL,
        metadata={"help": "sentence-transformers model name or path for similarity=embedding."},
    )
    max_new_tokens: int = field(
        default=DEFAULT_MAX_NEW_TOKENS,
        metadata={"help": "Greedy generation length (new tokens). A generation that reaches it with no end (EOS or "
                  "a stop) is counted and noted. A base model runs on to it: a stop (e.g. '\\n') ends it sooner."},
    )
    stop_strings: list[str] = field(
        default_factory=list,
        metadata={"help": "Strings that end a generation (in addition to EOS) and its answer span; the output is cut "
                  "before them; "
                  "backslash escapes such as '\\n' typed on a command line are read. On the command line: repeat "
                  "--stop."},
    )
    chat_template: str = field(
        default="auto",
        metadata={"help": "How string variants are fed: 'always' renders each as one user message with the "
                  "tokenizer's chat template and the generation prompt; 'never' feeds the string as it is; "
                  "'auto' = 'always' when the tokenizer's chat template marks turns with special tokens (an "
                  "instruct model's template), else 'never'. Message-list variants are always rendered.",
                  "choices": CHAT_TEMPLATE_MODES},
    )
    batch_size: int = field(default=DEFAULT_BATCH_SIZE, metadata={"help": "Sequences per forward/generate batch."})
    max_groups: int | None = field(
        default=None,
        metadata={"help": "Cap on groups per set and evaluation (a seeded subset, the same at every evaluation and "
                  "after a resume). Default: every group for 'sago-train eval'; "
                  f"{IN_TRAINING_MAX_GROUPS} per set inside training (SAGOCallback), where each evaluation costs "
                  "training time; 0 = every group in both."},
    )
    seed: int = field(default=0, metadata={"help": "Seed for the group subset and the bootstrap."})
    n_bootstrap: int = field(default=2000, metadata={"help": "Bootstrap resamples for confidence intervals."})
    correctness: str = field(
        default="auto",
        metadata={"help": "How an answer matches the reference (or any of its aliases): prefix, contains, exact, or "
                  "'auto' = 'contains' (instruct and base models both answer in sentences). Judged on the answer "
                  "span: the output up to its first stop (the stop strings; for plain completions also a blank "
                  "line or a new line repeating a scaffold label of the prompt, such as 'Question:'); numerals "
                  "and number words compare equal ('7' = 'seven')."},
    )
    strict: bool = field(
        default=False,
        metadata={"help": "Raise on prompts longer than the model's context instead of skipping and counting them."},
    )

    def __post_init__(self) -> None:
        self._check_types()
        self.axes = parse_axes(self.axes)
        self.layers = check_layer_indices(self.layers)
        if self.pooling is not None:
            warnings.warn("SAGOConfig(pooling=...) is deprecated: use prompt_pooling (the stability loss has its own "
                          "act_pooling)", DeprecationWarning, stacklevel=3)
            self.prompt_pooling, self.pooling = self.pooling, None
        if self.prompt_pooling not in PROMPT_POOLINGS:
            raise unknown_name_error("prompt_pooling", self.prompt_pooling, PROMPT_POOLINGS, key="prompt_pooling")
        if self.similarity not in SIMILARITIES:
            raise unknown_name_error("similarity", self.similarity, SIMILARITIES, key="similarity")
        if isinstance(self.stop_strings, str):
            self.stop_strings = [self.stop_strings]
        if self.chat_template not in CHAT_TEMPLATE_MODES:
            raise unknown_name_error("chat_template mode", self.chat_template, CHAT_TEMPLATE_MODES,
                                     key="chat_template")
        if self.correctness not in MATCH_MODES:
            raise unknown_name_error("correctness mode", self.correctness, MATCH_MODES, key="correctness")
        for name, most, limit in (("max_new_tokens", MAX_NEW_TOKENS, "MAX_NEW_TOKENS"),
                                  ("batch_size", MAX_BATCH_SIZE, "MAX_BATCH_SIZE"),
                                  ("n_bootstrap", MAX_BOOTSTRAP, "MAX_BOOTSTRAP")):
            check_int_range(getattr(self, name), 1, most, key=name, limit_name=limit)  # bounded before any work
        check_seed(self.seed)
        if self.max_groups is not None and (isinstance(self.max_groups, bool) or not isinstance(self.max_groups, int)
                                            or self.max_groups < 0):
            raise SagoInputError(f"expected an integer >= 0 (0 = every group) or None, got {self.max_groups!r}",
                                 key="max_groups")

    def _check_types(self) -> None:
        """Options of the wrong type, refused with the expected type before anything uses them (a nested list
        given for ``similarity`` was a TypeError, ``stop_strings: [5]`` failed every evaluation inside
        generation)."""
        for name in ("prompt_pooling", "similarity", "embedding_model", "chat_template", "correctness"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise SagoInputError(f"expected a string, got {type_name(value)} {short_repr(value)}", key=name)
        if self.pooling is not None and not isinstance(self.pooling, str):
            raise SagoInputError(f"expected a string, got {type_name(self.pooling)} {short_repr(self.pooling)}",
                                 key="pooling")
        stops = self.stop_strings
        if not isinstance(stops, str) and (not isinstance(stops, (list, tuple))
                                           or not all(isinstance(s, str) and s for s in stops)):
            raise SagoInputError(f"expected a list of non-empty strings, got {type_name(stops)} {short_repr(stops)}",
                                 key="stop_strings", hint="e.g. stop_strings: [\"\\n\\n\"]")
        if isinstance(stops, tuple):
            self.stop_strings = list(stops)
        if not isinstance(self.axes, str) and (not isinstance(self.axes, (list, tuple))
                                               or not all(isinstance(a, str) for a in self.axes)):
            raise SagoInputError(f"expected axis names (a list of strings or 'a,b'), got {type_name(self.axes)} "
                                 f"{short_repr(self.axes)}", key="axes")
        if not isinstance(self.strict, bool):
            raise SagoInputError(f"expected true or false, got {type_name(self.strict)} {short_repr(self.strict)}",
                                 key="strict")

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> SAGOConfig:
        """Build from keyword options, rejecting unknown names with a suggestion."""
        names = cls.field_names()
        for key in kwargs:
            if key not in names:
                raise unknown_name_error("evaluation option", key, names, key=key)
        return cls(**kwargs)

    def in_training(self) -> SAGOConfig:
        """The settings inside training (``SAGOCallback``): ``max_groups`` None means
        :data:`IN_TRAINING_MAX_GROUPS` there, since every evaluation costs training time; 0 stays every group.
        Whoever loads a monitored set reads only those groups (:meth:`VariantSet.from_jsonl`).

        Example:
            >>> SAGOConfig().in_training().max_groups, SAGOConfig(max_groups=0).in_training().max_groups
            (64, 0)
        """
        return self if self.max_groups is not None else dataclasses.replace(self, max_groups=IN_TRAINING_MAX_GROUPS)

    def to_dict(self) -> dict[str, Any]:
        """The settings, without deprecated aliases (already folded into their new names)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "pooling"}

