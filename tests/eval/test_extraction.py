"""The extraction engine: one prefill per batch, the shared prefix run once, and every axis equals the
one-variant-at-a-time reference."""

from __future__ import annotations

import logging

import pytest

from sago_train import SAGOEvaluator
from sago_train.data import VariantSet
from sago_train.eval import extraction
from sago_train.eval.cache import _warned
from sago_train.eval.extraction import Extractor, shared_prefix_length

from ..conftest import make_byte_tokenizer, make_tiny_model
from .test_evaluator import ARCHS, RECORDS, _assert_close, reference_group

# A few-shot preamble shared by every variant: the prefix the shared prefill runs once per batch.
PREAMBLE = "Answer briefly.\nQ: What is 1+1?\nA: 2\nQ: "
PREFIXED = [{**r, "variants": [PREAMBLE + v for v in r["variants"]]} for r in RECORDS]
AXES = ("activation", "confidence", "confidence_prob", "generation", "mirroring", "posix")


@pytest.fixture
def no_fallback(monkeypatch):
    """Fail if the separate generation/scoring passes run; record the prefix lengths shared."""
    seen: list[int] = []

    def boom(*_a, **_k):
        raise AssertionError("fell back to separate passes")

    original = extraction.shared_prefix_length

    def spy(seqs):
        seen.append(original(seqs))
        return seen[-1]

    monkeypatch.setattr(Extractor, "generate", boom)
    monkeypatch.setattr(Extractor, "score", boom)
    monkeypatch.setattr(extraction, "shared_prefix_length", spy)
    return seen


def _check(model, tok, records, batch_size, layers=(0, 1, 2), max_new=6):
    ev = SAGOEvaluator(model, tok, layers=list(layers), max_new_tokens=max_new, batch_size=batch_size,
                       chat_template="never", axes=",".join(AXES))
    res = ev.evaluate(VariantSet.from_records(records, name="t")).sets["t"]
    for rec, g in zip(records, res.groups):
        ref = reference_group(model, tok, rec, list(layers), max_new)
        assert g.outputs == ref["_outputs"], f"bs={batch_size} {rec['id']} outputs"
        for axis in AXES:
            _assert_close(g.axes[axis], ref[axis], f"bs={batch_size} {rec['id']} {axis}")


def test_shared_prefix_length():
    assert shared_prefix_length([]) == 0
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3, 4]]) == 2  # each keeps its last token
    assert shared_prefix_length([[1, 2, 3], [9, 2, 3]]) == 0
    assert shared_prefix_length([[5]]) == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_each_architecture_matches_reference_with_shared_prefix(arch, no_fallback):
    tok = make_byte_tokenizer()
    model = make_tiny_model(arch)
    for bs in (1, 5, 12):
        _check(model, tok, PREFIXED, bs)
    assert max(no_fallback) >= len(PREAMBLE)  # the preamble (plus BOS) ran once per batch


def test_padding_side_and_no_prefix(no_fallback, tiny_llama):
    tok = make_byte_tokenizer()
    tok.padding_side = "left"
    _check(tiny_llama, tok, PREFIXED, 4)
    tok.padding_side = "right"
    _check(tiny_llama, tok, PREFIXED, 7)
    # Without a shared preamble only BOS is shared; with a tokenizer that adds none, nothing is.
    _check(tiny_llama, tok, RECORDS, 12)


def test_peft_model_matches_reference(no_fallback):
    peft = pytest.importorskip("peft")
    tok = make_byte_tokenizer()
    model = make_tiny_model("qwen2", seed=1)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    _check(lora, tok, PREFIXED, 5)


def test_stop_strings_and_chat_rendering_match_unshared(tiny_llama, monkeypatch):
    """Chat-rendered prompts (the template's text is the shared prefix) give what separate passes give."""
    tok = make_byte_tokenizer()
    vs = VariantSet.from_records(PREFIXED, name="t")
    opts = dict(max_new_tokens=8, batch_size=6, stop_strings=["\n"], chat_template="always")
    got = SAGOEvaluator(tiny_llama, tok, **opts).evaluate(vs).sets["t"]
    monkeypatch.setattr(Extractor, "_prefill_unsupported", lambda *_a: "test: separate passes")
    want = SAGOEvaluator(tiny_llama, tok, **opts).evaluate(vs).sets["t"]
    for a, b in zip(got.groups, want.groups):
        assert a.outputs == b.outputs
        for axis, v in b.axes.items():
            _assert_close(a.axes[axis], v, f"{a.id} {axis}")


def test_mean_pooling_falls_back_and_says_so_once(tiny_llama, caplog):
    tok = make_byte_tokenizer()
    _warned.discard(type(tiny_llama).__name__)
    vs = VariantSet.from_records(RECORDS, name="t")
    with caplog.at_level(logging.WARNING, logger="sago_train.eval.extraction"):
        for _ in range(2):
            SAGOEvaluator(tiny_llama, tok, pooling="mean", axes="activation", max_new_tokens=2).evaluate(vs)
    msgs = [r.getMessage() for r in caplog.records if "computed twice" in r.getMessage()]
    assert len(msgs) == 1 and "pooling='mean'" in msgs[0]


SLIDING = ("mistral-window", "gemma2", "gemma3")


@pytest.mark.parametrize("arch", SLIDING)
def test_sliding_window_caches_take_the_one_prefill_path(arch, no_fallback):
    # A window longer than every call: the hybrid cache's sliding layers evict nothing, so the shared prefix is
    # expanded and the reference cropped exactly, and every axis equals the one-variant-at-a-time reference.
    tok = make_byte_tokenizer()
    model = make_tiny_model(arch, window=160)
    longest = max(len(tok(v)["input_ids"]) for r in PREFIXED for v in r["variants"])
    assert longest + 6 < 160 < model.config.max_position_embeddings  # the old rule (window >= context) fell back
    for bs in (1, 5):
        _check(model, tok, PREFIXED, bs)
    assert max(no_fallback) >= len(PREAMBLE)


@pytest.mark.parametrize("arch", SLIDING)
def test_a_call_that_overflows_the_window_falls_back_and_says_why(arch, caplog):
    tok = make_byte_tokenizer()
    model = make_tiny_model(arch, window=24)
    _warned.discard(type(model).__name__)
    with caplog.at_level(logging.WARNING, logger="sago_train.eval.extraction"):
        _check(model, tok, PREFIXED, 1)  # one variant per batch: no padding, the reference's own computation
    msgs = [r.getMessage() for r in caplog.records if "computed twice" in r.getMessage()]
    assert len(msgs) == 1 and "overflows its sliding window of 24" in msgs[0]
