"""The shipped tiny model, its tokenizer, the bundled variant sets and the demo data."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sago_train.data import VariantSet
from sago_train.functional.text import words
from sago_train.model.tiny import TINY_MODEL_PATH, load_tiny_model, tiny_model_path

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "sago_train" / "assets"
SET_NAMES = ("paraphrase", "format", "typo")
# Measured when the shipped model was built (see assets/tiny-llama/README.md): canonical accuracy on the
# paraphrase set is 1.0; the threshold leaves room for float differences across CPUs, not for a broken model.
MIN_CANONICAL_ACCURACY = 0.9


@pytest.fixture(scope="module")
def tiny() -> tuple:
    return load_tiny_model()


def greedy(model, tokenizer, prompts: list[str], max_new_tokens: int = 12) -> list[str]:
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def prefix_correct(output: str, reference: str) -> bool:
    ref = words(reference)
    return words(output)[: len(ref)] == ref


def test_model_loads_from_package_path(tiny) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert tiny_model_path() == str(TINY_MODEL_PATH)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path(), local_files_only=True)
    assert model.config.model_type == "llama"
    assert model.config.num_hidden_layers == 4 and len(model.model.layers) == 4
    assert model.config.vocab_size == len(tokenizer) == 259
    assert next(model.parameters()).dtype == torch.float32
    size_mb = (TINY_MODEL_PATH / "model.safetensors").stat().st_size / 1e6
    assert 1.0 <= size_mb <= 5.0
    gen = json.loads((TINY_MODEL_PATH / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (1, 2, 0)
    model_bf16, _ = load_tiny_model(dtype=torch.bfloat16)
    assert next(model_bf16.parameters()).dtype == torch.bfloat16


def test_tokenizer_bos_no_eos_and_round_trip(tiny) -> None:
    _, tok = tiny
    assert tok.is_fast
    ids = tok("The capital of France is")["input_ids"]
    assert ids[0] == tok.bos_token_id == 1
    assert tok.eos_token_id not in ids
    assert len(ids) == 1 + len(b"The capital of France is")  # one token per byte
    assert tok("hi", add_special_tokens=False)["input_ids"] == [3 + ord("h"), 3 + ord("i")]
    for text in ("Café ☕ naïve", " Paris.", "a  b\tc\nd", "日本語 🙂 'quoted' ."):
        assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text


def test_chat_template_renders_with_generation_prompt(tiny) -> None:
    _, tok = tiny
    messages = [{"role": "user", "content": "The capital of France is"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "User: The capital of France is\nAssistant:"
    assert tok.apply_chat_template(messages, tokenize=False) == "User: The capital of France is\n"
    # BOS comes from the tokenizer's default encoding, not the template, so it is never doubled.
    assert tok(text)["input_ids"].count(tok.bos_token_id) == 1


@pytest.mark.parametrize("name", SET_NAMES)
def test_bundled_sets_load_with_aligned_kinds(name: str) -> None:
    vs = VariantSet.from_jsonl(ASSETS / "sets" / f"{name}.jsonl")
    assert vs.name == name and 24 <= len(vs) <= 32
    assert vs.kinds is not None and len(vs.kinds) == 4 and vs.kinds[0] == "canonical"
    for g in vs:
        assert g.k == 4 and g.canonical == 0 and g.reference and g.reference.startswith(" ")
        assert len(set(g.variants)) == 4  # every variant differs from the canonical phrasing
    other = [VariantSet.from_jsonl(ASSETS / "sets" / f"{n}.jsonl") for n in SET_NAMES]
    assert all([g.id for g in o] == [g.id for g in vs] for o in other)  # same facts in every set


@pytest.mark.parametrize("name", SET_NAMES)
def test_demo_monitoring_sets(name: str) -> None:
    vs = VariantSet.from_jsonl(ASSETS / "demo" / f"{name}.jsonl")
    assert vs.kinds == VariantSet.from_jsonl(ASSETS / "sets" / f"{name}.jsonl").kinds
    train = [json.loads(line) for line in (ASSETS / "demo" / "train.jsonl").read_text().splitlines()]
    train_prompts = {r["prompt"] for r in train}
    for g in vs:
        seen = [v in train_prompts for v in g.variants]
        # Only the canonical variant of a "trained" fact was seen in training; held-out facts not at all.
        assert seen == ([True, False, False, False] if g.meta["split"] == "trained" else [False] * 4)
    assert {g.meta["split"] for g in vs} == {"trained", "heldout"}


def test_demo_training_data_single_phrasing_and_not_pretrained() -> None:
    train = [json.loads(line) for line in (ASSETS / "demo" / "train.jsonl").read_text().splitlines()]
    groups = [json.loads(line) for line in (ASSETS / "demo" / "groups.jsonl").read_text().splitlines()]
    assert train and all(set(r) == {"prompt", "completion"} for r in train)
    assert all(r["prompt"].startswith("The opposite of ") and r["prompt"].endswith(" is") for r in train)
    assert [g["variants"][0] for g in groups] == [r["prompt"] for r in train]
    assert [g["target"] for g in groups] == [r["completion"] for r in train]
    assert all(len(g["variants"]) == 4 for g in groups)
    # The demo family is absent from the pretraining corpus.
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import build_tiny_model
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert not any("opposite" in t.lower() for t in build_tiny_model.training_texts())


def test_canonical_accuracy_beats_held_out_kinds(tiny) -> None:
    model, tok = tiny
    vs = VariantSet.from_jsonl(ASSETS / "sets" / "paraphrase.jsonl")
    kinds = vs.kinds
    assert kinds is not None
    acc = {}
    for k, kind in enumerate(kinds):
        outs = greedy(model, tok, [g.variants[k] for g in vs])
        acc[kind] = sum(prefix_correct(o, g.reference) for o, g in zip(outs, vs)) / len(vs)
    assert acc["canonical"] >= MIN_CANONICAL_ACCURACY, acc
    assert acc["canonical"] > min(acc[k] for k in kinds[1:]), acc


def test_generation_stops_at_eos(tiny) -> None:
    model, tok = tiny
    enc = tok(["The capital of France is"], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=20, do_sample=False)
    new = out[0, enc["input_ids"].shape[1]:].tolist()
    assert new[-1] == tok.eos_token_id and len(new) < 20
    assert tok.decode(new, skip_special_tokens=True) == " Paris."


@pytest.mark.slow
def test_build_is_reproducible(tmp_path: Path) -> None:
    digests = []
    for run in ("a", "b"):
        out = tmp_path / run
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "build_tiny_model.py"), "--steps", "3", "--out", str(out),
             "--no-sets", "--no-eval"],
            check=True,
            capture_output=True,
            timeout=300,
        )
        digests.append(hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest())
    assert digests[0] == digests[1]


def test_sets_are_regenerated_identically(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import build_tiny_model
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    build_tiny_model.write_sets(tmp_path / "sets")
    build_tiny_model.write_demo(tmp_path / "demo")
    for sub, names in (("sets", SET_NAMES), ("demo", (*SET_NAMES, "train", "groups"))):
        for name in names:
            shipped = (ASSETS / sub / f"{name}.jsonl").read_bytes()
            assert (tmp_path / sub / f"{name}.jsonl").read_bytes() == shipped, f"{sub}/{name}.jsonl is stale"
