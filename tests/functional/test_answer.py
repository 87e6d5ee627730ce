"""The answer span and answer words (SPEC "correctness"), against hand-written cases."""

from __future__ import annotations

import pytest

from sago_train.functional.answer import (
    BLANK_LINE,
    answer_end,
    answer_span,
    answer_stops,
    answer_words,
    default_stops,
    scaffold_labels,
)

QA = "Question: What is the capital of Uruguay?\nAnswer: Montevideo\n\nQuestion: What is the capital of France?\nAnswer:"


@pytest.mark.parametrize(
    ("prompt", "labels"),
    [
        (QA, ["Question", "Answer"]),
        ("Q: What is 2 + 2?\nA: 4\n\nQ: What is 3 + 3?\nA:", ["Q", "A"]),
        ("What is the capital of France?", []),
        ("Context: The sky.\nInput text: blue\nAnswer:", ["Context", "Input text", "Answer"]),
        ("  Indented label: x", ["Indented label"]),
        ("The meeting is at 10:30.\nRatio 3:1", []),  # a time or a ratio is no label
        ("Note: this is a very long label that goes on: x", ["Note"]),
        ("A three-word label: x", []),  # at most two words
        ("opposite of old:", []),  # a terse prompt, not a field name
        ("mid-line Question: no", []),
    ],
)
def test_scaffold_labels(prompt, labels):
    assert scaffold_labels(prompt) == labels


def test_default_stops_and_what_chat_answers_get():
    assert default_stops(QA) == [BLANK_LINE, "\nQuestion:", "\nAnswer:"]
    assert default_stops("What is 7 + 2?") == [BLANK_LINE]
    assert answer_stops(QA, chat=True) == []  # a chat answer ends at its end of turn (EOS)
    assert answer_stops(QA, chat=True, configured=["###"]) == ["###"]
    assert answer_stops(QA, chat=False, configured=["\n\n", "###"]) == ["\n\n", "###", "\nQuestion:", "\nAnswer:"]


@pytest.mark.parametrize(
    ("output", "span"),
    [
        # the blank line
        (" Paris.\n\nQuestion: What is the capital of Spain?", " Paris."),
        (" Paris.\n   \nMore text", " Paris."),  # a line of spaces is blank
        # a new line repeating the scaffold
        (" Paris\nQuestion: What is the capital of Spain?\nAnswer: Madrid", " Paris"),
        (" Paris\n  Question: indented", " Paris"),
        (" Paris\nAnswer: Paris", " Paris"),
        # leading whitespace is skipped: a blank line ends an answer, it does not precede one
        ("\n\nThe capital of France is Paris.\n\nWhat is", "\n\nThe capital of France is Paris."),
        # no stop: the whole output
        (" Paris, the largest city of France", " Paris, the largest city of France"),
        # the label on the same line does not end it; another label than the prompt's does not either
        (" Paris Question: next", " Paris Question: next"),
        (" Paris\nNote: next", " Paris\nNote: next"),
        # a label's case matters (the prompt's scaffold is repeated verbatim)
        (" Paris\nquestion: next", " Paris\nquestion: next"),
        ("", ""),
        ("   ", "   "),
    ],
)
def test_answer_span_with_each_default_stop(output, span):
    assert answer_span(output, default_stops(QA)) == span


def test_answer_end_is_none_when_the_answer_runs_to_the_end():
    assert answer_end(" Paris", default_stops(QA)) is None
    assert answer_end(" Paris\n\nx", default_stops(QA)) == len(" Paris")
    assert answer_end(" Paris###x", ["###"]) == len(" Paris")
    assert answer_end("abc", ["", "z"]) is None  # an empty stop never matches


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("A week has seven days.", ["a", "week", "has", "7", "days"]),
        ("7", ["7"]),
        ("100.0", ["100"]),
        ("3.50 and 0.5", ["3.5", "and", "0.5"]),
        ("1,000 people", ["1000", "people"]),
        ("007", ["7"]),
        ("twenty-one", ["21"]),
        ("twenty one", ["21"]),
        ("one hundred and six", ["106"]),
        ("two hundred six bones", ["206", "bones"]),
        ("nineteen hundred", ["1900"]),
        ("seven hundred thousand", ["700000"]),
        ("one two three", ["1", "2", "3"]),  # a word that cannot continue the number starts a new one
        ("zero", ["0"]),
        ("one and two", ["1", "and", "2"]),
        ("The answer is 10.", ["the", "answer", "is", "10"]),
        ("X-ray of a bone", ["x", "ray", "of", "a", "bone"]),
        ("Paris, France", ["paris", "france"]),
    ],
)
def test_answer_words(text, words):
    assert answer_words(text) == words
