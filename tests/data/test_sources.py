"""Naming bundled sets: a collection, or one of its sets (``real/capitals``), on the command line, in
``--sago_sets`` and in a recipe."""

from __future__ import annotations

import pytest

from sago_train.data.sources import bundled_set_paths, bundled_sets, is_bundled_spec, sets_from_specs
from sago_train.errors import SagoInputError


def test_one_bundled_set_by_name():
    sets = bundled_sets("real/capitals")
    assert list(sets) == ["capitals"]
    assert len(sets["capitals"]) == len(bundled_sets("real")["capitals"])
    assert list(sets_from_specs(["real/capitals", "real/science"])) == ["capitals", "science"]
    assert set(sets_from_specs(["tiny"])) == set(bundled_set_paths("tiny"))


def test_an_unknown_bundled_set_suggests_the_name():
    with pytest.raises(SagoInputError) as info:
        sets_from_specs(["real/capital"], key="sago_sets")
    text = str(info.value)
    assert "field 'sago_sets'" in text and "Did you mean 'real/capitals'?" in text
    with pytest.raises(SagoInputError, match="Did you mean 'real'"):
        bundled_sets("reel/capitals")


def test_a_file_of_that_name_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_bundled_spec("real/capitals")
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "capitals").write_text('{"id": "x", "variants": ["a", "b"]}\n')
    assert not is_bundled_spec("real/capitals")
    assert [g.id for g in sets_from_specs(["real/capitals"])["capitals"]] == ["x"]
    assert not is_bundled_spec("caps=real/capitals")  # NAME=FILE is always a file

