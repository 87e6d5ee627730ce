"""The tiny byte-level Llama shipped with sago_train, for tests, demos and trying the tool offline.

The model (4 decoder layers, ~0.9M parameters, ~3.5 MB) was trained from scratch on short synthetic facts by
``scripts/build_tiny_model.py``. It answers the phrasings it was trained on and is unreliable on held-out
rewordings, format changes and typos, which is what the bundled variant sets (``sago_train/assets/sets``)
probe. It loads through the ordinary Hugging Face path, so anything that accepts a model folder accepts
:func:`tiny_model_path`.

Example:
    >>> from sago_train.model.tiny import load_tiny_model
    >>> model, tokenizer = load_tiny_model()
    >>> model.config.num_hidden_layers
    4
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch and transformers load only when a model is loaded, so the path costs nothing
    import torch

#: Folder of the shipped model (``config.json``, ``model.safetensors``, ``tokenizer.json``, ...).
TINY_MODEL_PATH: Path = Path(__file__).resolve().parent.parent / "assets" / "tiny-llama"


def tiny_model_path() -> str:
    """The shipped model's folder as a string, for ``from_pretrained`` or ``sago-train eval --model``.

    Raises:
        FileNotFoundError: the folder has no ``model.safetensors`` (an install without package data, or a
            checkout where the model was not built: run ``python scripts/build_tiny_model.py``).
    """
    if not (TINY_MODEL_PATH / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"the tiny model is missing from {TINY_MODEL_PATH}; rebuild it with "
            "`python scripts/build_tiny_model.py` (or reinstall sago_train with its package data)"
        )
    return str(TINY_MODEL_PATH)


def load_tiny_model(dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """Load the shipped model and tokenizer, offline, in evaluation mode.

    Args:
        dtype: the model's ``torch.dtype``; ``None`` (the default) means ``torch.float32``, the stored precision.

    Returns:
        ``(model, tokenizer)``: a ``LlamaForCausalLM`` and a fast byte-level tokenizer that prepends ``<s>``,
        adds no ``</s>``, pads on the left with ``<pad>`` and has a ``User: ...\\nAssistant:`` chat template.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype if dtype is not None else torch.float32, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.eval(), tokenizer
