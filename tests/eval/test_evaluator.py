"""The evaluation engine against a plain one-variant-at-a-time reference implementation."""

from __future__ import annotations

import math

import pytest
import torch

from sago_train import SAGOEvaluator
from sago_train.data import VariantSet
from sago_train.errors import SagoInputError

from .._helpers.evaluator_ref import ARCHS, FIVE_AXES, RECORDS, TOL, ref_generate, reference_group
from .._helpers.tiny import make_byte_tokenizer, make_tiny_model


def _assert_close(got: float, want: float, what: str) -> None:
    if math.isnan(want):
        assert math.isnan(got), what
    else:
        assert got == pytest.approx(want, abs=TOL), what


@pytest.mark.parametrize("arch", ARCHS)
def test_matches_reference_each_architecture(arch):
    tok = make_byte_tokenizer()
    model = make_tiny_model(arch)
    vs = VariantSet.from_records(RECORDS, name="t")
    layers = [0, 1, 2]
    ev = SAGOEvaluator(model, tok, layers=layers, max_new_tokens=6, batch_size=4,
                       axes="activation,confidence,confidence_prob,generation,mirroring,posix")
    res = ev.evaluate(vs).sets["t"]
    for rec, g in zip(RECORDS, res.groups):
        ref = reference_group(model, tok, rec, layers, 6)
        assert g.outputs == ref["_outputs"], f"{arch} {rec['id']} outputs"
        for axis in ("activation", "confidence", "confidence_prob", "generation", "mirroring", "posix"):
            _assert_close(g.axes[axis], ref[axis], f"{arch} {rec['id']} {axis}")


def test_confidence_scores_the_reference_after_the_models_own_lead_in(byte_tokenizer, tiny_llama):
    """A reference that the model's outputs contain is scored after the lead-in the model wrote before it, as
    the one-prompt-at-a-time reference does; the lead-in is recorded."""
    plain = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="generation", max_new_tokens=10).evaluate(
        VariantSet.from_records(RECORDS, name="t")).sets["t"]
    records = []
    for rec, g in zip(RECORDS, plain.groups):
        out = g.outputs[1]  # a non-canonical variant's output: found after the canonical one's is searched
        records.append({**rec, "reference": out[4:7] if len(out.strip()) > 7 else " Paris"})
    ev = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="confidence,confidence_prob", max_new_tokens=10)
    res = ev.evaluate(VariantSet.from_records(records, name="t")).sets["t"]
    found = 0
    for rec, g in zip(records, res.groups):
        ref = reference_group(tiny_llama, byte_tokenizer, rec, [0], 10)
        _assert_close(g.axes["confidence"], ref["confidence"], rec["id"])
        _assert_close(g.axes["confidence_prob"], ref["confidence_prob"], rec["id"])
        if ref["_answer_lps"] is not None:
            found += 1
            assert g.answer_lead and g.answer_logprobs == pytest.approx(ref["_answer_lps"], abs=TOL)
            assert g.answer_logprobs != pytest.approx(g.logprobs, abs=1e-3)  # not the bare reference's
    assert found >= 3


def test_mean_pooling_matches_reference(byte_tokenizer, tiny_llama):
    vs = VariantSet.from_records(RECORDS, name="t")
    ev = SAGOEvaluator(tiny_llama, byte_tokenizer, layers=[0, 2], pooling="mean", axes="activation", batch_size=3)
    res = ev.evaluate(vs).sets["t"]
    for rec, g in zip(RECORDS, res.groups):
        ref = reference_group(tiny_llama, byte_tokenizer, rec, [0, 2], 2, pooling="mean")
        _assert_close(g.axes["activation"], ref["activation"], rec["id"])


