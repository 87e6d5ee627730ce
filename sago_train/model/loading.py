"""Loading models and tokenizers for SAGO evaluation (full models or PEFT adapter folders)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..errors import SagoInputError, unknown_name_error
from .real import resolve_model_path

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return None
    if dtype not in DTYPES:
        raise unknown_name_error("dtype", dtype, DTYPES, key="dtype")
    return DTYPES[dtype]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _adapter_base(adapter: Path) -> str:
    """``base_model_name_or_path`` of a PEFT ``adapter_config.json``, or an error naming the file."""
    try:
        config = json.loads(adapter.read_text(encoding="utf-8")[:1_000_000])
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise SagoInputError(f"unreadable adapter config ({type(err).__name__})", source=str(adapter),
                             key="model") from None
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str) or not base.strip():
        raise SagoInputError(
            "a PEFT adapter config needs 'base_model_name_or_path' (the base model's folder or hub id), got "
            + ("no such key" if not isinstance(config, dict) or "base_model_name_or_path" not in config
               else f"{type(base).__name__ if base is not None else 'null'}"),
            source=str(adapter), key="model", hint="set it to the folder of the model the adapter was trained on")
    return base


def load_model_and_tokenizer(
    path: str | Path,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | None = None,
    trust_remote_code: bool = False,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a local folder (or a cached hub id).

    ``sago://tiny-llama`` names the shipped tiny model; ``sago://smollm2-135m-instruct`` and
    ``sago://gemma-3-270m`` the real models converted on first use (:mod:`sago_train.model.real`). A folder
    with ``adapter_config.json`` is a PEFT adapter: its base model is loaded and the adapter applied.
    ``trust_remote_code`` stays off unless asked for.

    Example:
        >>> from sago_train import load_model_and_tokenizer
        >>> model, tokenizer = load_model_and_tokenizer("sago://tiny-llama", device="cpu")
        >>> type(model).__name__
        'LlamaForCausalLM'
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer


    path = resolve_model_path(path)
    torch_dtype = parse_dtype(dtype)
    local = Path(path)
    if not local.exists() and (str(path).startswith((".", "/", "~")) or str(path).count("/") > 1):
        raise SagoInputError(f"model path does not exist: {path}", key="model", hint="pass a model folder")
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if torch_dtype is not None:
        kwargs["dtype"] = torch_dtype
    adapter = local / "adapter_config.json"
    try:
        if adapter.exists():
            try:
                from peft import PeftModel
            except ImportError as err:
                raise SagoInputError(
                    f"{path} is a PEFT adapter and peft is not installed", hint="pip install peft (a sago_train dependency)"
                ) from err
            base_name = _adapter_base(adapter)
            base = AutoModelForCausalLM.from_pretrained(base_name, **kwargs)
            model = PeftModel.from_pretrained(base, str(local))
            tok_src = str(local) if (local / "tokenizer_config.json").exists() else base_name
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
            tok_src = str(path)
        tokenizer = AutoTokenizer.from_pretrained(tok_src, trust_remote_code=trust_remote_code)
    except SagoInputError:
        raise
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SagoInputError(
            f"could not load model '{path}': {first}",
            key="model",
            hint="pass a local model folder; there is no network access to download from the Hub",
        ) from err
    model.to(device or default_device())
    model.eval()
    return model, tokenizer
