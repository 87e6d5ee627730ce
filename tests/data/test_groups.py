"""Tests for sago_train.data.groups and sago_train.errors (SPEC "Data").

Every invalid input must raise a SagoInputError whose message names the file, the line and the field;
nothing is silently dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sago_train.data import VariantGroup, VariantSet, read_jsonl, resolve_sets, validate_set_name
from sago_train.errors import SagoInputError, did_you_mean, unknown_name_error

GOOD1 = {"id": "a", "variants": ["What is the capital of France?", "Name the capital of France."]}
GOOD2 = {"id": "b", "variants": ["2+2=", "two plus two is"], "reference": " 4"}


def write_lines(tmp_path: Path, lines: list[str], name: str = "p.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def load_error(path: Path, **kwargs) -> str:
    with pytest.raises(SagoInputError) as info:
        VariantSet.from_jsonl(path, **kwargs)
    return str(info.value)


def bad_line_error(tmp_path: Path, record: object) -> str:
    """The error for ``record`` on line 3 (line 2 is blank, so line counting must skip it correctly)."""
    raw = record if isinstance(record, str) else json.dumps(record)
    return load_error(write_lines(tmp_path, [json.dumps(GOOD1), "", raw]))


# --------------------------------------------------------------------------- errors module


def test_error_format_variants():
    e = SagoInputError("expected a list", source="sets/p.jsonl", line=3, key="variants", hint="fix it")
    assert str(e) == "sets/p.jsonl:3: field 'variants': expected a list (fix it)"
    assert isinstance(e, ValueError)
    assert (e.message, e.source, e.line, e.key, e.hint) == (
        "expected a list",
        "sets/p.jsonl",
        3,
        "variants",
        "fix it",
    )
    assert str(SagoInputError("boom", line=7)) == "line 7: boom"
    assert str(SagoInputError("boom", source="f.jsonl")) == "f.jsonl: boom"
    assert str(SagoInputError("boom", key="axes")) == "field 'axes': boom"
    assert str(SagoInputError("boom")) == "boom"


def test_did_you_mean_and_unknown_name_error():
    assert did_you_mean("variant", ["variants", "kinds"]) == " Did you mean 'variants'?"
    assert did_you_mean("zzzzzz", ["variants", "kinds"]) == ""
    e = unknown_name_error("axis", "activaton", ["mirroring", "activation"], key="axes")
    text = str(e)
    assert text.startswith("field 'axes': unknown axis 'activaton'.")
    assert "Did you mean 'activation'?" in text
    assert "Valid: activation, mirroring" in text


# --------------------------------------------------------------------------- reading JSONL


def test_truncated_json_names_file_and_line(tmp_path):
    text = bad_line_error(tmp_path, '{"id": "c", "variants": ["x", ')
    assert "p.jsonl:3: malformed JSON" in text
    assert "column" in text


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_literals_rejected(tmp_path, literal):
    text = bad_line_error(tmp_path, '{"id": "c", "variants": ["x", "y"], "meta": {"score": ' + literal + "}}")
    assert "p.jsonl:3: malformed JSON" in text
    assert f"{literal.lstrip('-')} is not a valid JSON number" in text


def test_invalid_utf8_names_file_and_line(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_bytes(json.dumps(GOOD1).encode() + b"\n\n" + b'{"id": "c", "variants": ["\xff\xfe", "y"]}\n')
    text = load_error(p)
    assert "p.jsonl:3: not valid UTF-8" in text


def test_utf8_bom_is_accepted(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD1).encode() + b"\n" + json.dumps(GOOD2).encode() + b"\n")
    vs = VariantSet.from_jsonl(p)
    assert [g.id for g in vs] == ["a", "b"]
    # Line numbers are unaffected by the BOM.
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD1).encode() + b"\n{bad\n")
    assert "p.jsonl:2: malformed JSON" in load_error(p)


def test_crlf_line_endings_accepted(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_bytes(json.dumps(GOOD1).encode() + b"\r\n" + json.dumps(GOOD2).encode() + b"\r\n")
    assert len(VariantSet.from_jsonl(p)) == 2


def test_read_jsonl_skips_blank_lines_and_keeps_line_numbers(tmp_path):
    p = write_lines(tmp_path, ["", json.dumps(GOOD1), "   ", "\t", json.dumps(GOOD2), ""])
    assert [(n, rec["id"]) for n, rec in read_jsonl(p)] == [(2, "a"), (5, "b")]


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file_rejected(tmp_path, content):
    p = tmp_path / "p.jsonl"
    p.write_text(content)
    text = load_error(p)
    assert "p.jsonl: " in text and "no variant groups" in text


def test_file_not_found(tmp_path):
    with pytest.raises(SagoInputError, match="file not found: .*missing.jsonl"):
        VariantSet.from_jsonl(tmp_path / "missing.jsonl")


def test_directory_rejected(tmp_path):
    d = tmp_path / "sets.jsonl"
    d.mkdir()
    with pytest.raises(SagoInputError, match="sets.jsonl is a directory"):
        VariantSet.from_jsonl(d)


# --------------------------------------------------------------------------- group validation


def test_non_object_line(tmp_path):
    assert "p.jsonl:3: expected a JSON object (a variant group), got list" in bad_line_error(tmp_path, [1, 2])
    assert "p.jsonl:3: expected a JSON object (a variant group), got string" in bad_line_error(
        tmp_path, '"hi"'
    )


BAD_RECORDS = [
    # (record, location prefix, fragment of the message)
    ({"id": "c"}, "p.jsonl:3: ", "missing required field 'variants'"),
    ({"variants": "What?"}, "p.jsonl:3: field 'variants': ", "expected a list of prompts, got string"),
    ({"variants": {"a": 1}}, "p.jsonl:3: field 'variants': ", "got object"),
    ({"variants": ["only one"]}, "p.jsonl:3: field 'variants': ", "at least 2 variants, got 1"),
    ({"variants": []}, "p.jsonl:3: field 'variants': ", "at least 2 variants, got 0"),
    ({"variants": ["x", ""]}, "p.jsonl:3: field 'variants': ", "variant 1 is empty"),
    ({"variants": ["x", " \n\t"]}, "p.jsonl:3: field 'variants': ", "variant 1 is empty"),
    (
        {"variants": ["x", 3]},
        "p.jsonl:3: field 'variants': ",
        "variant 1: expected a string or a list of chat",
    ),
    (
        {"variants": [None, "x"]},
        "p.jsonl:3: field 'variants': ",
        "variant 0: expected a string or a list of chat",
    ),
    ({"variants": [{"role": "user", "content": "hi"}, "x"]}, "p.jsonl:3: field 'variants': ", "got object"),
    ({"variants": [[], "x"]}, "p.jsonl:3: field 'variants': ", "variant 0 is an empty message list"),
    (
        {"variants": [["hi"], "x"]},
        "p.jsonl:3: field 'variants': ",
        "variant 0, message 0: expected an object",
    ),
    (
        {"variants": ["x", [{"role": "usr", "content": "hi"}]]},
        "p.jsonl:3: field 'variants': ",
        "variant 1, message 0: role 'usr' is not one of",
    ),
    (
        {"variants": [[{"role": "user"}], "x"]},
        "p.jsonl:3: field 'variants': ",
        "expected string 'content', got null",
    ),
    (
        {"variants": [[{"role": "system", "content": "s"}, {"role": "user", "content": 5}], "x"]},
        "p.jsonl:3: field 'variants': ",
        "variant 0, message 1: expected string 'content', got integer",
    ),
    (
        {"variants": ["x", "y"], "kinds": ["canonical"]},
        "p.jsonl:3: field 'kinds': ",
        "one kind per variant (2), got 1",
    ),
    (
        {"variants": ["x", "y"], "kinds": ["a", "b", "c"]},
        "p.jsonl:3: field 'kinds': ",
        "one kind per variant (2), got 3",
    ),
    (
        {"variants": ["x", "y"], "kinds": "canonical"},
        "p.jsonl:3: field 'kinds': ",
        "expected a list of strings",
    ),
    ({"variants": ["x", "y"], "kinds": [1, 2]}, "p.jsonl:3: field 'kinds': ", "expected a list of strings"),
    (
        {"variants": ["x", "y"], "canonical": 2},
        "p.jsonl:3: field 'canonical': ",
        "variant index in [0, 1], got 2",
    ),
    ({"variants": ["x", "y"], "canonical": -1}, "p.jsonl:3: field 'canonical': ", "got -1"),
    ({"variants": ["x", "y"], "canonical": True}, "p.jsonl:3: field 'canonical': ", "got True"),
    ({"variants": ["x", "y"], "canonical": 1.0}, "p.jsonl:3: field 'canonical': ", "got 1.0"),
    ({"variants": ["x", "y"], "canonical": "0"}, "p.jsonl:3: field 'canonical': ", "got '0'"),
    ({"variants": ["x", "y"], "reference": ""}, "p.jsonl:3: field 'reference': ", "reference is empty"),
    ({"variants": ["x", "y"], "reference": "   "}, "p.jsonl:3: field 'reference': ", "reference is empty"),
    (
        {"variants": ["x", "y"], "reference": 4},
        "p.jsonl:3: field 'reference': ",
        "expected a string, got integer",
    ),
    ({"variants": ["x", "y"], "reference": []}, "p.jsonl:3: field 'reference': ", "reference is an empty list"),
    ({"variants": ["x", "y"], "reference": ["Kyiv", ""]}, "p.jsonl:3: field 'reference': ", "alias 1 is empty"),
    (
        {"variants": ["x", "y"], "reference": ["Kyiv", 4]},
        "p.jsonl:3: field 'reference': ",
        "alias 1: expected a string, got integer",
    ),
    ({"variants": ["x", "y"], "choices": ["Paris"]}, "p.jsonl:3: field 'choices': ", "at least 2 non-empty"),
    (
        {"variants": ["x", "y"], "choices": ["Paris", " "]},
        "p.jsonl:3: field 'choices': ",
        "at least 2 non-empty",
    ),
    ({"variants": ["x", "y"], "choices": "Paris"}, "p.jsonl:3: field 'choices': ", "at least 2 non-empty"),
    ({"variants": ["x", "y"], "answer": 0}, "p.jsonl:3: field 'answer': ", "'answer' needs 'choices'"),
    ({"variants": ["x", "y"], "answer": 0}, "p.jsonl:3: field 'answer': ", "use 'reference'"),
    (
        {"variants": ["x", "y"], "choices": ["P", "L"], "answer": 2},
        "p.jsonl:3: field 'answer': ",
        "choice index in [0, 1], got 2",
    ),
    ({"variants": ["x", "y"], "choices": ["P", "L"], "answer": -1}, "p.jsonl:3: field 'answer': ", "got -1"),
    (
        {"variants": ["x", "y"], "choices": ["P", "L"], "answer": True},
        "p.jsonl:3: field 'answer': ",
        "got True",
    ),
    (
        {"variants": ["x", "y"], "choices": ["P", "L"], "answer": [0]},
        "p.jsonl:3: field 'answer': ",
        "one answer index per variant (2), got 1",
    ),
    (
        {"variants": ["x", "y"], "choices": ["P", "L"], "answer": [0, 5]},
        "p.jsonl:3: field 'answer': ",
        "choice index in [0, 1], got 5",
    ),
    ({"variants": ["x", "y"], "meta": "note"}, "p.jsonl:3: field 'meta': ", "expected an object, got string"),
    (
        {"id": ["c"], "variants": ["x", "y"]},
        "p.jsonl:3: field 'id': ",
        "expected a string or integer id, got list",
    ),
    ({"id": True, "variants": ["x", "y"]}, "p.jsonl:3: field 'id': ", "got boolean"),
]


@pytest.mark.parametrize(
    ("record", "where", "fragment"), BAD_RECORDS, ids=[str(i) for i in range(len(BAD_RECORDS))]
)
def test_bad_record_names_file_line_and_field(tmp_path, record, where, fragment):
    text = bad_line_error(tmp_path, record)
    assert where in text, text
    assert fragment in text, text


def test_bad_chat_role_did_you_mean(tmp_path):
    text = bad_line_error(tmp_path, {"variants": ["x", [{"role": "asistant", "content": "hi"}]]})
    assert "p.jsonl:3: field 'variants': " in text
    assert "Did you mean 'assistant'?" in text


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [("variant", "variants"), ("refrence", "reference"), ("kind", "kinds"), ("choice", "choices")],
)
def test_unknown_key_did_you_mean(tmp_path, key, suggestion):
    record = {"id": "c", "variants": ["x", "y"], key: "v"}
    if key == "variant":
        record = {"id": "c", "variant": ["x", "y"]}
    text = bad_line_error(tmp_path, record)
    assert f"p.jsonl:3: unknown key '{key}'." in text
    assert f"Did you mean '{suggestion}'?" in text
    assert "meta" in text  # the hint says where extra fields go


def test_unknown_key_without_close_match(tmp_path):
    text = bad_line_error(tmp_path, {"variants": ["x", "y"], "zzzzzz": 1})
    assert "unknown key 'zzzzzz'." in text and "Did you mean" not in text


def test_duplicate_ids_name_both_lines(tmp_path):
    p = write_lines(
        tmp_path, [json.dumps(GOOD1), json.dumps(GOOD2), json.dumps({**GOOD1, "variants": ["u", "v"]})]
    )
    text = load_error(p)
    assert "p.jsonl:3: field 'id': duplicate id 'a' (first on line 1)" in text


def test_integer_and_string_ids_collide(tmp_path):
    p = write_lines(
        tmp_path,
        [json.dumps({"id": 7, "variants": ["x", "y"]}), json.dumps({"id": "7", "variants": ["u", "v"]})],
    )
    assert "p.jsonl:2: field 'id': duplicate id '7' (first on line 1)" in load_error(p)


def test_duplicate_ids_in_records_rejected():
    with pytest.raises(SagoInputError, match="duplicate id 'a'"):
        VariantSet.from_records([GOOD1, GOOD1], name="s")


def test_validation_without_a_file_still_names_the_field():
    with pytest.raises(SagoInputError) as info:
        VariantGroup(id="x", variants=["a", "b"], kinds=["k"])
    assert str(info.value).startswith("field 'kinds': ")
    with pytest.raises(SagoInputError, match="field 'canonical'"):
        VariantSet.from_records([{"variants": ["a", "b"], "canonical": 3}], name="s")


def test_empty_records_rejected():
    with pytest.raises(SagoInputError, match="has no groups"):
        VariantSet.from_records([], name="s")


# --------------------------------------------------------------------------- set names


@pytest.mark.parametrize(
    "name", ["../../x", "a/b", ".hidden", "", "a..b", "a\\b", "/abs", "x" * 101, "a b", "..", "-x"]
)
def test_bad_set_names_rejected(name):
    with pytest.raises(SagoInputError, match="invalid set name"):
        validate_set_name(name)
    with pytest.raises(SagoInputError, match="invalid set name"):
        VariantSet(name, [VariantGroup(id="a", variants=["x", "y"])])


@pytest.mark.parametrize("name", ["paraphrase", "format-v2", "typo_1", "A.b", "0"])
def test_good_set_names_accepted(name):
    assert validate_set_name(name) == name


def test_non_string_set_name_rejected():
    with pytest.raises(SagoInputError):
        validate_set_name(3)  # type: ignore[arg-type]


def test_bad_set_name_in_from_jsonl_and_resolve(tmp_path):
    p = write_lines(tmp_path, [json.dumps(GOOD1)])
    with pytest.raises(SagoInputError, match="invalid set name"):
        VariantSet.from_jsonl(p, name="../../x")
    with pytest.raises(SagoInputError, match="invalid set name"):
        resolve_sets(f"a/b={p}")
    with pytest.raises(SagoInputError, match="invalid set name"):
        resolve_sets({".hidden": p})


# --------------------------------------------------------------------------- positive cases


def test_from_jsonl_name_defaults_to_stem(tmp_path):
    p = write_lines(tmp_path, [json.dumps(GOOD1), json.dumps(GOOD2)], name="paraphrase.jsonl")
    vs = VariantSet.from_jsonl(p)
    assert vs.name == "paraphrase"
    assert vs.source == str(p)
    assert len(vs) == 2 and vs[1].reference == " 4" and vs[0].reference is None
    assert VariantSet.from_jsonl(p, name="other").name == "other"
    # A stem that is not a safe name is made safe rather than rejected.
    q = write_lines(tmp_path, [json.dumps(GOOD1)], name="my set.jsonl")
    assert VariantSet.from_jsonl(q).name == "my_set"


def test_default_ids_and_defaults():
    vs = VariantSet.from_records([{"variants": ["a", "b"]}, {"variants": ["c", "d", "e"]}], name="s")
    assert [g.id for g in vs] == ["#0", "#1"]
    g = vs[1]
    assert (g.k, g.canonical, g.kinds, g.reference, g.choices, g.answer, g.meta) == (
        3,
        0,
        None,
        None,
        None,
        None,
        {},
    )
    assert g.answer_for(0) is None
    assert VariantGroup(id="i", variants=["a", "b"]).to_dict() == {"id": "i", "variants": ["a", "b"]}


def test_integer_id_becomes_string():
    assert VariantGroup.from_dict({"id": 17, "variants": ["a", "b"]}).id == "17"


def test_round_trip_jsonl(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]
    groups = [
        VariantGroup(
            id="capital-017",
            variants=["What is the capital of France?", "france's capital city is which?", chat],
            kinds=["original", "typo", "chat"],
            canonical=1,
            reference=" Paris",
            meta={"source": "unit", "note": "é « » — ✓"},
        ),
        VariantGroup(
            id="mc-1",
            variants=["Q: 2+2?\nA. 3\nB. 4\nAnswer:", "Q: 2+2?\nA. 4\nB. 3\nAnswer:"],
            choices=["3", "4"],
            answer=[1, 0],
        ),
        VariantGroup(id="mc-2", variants=["x?", "y?"], choices=["yes", "no"], answer=0),
    ]
    vs = VariantSet("round", groups)
    p = tmp_path / "round.jsonl"
    vs.to_jsonl(p)
    back = VariantSet.from_jsonl(p)
    assert back.name == "round"
    assert [g.to_dict() for g in back] == [g.to_dict() for g in vs]
    assert back[0].is_chat(2) and not back[0].is_chat(0)
    assert back[1].answer_for(0) == 1 and back[1].answer_for(1) == 0
    assert back[2].answer_for(1) == 0
    # The file is one JSON object per line, UTF-8 without escapes.
    text = p.read_text(encoding="utf-8")
    assert len(text.splitlines()) == 3 and "« »" in text


def test_from_dataset_with_missing_optional_fields():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(
        [
            {
                "id": "a",
                "variants": ["What is the capital of France?", "Name the capital of France."],
                "kinds": ["original", "paraphrase"],
                "reference": " Paris",
                "choices": None,
                "answer": None,
                "canonical": 1,
            },
            {
                "id": "b",
                "variants": ["Pick: A. 3 B. 4", "Choose: A. 4 B. 3"],
                "kinds": None,
                "reference": None,
                "choices": ["3", "4"],
                "answer": 1,
                "canonical": None,
            },
        ]
    )
    vs = VariantSet.from_dataset(ds, name="ds")
    assert vs.name == "ds" and len(vs) == 2
    a, b = vs
    assert (a.id, a.kinds, a.reference, a.choices, a.answer, a.canonical) == (
        "a",
        ["original", "paraphrase"],
        " Paris",
        None,
        None,
        1,
    )
    assert (b.id, b.kinds, b.reference, b.choices, b.answer, b.canonical) == (
        "b",
        None,
        None,
        ["3", "4"],
        1,
        0,
    )
    assert vs.kinds is None  # one group has no kinds


def test_from_dataset_invalid_row_is_located():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"id": "a", "variants": ["x", "y"]}, {"id": "b", "variants": ["only"]}])
    with pytest.raises(SagoInputError, match=r"<dataset ds>: field 'variants': .*at least 2 variants"):
        VariantSet.from_dataset(ds, name="ds")


def test_chat_message_variants_accepted():
    chat = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Capital of France?"},
    ]
    for role in ("system", "user", "assistant", "tool", "developer"):
        VariantGroup(id=role, variants=[[{"role": role, "content": ""}], "x"])
    g = VariantGroup(id="c", variants=[chat, [{"role": "user", "content": "France's capital?"}]])
    assert g.is_chat(0) and g.is_chat(1) and g.k == 2


def test_kinds_property():
    same = VariantSet.from_records(
        [
            {"id": "a", "variants": ["x", "y"], "kinds": ["canonical", "typo"]},
            {"id": "b", "variants": ["u", "v"], "kinds": ["canonical", "typo"]},
        ],
        name="s",
    )
    assert same.kinds == ["canonical", "typo"]
    differ = VariantSet.from_records(
        [
            {"id": "a", "variants": ["x", "y"], "kinds": ["canonical", "typo"]},
            {"id": "b", "variants": ["u", "v"], "kinds": ["canonical", "paraphrase"]},
        ],
        name="s",
    )
    assert differ.kinds is None
    missing = VariantSet.from_records(
        [{"id": "a", "variants": ["x", "y"]}, {"id": "b", "variants": ["u", "v"], "kinds": ["c", "t"]}],
        name="s",
    )
    assert missing.kinds is None
    assert same.subset([1]).name == "s" and [g.id for g in same.subset([1])] == ["b"]


# --------------------------------------------------------------------------- resolve_sets


@pytest.fixture
def two_files(tmp_path):
    p = write_lines(tmp_path, [json.dumps(GOOD1)], name="paraphrase.jsonl")
    q = write_lines(tmp_path, [json.dumps(GOOD2)], name="typo.jsonl")
    return p, q


def test_resolve_sets_variant_set():
    vs = VariantSet.from_records([GOOD1], name="x")
    out = resolve_sets(vs)
    assert list(out) == ["x"] and out["x"] is vs


def test_resolve_sets_path(two_files):
    p, _ = two_files
    assert list(resolve_sets(p)) == ["paraphrase"]
    assert list(resolve_sets(str(p))) == ["paraphrase"]


def test_resolve_sets_name_equals_path(two_files):
    p, _ = two_files
    out = resolve_sets(f"para={p}")
    assert list(out) == ["para"] and out["para"][0].id == "a"


def test_resolve_sets_dict(two_files):
    p, q = two_files
    vs = VariantSet.from_records([GOOD1], name="inner")
    out = resolve_sets({"renamed": vs, "t": q, "p": str(p)})
    assert list(out) == ["renamed", "t", "p"]
    assert out["renamed"].name == "renamed" and out["renamed"][0].id == "a"
    assert out["t"].name == "t" and out["t"][0].id == "b"


def test_resolve_sets_list(two_files):
    p, q = two_files
    vs = VariantSet.from_records([GOOD1], name="mem")
    out = resolve_sets([vs, p, f"other={q}"])
    assert list(out) == ["mem", "paraphrase", "other"]


def test_resolve_sets_duplicate_names_rejected(two_files):
    p, _ = two_files
    vs = VariantSet.from_records([GOOD1], name="paraphrase")
    with pytest.raises(SagoInputError, match="two variant sets are named 'paraphrase'"):
        resolve_sets([vs, p])
    with pytest.raises(SagoInputError, match="two variant sets are named 'paraphrase'"):
        resolve_sets([p, p])


def test_resolve_sets_bad_inputs(tmp_path):
    with pytest.raises(SagoInputError, match="no variant sets given"):
        resolve_sets([])
    with pytest.raises(SagoInputError, match="expected a VariantSet"):
        resolve_sets(42)  # type: ignore[arg-type]
    with pytest.raises(SagoInputError, match="file not found"):
        resolve_sets(f"x={tmp_path / 'nope.jsonl'}")


def test_reference_aliases_round_trip_and_the_first_is_scored(tmp_path):
    from sago_train.data.groups import reference_aliases

    g = VariantGroup(id="ua", variants=["Capital of Ukraine?", "Ukraine's capital?"], reference=["Kyiv", "Kiev"])
    assert g.references == ["Kyiv", "Kiev"] and g.primary_reference == "Kyiv"
    assert g.to_dict()["reference"] == ["Kyiv", "Kiev"]
    one = VariantGroup(id="fr", variants=["a", "b"], reference=" Paris")
    assert one.references == [" Paris"] and one.primary_reference == " Paris"
    none = VariantGroup(id="n", variants=["a", "b"])
    assert none.references == [] and none.primary_reference is None
    assert reference_aliases(None) == [] and reference_aliases("x") == ["x"]
    path = tmp_path / "s.jsonl"
    VariantSet("s", [g, one]).to_jsonl(path)
    back = VariantSet.from_jsonl(path)
    assert back[0].reference == ["Kyiv", "Kiev"] and back[1].reference == " Paris"
