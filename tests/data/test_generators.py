"""Variant generators: determinism, order independence, answer remapping, validation, round trips."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sago_train.data.build import build_variant_set, unchanged_counts
from sago_train.data.examples import load_examples, load_text_list
from sago_train.data.generators import (
    GENERATORS,
    CallableGenerator,
    CasingGenerator,
    Example,
    FormatGenerator,
    InstructionGenerator,
    OptionShuffleGenerator,
    TemplateGenerator,
    TypoGenerator,
    WhitespaceGenerator,
    make_generator,
)
from sago_train.data.groups import VariantSet
from sago_train.errors import SagoInputError

ROOT = Path(__file__).resolve().parents[2]

MC = [
    {
        "id": f"mc-{i}",
        "question": f"Which number is the largest in list {i}?",
        "choices": [str(i), str(i + 10), str(i + 5), str(i + 1)],
        "answer": 1,
        "instruction": "Pick the correct option.",
    }
    for i in range(8)
]
FREE = [
    {"id": "cap-1", "prompt": "The capital of France is", "reference": " Paris"},
    {"id": "cap-2", "prompt": "The capital of Germany is", "reference": " Berlin", "meta": {"src": "x"}},
    {"id": "cap-3", "prompt": "What is the capital of Italy?", "reference": " Rome"},
]
FIELDS = [
    {
        "id": "rc-1",
        "fields": {"Context": "The sky is blue.", "Question": "What colour is the sky?", "Answer": ""},
        "reference": " blue",
    },
    {"id": "rc-2", "fields": {"Passage": "Grass is green.", "Question": "What colour is grass?"}},
]


def all_generators() -> list:
    return [
        FormatGenerator(),
        TypoGenerator(rate=0.1),
        CasingGenerator("random"),
        WhitespaceGenerator(),
        OptionShuffleGenerator(),
        TemplateGenerator(["Q: {question}\n{choices}\nA:", "{prompt}\n(think first)"]),
        InstructionGenerator(["Choose one option.", "Answer with the best option."]),
        CallableGenerator(
            lambda text, rng: text.replace("largest", rng.choice(["biggest", "greatest"])), "synonym"
        ),
    ]


def as_records(vs: VariantSet) -> list[dict]:
    return [g.to_dict() for g in vs]


# ---------------------------------------------------------------------------------------------------------------
# Determinism and order independence
# ---------------------------------------------------------------------------------------------------------------


def test_deterministic_for_a_seed_and_differs_across_seeds():
    a = build_variant_set(MC, all_generators(), name="mc", seed=3)
    b = build_variant_set(MC, all_generators(), name="mc", seed=3)
    c = build_variant_set(MC, all_generators(), name="mc", seed=4)
    assert as_records(a) == as_records(b)
    assert as_records(a) != as_records(c)
    # the original is the same whatever the seed
    assert [g.variants[0] for g in a] == [g.variants[0] for g in c]


def test_independent_of_example_order_and_other_generators():
    forward = build_variant_set(MC, all_generators(), name="mc", seed=1)
    backward = build_variant_set(list(reversed(MC)), all_generators(), name="mc", seed=1)
    by_id = {g.id: g.to_dict() for g in backward}
    assert all(g.to_dict() == by_id[g.id] for g in forward)
    # a kind's variants do not depend on which other generators run
    alone = build_variant_set(MC, [TypoGenerator(rate=0.1)], name="mc", seed=1)
    typo_k = forward[0].kinds.index("typo")
    assert [g.variants[typo_k] for g in forward] == [g.variants[1] for g in alone]


def test_ids_derived_from_content_are_order_independent():
    no_ids = [{k: v for k, v in r.items() if k != "id"} for r in FREE]
    a = build_variant_set(no_ids, [TypoGenerator(0.2)], name="s")
    b = build_variant_set(no_ids[::-1], [TypoGenerator(0.2)], name="s")
    assert {g.id: g.variants for g in a} == {g.id: g.variants for g in b}
    assert all(g.id.startswith("ex-") for g in a)


def test_independent_of_pythonhashseed():
    # A subprocess with a hash seed that (almost surely) differs from this process's random one. It registers
    # a bare `sago_train` package so that only the data modules load, not the torch-importing package root.
    records = [{"id": "a", "question": "Which is red?", "choices": ["sky", "rose", "grass"], "answer": 1}]
    gens = ["format", "typo", "option_shuffle", "whitespace"]
    code = (
        "import json, sys, types; pkg = types.ModuleType('sago_train');"
        f"pkg.__path__ = [{str(ROOT / 'sago_train')!r}]; sys.modules['sago_train'] = pkg;"
        "from sago_train.data.build import build_variant_set;"
        f"vs = build_variant_set({records!r}, {gens!r}, name='s', seed=7);"
        "print(json.dumps(vs[0].to_dict()))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    here = build_variant_set(records, gens, name="s", seed=7)[0].to_dict()
    assert json.loads(out.stdout) == here


# ---------------------------------------------------------------------------------------------------------------
# Structure of the output
# ---------------------------------------------------------------------------------------------------------------


def test_kinds_aligned_and_set_round_trips(tmp_path):
    vs = build_variant_set(MC, all_generators(), name="mc", seed=0)
    expected = [
        "canonical",
        "format",
        "typo",
        "casing",
        "whitespace",
        "option_shuffle",
        "template",
        "instruction",
        "synonym",
    ]
    assert vs.kinds == expected
    assert all(g.kinds == expected and g.canonical == 0 for g in vs)
    # every generated variant differs from the original here
    assert all(len(set(g.variants)) == g.k for g in vs)
    path = tmp_path / "mc.jsonl"
    vs.to_jsonl(path)
    back = VariantSet.from_jsonl(path)
    assert back.name == "mc"
    assert as_records(back) == as_records(vs)


def test_option_shuffle_keeps_correct_text_at_remapped_index():
    vs = build_variant_set(MC, all_generators(), name="mc", seed=0)
    for g, ex in zip(vs, MC):
        correct = ex["choices"][ex["answer"]]
        info = g.meta["generation"]
        assert g.choices == ex["choices"]  # the group keeps the original order
        assert isinstance(g.answer, list) and len(g.answer) == g.k
        for k in range(g.k):
            order, labels = info["choice_orders"][k], info["choice_labels"][k]
            assert sorted(order) == list(range(4))
            assert g.choices[order[g.answer[k]]] == correct
            # and that option is shown in the prompt under the variant's label
            label = re.escape(labels[g.answer[k]])
            assert re.search(rf"(^|\s)[\[(]?{label}[.):\]]? {re.escape(correct)}(\n|;|\s|$)", g.variants[k])
        shuffled = g.kinds.index("option_shuffle")
        assert info["choice_orders"][shuffled] != [0, 1, 2, 3]


def test_reference_and_meta_pass_through():
    vs = build_variant_set(FREE, ["typo", "casing"], name="free")
    assert [g.reference for g in vs] == [" Paris", " Berlin", " Rome"]
    assert vs[1].meta["src"] == "x"
    assert vs[0].answer is None and vs[0].choices is None
    assert vs[0].meta["generation"]["seed"] == 0


def test_canonical_rendering_of_structured_examples():
    assert Example.from_dict(FIELDS[0]).render() == (
        "Context: The sky is blue.\nQuestion: What colour is the sky?\nAnswer:"
    )
    assert Example.from_dict(MC[0]).render() == (
        "Pick the correct option.\n\nQuestion: Which number is the largest in list 0?\n"
        "A. 0\nB. 10\nC. 5\nD. 1\nAnswer:"
    )
    # prompt + choices: the free text is the stem
    ex = Example.from_dict({"prompt": "2+2 =", "choices": ["3", "4"], "answer": 1})
    assert ex.render() == "2+2 =\nA. 3\nB. 4\nAnswer:"


def test_format_changes_scaffolding_not_content():
    vs = build_variant_set(FIELDS + MC[:2], [FormatGenerator()], name="fmt", seed=5)
    for g in vs:
        assert g.variants[1] != g.variants[0]
    # content words survive every format
    assert "The sky is blue." in vs[0].variants[1] and "What colour is the sky?" in vs[0].variants[1]
    # the prompt ends at the cue without trailing whitespace, so the reference still attaches the same way
    assert vs[0].variants[1] == vs[0].variants[1].rstrip()
    fixed = FormatGenerator(separators=[" = "], name_casings=["lower"], aliases={}, joiners=["\n"])
    v = fixed.generate(Example.from_dict(FIELDS[0]), random.Random(0))
    assert v.text == "context = The sky is blue.\nquestion = What colour is the sky?\nanswer ="


def test_content_generators_leave_scaffolding_alone():
    vs = build_variant_set(FIELDS[:1] + MC[:1], [CasingGenerator("upper"), TypoGenerator(rate=1.0)], name="s")
    up = vs[0].variants[1]
    assert up == "Context: THE SKY IS BLUE.\nQuestion: WHAT COLOUR IS THE SKY?\nAnswer:"
    lines = vs[1].variants[2].splitlines()
    assert lines[2].startswith("Question: ")  # the field name survives rate-1.0 typos
    assert lines[3:] == vs[1].variants[0].splitlines()[3:]  # so do the options and the cue


def test_unchanged_variants_are_kept_and_counted():
    examples = [{"id": "lo", "prompt": "already lower"}, {"id": "Up", "prompt": "Has Upper"}]
    vs = build_variant_set(examples, [CasingGenerator("lower"), TypoGenerator(0.1)], name="s", max_attempts=3)
    assert vs[0].variants[1] == vs[0].variants[0]  # kept, not dropped
    assert vs[0].meta["generation"]["unchanged"] == ["casing"]
    assert vs[1].meta["generation"]["unchanged"] == []
    assert unchanged_counts(vs) == {"casing": 1, "typo": 0}


def test_retry_finds_a_different_draw():
    # one template reproduces the original; retries draw the other one
    gen = TemplateGenerator(["{prompt}", "Say: {prompt}"])
    vs = build_variant_set([{"id": str(i), "prompt": f"text {i}"} for i in range(20)], [gen], name="s")
    assert all(g.variants[1] == "Say: " + g.variants[0] for g in vs)
    assert unchanged_counts(vs) == {"template": 0}


def test_repeated_generator_names_get_unique_kinds_and_different_draws():
    vs = build_variant_set(FREE, [TypoGenerator(0.2), TypoGenerator(0.2), "casing"], name="s")
    assert vs.kinds == ["canonical", "typo", "typo-2", "casing"]
    assert any(g.variants[1] != g.variants[2] for g in vs)


def test_include_original_false():
    vs = build_variant_set(FREE, ["typo", "whitespace"], name="s", include_original=False)
    assert vs.kinds == ["typo", "whitespace"]
    assert all(FREE[i]["prompt"] not in g.variants for i, g in enumerate(vs))
    with pytest.raises(SagoInputError, match="at least 2 variants"):
        build_variant_set(FREE, ["typo"], name="s", include_original=False)


def test_user_callable():
    def shout(text: str, rng: random.Random) -> str:
        return text.upper() + "!" * rng.randint(1, 3)

    vs = build_variant_set(FREE, [CallableGenerator(shout, name="shout")], name="s", seed=2)
    assert vs.kinds == ["canonical", "shout"]
    assert vs[0].variants[1].startswith("THE CAPITAL OF FRANCE IS!")
    again = build_variant_set(FREE, [CallableGenerator(shout, name="shout")], name="s", seed=2)
    assert as_records(vs) == as_records(again)
    with pytest.raises(SagoInputError, match="produced an empty variant"):
        build_variant_set(FREE, [CallableGenerator(lambda t, r: "  ", name="blank")], name="s")
    with pytest.raises(SagoInputError, match="returned integer"):
        build_variant_set(FREE, [CallableGenerator(lambda t, r: 3, name="bad")], name="s")  # type: ignore


def test_instruction_generator_replaces_or_prepends():
    ex = Example.from_dict({"id": "a", "prompt": "2+2=", "instruction": "Compute."})
    gen = InstructionGenerator(["Compute.", "Work it out."])
    assert gen.generate(ex, random.Random(0)).text == "Work it out.\n\n2+2="
    plain = Example.from_dict({"id": "b", "prompt": "2+2="})
    assert gen.generate(plain, random.Random(0)).text.endswith("\n\n2+2=")


def test_whitespace_and_casing_modes():
    rng = random.Random(0)
    assert CasingGenerator("title").perturb("they're in new york", rng) == "They're In New York"
    assert CasingGenerator("swap").perturb("Ab", rng) == "aB"
    out = WhitespaceGenerator(rate=0.5, styles=["tab"]).perturb("one two three four", rng)
    assert "\t" in out and out.replace("\t", " ") == "one two three four"
    assert WhitespaceGenerator().perturb(" edge ", rng) == " edge "  # no inner gap, ends untouched


# ---------------------------------------------------------------------------------------------------------------
# Typos
# ---------------------------------------------------------------------------------------------------------------


def _levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return cur[-1] if a else len(b)


def test_typo_rate_roughly_respected():
    text = " ".join(["the quick brown fox jumps over the lazy dog"] * 8)
    letters = sum(c.isalpha() for c in text)
    for rate in (0.02, 0.1):
        dists = [_levenshtein(text, TypoGenerator(rate).perturb(text, random.Random(s))) for s in range(5)]
        mean = sum(dists) / len(dists)
        # a swap costs 2 Levenshtein edits, everything else 1
        assert 0.6 * rate * letters <= mean <= 1.6 * rate * letters, (rate, mean, rate * letters)


def test_typo_never_empty_and_keeps_digits():
    gen = TypoGenerator(rate=1.0, ops=["drop"])
    for s in range(20):
        assert gen.perturb("a", random.Random(s)).strip()
        out = gen.perturb("ab 12+3", random.Random(s))
        assert out.strip() and "12+3" in out
    assert gen.perturb("123 + 4 =", random.Random(0)) == "123 + 4 ="  # no letters: nothing to edit
    cancel = TypoGenerator(rate=1.0, ops=["drop", "duplicate"])
    assert all(cancel.perturb("aa", random.Random(s)) != "aa" for s in range(50))


@settings(max_examples=60, deadline=None)
@given(
    st.text(min_size=1, max_size=60).filter(lambda t: t.strip()), st.floats(0.01, 1.0), st.integers(0, 10**6)
)
def test_typo_property_never_empty(text, rate, seed):
    out = TypoGenerator(rate).perturb(text, random.Random(seed))
    assert out.strip()
    if any(c.isalpha() for c in text):
        assert out != text  # at least one letter is edited, and every edit changes the text
    # only letters are edited: everything else survives in order
    assert "".join(c for c in out if not c.isalpha()) == "".join(c for c in text if not c.isalpha())


# ---------------------------------------------------------------------------------------------------------------
# Property: shuffled answer always maps to the same choice text
# ---------------------------------------------------------------------------------------------------------------

choice_text = st.text(alphabet="abcdefghij XYZ0123", min_size=1, max_size=8).filter(lambda s: s.strip())


@settings(max_examples=60, deadline=None)
@given(st.lists(choice_text, min_size=2, max_size=7), st.data(), st.integers(0, 2**31))
def test_property_shuffled_answer_maps_to_same_choice(choices, data, seed):
    answer = data.draw(st.integers(0, len(choices) - 1))
    ex = {"id": "p", "question": "Which one?", "choices": choices, "answer": answer}
    vs = build_variant_set(
        [ex], [OptionShuffleGenerator(), FormatGenerator(), "option_shuffle"], name="p", seed=seed
    )
    g = vs[0]
    for k in range(g.k):
        order = g.meta["generation"]["choice_orders"][k]
        assert sorted(order) == list(range(len(choices)))
        assert choices[order[g.answer[k]]] == choices[answer]
    # unless every option text is the same, the shuffled variants show a different order
    if len(set(choices)) > 1:
        assert g.meta["generation"]["choice_orders"][1] != list(range(len(choices)))


# ---------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "record, pattern",
    [
        ({"id": "x", "reference": " a"}, r"example 0 \(id 'x'\): missing 'prompt'"),
        ({"id": "x", "prompt": "  "}, r"field 'prompt': example 0 \(id 'x'\): 'prompt' is empty"),
        (
            {"id": "x", "question": "q?", "choices": ["a", "b"], "answer": 2},
            r"field 'answer'.*answer out of range",
        ),
        ({"id": "x", "question": "q?", "choices": [], "answer": 0}, r"field 'choices'.*choices are empty"),
        ({"id": "x", "question": "q?", "choices": ["a"]}, r"at least 2 choices"),
        ({"id": "x", "question": "q?", "choices": ["a", ""]}, r"choice 1"),
        ({"id": "x", "prompt": "p", "answer": 0}, r"'answer' needs 'choices'"),
        ({"id": "x", "prompt": "p", "question": "q"}, r"either 'prompt'"),
        ({"id": "x", "promt": "p"}, r"unknown key 'promt'. Did you mean 'prompt'\?"),
        ({"id": "x", "fields": {"A": "", "B": "b"}}, r"field 'A' is empty"),
        ({"id": True, "prompt": "p"}, r"field 'id'"),
        ("just text", r"example 0: expected an object, got string"),
    ],
)
def test_bad_examples(record, pattern):
    with pytest.raises(SagoInputError, match=pattern):
        build_variant_set([record], ["typo"], name="s")


def test_bad_example_is_located_by_index():
    with pytest.raises(SagoInputError, match=r"example 1 \(id 'b'\): missing 'prompt'"):
        build_variant_set([{"id": "a", "prompt": "p"}, {"id": "b"}], ["typo"], name="s")
    with pytest.raises(SagoInputError, match=r"example 1: duplicate id 'a'"):
        build_variant_set([{"id": "a", "prompt": "p"}, {"id": "a", "prompt": "q"}], ["typo"], name="s")


def test_unknown_generator_suggests_closest():
    with pytest.raises(SagoInputError, match=r"unknown generator 'typos'. Did you mean 'typo'\?"):
        make_generator("typos")
    with pytest.raises(SagoInputError, match=r"Did you mean 'option_shuffle'"):
        build_variant_set(MC, ["option_shufle"], name="s")
    with pytest.raises(
        SagoInputError, match=r"bad arguments for generator 'typo'.*Accepted: rate, ops, name"
    ):
        make_generator("typo", rat=0.1)
    with pytest.raises(SagoInputError, match=r"unknown casing mode 'Lower'. Did you mean 'lower'"):
        make_generator("casing", mode="Lower")
    assert set(GENERATORS) == {
        "template",
        "format",
        "typo",
        "casing",
        "whitespace",
        "option_shuffle",
        "instruction",
        "callable",
    }


def test_inapplicable_generators_are_rejected():
    with pytest.raises(
        SagoInputError, match=r"example 0 \(id 'cap-1'\): generator 'option_shuffle'.*no 'choices'"
    ):
        build_variant_set(FREE, ["option_shuffle"], name="s")
    with pytest.raises(SagoInputError, match=r"generator 'format'.*free text only"):
        build_variant_set(FREE, ["format"], name="s")
    with pytest.raises(SagoInputError, match=r"template 0 uses \{Context\}.*Available: body, prompt"):
        build_variant_set(FREE, [TemplateGenerator(["{Context}: {prompt}"])], name="s")
    with pytest.raises(SagoInputError, match=r"reference ' B' is the answer's option label"):
        build_variant_set([{**MC[0], "reference": " B"}], ["option_shuffle"], name="s")


@pytest.mark.parametrize(
    "factory, pattern",
    [
        (lambda: TypoGenerator(rate=0), r"typo rate must be in \(0, 1\]"),
        (lambda: TypoGenerator(rate=0.1, ops=["swapp"]), r"Did you mean 'swap'"),
        (lambda: WhitespaceGenerator(rate=2), r"whitespace rate"),
        (lambda: TemplateGenerator([]), r"non-empty list of template strings"),
        (lambda: TemplateGenerator("{prompt}"), r"non-empty list of template strings"),
        (lambda: TemplateGenerator(["{0}"]), r"invalid placeholder"),
        (lambda: TemplateGenerator(["{prompt"]), r"malformed"),
        (lambda: InstructionGenerator([""]), r"instruction 0 is empty"),
        (lambda: FormatGenerator(label_templates=["A."]), r"exactly one '\{\}'"),
        (lambda: CallableGenerator("nope"), r"expected a function"),  # type: ignore[arg-type]
        (lambda: TypoGenerator(name="canonical"), r"reserved"),
    ],
)
def test_bad_generator_arguments(factory, pattern):
    with pytest.raises(SagoInputError, match=pattern):
        factory()


def test_bad_build_arguments():
    with pytest.raises(SagoInputError, match="no examples"):
        build_variant_set([], ["typo"], name="s")
    with pytest.raises(SagoInputError, match="invalid set name"):
        build_variant_set(FREE, ["typo"], name="../x")
    with pytest.raises(SagoInputError, match="max_attempts"):
        build_variant_set(FREE, ["typo"], name="s", max_attempts=0)
    with pytest.raises(SagoInputError, match="at least 2 variants"):
        build_variant_set(FREE, [], name="s")


# ---------------------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------------------


def test_load_text_list_formats(tmp_path):
    (tmp_path / "t.json").write_text(json.dumps(["Q: {prompt}", "{prompt}?"]))
    (tmp_path / "o.json").write_text(json.dumps({"templates": ["A {prompt}"]}))
    (tmp_path / "t.yaml").write_text("- 'Q: {prompt}'\n- |\n  Please answer.\n  {prompt}\n")
    (tmp_path / "lines.txt").write_text("Q: {prompt}\n\nSay {prompt}\n")
    (tmp_path / "blocks.txt").write_text("Line one\n{prompt}\n---\nOther {prompt}\n")
    assert load_text_list(tmp_path / "t.json") == ["Q: {prompt}", "{prompt}?"]
    assert load_text_list(tmp_path / "o.json") == ["A {prompt}"]
    assert load_text_list(tmp_path / "t.yaml") == ["Q: {prompt}", "Please answer.\n{prompt}\n"]
    assert load_text_list(tmp_path / "lines.txt") == ["Q: {prompt}", "Say {prompt}"]
    assert load_text_list(tmp_path / "blocks.txt") == ["Line one\n{prompt}", "Other {prompt}"]
    gen = TemplateGenerator.from_file(tmp_path / "blocks.txt")
    assert gen.templates == ("Line one\n{prompt}", "Other {prompt}")
    (tmp_path / "bad.json").write_text(json.dumps(["ok", 3]))
    with pytest.raises(SagoInputError, match=r"bad.json: field 'templates': entry 1"):
        load_text_list(tmp_path / "bad.json")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(SagoInputError, match="no templates"):
        load_text_list(tmp_path / "empty.txt")
    with pytest.raises(SagoInputError, match="file not found"):
        load_text_list(tmp_path / "missing.txt")


def test_load_examples_locates_errors(tmp_path):
    p = tmp_path / "ex.jsonl"
    p.write_text(
        json.dumps(MC[0])
        + "\n\n"
        + json.dumps({"id": "z", "question": "q", "choices": ["a", "b"], "answer": 5})
        + "\n"
    )
    with pytest.raises(SagoInputError, match=r"ex.jsonl:3: field 'answer': example 1 \(id 'z'\)"):
        load_examples(p)
    p.write_text("\n".join(json.dumps(r) for r in MC) + "\n")
    exs = load_examples(p)
    vs = build_variant_set(exs, ["option_shuffle"], name="mc")
    assert as_records(vs) == as_records(build_variant_set(MC, ["option_shuffle"], name="mc"))
    j = tmp_path / "ex.json"
    j.write_text(json.dumps(FREE))
    assert [e.id for e in load_examples(j)] == ["cap-1", "cap-2", "cap-3"]
