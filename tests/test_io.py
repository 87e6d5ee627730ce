"""sago_train.io: the one check of an output path, backups that never reuse a name, all-or-nothing writes, and the
JSONL reader's duplicate keys and partial reads."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from sago_train import io as sio
from sago_train.errors import SagoInputError
from sago_train.io import (
    atomic_write_files,
    check_output_path,
    count_records,
    first_link,
    read_jsonl,
    set_aside,
)


# ------------------------------------------------------------------ check_output_path
def test_an_output_that_is_an_input_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "s.jsonl"
    data.write_text('{"variants": ["a", "b"]}\n')
    with pytest.raises(SagoInputError, match=r"--out .*s\.jsonl is the set 's', an input of this command"):
        check_output_path(data, what="--out", inputs={"the set 's'": data})
    # The same file named another way (a relative path, a link to it) is still the input.
    link = tmp_path / "alias.jsonl"
    link.symlink_to(data)
    with pytest.raises(SagoInputError, match="an input of this command"):
        check_output_path(tmp_path / "sub" / ".." / "s.jsonl", what="--out", inputs={"the set": link})
    # A new file beside it is fine.
    assert check_output_path(tmp_path / "out.jsonl", inputs={"the set": data}).name == "out.jsonl"


def test_a_directory_where_a_file_goes_and_the_reverse(tmp_path: Path) -> None:
    (tmp_path / "summary.json").mkdir()
    with pytest.raises(SagoInputError, match="summary.json is a directory, expected a file"):
        check_output_path(tmp_path / "summary.json", what="--out")
    (tmp_path / "file").write_text("x")
    with pytest.raises(SagoInputError, match="exists and is not a directory"):
        check_output_path(tmp_path / "file", what="--out", directory=True)
    with pytest.raises(SagoInputError, match="is a file, not a directory"):
        check_output_path(tmp_path / "file" / "summary.json", what="--out")


def test_an_unwritable_place_is_tried_not_asked(tmp_path: Path) -> None:
    with pytest.raises(SagoInputError, match="is not writable"):
        check_output_path("/proc/sago-no-such/out.json", what="--json")
    assert not list(tmp_path.iterdir())


def test_links_below_the_chosen_directory_are_refused_a_chosen_link_is_not(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    (run / "sago").mkdir(parents=True)
    (run / "sago" / "step-2").symlink_to(outside)
    target = run / "sago" / "step-2" / "s.jsonl"
    assert first_link(target, run) == run / "sago" / "step-2"
    with pytest.raises(SagoInputError, match="step-2 is a symbolic link; sago_train never writes through one"):
        check_output_path(target, root=run)
    # A file named directly that is a link: refused (writing would replace the link or what it points to).
    (tmp_path / "out.json").symlink_to(outside / "x.json")
    with pytest.raises(SagoInputError, match="is a symbolic link"):
        check_output_path(tmp_path / "out.json", what="--json")
    # A directory the user chose that is a link is their choice.
    chosen = tmp_path / "chosen"
    chosen.symlink_to(outside)
    assert check_output_path(chosen / "summary.json", root=chosen).name == "summary.json"
    assert not list(outside.iterdir())


# ------------------------------------------------------------------ set_aside
def test_backups_never_reuse_a_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two overwrites in the same second used to give the same history.jsonl.<time>.old: the first was lost."""
    monkeypatch.setattr(sio.time, "strftime", lambda fmt: "20250101T000000")  # every call in the same second
    path = tmp_path / "history.jsonl"
    kept = []
    for i in range(3):
        path.write_text(f"run {i}\n")
        kept.append(set_aside(path))
    assert [p.name for p in kept] == ["history.jsonl.20250101T000000.old", "history.jsonl.20250101T000000.1.old",
                                      "history.jsonl.20250101T000000.2.old"]
    assert [p.read_text() for p in kept] == ["run 0\n", "run 1\n", "run 2\n"] and not path.exists()


def test_backups_without_hard_links_still_never_replace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "hard links not supported")

    monkeypatch.setattr(sio.os, "link", no_links)
    monkeypatch.setattr(sio.time, "strftime", lambda fmt: "T")
    path = tmp_path / "h"
    path.write_text("a")
    first = set_aside(path)
    path.write_text("b")
    second = set_aside(path)
    assert (first.read_text(), second.read_text()) == ("a", "b") and first != second


# ------------------------------------------------------------------ atomic_write_files
def test_a_full_disk_leaves_every_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "summary.json"
    a.write_text("old a\n")
    b.write_text("old b\n")
    real_fdopen = os.fdopen
    calls = {"n": 0}

    class FullDisk:
        def __init__(self, f: object) -> None:
            self.f = f

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()  # type: ignore[attr-defined]

        def write(self, data: bytes) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

    def fdopen(fd: int, *args: object, **kwargs: object) -> object:
        calls["n"] += 1
        f = real_fdopen(fd, *args, **kwargs)
        return FullDisk(f) if calls["n"] == 2 else f  # the second file finds the disk full

    monkeypatch.setattr(sio.os, "fdopen", fdopen)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_files({a: b"new a\n", b: b"new b\n"})
    assert (a.read_text(), b.read_text()) == ("old a\n", "old b\n")  # neither replaced: never half a set
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "summary.json"]  # no temporary file left


# ------------------------------------------------------------------ read_jsonl
def test_a_key_given_twice_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"id": "a", "variants": ["x", "y"]}\n{"id": "b", "meta": {"k": 1, "k": 2}, "variants": ["x", "y"]}\n')
    with pytest.raises(SagoInputError, match=r"s\.jsonl:2: field 'k': key 'k' is given twice in one object"):
        list(read_jsonl(path))


def test_keep_parses_only_the_records_asked_for(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"i": 0}\n\n{not json\n{"i": 2}\n{"i": 3}\n')
    assert count_records(path) == 4  # blank lines are not records; unparsed lines are counted
    assert [v["i"] for _, v in read_jsonl(path, keep={0, 3})] == [0, 3]  # the malformed record is never parsed
    assert [n for n, _ in read_jsonl(path, keep={3})] == [5]  # line numbers are the file's


def test_partial_read_gives_the_groups_a_capped_evaluation_runs(tmp_path: Path) -> None:
    from sago_train.data.groups import VariantSet
    from sago_train.eval.plan import select_groups

    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"variants": [f"q{i}", f"Q{i}?"]}) + "\n" for i in range(200)))
    whole = VariantSet.from_jsonl(path)
    chosen = [whole.groups[i] for i in select_groups(whole, 5, 3)]
    part = VariantSet.from_jsonl(path, max_groups=5, seed=3)
    assert [g.to_dict() for g in part] == [g.to_dict() for g in chosen]  # default ids (#index) included
    assert select_groups(part, 5, 3) == [0, 1, 2, 3, 4]
