"""The byte tokenizer every training test uses (one fixture, shared by the files of this folder)."""

from __future__ import annotations

import pytest

from tests._helpers.tiny import SPECIALS_FIRST, TAGGED_TEMPLATE, make_byte_tokenizer


@pytest.fixture(scope="module")
def tok():
    return make_byte_tokenizer(TAGGED_TEMPLATE, SPECIALS_FIRST)