def test_last_layer_is_block_output_not_final_norm(byte_tokenizer, tiny_llama):
    """Layer -1 is the residual stream the last block returns (before the model's final norm)."""
    captured = {}
    block = tiny_llama.model.layers[-1]
    handle = block.register_forward_hook(lambda m, i, o: captured.__setitem__("h", o[0] if isinstance(o, tuple) else o))
    vs = VariantSet.from_records([{"variants": ["abc def", "xyz"]}], name="t")
    try:
        ids = [byte_tokenizer(v)["input_ids"] for v in ["abc def", "xyz"]]
        vecs = []
        with torch.no_grad():
            for p in ids:
                tiny_llama(torch.tensor([p]))
                vecs.append(captured["h"][0, -1].double())
    finally:
        handle.remove()
    want = 1 - float(torch.nn.functional.cosine_similarity(vecs[0], vecs[1], dim=0))
    got = SAGOEvaluator(tiny_llama, byte_tokenizer, layers=[-1], axes="activation").evaluate(vs).sets["t"].groups[0]
    assert got.axes["activation"] == pytest.approx(min(1.0, want), abs=TOL)


def _axis_table(result, name="t"):
    return {g.id: g.axes for g in result.sets[name].groups}


def test_batch_size_padding_side_and_order_invariance(byte_tokenizer, tiny_llama):
    vs = VariantSet.from_records(RECORDS, name="t")
    base = _axis_table(SAGOEvaluator(tiny_llama, byte_tokenizer, max_new_tokens=6, batch_size=1).evaluate(vs))
    for bs in (2, 5, 64):
        got = _axis_table(SAGOEvaluator(tiny_llama, byte_tokenizer, max_new_tokens=6, batch_size=bs).evaluate(vs))
        for gid in base:
            for axis, v in base[gid].items():
                _assert_close(got[gid][axis], v, f"bs={bs} {gid} {axis}")
    # The tokenizer's padding side must not matter: the extractor pads itself.
    tok = make_byte_tokenizer()
    tok.padding_side = "left"
    got = _axis_table(SAGOEvaluator(tiny_llama, tok, max_new_tokens=6, batch_size=5).evaluate(vs))
    for gid in base:
        for axis, v in base[gid].items():
            _assert_close(got[gid][axis], v, f"left padding {gid} {axis}")
    # Reversing the groups and permuting variants inside each group (keeping the canonical one) changes nothing.
    perm = []
    for rec in reversed(RECORDS):
        order = [0, 2, 1]
        perm.append({**rec, "variants": [rec["variants"][i] for i in order], "kinds": [rec["kinds"][i] for i in order]})
    got = _axis_table(SAGOEvaluator(tiny_llama, byte_tokenizer, max_new_tokens=6, batch_size=4).evaluate(
        VariantSet.from_records(perm, name="t")))
    for gid in base:
        for axis, v in base[gid].items():
            _assert_close(got[gid][axis], v, f"permuted {gid} {axis}")


def test_identical_variants_give_zero(byte_tokenizer, tiny_llama):
    recs = [{"id": str(i), "variants": [p] * 3, "reference": " x"} for i, p in enumerate(["hello there", "abc", "The sky is"])]
    recs.append({"id": "noref", "variants": ["Dogs say"] * 4})
    res = SAGOEvaluator(tiny_llama, byte_tokenizer, max_new_tokens=5).evaluate(VariantSet.from_records(recs, name="t"))
    for g in res.sets["t"].groups:
        for axis, v in g.axes.items():
            assert v == pytest.approx(0.0, abs=1e-6), (g.id, axis)


def test_peft_wrapped_model_matches_merged(byte_tokenizer):
    peft = pytest.importorskip("peft")
    model = make_tiny_model("llama", seed=1)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    vs = VariantSet.from_records(RECORDS, name="t")
    got = _axis_table(SAGOEvaluator(lora, byte_tokenizer, max_new_tokens=5, batch_size=4).evaluate(vs))
    merged = lora.merge_and_unload()
    want = _axis_table(SAGOEvaluator(merged, byte_tokenizer, max_new_tokens=5, batch_size=4).evaluate(vs))
    for gid in want:
        for axis, v in want[gid].items():
            _assert_close(got[gid][axis], v, f"peft {gid} {axis}")


