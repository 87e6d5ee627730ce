"""A variant set file whose only valid lines are the ones a capped evaluation runs, and a meter of the bytes
parsed: together they show that a monitored set is read lazily (issue 22).

A capped evaluation runs a seeded subset of a set's groups (:func:`sago_train.data.groups.subset_indices`, over
the whole file): every other line here is malformed JSON of ``GARBAGE_BYTES`` bytes, so a reader that parses
it fails, and the meter shows that only the kept lines were parsed (the others are counted, unparsed).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sago_train.io
from sago_train.data.groups import subset_indices

GARBAGE_BYTES = 200_000


def set_with_garbage_outside_the_subset(path: Path, *, n: int, max_groups: int, seed: int = 0,
                                        name: str | None = None) -> tuple[list[str], int]:
    """Write ``n`` lines to ``path``: a group at each index a ``max_groups`` evaluation with ``seed`` runs,
    garbage elsewhere. Returns the kept ids, in file order, and their lines' bytes (newlines excluded)."""
    keep = set(subset_indices(n, max_groups, seed, name if name is not None else path.stem))
    ids, kept_bytes = [], 0
    with open(path, "wb") as f:
        for i in range(n):
            if i in keep:
                line = json.dumps({"id": f"g{i}", "variants": [f"The number {i} is", f"number {i}:"],
                                   "reference": f" {i}"}).encode()
                ids.append(f"g{i}")
                kept_bytes += len(line)
            else:
                line = b"{not json " + b"x" * GARBAGE_BYTES
            f.write(line + b"\n")
    return ids, kept_bytes


@contextmanager
def parsed_bytes(monkeypatch) -> Iterator[dict[str, int]]:
    """``{source path: bytes parsed}`` while the block runs (every JSONL reader parses through one function)."""
    seen: dict[str, int] = {}
    parse = sago_train.io._parse_line

    def counting(raw: bytes, source: str, lineno: int):
        seen[source] = seen.get(source, 0) + len(raw)
        return parse(raw, source, lineno)

    monkeypatch.setattr(sago_train.io, "_parse_line", counting)
    yield seen
