"""One process per run directory: the run lock (``<output_dir>/sago/run.lock``). Re-exported by
:mod:`sago_train.io`, the module every writer imports."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any

from .errors import SagoInputError

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
    root = Path(directory)
    if root.is_symlink():  # the run's own folder (<output_dir>/sago): a link would put the run's files elsewhere
        raise SagoInputError(f"{root} is a symbolic link; sago_train never writes through one",
                             hint="remove it (the folder is created afresh), or choose another output directory")
    root.mkdir(parents=True, exist_ok=True)
    path = _lock_path(root)
    if path in _held:
        f, n = _held[path]
        _held[path] = (f, n + 1)
        return path
    while True:
        f = _open_lock_file(path)
        try:
            import fcntl

            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # no flock (Windows): the pid in the file decides
            owner = _lock_owner(path)
            if owner.get("pid") and owner.get("host") == socket.gethostname() and _pid_alive(int(owner["pid"])):
                f.close()
                raise SagoInputError(_locked_message(root, owner)) from None
            break
        except OSError:
            owner = _lock_owner(path)
            f.close()
            raise SagoInputError(_locked_message(root, owner),
                                 hint="wait for it to finish, or choose another output directory") from None
        # The releasing owner removes the file: a lock won on a file that was removed meanwhile (opened just
        # before the removal) holds nothing that the next process would see, so take the current file again.
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()
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


def _lock_path(root: Path) -> Path:
    # The folder resolved, the file itself not: a symlink named run.lock is refused, never followed.
    return root.resolve() / LOCK_NAME


def _open_lock_file(path: Path) -> Any:
    """The lock file opened for reading and writing, created if missing; a symlink or a non-regular file in its
    place is refused (writing through it would truncate whatever it points to)."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if path.is_symlink():
            raise SagoInputError(f"{path} is a symbolic link; sago_train never writes through one",
                                 hint="remove it (the run's lock file is created afresh)") from None
        raise SagoInputError(f"cannot open the lock file {path}: {err.strerror or err}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SagoInputError(f"{path} is not a regular file", hint="remove it (the run's lock file is created afresh)")
    return os.fdopen(fd, "r+", encoding="utf-8")


def release_run_lock(directory: str | os.PathLike[str]) -> None:
    """Drop one hold of :func:`acquire_run_lock`; the last one removes the file and unlocks, so a clean run
    leaves no lock file behind (a dead owner's file, with its pid, stays: a stale lock the next run takes over)."""
    path = _lock_path(Path(directory))
    if path not in _held:
        return
    f, n = _held[path]
    if n > 1:
        _held[path] = (f, n - 1)
        return
    del _held[path]
    with contextlib.suppress(OSError):
        os.unlink(path)  # before unlocking: a process that opens it now creates a new file
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
