"""Loading models and tokenizers for SAGO evaluation (full models or PEFT adapter folders)."""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..errors import SagoInputError, unknown_name_error
from ..formatting import printable
from ..limits import read_bounded_text
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


#: The block count, as configs spell it (``n_layer`` for GPT-2 is mapped by its config's attribute_map).
BLOCK_COUNT = "num_hidden_layers"
logger = logging.getLogger(__name__)

#: Deprecation warnings that other libraries' own code raises in every run, and that no setting of ours avoids:
#: PEFT 0.21's get_peft_model and PeftModel.from_pretrained read transformers' deprecated
#: ``is_gradient_checkpointing``; TRL's SFTConfig sets the deprecated ``gradient_checkpointing`` argument by
#: default. Neither is the user's to fix, so a recipe run and an adapter's loading filter exactly these (``make
#: test`` filters them too, in pyproject).
OTHERS_DEPRECATIONS = (r"`is_gradient_checkpointing` is deprecated", r"`gradient_checkpointing` is deprecated")


@contextlib.contextmanager
def others_deprecations() -> Iterator[None]:
    """Ignore :data:`OTHERS_DEPRECATIONS` (FutureWarning) inside the block."""
    with warnings.catch_warnings():
        for message in OTHERS_DEPRECATIONS:
            warnings.filterwarnings("ignore", message=message, category=FutureWarning)
        yield


def check_block_count(folder: Path) -> None:
    """A local model folder's ``config.json`` must give its number of decoder blocks: without it transformers
    builds the config class's default (32 for Llama), loads the checkpoint's blocks into the first ones and leaves
    the rest freshly initialized, and every number measured on it is noise. Raises naming the file."""
    path = folder / "config.json"
    if not path.is_file():
        return  # from_pretrained says what is missing
    try:
        raw = json.loads(read_bounded_text(path, max_bytes=10 * 1024 * 1024, what="model config"))
    except ValueError:
        return  # from_pretrained reports malformed JSON
    if not isinstance(raw, dict):
        return
    from transformers import AutoConfig

    try:
        config_class = type(AutoConfig.for_model(raw["model_type"])) if isinstance(raw.get("model_type"), str) else None
    except (ValueError, KeyError):
        return  # an unknown model type: from_pretrained says so
    for section in (raw, raw.get("text_config")):
        if not isinstance(section, dict):
            continue
        names = {BLOCK_COUNT}
        text_class = getattr(config_class, "sub_configs", {}).get("text_config") if section is not raw else config_class
        amap = getattr(text_class, "attribute_map", {}) or {}
        names |= {v for k, v in amap.items() if k == BLOCK_COUNT} | {k for k, v in amap.items() if v == BLOCK_COUNT}
        if names & set(section):
            return
    raise SagoInputError(
        f"the model config gives no number of decoder blocks ({BLOCK_COUNT}): transformers would build its default "
        "and leave the blocks the checkpoint does not have freshly initialized", source=str(path), key=BLOCK_COUNT,
        hint="restore the key from the model's original config.json")


@contextlib.contextmanager
def _quiet_load_report() -> Iterator[None]:
    """transformers logs a multi-line load report for missing or unused weights; it is turned into one clear error
    (or one warning line) by :func:`_from_pretrained` instead."""
    report = logging.getLogger("transformers.modeling_utils")

    def not_the_report(record: logging.LogRecord) -> bool:
        # A filter, not a level: transformers checks that logger's level to decide other warnings.
        return "LOAD REPORT" not in str(record.msg)

    report.addFilter(not_the_report)
    try:
        yield
    finally:
        report.removeFilter(not_the_report)


def _from_pretrained(name: str, **kwargs: Any) -> Any:
    """``AutoModelForCausalLM.from_pretrained`` that refuses a checkpoint leaving weights newly initialized
    (missing from it, or of another shape): a model measured with random blocks gives numbers, all wrong."""
    from transformers import AutoModelForCausalLM

    with _quiet_load_report():
        model, info = AutoModelForCausalLM.from_pretrained(name, output_loading_info=True, **kwargs)
    fresh = sorted(info.get("missing_keys") or []) + sorted(str(k[0] if isinstance(k, tuple) else k)
                                                             for k in info.get("mismatched_keys") or [])
    if fresh:
        raise SagoInputError(
            f"could not load model '{name}': {len(fresh)} weight(s) are not in its checkpoint (or have another "
            f"shape) and would be newly initialized, e.g. {', '.join(fresh[:3])}", key="model",
            hint="check that config.json matches the checkpoint (the number of blocks, the sizes)")
    unused = sorted(info.get("unexpected_keys") or [])
    if unused:
        logger.warning("sago: %d weight(s) in the checkpoint of %s are not used by the model, e.g. %s", len(unused),
                       printable(name), printable(", ".join(unused[:3])))
    return model


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
    from transformers import AutoTokenizer

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
            if Path(base_name).is_dir():
                check_block_count(Path(base_name))
            base = _from_pretrained(base_name, **kwargs)
            with others_deprecations():
                model = PeftModel.from_pretrained(base, str(local))
            tok_src = str(local) if (local / "tokenizer_config.json").exists() else base_name
        else:
            if local.is_dir():
                check_block_count(local)
            model = _from_pretrained(str(path), **kwargs)
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
