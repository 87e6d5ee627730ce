"""The one reader of user JSONL (bounded, located errors), atomic writes, safe names, the one check of an output
path (:func:`check_output_path`: never an input, never through a link, writable) and backups that never reuse a
name; the run lock (:mod:`sago_train.runlock`) is re-exported here."""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Container, Iterator, Mapping
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
    keep: Container[int] | None = None,
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, parsed_object)`` for each non-blank line, with located errors.

    The file is streamed one line at a time: a non-regular file (FIFO, device) or one larger than
    ``max_file_bytes`` is refused before reading, and a line longer than ``max_line_bytes`` is refused
    without being held whole. A line that does not parse (malformed JSON, invalid UTF-8, a key given twice in
    one object) raises, or, with ``on_bad_line``, is handed to it as the located error and skipped. ``keep``:
    only the records of these indices (0-based over non-blank lines) are parsed, the others only counted."""
    for index, (lineno, raw) in enumerate(_raw_lines(path, max_file_bytes, max_line_bytes, what)):
        if keep is not None and index not in keep:
            continue
        try:
            value = _parse_line(raw[:-1] if raw.endswith(b"\n") else raw, str(path), lineno)
        except SagoInputError as err:
            if on_bad_line is None:
                raise
            on_bad_line(err)
            continue
        yield lineno, value


def count_records(path: str | os.PathLike[str], *, max_file_bytes: int = MAX_SET_FILE_BYTES,
                  max_line_bytes: int = MAX_LINE_BYTES, what: str = "JSONL file") -> int:
    """How many records (non-blank lines) :func:`read_jsonl` would yield, read with the same bounds, unparsed."""
    return sum(1 for _ in _raw_lines(path, max_file_bytes, max_line_bytes, what))


def _raw_lines(path: str | os.PathLike[str], max_file_bytes: int, max_line_bytes: int,
               what: str) -> Iterator[tuple[int, bytes]]:
    """``(line_number, bytes)`` of each non-blank line, within the limits (see :func:`read_jsonl`)."""
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
            if raw.strip():
                yield lineno, raw


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique: a key given twice (which json would resolve silently, the last one
    winning) is an error naming it."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def _parse_line(raw: bytes, source: str, lineno: int) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SagoInputError(
            f"not valid UTF-8 (byte {err.start})", source=source, line=lineno, hint="save the file as UTF-8"
        ) from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except _DuplicateKey as dup:
        raise SagoInputError(f"key {short_repr(dup.key)} is given twice in one object", source=source, line=lineno,
                             key=dup.key[:100], hint="JSON keeps only the last; remove one of them") from None
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
    atomic_write_files({Path(path): data})


def atomic_write_files(files: Mapping[str | os.PathLike[str], bytes],
                       before_replace: Callable[[], object] | None = None) -> None:
    """Several files written as one: every temporary file is written and synced first, then each is renamed into
    place, so a failure while writing (a full disk) leaves every previous file as it was, never half a set.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> atomic_write_files({d / "a.json": b"{}", d / "b.json": b"[]"})
        >>> sorted(p.name for p in d.iterdir())
        ['a.json', 'b.json']
    """
    written: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            written.append((tmp, path))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, _default_mode())
        if before_replace is not None:  # every new file is on disk: only now may the old ones be moved
            before_replace()
        while written:
            tmp, path = written[0]
            os.replace(tmp, path)
            written.pop(0)
    except BaseException:
        for tmp, _ in written:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """:func:`atomic_write_bytes` of UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def jsonl_bytes(records: list[dict[str, Any]]) -> bytes:
    """JSON Lines as written to disk (UTF-8, no NaN)."""
    return "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in records).encode("utf-8")


