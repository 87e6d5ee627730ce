"""Chat-aware evaluation (SPEC "Chat rendering"), stop strings, degenerate-output warnings, the bundled
real-model sets and the thread policy, on tiny offline models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sago_train import SAGOEvaluator
from sago_train.data import VariantSet
from sago_train.data.build import build_variant_set
from sago_train.data.sources import bundled_set_paths, bundled_sets
from sago_train.errors import SagoInputError
from sago_train.eval.extraction import Extractor
from sago_train.model.tokenize import encode_variant, resolve_chat_template
from sago_train.threads import planned_threads

from .._helpers.evaluator_ref import FIVE_AXES, TOL, reference_group
from .._helpers.tiny import make_byte_tokenizer

ROOT = Path(__file__).resolve().parents[2]
# A template that marks turns with special tokens, as instruct models' templates do.
SPECIAL_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
RECS = [
    {"id": "a", "variants": ["What is the capital of France?", "Name the capital of France."], "reference": "Paris"},
    {"id": "b", "variants": ["Two plus two equals", "2 + 2 ="]},
]


def test_resolve_chat_template():
    from sago_train.model.tiny import load_tiny_model

    assert resolve_chat_template("auto", load_tiny_model()[1]) == "never"  # plain "User:/Assistant:" text
    assert resolve_chat_template("auto", make_byte_tokenizer()) == "never"
    assert resolve_chat_template("auto", make_byte_tokenizer(SPECIAL_TEMPLATE)) == "always"
    assert resolve_chat_template("always", make_byte_tokenizer()) == "always"
    assert resolve_chat_template("never", make_byte_tokenizer(SPECIAL_TEMPLATE)) == "never"
    assert resolve_chat_template("auto", make_byte_tokenizer(None)) == "never"
    with pytest.raises(SagoInputError, match="no chat template"):
        resolve_chat_template("always", make_byte_tokenizer(None))
    with pytest.raises(SagoInputError, match="Did you mean 'always'"):
        resolve_chat_template("alway", make_byte_tokenizer())


def test_always_renders_each_string_as_one_user_message(tiny_llama):
    tok = make_byte_tokenizer(SPECIAL_TEMPLATE)
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert encode_variant("Hi", tok, chat=True) == tok(text, add_special_tokens=False)["input_ids"]
    assert encode_variant("Hi", tok) == tok("Hi")["input_ids"]  # never: as it is, special tokens as added

    def encode(v):
        return tok.apply_chat_template([{"role": "user", "content": v}], add_generation_prompt=True,
                                       tokenize=True)["input_ids"]

    vs = VariantSet.from_records(RECS, name="t")
    result = SAGOEvaluator(tiny_llama, tok, layers=[0, -1], max_new_tokens=5, batch_size=3,
                           axes=FIVE_AXES).evaluate(vs)
    assert result.config["chat_template"] == "auto"
    resolved = result.config["resolved"]
    assert {k: resolved[k] for k in ("chat_template", "correctness")} == {"chat_template": "always",
                                                                          "correctness": {"t": "contains"}}
    assert resolved["answer_stops"] == {"t": []}  # a chat answer ends at EOS and the configured stops only
    assert result.to_summary()["config"]["resolved"]["chat_template"] == "always"
    assert result.sets["t"].correctness["mode"] == "contains"
    for rec, g in zip(RECS, result.sets["t"].groups):
        ref = reference_group(tiny_llama, tok, rec, [0, 3], 5, encode=encode)
        assert g.outputs == ref["_outputs"]
        for axis in ("activation", "confidence", "generation", "mirroring"):
            assert g.axes[axis] == pytest.approx(ref[axis], abs=TOL, nan_ok=True), axis


def test_never_keeps_the_plain_prompt_with_contains_matching_and_default_stops(byte_tokenizer, tiny_llama):
    vs = VariantSet.from_records(RECS, name="t")
    result = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="generation", max_new_tokens=3,
                           stop_strings=["###"]).evaluate(vs)
    resolved = result.config["resolved"]
    assert resolved["chat_template"] == "never" and resolved["correctness"] == {"t": "contains"}
    assert resolved["answer_stops"] == {"t": ["###", "\n\n"]}  # configured first, then the blank line
    assert result.sets["t"].correctness["stops"] == ["###", "\n\n"]


def test_stop_strings_end_generation_and_are_cut(byte_tokenizer, tiny_llama, monkeypatch):
    vs = VariantSet.from_records([{"id": "s", "variants": ["The sky is", "The sea is"]}], name="t")
    plain = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="generation", max_new_tokens=16).evaluate(vs)
    out = plain.sets["t"].groups[0].outputs[0]
    stop = next(ch for ch in out[2:] if ch.strip())  # a character the free generation produces
    want = out[: out.index(stop)]
    lengths = []
    original = type(tiny_llama).generate

    def spy(self, *args, **kwargs):
        gen = original(self, *args, **kwargs)
        lengths.append(gen.shape[1] - kwargs["input_ids"].shape[1])
        return gen

    monkeypatch.setattr(type(tiny_llama), "generate", spy)
    single = VariantSet.from_records([{"id": "s", "variants": ["The sky is", "The sky is"]}], name="t")
    stopped = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="generation", max_new_tokens=16,
                            stop_strings=[stop]).evaluate(single)
    assert stopped.sets["t"].groups[0].outputs == [want, want]
    assert lengths and max(lengths) < 16  # generation really stopped, not only the text cut


def _patched_outputs(monkeypatch, outputs):
    # Separate generation and scoring passes, so that generate() alone decides the outputs.
    monkeypatch.setattr(Extractor, "_prefill_unsupported", lambda *_a: "test: generations patched")
    monkeypatch.setattr(Extractor, "generate", lambda self, prompts: [outputs(i) for i in range(len(prompts))])


def test_empty_generations_warn_and_name_causes(byte_tokenizer, tiny_llama, monkeypatch, tmp_path):
    _patched_outputs(monkeypatch, lambda i: "" if i % 4 else f"x{i}")  # 75% empty
    vs = VariantSet.from_records([{"id": f"g{i}", "variants": [f"q{i}", f"Q{i}"]} for i in range(4)], name="t")
    result = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="generation", stop_strings=["\n"]).evaluate(vs)
    assert len(result.warnings) == 1
    note = result.warnings[0]
    assert "75% of generations are empty" in note
    assert "chat template 'never'" in note and "['\\n']" in note and "max_new_tokens=64" in note
    result.write(tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["warnings"] == result.warnings


def test_identical_answers_across_unrelated_groups_warn(byte_tokenizer, tiny_llama, monkeypatch):
    _patched_outputs(monkeypatch, lambda i: "I am a helpful assistant.")
    unrelated = [{"id": f"g{i}", "variants": [f"q{i}", f"Q{i}"], "reference": f"r{i}"} for i in range(5)]
    result = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="generation").evaluate(
        VariantSet.from_records(unrelated, name="t"))
    assert len(result.warnings) == 1 and "100% of groups give the same answer" in result.warnings[0]
    # groups that share a reference may share an answer
    same = [{"id": f"g{i}", "variants": [f"q{i}", f"Q{i}"], "reference": "r"} for i in range(5)]
    result = SAGOEvaluator(tiny_llama, byte_tokenizer, axes="generation").evaluate(
        VariantSet.from_records(same, name="t"))
    assert result.warnings == []


def test_varied_answers_do_not_warn(byte_tokenizer, tiny_llama, monkeypatch):
    _patched_outputs(monkeypatch, lambda i: f"answer {i // 2}")
    vs = VariantSet.from_records([{"id": f"g{i}", "variants": [f"q{i}", f"Q{i}"]} for i in range(5)], name="t")
    assert SAGOEvaluator(tiny_llama, byte_tokenizer, axes="generation").evaluate(vs).warnings == []


# ------------------------------------------------------------------ CLI
def test_cli_options_reach_the_config():
    import argparse

    from sago_train.cli.eval_cmd import add_parser, config_from_args

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["eval", "--chat-template", "never", "--stop", "\\n", "--stop", "END",
                              "--correctness", "contains"])
    cfg = config_from_args(args)
    assert cfg.chat_template == "never" and cfg.stop_strings == ["\n", "END"] and cfg.correctness == "contains"
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "--chat-template", "sometimes"])


def test_set_shorthand_and_default_collection():
    from sago_train.cli.eval_cmd import _sets_for

    assert set(_sets_for(["real"], None)) == set(bundled_set_paths("real"))
    assert set(_sets_for(None, "sago://smollm2-135m-instruct")) == set(bundled_set_paths("real"))
    assert set(_sets_for(None, None)) == set(bundled_set_paths("tiny"))
    path = bundled_set_paths("tiny")["typo"]
    assert set(_sets_for(["real", f"mine={path}"], None)) == {*bundled_set_paths("real"), "mine"}


# ------------------------------------------------------------------ bundled real-model sets
def test_real_sets_shape():
    sets = bundled_sets("real")
    assert len(sets) >= 3
    for name, vs in sets.items():
        assert len(vs) >= 40, name
        assert vs.kinds == ["canonical", "paraphrase", "format", "typo"]
        for g in vs.groups:
            canonical, paraphrase, fmt, typo = g.variants
            assert g.references and all(len(r.split()) <= 3 for r in g.references)
            # few-shot completions that a base model answers too: solved questions, then the question
            assert canonical.count("Question: ") == 3 and canonical.endswith("\nAnswer:")
            assert fmt == canonical.replace("Question: ", "Q: ").replace("\nAnswer:", "\nA:")
            assert typo != canonical and paraphrase != canonical
            shots = canonical.rsplit("\n\n", 1)[0]
            assert all(v.startswith(shots) for v in (paraphrase, typo))
        assert len({g.id for g in vs.groups}) == len(vs)


def test_real_sets_are_reproduced_by_their_script(tmp_path):
    script = ROOT / "scripts" / "build_real_sets.py"
    code = (f"import runpy, sys; sys.argv=['x']; m = runpy.run_path({str(script)!r}, run_name='lib'); "
            f"m['OUT'] = None; import json; print(json.dumps(m['build']()))")
    built = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    for name, rows in built.items():
        shipped = [json.loads(line) for line in bundled_set_paths("real")[name].read_text().splitlines()]
        assert rows == shipped, name


def test_typo_noise_keeps_the_template_scaffold():
    example = {"id": "q", "fields": {"Question": "What is the capital of France?", "Answer": ""}, "reference": "Paris"}
    vs = build_variant_set([example], ["typo"], name="t", seed=3)
    original, typo = vs[0].variants
    assert original == "Question: What is the capital of France?\nAnswer:"
    assert typo.startswith("Question: ") and typo.endswith("\nAnswer:") and typo != original


# ------------------------------------------------------------------ threads
@pytest.mark.parametrize(
    ("current", "default", "cores", "processes", "env", "expected"),
    [
        (16, 16, 16, 1, {}, None),  # alone: torch's default is right
        (16, 16, 16, 4, {}, 4),  # torchrun with 4 local workers: a quarter each
        (2, 2, 2, 2, {}, 1),  # pytest -n 2 on 2 cores
        (16, 16, 16, 4, {"OMP_NUM_THREADS": "8"}, None),  # the user chose
        (3, 16, 16, 1, {}, None),  # torch.set_num_threads(3) was called: kept
        (1, 1, 1, 4, {}, None),  # never below one thread
    ],
)
def test_planned_threads(current, default, cores, processes, env, expected):
    assert planned_threads(current, default, cores, processes, env) == expected


# ------------------------------------------------------------------ demo-real data
def test_demo_real_data_is_reproduced_and_holds_out_its_phrasings():
    script = ROOT / "scripts" / "build_real_demo.py"
    code = (f"import runpy, json; m = runpy.run_path({str(script)!r}, run_name='lib'); "
            "print(json.dumps({'train': [m['train_group'](c, cap) for c, cap in m['FACTS']], **m['monitor_sets']()}))")
    built = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    root = ROOT / "sago_train" / "assets" / "demo-real"
    for name, rows in built.items():
        assert rows == [json.loads(line) for line in (root / f"{name}.jsonl").read_text().splitlines()], name
    trained = {m[0]["content"] for g in built["train"] for m in g["variants"]}
    for name in ("paraphrase", "format", "typo"):
        for g in built[name]:
            assert g["variants"][0] in trained  # the canonical phrasing is the one taught
            assert not set(g["variants"][1:]) & trained, (name, g["id"])  # the others are held out
