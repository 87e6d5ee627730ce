"""Every branch of the sentence builders (results/wording.py) rendered and read: one sentence, the
comparative once, "collapse" only against a baseline (issue 33: "augment lower, but so is the between-group
dispersion: a collapse, not stability than sft")."""

from __future__ import annotations

import itertools

import pytest

from sago_train.functional.stats import BETTER, NO_DIFFERENCE, NOT_ENOUGH, WORSE
from sago_train.results.wording import change_words, comparison_sentence, set_context

QUANTITIES = ["activation", "activation_rel", "confidence", "generation", "instability", "accuracy",
              "accuracy_all", "accuracy_worst_kind", "between_dispersion"]
VERDICTS = [BETTER, WORSE, NO_DIFFERENCE, NOT_ENOUGH]
OTHERS = [None, BETTER, WORSE, NO_DIFFERENCE]  # the set's verdicts on between_dispersion and on accuracy


def _contexts():
    for between, accuracy, baseline in itertools.product(OTHERS, OTHERS, (True, False)):
        yield baseline, set_context({"between_dispersion": between, "accuracy": accuracy}, against_baseline=baseline)


@pytest.mark.parametrize("quantity", QUANTITIES)
def test_every_branch_reads_as_one_sentence(quantity):
    seen = set()
    for verdict in VERDICTS:
        for baseline, context in _contexts():
            words = change_words(quantity, verdict, **context)
            sentence = comparison_sentence("augment", quantity, verdict, "sft", **context)
            seen.add(sentence)
            assert sentence.startswith("augment ") and sentence.count("sft") == 1
            assert "  " not in sentence and not sentence.endswith((" ", ":", ","))
            if verdict in (BETTER, WORSE):
                assert sentence.count(" than sft") == 1
                # the comparative follows its adjective, never a clause after it
                head = sentence.split(" than sft")[0]
                assert ":" not in head and "," not in head, sentence
            else:
                assert sentence == f"augment vs sft: {verdict}" and words == verdict
            if "collapse" in sentence:
                assert baseline and context["collapse"], sentence
    assert len(seen) >= 3  # the branches differ


def test_collapse_only_against_a_baseline():
    fell = {"between_dispersion": BETTER}
    assert change_words("activation", BETTER, **set_context(fell)) == \
        "lower, but so is the between-group dispersion: a collapse, not stability"
    assert comparison_sentence("augment", "activation", BETTER, "sft", **set_context(fell, against_baseline=False)) \
        == "augment lower than sft, with a lower between-group dispersion too: read activation_rel"
    assert comparison_sentence("ft", "between_dispersion", BETTER, "base", **set_context(fell)) == \
        "ft less dispersed between groups than base (a collapse)"
    assert comparison_sentence("augment", "between_dispersion", BETTER, "sft",
                               **set_context(fell, against_baseline=False)) == \
        "augment less dispersed between groups than sft"
    assert comparison_sentence("ft", "generation", BETTER, "base", **set_context({"accuracy": WORSE})) == \
        "ft more stable but less accurate than base: consistently wrong?"
    assert comparison_sentence("ft", "accuracy", WORSE, "base") == "ft less accurate than base"