def test_chat_message_variants_use_chat_template(byte_tokenizer, tiny_llama):
    msgs = [[{"role": "user", "content": "What is the capital of France?"}],
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "France capital?"}]]
    vs = VariantSet.from_records([{"id": "chat", "variants": msgs, "reference": " Paris"}], name="chat")
    g = SAGOEvaluator(tiny_llama, byte_tokenizer, max_new_tokens=4, axes=FIVE_AXES).evaluate(vs).sets["chat"].groups[0]
    rendered = byte_tokenizer.apply_chat_template(msgs[0], tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("assistant:")
    ids = byte_tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert g.outputs[0] == ref_generate(tiny_llama, byte_tokenizer, ids, 4)
    assert 0.0 <= g.axes["activation"] <= 1.0


def test_chat_variants_without_template_is_clear_error(tiny_llama):
    tok = make_byte_tokenizer(chat_template=None)
    vs = VariantSet.from_records([{"variants": [[{"role": "user", "content": "hi"}], "hello"]}], name="t")
    with pytest.raises(SagoInputError, match="chat template"):
        SAGOEvaluator(tiny_llama, tok).evaluate(vs)


def test_too_long_prompts_are_skipped_and_counted_or_strict(byte_tokenizer, tiny_llama):
    long = "x" * 300  # the tiny model's context is 256 tokens
    recs = RECORDS[:2] + [{"id": "long", "variants": [long, long + "y"]}]
    vs = VariantSet.from_records(recs, name="t")
    res = SAGOEvaluator(tiny_llama, byte_tokenizer, max_new_tokens=4, axes=FIVE_AXES).evaluate(vs)
    s = res.sets["t"]
    assert s.n_groups == 2 and sum(s.skipped.values()) == 1
    assert res.to_summary()["sets"]["t"]["skipped"] == {"prompt longer than the model's context": 1}
    with pytest.raises(SagoInputError, match="context"):
        SAGOEvaluator(tiny_llama, byte_tokenizer, max_new_tokens=4, strict=True).evaluate(vs)


def test_max_groups_is_a_stable_seeded_subset(byte_tokenizer, tiny_llama):
    vs = VariantSet.from_records(RECORDS, name="t")
    a = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="activation", max_groups=2, seed=3).evaluate(vs)
    b = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="activation", max_groups=2, seed=3).evaluate(vs)
    assert [g.id for g in a.sets["t"].groups] == [g.id for g in b.sets["t"].groups]
    assert a.sets["t"].n_groups == 2


def test_correctness_and_kinds_in_summary(byte_tokenizer, tiny_llama):
    vs = VariantSet.from_records(RECORDS, name="t")
    res = SAGOEvaluator(tiny_llama, byte_tokenizer, max_new_tokens=4, axes=FIVE_AXES).evaluate(vs)
    summary = res.to_summary()
    s = summary["sets"]["t"]
    assert s["n_groups"] == 4
    assert set(s["axes"]) == {"activation", "activation_rel", "confidence", "generation", "mirroring"}
    for axis in s["axes"].values():
        assert set(axis) == {"mean", "ci_low", "ci_high", "n"}
        assert axis["ci_low"] <= axis["mean"] <= axis["ci_high"]
    assert s["correctness"]["n"] == 2  # the groups with a reference
    assert set(s["kinds"]["activation"]["means"]) == {"canonical", "paraphrase", "typo"}
    assert summary["axis_correlation"]["axes"] == ["activation", "activation_rel", "confidence", "generation", "mirroring"]
    rec = res.sets["t"].groups[0].to_dict()
    assert {"id", "variants", "outputs", "axes", "logprobs"} <= set(rec)
    assert len(rec["logprobs"]) == 3


def test_multiple_choice_correctness(byte_tokenizer, tiny_llama, monkeypatch):
    """Per-variant answers (shuffled options) are scored against each variant's own answer index; a group
    with choices but no answer gets no correctness, never 'wrong'."""
    from sago_train.eval.extraction import Extractor

    recs = [
        {"id": "mc", "variants": ["Pick one: A. red B. blue", "Choose: A. blue B. red", "red or blue? A. red B. blue"],
         "choices": ["red", "blue"], "answer": [0, 1, 0]},
        {"id": "no-answer", "variants": ["A. red B. blue", "A. blue B. red"], "choices": ["red", "blue"]},
    ]
    outputs = {"Pick one: A. red B. blue": "The answer is A.", "Choose: A. blue B. red": "A cat sat on it.",
               "red or blue? A. red B. blue": "It is blue.", "A. red B. blue": "A", "A. blue B. red": "B"}
    by_prompt = {byte_tokenizer(p)["input_ids"].__repr__(): out for p, out in outputs.items()}
    monkeypatch.setattr(Extractor, "_prefill_unsupported", lambda *_a: "test: generations patched")
    monkeypatch.setattr(Extractor, "generate", lambda self, prompts: [by_prompt[repr(list(p))] for p in prompts])
    res = SAGOEvaluator(tiny_llama, byte_tokenizer, max_new_tokens=3).evaluate(VariantSet.from_records(recs, name="m"))
    groups = {g.id: g for g in res.sets["m"].groups}
    # "A" is right for variant 0; "A cat" is an article (no label, no option text) and so wrong for variant
    # 1; "blue" is option text, wrong where the answer is red.
    assert groups["mc"].correct == [True, False, False]
    assert groups["no-answer"].correct is None
    acc = res.sets["m"].correctness
    assert acc["n"] == 1 and acc["accuracy"] == pytest.approx(1 / 3) and acc["mode"] == "contains"


