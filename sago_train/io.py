"""The one reader of user JSONL (bounded, located errors), atomic writes, safe names and output paths that
cannot escape their directory, and the run lock."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .errors import SagoInputError, short_repr
from .limits import MAX_LINE_BYTES, MAX_SET_FILE_BYTES, human_bytes, open_regular_file

# Names that become one path component (a set's file, a run's folder): no '/', no '..', at most 100 characters.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+\-]{0,99}$")


def is_safe_name(name: Any) -> bool:
    """Whether ``name`` is a single safe path component: letters, digits, '_', '-', '+', '.', no '..'."""
    return isinstance(name, str) and bool(_SAFE_NAME.match(name)) and ".." not in name


def read_escapes(text: str, *, key: str) -> str:
    r"""Backslash escapes typed on a command line (``\n`` -> newline), for stop strings given as flags (the
    ``sago-train eval --stop`` and ``--sago_stop_strings`` flags read them the same way).

    Example:
        >>> read_escapes(r"\n", key="stop") == "\n"
        True
    """
    try:
        return text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError as err:
        raise SagoInputError(f"cannot read the escapes in {short_repr(text)}: {err}", key=key) from None


def validate_set_name(name: str, **where: Any) -> str:
    """Check that ``name`` is safe as a file name component and return it."""
    if not is_safe_name(name):
        raise SagoInputError(
            f"invalid set name {short_repr(name)}: expected letters, digits, '_', '-', '+' or '.', starting with a "
            "letter or digit",
            hint="set names become file names, so they cannot contain '/' or '..'",
            **where,
        )
    return name


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON number")


# A JSON escape of a UTF-16 surrogate: only lines containing one can decode to a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def find_lone_surrogate(value: Any, path: str = "") -> tuple[str, str] | None:
    """``(where, char)`` of the first lone UTF-16 surrogate in a parsed JSON value, else None. JSON's
    ``"\\ud800"`` decodes to one; it is not valid Unicode, so no tokenizer or UTF-8 writer accepts it."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            found = _LONE_SURROGATE.search(item)
            if found:
                return where, found.group()
        elif isinstance(item, Mapping):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in reversed(list(item.items())))
            stack.extend((where, k) for k in item)
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(item))))
    return None


def read_jsonl(
    path: str | os.PathLike[str],
    *,
    max_file_bytes: int = MAX_SET_FILE_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
    what: str = "JSONL file",
    on_bad_line: Callable[[SagoInputError], None] | None = None,
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, parsed_object)`` for each non-blank line, with located errors.

    The file is streamed one line at a time: a non-regular file (FIFO, device) or one larger than
    ``max_file_bytes`` is refused before reading, and a line longer than ``max_line_bytes`` is refused
    without being held whole. A line that does not parse (malformed JSON, invalid UTF-8) raises, or, with
    ``on_bad_line``, is handed to it as the located error and skipped."""
    p = Path(path)
    limit_name = "MAX_SET_FILE_BYTES" if max_file_bytes == MAX_SET_FILE_BYTES else ""
    with open_regular_file(p, max_bytes=max_file_bytes, what=what, limit_name=limit_name) as f:
        total = 0
        lineno = 0
        while True:
            raw = f.readline(max_line_bytes + 1)
            if not raw:
                return
            lineno += 1
            total += len(raw)
            if len(raw) > max_line_bytes:
                raise SagoInputError(
                    f"line longer than the limit of {human_bytes(max_line_bytes)} (MAX_LINE_BYTES)",
                    source=str(p), line=lineno, hint="each line must be one JSON object of reasonable size",
                )
            if total > max_file_bytes:  # the file grew while it was read
                raise SagoInputError(f"file longer than the limit of {human_bytes(max_file_bytes)}",
                                     source=str(p), line=lineno, hint="split it into smaller files")
            if lineno == 1:
                if raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]  # a UTF-8 byte-order mark is harmless; accept it
                elif raw.startswith((b"\xff\xfe", b"\xfe\xff")):
                    raise SagoInputError(
                        "not valid UTF-8: the file is UTF-16 (it starts with a UTF-16 byte-order mark)",
                        source=str(p), line=1, hint="save the file as UTF-8",
                    )
            if not raw.strip():
                continue
            try:
                value = _parse_line(raw[:-1] if raw.endswith(b"\n") else raw, str(p), lineno)
            except SagoInputError as err:
                if on_bad_line is None:
                    raise
                on_bad_line(err)
                continue
            yield lineno, value


def _parse_line(raw: bytes, source: str, lineno: int) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SagoInputError(
            f"not valid UTF-8 (byte {err.start})", source=source, line=lineno, hint="save the file as UTF-8"
        ) from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise SagoInputError(
            "malformed JSON: nested too deeply", source=source, line=lineno, hint="each line must be one JSON object"
        ) from None
    except (json.JSONDecodeError, ValueError) as err:
        msg = err.msg if isinstance(err, json.JSONDecodeError) else str(err)
        col = f" (column {err.colno})" if isinstance(err, json.JSONDecodeError) else ""
        raise SagoInputError(
            f"malformed JSON: {msg}{col}", source=source, line=lineno, hint="each line must be one JSON object"
        ) from None
    if _SURROGATE_ESCAPE.search(raw):
        found = find_lone_surrogate(value)
        if found is not None:
            where, char = found
            raise SagoInputError(
                f"a lone UTF-16 surrogate '{char.encode('unicode_escape').decode()}' is not valid Unicode text",
                source=source, line=lineno, key=where or None,
                hint="write the character itself, or a surrogate pair for characters outside the BMP",
            )
    return value


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
    root = Path(directory)
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