def json_bytes(obj: Any) -> bytes:
    """An indented JSON document as written to disk (UTF-8, no NaN)."""
    return (json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def atomic_write_jsonl(path: str | os.PathLike[str], records: list[dict[str, Any]]) -> None:
    atomic_write_bytes(path, jsonl_bytes(records))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_bytes(path, json_bytes(obj))


# ------------------------------------------------------------------ output paths
def first_link(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> Path | None:
    """The first component of ``path`` below ``root`` (``path`` itself included) that is a symbolic link, else
    None; both taken as written (absolute, not resolved), so a link the user chose as ``root`` is not counted.

    Example:
        >>> first_link("/tmp/sago-no-such/run/sago/history.jsonl", "/tmp/sago-no-such/run") is None
        True
    """
    absolute, base = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    try:
        parts = absolute.relative_to(base).parts
    except ValueError:
        return None
    probe = base
    for part in parts:
        probe = probe / part
        if probe.is_symlink():
            return probe
        if not probe.exists():
            return None
    return None


def check_output_path(
    path: str | os.PathLike[str],
    *,
    what: str = "output",
    directory: bool = False,
    inputs: Mapping[str, str | os.PathLike[str]] | None = None,
    root: str | os.PathLike[str] | None = None,
) -> Path:
    """Check a path a command will write, before any work, and return it; every writer checks its outputs here.

    Refused, each with one line naming the path: a file where a directory goes or a directory where a file goes;
    a place that cannot be written (tried by creating a file: ``os.access`` says yes to root also on ``/proc``
    or a read-only mount); a path that is one of the command's ``inputs`` (``{what it is: path}``, compared
    resolved, so writing would replace what was read); a symbolic link where a file goes, or any link below
    ``root`` (the directory the user chose), which would send the writes outside it.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> check_output_path(os.path.join(d, "summary.json"), what="--out").name
        'summary.json'
        >>> check_output_path(d, what="--out", directory=True) == Path(d)
        True
    """
    p = Path(path)
    absolute = Path(os.path.abspath(p))
    # A link the user named as a directory is their choice; a link in the place of a file, or anywhere below the
    # chosen directory, would make the write land elsewhere (or truncate what it points to).
    base = root if root is not None else (absolute if directory else absolute.parent)
    link = first_link(absolute, base)
    if link is not None:
        raise SagoInputError(f"{what} {link} is a symbolic link; sago_train never writes through one",
                             hint="remove the link, or choose a path without one")
    if directory and absolute.exists() and not absolute.is_dir():
        raise SagoInputError(f"{what} {p} exists and is not a directory",
                             hint="choose a new directory name or remove the file")
    if not directory and absolute.is_dir():
        raise SagoInputError(f"{what} {p} is a directory, expected a file",
                             hint=f"give a file name, e.g. {p / 'out.json'}" if not p.suffix else
                             "remove the directory or choose another name")
    for label, source in (inputs or {}).items():
        if os.path.exists(source) and absolute.exists() and os.path.samefile(source, absolute):
            raise SagoInputError(f"{what} {p} is {label}, an input of this command: writing it would replace "
                                 "what was read", hint="choose another output path")
    probe = absolute if directory else absolute.parent
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise SagoInputError(f"cannot create {what} {p}: {probe} is a file, not a directory")
    try:  # tried, not asked: os.access says yes to root everywhere, also where writing fails
        fd, tmp = tempfile.mkstemp(prefix=".sago-write-check.", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as err:
        raise SagoInputError(f"{what} {p} is not writable ({probe}: {err.strerror})",
                             hint="choose a directory you can write to") from None
    return p


def check_output_dir(path: str | os.PathLike[str], *, what: str = "output directory") -> Path:
    """:func:`check_output_path` of a directory: fail now, before any model loads or evaluation runs, if
    ``path`` cannot become a writable directory."""
    return check_output_path(path, what=what, directory=True)


def set_aside(path: str | os.PathLike[str], *, suffix: str = "old") -> Path:
    """Move ``path`` to ``<name>.<time>.<suffix>`` beside it and return the new path. A name that exists is never
    reused (two calls in one second get ``<time>.1``, ...): each move links the file under a name the kernel
    refuses to give twice, then removes the old name, so no earlier copy is ever replaced.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> for _ in range(2):
        ...     _ = (d / "h.jsonl").write_text("x")
        ...     _ = set_aside(d / "h.jsonl")
        >>> len(list(d.glob("h.jsonl.*.old")))
        2
    """
    p = Path(path)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(10_000):
        aside = p.with_name(f"{p.name}.{stamp}{'' if n == 0 else f'.{n}'}.{suffix}")
        try:
            os.link(p, aside)  # fails if the name exists: never replaces an earlier copy
        except FileExistsError:
            continue
        except OSError:  # no hard links here (some network or FAT file systems): check, then rename
            if os.path.lexists(aside):
                continue
            os.rename(p, aside)
            return aside
        os.unlink(p)
        return aside
    raise SagoInputError(f"cannot set {p} aside: 10,000 copies of it exist already", hint="remove old copies")


from .runlock import LOCK_NAME, acquire_run_lock, release_run_lock  # noqa: E402 - re-exported: one import for writers

__all__ = ["LOCK_NAME", "acquire_run_lock", "atomic_write_bytes", "atomic_write_json", "atomic_write_jsonl",
           "atomic_write_files", "atomic_write_text", "check_output_dir", "check_output_path", "count_records", "find_lone_surrogate", "first_link",
           "is_safe_name", "json_bytes", "jsonl_bytes", "read_escapes", "read_jsonl", "release_run_lock", "safe_child", "set_aside",
           "validate_set_name"]