def test_bfloat16_model_runs_and_stays_close_to_float32(byte_tokenizer):
    """The bf16 path (as on CUDA): hidden states are captured in float32, values stay finite and close."""
    vs = VariantSet.from_records(RECORDS, name="t")
    f32 = make_tiny_model("llama", seed=2)
    bf16 = make_tiny_model("llama", seed=2).to(torch.bfloat16)
    opts = dict(axes="activation,confidence", layers=[0, -1], max_new_tokens=3)
    a = _axis_table(SAGOEvaluator(f32, byte_tokenizer, **opts).evaluate(vs))
    b = _axis_table(SAGOEvaluator(bf16, byte_tokenizer, **opts).evaluate(vs))
    for gid in a:
        for axis, v in a[gid].items():
            assert math.isfinite(b[gid][axis])
            assert b[gid][axis] == pytest.approx(v, abs=0.05), (gid, axis)


# ------------------------------------------------------------------ evaluations without generation (issue 13)
def _with_refs(n: int = 6) -> list[dict]:
    return [{"id": f"r{i}", "variants": [f"The number {i} is", f"number {i}:", f"Tell me {i}", f"{i} is"],
             "reference": f" {i}"} for i in range(n)]


def test_without_generation_same_values_and_no_decoding(byte_tokenizer, tiny_llama, monkeypatch):
    """Skipping generation leaves activation, activation_rel and confidence_prob (references given) bitwise equal
    to a complete evaluation's, runs no generate, and lists what it left out: confidence scores the reference in
    the form the model answers, which needs its greedy outputs."""
    vs = VariantSet.from_records(_with_refs(), name="t")
    ev = SAGOEvaluator(tiny_llama, byte_tokenizer, layers=[0, 1], max_new_tokens=4, n_bootstrap=200,
                       axes="activation,activation_rel,confidence,confidence_prob,generation,mirroring")
    full = ev.evaluate(vs)
    calls = {"n": 0}
    real = tiny_llama.generate
    monkeypatch.setattr(tiny_llama, "generate", lambda *a, **k: (calls.__setitem__("n", calls["n"] + 1), real(*a, **k))[1])
    cheap = ev.evaluate(vs, generation=False)
    assert calls["n"] == 0
    s_full, s_cheap = full.sets["t"], cheap.sets["t"]
    assert s_cheap.axes == ["activation", "activation_rel", "confidence_prob"]
    assert cheap.skipped_axes == {"t": ["confidence", "generation", "mirroring"]} and cheap.config["generation"] is False
    assert full.skipped_axes == {} and "generation" not in full.config
    for g_full, g_cheap in zip(s_full.groups, s_cheap.groups):
        assert g_cheap.outputs is None and g_cheap.correct is None and g_full.correct is not None
        for axis in s_cheap.axes:
            assert g_cheap.axes[axis] == g_full.axes[axis], (g_full.id, axis)
            assert g_cheap.per_variant[axis] == g_full.per_variant[axis]
    for axis in s_cheap.axes:
        assert s_cheap.summaries[axis].to_dict() == s_full.summaries[axis].to_dict()
    assert "accuracy" not in s_cheap.correctness
    assert ev.count_sequences(vs, generation=False) == 24 and ev.count_sequences(vs) == 48


