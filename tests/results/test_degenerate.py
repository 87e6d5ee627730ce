"""Generations cut at max_new_tokens or running on (results/degenerate.py): counted per set, a note, and a
warning when most of a set runs on; on a tiny model with patched generations."""

from __future__ import annotations

import pytest

from sago_train import SAGOEvaluator
from sago_train.data import VariantSet
from sago_train.eval.extraction import Extractor
from sago_train.results.degenerate import hit_token_limit

from .._helpers.tiny import make_byte_tokenizer

QA = "Question: What is the capital of {}?\nAnswer:"


def _patch(monkeypatch, outputs):
    monkeypatch.setattr(Extractor, "_prefill_unsupported", lambda *_a: "test: generations patched")
    monkeypatch.setattr(Extractor, "generate", lambda self, prompts: [outputs(i) for i in range(len(prompts))])


def _groups(n=4):
    return VariantSet.from_records(
        [{"id": f"g{i}", "variants": [QA.format(f"C{i}"), QA.format(f"c{i}")], "reference": f"X{i}"} for i in range(n)],
        name="t")


def test_hit_token_limit_counts_tokens_of_the_text():
    tok = make_byte_tokenizer()  # one token per byte
    assert hit_token_limit(["abcdefgh", "abcdefg", "abc"], tok, 8) == [True, True, False]


def test_run_on_outputs_warn(byte_tokenizer, tiny_llama, monkeypatch):
    _patch(monkeypatch, lambda i: f" X{i // 2} and then it goes on and on")  # 8+ tokens, no stop
    result = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="generation", max_new_tokens=8).evaluate(_groups())
    assert result.config["resolved"]["cut_at_max_new_tokens"] == {"t": {"variants": 8, "of": 8}}
    (note,) = result.warnings
    assert "set 't': 8 of 8 generations (100%) reached max_new_tokens=8 with no end" in note
    assert "base model continuing on the answer's line" in note and "SAGOConfig(stop_strings=" in note


def test_a_few_cut_answers_get_a_note(byte_tokenizer, tiny_llama, monkeypatch):
    # One output runs to the limit; the others end with a stop (a blank line, a repeated label) or early (EOS).
    outs = [" X0 goes on and on", " X0\n\nQuestion: more text here", " X1\nQuestion: more and more", " X1"]
    _patch(monkeypatch, lambda i: outs[i % 4])
    result = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="generation", max_new_tokens=12).evaluate(_groups(2))
    assert result.config["resolved"]["cut_at_max_new_tokens"] == {"t": {"variants": 1, "of": 4}}
    (note,) = result.warnings
    assert note.startswith("set 't': 1 of 4 generations (25%) reached max_new_tokens=12") and "SAGOConfig(max_new_tokens=24)" in note


def test_chat_answers_have_no_default_stops(tiny_llama, monkeypatch):
    tok = make_byte_tokenizer("{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
                              "{% if add_generation_prompt %}<s>{% endif %}")
    _patch(monkeypatch, lambda i: " X0\n\nQuestion: a run-on")  # a blank line does not end a chat answer
    result = SAGOEvaluator(tiny_llama, tok, axes="generation", max_new_tokens=8).evaluate(_groups(1))
    assert result.config["resolved"]["chat_template"] == "always"
    assert result.config["resolved"]["cut_at_max_new_tokens"] == {"t": {"variants": 2, "of": 2}}


def test_no_note_without_cut_answers(byte_tokenizer, tiny_llama, monkeypatch):
    _patch(monkeypatch, lambda i: f" X{i // 2}")
    result = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="generation", max_new_tokens=16).evaluate(_groups())
    assert result.config["resolved"]["cut_at_max_new_tokens"] == {"t": {"variants": 0, "of": 8}}
    assert result.warnings == []
    assert result.sets["t"].correctness["accuracy"] == pytest.approx(1.0)
