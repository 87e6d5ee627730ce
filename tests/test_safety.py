"""Safe defaults: no code execution from user data, trust_remote_code off, outputs stay in their folder."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sago_train.errors import SagoInputError

PKG = Path(__file__).resolve().parents[1] / "sago_train"


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else (
                f"{getattr(f.value, 'id', getattr(f.value, 'attr', '?'))}.{f.attr}" if isinstance(f, ast.Attribute) else "?")
            out.append((name, node))
    return out


def test_no_eval_exec_pickle_or_unsafe_loads_in_the_package():
    offenders = []
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n.split(".")[0] in ("pickle", "dill", "marshal", "shelve") for n in names):
                    offenders.append(f"{path.name}: imports {names}")
        for name, call in _calls(tree):
            if name in ("eval", "exec", "compile"):
                offenders.append(f"{path.name}:{call.lineno}: {name}()")
            if name == "torch.load" and not any(k.arg == "weights_only" for k in call.keywords):
                offenders.append(f"{path.name}:{call.lineno}: torch.load without weights_only")
            if name == "yaml.load":
                loader = next((k.value for k in call.keywords if k.arg == "Loader"), None)
                if not (isinstance(loader, ast.Name) and "Safe" in loader.id):
                    offenders.append(f"{path.name}:{call.lineno}: yaml.load without a safe loader")
            if name in ("yaml.unsafe_load", "yaml.full_load"):
                offenders.append(f"{path.name}:{call.lineno}: {name}")
    assert not offenders, offenders


def test_yaml_python_tags_are_rejected(tmp_path):
    from sago_train.cli.recipe import load_yaml

    p = tmp_path / "r.yaml"
    p.write_text("sago_train_version: '0.1.0'\nmodel: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(SagoInputError, match="r.yaml"):
        load_yaml(p)


def test_trust_remote_code_is_off_by_default(monkeypatch, saved_tiny_model):
    import transformers

    from sago_train.cli.recipe import ModelSection
    from sago_train.model.loading import load_model_and_tokenizer

    seen = {}
    real_model = transformers.AutoModelForCausalLM.from_pretrained
    real_tok = transformers.AutoTokenizer.from_pretrained

    def model_fp(*a, **k):
        seen["model"] = k.get("trust_remote_code")
        return real_model(*a, **k)

    def tok_fp(*a, **k):
        seen["tokenizer"] = k.get("trust_remote_code")
        return real_tok(*a, **k)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model_fp)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tok_fp)
    load_model_and_tokenizer(saved_tiny_model, device="cpu")
    assert seen == {"model": False, "tokenizer": False}
    assert ModelSection().trust_remote_code is False
    from sago_train.cli.main import build_parser

    args = build_parser().parse_args(["eval"])
    assert args.trust_remote_code is False


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".hidden", "x/../../y", "/abs"])
def test_set_names_from_data_cannot_escape_the_output_folder(tmp_path, name):
    from sago_train.data import VariantSet
    from sago_train.io import safe_child

    with pytest.raises(SagoInputError, match="invalid set name"):
        VariantSet.from_records([{"variants": ["a", "b"]}], name=name)
    with pytest.raises((SagoInputError, ValueError)):
        safe_child(tmp_path, name, ".jsonl")