def test_without_generation_drops_confidence_when_a_reference_is_missing(byte_tokenizer, tiny_llama):
    """Without a reference, r is the canonical variant's greedy output: no generation, no confidence_prob."""
    vs = VariantSet.from_records(RECORDS, name="t")  # groups b and d have no reference
    res = SAGOEvaluator(tiny_llama, byte_tokenizer, layers=[0], max_new_tokens=3, n_bootstrap=100,
                        axes="activation,activation_rel,confidence,confidence_prob,generation").evaluate(
        vs, generation=False)
    assert res.sets["t"].axes == ["activation", "activation_rel"]
    assert res.skipped_axes == {"t": ["confidence", "confidence_prob", "generation"]}


def test_seeded_subset_is_stable_and_independent_of_order():
    from sago_train.eval.evaluator import select_groups

    vs = VariantSet.from_records(_with_refs(100), name="t")
    a = select_groups(vs, 64, seed=0)
    assert a == select_groups(vs, 64, seed=0) and len(a) == 64 and a == sorted(set(a))
    assert select_groups(vs, 64, seed=1) != a
    assert select_groups(vs, 0, seed=0) == list(range(100)) == select_groups(vs, None, seed=0)
    assert select_groups(vs, 200, seed=0) == list(range(100))


def test_generation_mirroring_and_correctness_read_the_answer_span(byte_tokenizer, tiny_llama, monkeypatch):
    """Run-on text after a default stop does not count as instability (SPEC "correctness"); the raw output is
    recorded as it was generated."""
    from itertools import combinations

    from sago_train.eval.extraction import Extractor
    from sago_train.functional.axes import mirroring_instability
    from sago_train.functional.text import token_f1

    qa = "Question: What is the capital of {}?\nAnswer:"
    recs = [{"id": "fr", "variants": [qa.format("France"), qa.format("france"), "Name the capital of France."],
             "reference": ["Paris", "Paname"]}]
    outputs = {qa.format("France"): " Paris\n\nQuestion: What is the capital of Spain?\nAnswer: Madrid",
               qa.format("france"): " Paris\nQuestion: france france, tell me more",
               "Name the capital of France.": " Paname.\n\nName the capital of Peru."}
    by_prompt = {repr(byte_tokenizer(p)["input_ids"]): out for p, out in outputs.items()}
    monkeypatch.setattr(Extractor, "_prefill_unsupported", lambda *_a: "test: generations patched")
    monkeypatch.setattr(Extractor, "generate", lambda self, prompts: [by_prompt[repr(list(p))] for p in prompts])
    res = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="generation,mirroring").evaluate(
        VariantSet.from_records(recs, name="s"))
    (g,) = res.sets["s"].groups
    assert g.outputs == [outputs[v] for v in recs[0]["variants"]]  # raw
    spans = [" Paris", " Paris", " Paname."]
    prompts = recs[0]["variants"]
    pairs = list(combinations(spans, 2))
    assert g.axes["generation"] == pytest.approx(1 - sum(token_f1(a, b) for a, b in pairs) / len(pairs))  # 2/3
    assert g.axes["mirroring"] == pytest.approx(mirroring_instability(prompts, spans, ["Paris", "Paname"]).value)
    assert g.axes["mirroring"] == 0.0  # the run-on "france france" would have counted as mirroring
    assert g.correct == [True, True, True]  # the second alias is right too
    assert res.config["resolved"]["answer_stops"] == {"s": ["\n\n", "\nQuestion:", "\nAnswer:"]}
    assert res.sets["s"].correctness["stops"] == ["\n\n", "\nQuestion:", "\nAnswer:"]


def test_confidence_scores_the_first_alias(byte_tokenizer, tiny_llama):
    variants = ["The capital of Ukraine is", "Ukraine's capital is"]
    first = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="confidence").evaluate(
        VariantSet.from_records([{"id": "ua", "variants": variants, "reference": [" Kyiv", " Kiev"]}], name="a"))
    plain = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="confidence").evaluate(
        VariantSet.from_records([{"id": "ua", "variants": variants, "reference": " Kyiv"}], name="a"))
    a, b = first.sets["a"].groups[0], plain.sets["a"].groups[0]
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-9) and a.scored_reference == " Kyiv"
    assert a.reference == [" Kyiv", " Kiev"]  # recorded as given
