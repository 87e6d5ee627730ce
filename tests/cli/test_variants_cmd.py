"""`sago-train variants`: a valid, deterministic variant set from plain examples; one-line errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sago_train.cli.main import main
from sago_train.data import VariantSet

EXAMPLES = [
    {"id": "q1", "question": "What is 2+2?", "choices": ["3", "4", "5"], "answer": 1,
     "instruction": "Answer with a letter."},
    {"id": "q2", "question": "Which one is a colour?", "choices": ["red", "dog", "run"], "answer": 0,
     "instruction": "Answer with a letter."},
    {"id": "q3", "question": "the sky is", "choices": ["blue", "green"], "answer": 0},
]
ALL_FLAGS = ["--format", "--shuffle-options", "--typo-rate", "0.1", "--casing", "lower", "--whitespace"]


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def examples(tmp_path) -> Path:
    p = tmp_path / "examples.jsonl"
    p.write_text("".join(json.dumps(e) + "\n" for e in EXAMPLES))
    return p


def test_variants_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["variants", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--input", "--out", "--templates", "--instructions", "--typo-rate", "--casing", "--seed"):
        assert flag in out


def test_writes_a_valid_set(tmp_path, capsys, examples):
    instructions = tmp_path / "instr.txt"
    instructions.write_text("Answer briefly.\nPick the right option.\n")
    templates = tmp_path / "templates.txt"
    templates.write_text("Q: {prompt}\n---\nPlease answer.\n{prompt}\n")
    out = tmp_path / "sets" / "mc.jsonl"
    code, stdout, err = run_cli(["variants", "--input", str(examples), "--out", str(out), "--templates",
                                 str(templates), "--instructions", str(instructions), *ALL_FLAGS, "--seed", "3"],
                                capsys)
    assert code == 0, err
    vs = VariantSet.from_jsonl(out)
    assert vs.name == "mc" and len(vs) == 3
    # Fixed generator order, whatever the order of the flags.
    assert vs.kinds == ["canonical", "template", "format", "instruction", "option_shuffle", "typo", "casing",
                        "whitespace"]
    for g in vs:
        assert len(set(g.variants)) >= 2
        # The answer is remapped per variant: the option shown at the answer position is the right one.
        orders = g.meta["generation"]["choice_orders"]
        assert all(g.choices[orders[k][g.answer[k]]] == EXAMPLES[int(g.id[1]) - 1]["choices"][
            EXAMPLES[int(g.id[1]) - 1]["answer"]] for k in range(g.k))
    assert "wrote 3 groups, 24 variants" in stdout
    # "the sky is" is already lower case: the casing variant is unchanged and counted, not dropped.
    assert "casing 1/3" in stdout and "typo 0/3" in stdout


def test_deterministic_for_a_seed(tmp_path, capsys, examples):
    outs = []
    for i, seed in enumerate(["7", "7", "8"]):
        out = tmp_path / f"s{i}.jsonl"
        code, _, err = run_cli(["variants", "--input", str(examples), "--out", str(out), *ALL_FLAGS,
                                "--seed", seed, "--name", "same"], capsys)
        assert code == 0, err
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]


def test_name_option(tmp_path, capsys, examples):
    out = tmp_path / "file.jsonl"
    code, stdout, err = run_cli(["variants", "--input", str(examples), "--out", str(out), "--casing", "upper",
                                 "--name", "caps"], capsys)
    assert code == 0, err
    assert "set 'caps'" in stdout and "--set caps=" in stdout
    assert VariantSet.from_jsonl(out, name="caps").kinds == ["canonical", "casing"]


def _write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    "extra,expected",
    [
        ([], "no generator selected"),
        (["--casing", "loud"], "--casing: unknown casing mode 'loud'"),
        (["--typo-rate", "2"], "--typo-rate: typo rate must be in (0, 1]"),
        (["--templates", "{tmp}/missing.txt"], "--templates: file not found"),
        (["--templates", "{tmp}/bad_template.txt"], "template 0 uses {nope}"),
        (["--name", "../up", "--whitespace"], "invalid set name '../up'"),
        (["--input", "{tmp}/missing.jsonl", "--whitespace"], "file not found"),
        (["--input", "{tmp}/bad.jsonl", "--whitespace"], "bad.jsonl:2: malformed JSON"),
        (["--input", "{tmp}/free.jsonl", "--shuffle-options"], "has no 'choices' to shuffle"),
        (["--input", "{tmp}/qa.jsonl", "--whitespace"], "for a free-text answer use 'reference'"),
        (["--input", "{tmp}/empty_alias.jsonl", "--whitespace"], "alias 1 is empty"),
        (["--out", "{tmp}", "--whitespace"], "is a directory"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, examples, extra, expected):
    _write(tmp_path, "bad.jsonl", '{"prompt": "hi there"}\n{"prompt": \n')
    _write(tmp_path, "free.jsonl", '{"prompt": "hi there"}\n')
    _write(tmp_path, "qa.jsonl", '{"question": "What is the capital of France?", "answer": "Paris"}\n')
    _write(tmp_path, "empty_alias.jsonl", '{"question": "Capital of Ukraine?", "reference": ["Kyiv", " "]}\n')
    _write(tmp_path, "bad_template.txt", "Q: {nope}\n")
    extra = [x.replace("{tmp}", str(tmp_path)) for x in extra]
    args = ["variants", "--input", str(examples), "--out", str(tmp_path / "o.jsonl")]
    # A later --input/--out overrides the default one (argparse keeps the last).
    code, _, err = run_cli([*args, *extra], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("sago-train variants: error: ")
    assert expected in err
    assert not (tmp_path / "o.jsonl").exists()


def test_reference_aliases_pass_through_to_the_groups(tmp_path, capsys):
    examples = tmp_path / "ua.jsonl"
    examples.write_text('{"id": "ua", "question": "What is the capital of Ukraine?", "reference": ["Kyiv", "Kiev"]}\n')
    code, _, err = run_cli(["variants", "--input", str(examples), "--out", str(tmp_path / "o.jsonl"), "--casing",
                            "lower"], capsys)
    assert code == 0, err
    (g,) = VariantSet.from_jsonl(tmp_path / "o.jsonl").groups
    assert g.reference == ["Kyiv", "Kiev"]


def test_n_draws_several_seeded_variants_per_generator(tmp_path, capsys):
    """Issue 33: the CLI made one variant per generator, so it could not make several paraphrases per group."""
    examples = tmp_path / "free.jsonl"
    examples.write_text("".join(json.dumps({"id": f"e{i}", "prompt": f"The capital of country number {i} is",
                                            "reference": " X"}) + "\n" for i in range(4)))
    templates = tmp_path / "templates.txt"
    templates.write_text("Q: {prompt}\n---\nPlease answer.\n{prompt}\n---\nTell me: {prompt}\n---\n{prompt}?\n")
    out = tmp_path / "para.jsonl"
    argv = ["variants", "--input", str(examples), "--out", str(out), "--templates", str(templates), "--typo-rate",
            "0.2", "--n", "3", "--seed", "1"]
    code, stdout, err = run_cli(argv, capsys)
    assert code == 0, err
    vs = VariantSet.from_jsonl(out)
    assert vs.kinds == ["canonical", "template", "template-2", "template-3", "typo", "typo-2", "typo-3"]
    for g in vs:
        assert len(set(g.variants[4:])) == 3  # three different typo draws of one prompt
    assert any(len(set(g.variants[1:4])) > 1 for g in vs)  # the template draws differ too
    first = out.read_text()
    assert run_cli(argv, capsys)[0] == 0 and out.read_text() == first  # seeded: the same file again
    assert "7 per group" in stdout
    code, _, err = run_cli([*argv[:-4], "--n", "0"], capsys)
    assert code == 2 and "--n" in err


def test_the_kind_canonical_is_reserved_with_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "g", "variants": ["a?", "b?"], "kinds": ["paraphrase", "canonical"]}) + "\n")
    code, _, err = run_cli(["eval", "--set", f"bad={bad}", "--quiet", "--axes", "activation"], capsys)
    assert code == 2
    assert "kind 'canonical' is reserved for the group's canonical variant (index 0), but variant 1 has it" in err
    assert '"canonical": 1' in err
    from sago_train.data.generators import CallableGenerator
    from sago_train.errors import SagoInputError

    with pytest.raises(SagoInputError, match="reserved for the original variant") as info:
        CallableGenerator(lambda text, rng: text.upper(), name="canonical")
    assert "another name" in info.value.hint
