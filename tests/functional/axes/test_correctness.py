"""Correctness a user can steer (SPEC "correctness"): numerals and number words, aliases, the answer span
through the evaluator's rule, and multiple choice unchanged."""

from __future__ import annotations

import random

import pytest

from sago_train.functional.answer import answer_span, answer_words, default_stops
from sago_train.functional.axes.correctness import (
    choice_index,
    is_correct,
    resolve_match_mode,
    variant_correct,
)


@pytest.mark.parametrize(
    ("output", "reference", "mode", "expected"),
    [
        ("A week has 7 days.", "seven", "contains", True),
        ("A week has seven days.", "7", "contains", True),
        ("Seven.", "7", "exact", True),
        ("100.0", "100", "exact", True),
        ("It is 100.", "100.0", "contains", True),
        ("1,000", "1000", "exact", True),
        ("There are two hundred and six bones.", "206", "contains", True),
        ("Twenty-one", "21", "prefix", True),
        ("It is 17.", "7", "contains", False),  # a number is one word: 7 is not in 17
        ("3.5 litres", "35", "contains", False),  # the decimal point is kept
        ("It is 70.", "seven", "contains", False),
        ("zero degrees", "0", "prefix", True),
    ],
)
def test_numerals_and_number_words_compare_equal(output, reference, mode, expected):
    assert is_correct(output, reference, mode) is expected


@pytest.mark.parametrize(
    ("output", "aliases", "mode", "expected"),
    [
        ("The capital of Ukraine is Kiev.", ["Kyiv", "Kiev"], "contains", True),
        ("The capital of Ukraine is Kyiv.", ["Kyiv", "Kiev"], "contains", True),
        ("The capital of Ukraine is Lviv.", ["Kyiv", "Kiev"], "contains", False),
        ("Kiev", ["Kyiv", "Kiev"], "exact", True),
        ("Kiev is the capital", ["Kyiv", "Kiev"], "exact", False),
        (" CO2 mostly", ["carbon dioxide", "CO2"], "prefix", True),
        ("carbon", ["carbon dioxide", "CO2"], "prefix", False),
        ("Kiev", ["Kyiv"], "contains", False),  # a one-alias list is the plain reference
        ("Kyiv", ["Kyiv"], "contains", True),
    ],
)
def test_any_alias_is_right(output, aliases, mode, expected):
    assert is_correct(output, aliases, mode) is expected
    assert variant_correct(output, reference=aliases, choices=None, answer=None, mode=mode) is expected


def _contains_reference(output: str, reference: str) -> bool:
    """A plain reference: the reference's words joined by spaces, inside the output's, on word boundaries."""
    ref, out = " ".join(answer_words(reference)), " ".join(answer_words(output))
    return bool(ref) and f" {ref} " in f" {out} "


def test_contains_equals_a_plain_substring_reference():
    rng = random.Random(0)
    vocab = ["paris", "the", "capital", "is", "7", "seven", "new", "york", "city", "of", "100.0", "100"]
    for _ in range(2000):
        out = " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 8)))
        ref = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 3)))
        assert is_correct(out, ref, "contains") is _contains_reference(out, ref), (out, ref)


def test_judged_on_the_answer_span():
    prompt = "Question: What is the capital of Uruguay?\nAnswer: Montevideo\n\nQuestion: What is the capital of Spain?\nAnswer:"
    # The run-on names the reference in the next question: only the span counts.
    output = " Lisbon\nQuestion: Is Madrid the capital of Spain?\nAnswer: Madrid"
    span = answer_span(output, default_stops(prompt))
    assert span == " Lisbon"
    assert is_correct(output, "Madrid", resolve_match_mode("auto")) is True  # the raw output would be right
    assert is_correct(span, "Madrid", resolve_match_mode("auto")) is False


CHOICES = ["Paris", "Lyon", "New York", "New York City"]


@pytest.mark.parametrize(
    ("output", "expected"),
    [("The answer is B.", 1), ("(c)", 2), ("A cat.", None), ("I would say New York City.", 3), ("Paris or Lyon", None)],
)
def test_multiple_choice_unchanged(output, expected):
    assert choice_index(output, CHOICES) == expected
    answer = 1
    got = variant_correct(output, reference=None, choices=CHOICES, answer=answer, mode="contains")
    assert got is (expected == answer)


def test_numeric_options_stay_texts():
    # Options "3", "4", "5": an answer "4" is the option "4"; number words are not read as options.
    assert choice_index("The answer is 4.", ["3", "4", "5"]) == 1
    assert choice_index("four", ["3", "4", "5"]) is None
