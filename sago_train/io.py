"""Atomic writes and output paths that cannot escape their directory."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .data.groups import validate_set_name


def safe_child(directory: str | os.PathLike[str], name: str, suffix: str = "") -> Path:
    """``directory/name+suffix`` where ``name`` comes from data (a set name): it must be a plain file name.

    Example:
        >>> safe_child("/tmp/out", "paraphrase", ".jsonl").name
        'paraphrase.jsonl'
    """
    validate_set_name(name)
    root = Path(directory).resolve()
    path = (root / f"{name}{suffix}").resolve()
    if path.parent != root:
        raise ValueError(f"refusing to write outside {root}: {path}")
    return path


def _default_mode() -> int:
    # mkstemp creates 0600 files; results should get the permissions an ordinary open() would give.
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write via a temporary file in the same directory and ``os.replace``: readers never see half a file,
    and a crash leaves the previous version intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _default_mode())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """:func:`atomic_write_bytes` of UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_jsonl(path: str | os.PathLike[str], records: list[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in records))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
