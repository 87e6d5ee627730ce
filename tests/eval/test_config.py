"""SAGOConfig's declared settings: what the CLI's help says about them is true."""

from __future__ import annotations

from dataclasses import fields

from sago_train.eval.config import SAGOConfig
from sago_train.functional.axes import AXES, DEFAULT_AXES


def test_the_axes_help_names_every_built_in_axis_and_the_real_default():
    help_text = next(f for f in fields(SAGOConfig) if f.name == "axes").metadata["help"]
    for name in AXES:
        assert name in help_text, name
    assert f"default: {','.join(DEFAULT_AXES)}" in help_text
    assert SAGOConfig().axes == list(DEFAULT_AXES)
