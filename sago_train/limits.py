"""Limits on what sago_train reads, declared once (RELIABILITY.md states them), and the one way user files are
opened: a regular file only, never read past its limit.

A hostile or careless input (``/dev/zero``, a FIFO with no writer, a 50 MB line, a "billion laughs" YAML)
must end in one clear error or a counted skip, in bounded time and memory, never in a hang or an
out-of-memory crash.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .errors import MAX_ERROR_CHARS as _MAX_ERROR_CHARS
from .errors import MAX_REPR_CHARS as _MAX_REPR_CHARS
from .errors import SagoInputError

MiB = 1024 * 1024

# One JSONL line (one variant group, training record or example). Generous enough for a group with a few
# variants of MAX_VARIANT_CHARS each; what lies beyond is refused while reading, never held whole.
MAX_LINE_BYTES = 64 * MiB
# A variant set or a generator-examples file. A set this size holds far more groups than one evaluation
# runs (see SAGOConfig.max_groups) and parses in well under 2 GB of memory.
MAX_SET_FILE_BYTES = 128 * MiB
# Training data (data.train / data.eval of a recipe): loaded whole into the training dataset, so bounded too.
MAX_TRAIN_FILE_BYTES = 4096 * MiB
# Variants per group: a group is evaluated in one piece.
MAX_VARIANTS_PER_GROUP = 1024
# A variant (string, or all message contents of a chat variant) longer than this is not tokenized: its
# group is skipped and counted (docs/definitions.md#data: nothing is silently dropped). 1M characters is ~250k tokens,
# beyond the context of the models sago_train targets; tokenizing much more can exhaust memory.
MAX_VARIANT_CHARS = 1_000_000
# Prompt tokens allowed when the model does not declare its context length (otherwise its context applies).
MAX_VARIANT_TOKENS = 262_144
# A recipe file, and its size once YAML aliases are expanded (values + characters of strings, each alias
# counted as often as it is used): a "billion laughs" recipe is refused instead of expanded.
MAX_RECIPE_BYTES = 1 * MiB
MAX_RECIPE_EXPANDED = 1_000_000
# Bootstrap resamples of a confidence interval (SAGOConfig.n_bootstrap): one float each, per set and quantity;
# 2000 is the default, and past 100,000 the interval no longer moves at the digits reported.
MAX_BOOTSTRAP = 100_000
# New tokens per greedy generation (SAGOConfig.max_new_tokens) and sequences per batch (batch_size): a value past
# these asks for memory no model sago_train targets has (the longest contexts are a few hundred thousand tokens).
MAX_NEW_TOKENS = MAX_VARIANT_TOKENS
MAX_BATCH_SIZE = 65_536
# A number read back from a results file (history.jsonl, summary.json, group records): every axis is in [0, 1]
# and activation_rel a ratio near 1, so anything this large is a hand edit; refused, it cannot reach a plot.
MAX_RECORDED_VALUE = 1e9
# The same warning about many lines of one file (corrupt history lines) is logged this many times, then the
# rest are counted in one line ("... and 299,990 more corrupt lines").
MAX_REPEATED_WARNINGS = 10
# Seeds: what numpy's legacy seeding (transformers.set_seed, np.random.seed) takes; torch takes more.
MAX_SEED = 2**32 - 1
# Optimizer steps (a recipe's training.max_steps, the *_steps cadences, epochs): within a signed 32-bit counter,
# what every scheduler and progress bar counts in; no run sago_train targets comes near it.
MAX_TRAINING_STEPS = 2**31 - 1
#: Fresh variants drawn per group each time it is collated (``stability.fresh_variants``): each is one more
#: sequence in every forward of the group, so 64 is already 64x the memory of one prompt (``1e8`` was accepted).
MAX_FRESH_VARIANTS = 64
#: A loss weight or a temperature (``stability.act_weight``, ``temperature``, ...): finite and at most this.
MAX_LOSS_WEIGHT = 1e6
# Characters of a user value quoted in an error message, and of a whole message: declared where the messages
# are made (errors.py, which every module imports), listed here with the other limits.
MAX_REPR_CHARS = _MAX_REPR_CHARS
MAX_ERROR_CHARS = _MAX_ERROR_CHARS


def human_bytes(n: int) -> str:
    """``134217728`` -> ``"128 MiB"``; used in limit messages."""
    if n >= MiB:
        return f"{n / MiB:.4g} MiB"
    if n >= 1024:
        return f"{n / 1024:.4g} KiB"
    return f"{n} bytes"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular_file(path: str | os.PathLike[str], *, max_bytes: int, what: str = "file",
                      limit_name: str = "") -> BinaryIO:
    """Open ``path`` for reading in binary mode, refusing up front anything but a regular file no larger than
    ``max_bytes``. The file is opened non-blocking and checked on the open descriptor, so a FIFO with no
    writer is refused at once instead of blocking, and a file swapped after a check cannot slip through."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        noun = "recipe" if what == "recipe" else "file"  # the words users and scripts already match on
        raise SagoInputError(f"{noun} not found: {p}", hint="check the path") from None
    except IsADirectoryError:
        raise SagoInputError(f"{p} is a directory, expected a {what}") from None
    except OSError as err:
        raise SagoInputError(f"cannot open {what} {p}: {err.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _kind(st.st_mode)
            raise SagoInputError(f"{p} is {kind}, expected a {what}",
                                 hint="pass a regular file (pipes and devices are not read)")
        if st.st_size > max_bytes:
            raise SagoInputError(
                f"{p} is {human_bytes(st.st_size)}, over the limit of {human_bytes(max_bytes)} for a {what}"
                + (f" ({limit_name})" if limit_name else ""),
                hint="split it into smaller files",
            )
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded_text(path: str | os.PathLike[str], *, max_bytes: int = MAX_SET_FILE_BYTES,
                      what: str = "file") -> str:
    """A whole small file (templates, a JSON list of examples) as UTF-8 text (a BOM dropped), through
    :func:`open_regular_file`: never a FIFO or device, never more than ``max_bytes``."""
    with open_regular_file(path, max_bytes=max_bytes, what=what) as f:
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise SagoInputError(f"{path} grew past the limit of {human_bytes(max_bytes)} for a {what} while read")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SagoInputError("not valid UTF-8", source=str(path), hint="save the file as UTF-8") from None


@dataclass(frozen=True)
class NumberRange:
    """The numbers a setting takes: ``lo <= value <= hi`` (whole numbers when ``integer``), finite; ``ratio``: a
    number in (0, 1) too (a share of the total steps, as the Trainer reads ``logging_steps: 0.1``); ``also``:
    other values, each with what it means (``-1``: the epochs decide). ``limit_name`` names the limit in errors.

    Example:
        >>> NumberRange(1, 100, also=((-1, "no limit"),)).words()
        'an integer in [1, 100] or -1 (no limit)'
        >>> NumberRange(0, math.inf, integer=False).check(float("nan"), key="learning_rate")
        Traceback (most recent call last):
        ...
        sago_train.errors.SagoInputError: field 'learning_rate': expected a finite number >= 0, got nan
    """

    lo: float
    hi: float
    integer: bool = True
    ratio: bool = False
    also: tuple[tuple[float, str], ...] = ()
    limit_name: str = ""
    below: bool = False  # ``hi`` itself excluded: [lo, hi)

    def words(self) -> str:
        if self.hi == math.inf:
            text = f"{'an integer' if self.integer else 'a finite number'} >= {self.lo:,}"
        elif self.integer and self.lo == 1 and not self.ratio and not self.also:
            text = f"a positive integer up to {self.hi:,}"
        else:
            text = (f"{'an integer' if self.integer else 'a number'} in [{self.lo:,}, {self.hi:,}"
                    f"{')' if self.below else ']'}")
        text += f" ({self.limit_name})" if self.limit_name else ""
        if self.ratio:
            text += ", or a share of the total steps in (0, 1)"
        return text + "".join(f" or {value:g} ({meaning})" for value, meaning in self.also)

    def holds(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not self.ratio and not isinstance(value, int):
            return False  # 1e9 read as a float is not a count
        if not math.isfinite(value):
            return False
        if value in [v for v, _ in self.also] or (self.ratio and 0 < value < 1):
            return True
        if self.below and value >= self.hi:
            return False
        return self.lo <= value <= self.hi and (not self.integer or float(value).is_integer())

    def check(self, value: object, *, key: str, **where: object) -> object:
        """``value`` when it is in the range, else a located :class:`SagoInputError` saying the range."""
        if not self.holds(value):
            shown = repr(value) if isinstance(value, (int, float)) else type(value).__name__
            raise SagoInputError(f"expected {self.words()}, got {shown[:40]}", key=key,
                                 **where)  # type: ignore[arg-type]
        return value


def check_int_range(value: object, lo: int, hi: int, *, key: str, limit_name: str = "", **where: object) -> int:
    """``value`` as an integer in ``[lo, hi]``, else a located :class:`SagoInputError` naming the range (and the
    limit's name). Booleans and floats are refused (``1e9`` read as a float is not a count).

    Example:
        >>> check_int_range(7, 0, MAX_SEED, key="seed")
        7
        >>> check_int_range(-1, 0, MAX_SEED, key="seed")
        Traceback (most recent call last):
        ...
        sago_train.errors.SagoInputError: field 'seed': expected an integer in [0, 4,294,967,295], got -1
    """
    return NumberRange(lo, hi, limit_name=limit_name).check(value, key=key, **where)  # type: ignore[return-value]


def check_seed(value: object, *, key: str = "seed", **where: object) -> int:
    """A seed numpy, torch and Python's ``random`` all take: an integer in ``[0, MAX_SEED]``."""
    return check_int_range(value, 0, MAX_SEED, key=key, limit_name="MAX_SEED", **where)
