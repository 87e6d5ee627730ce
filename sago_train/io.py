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


def check_output_dir(path: str | os.PathLike[str], *, what: str = "output directory") -> Path:
    """Fail now, before any model loads or evaluation runs, if ``path`` cannot become a writable directory:
    it names an existing file, or the directory (or its nearest existing parent) is not writable."""
    from .errors import SagoInputError

    p = Path(path)
    if p.exists() and not p.is_dir():
        raise SagoInputError(f"{what} {p} exists and is not a directory",
                             hint="choose a new directory name or remove the file")
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise SagoInputError(f"cannot create {what} {p}: {probe} is a file, not a directory")
    # Try it: os.access says yes to root everywhere, also where writing fails (/proc, a read-only mount).
    try:
        fd, tmp = tempfile.mkstemp(prefix=".sago-write-check.", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as err:
        raise SagoInputError(f"{what} {p} is not writable ({probe}: {err.strerror})",
                             hint="choose a directory you can write to") from None
    return p


# ------------------------------------------------------------------ one process per run directory
LOCK_NAME = "run.lock"
_held: dict[Path, tuple[Any, int]] = {}  # lock path -> (open file, how many holders in this process)


def _lock_owner(path: Path) -> dict[str, Any]:
    try:
        owner = json.loads(path.read_text(encoding="utf-8")[:4096] or "{}")
        return owner if isinstance(owner, dict) else {}
    except (OSError, ValueError):
        return {}


def acquire_run_lock(directory: str | os.PathLike[str]) -> Path:
    """Hold ``directory/run.lock`` for this process: a second process on the same run directory is refused
    while the first is alive, so neither can replace the other's history.

    The lock is an advisory ``flock`` on a file that records the owner's pid, host and start time. The kernel
    drops it when the owner dies (even by SIGKILL), so a lock left by a dead process is stale by construction:
    the next run takes it over (and logs whose it was). Re-acquiring in the same process is allowed (a resumed
    ``train()``, the CLI and the callback). Raises :class:`sago_train.errors.SagoInputError` naming the owner."""
    import logging
    import socket
    import time

    from .errors import SagoInputError

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    path = (root / LOCK_NAME).resolve()
    if path in _held:
        f, n = _held[path]
        _held[path] = (f, n + 1)
        return path
    f = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - kept open while the lock is held
    try:
        import fcntl

        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # no flock (Windows): the pid in the file decides
        owner = _lock_owner(path)
        if owner.get("pid") and owner.get("host") == socket.gethostname() and _pid_alive(int(owner["pid"])):
            f.close()
            raise SagoInputError(_locked_message(root, owner)) from None
    except OSError:
        owner = _lock_owner(path)
        f.close()
        raise SagoInputError(_locked_message(root, owner),
                             hint="wait for it to finish, or choose another output directory") from None
    previous = _lock_owner(path)
    if previous.get("pid") and previous.get("pid") != os.getpid():
        logging.getLogger(__name__).warning(
            "sago: taking over the stale lock %s of pid %s on %s (no longer running)", path, previous.get("pid"),
            previous.get("host"))
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}) + "\n")
    f.flush()
    _held[path] = (f, 1)
    return path


def release_run_lock(directory: str | os.PathLike[str]) -> None:
    """Drop one hold of :func:`acquire_run_lock`; the last one empties the file and unlocks."""
    path = (Path(directory) / LOCK_NAME).resolve()
    if path not in _held:
        return
    f, n = _held[path]
    if n > 1:
        _held[path] = (f, n - 1)
        return
    del _held[path]
    try:  # an empty file means "released cleanly"; a dead owner's pid left in it means a stale lock
        f.seek(0)
        f.truncate()
    except OSError:
        pass
    f.close()  # closing the descriptor releases the flock


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _locked_message(root: Path, owner: dict[str, Any]) -> str:
    who = f"process {owner.get('pid', '?')} on {owner.get('host', '?')}" if owner else "another process"
    return f"output directory {root} is in use by {who} (lock file {root / LOCK_NAME})"
