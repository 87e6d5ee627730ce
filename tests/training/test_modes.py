"""The stability modes as registered classes (issue #31): each declares its own fields and needs once, checks
its fields, and the loss asks it for its terms."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from sago_train.errors import SagoInputError
from sago_train.training.config import StabilityConfig
from sago_train.training.modes import MODES, MODES_REGISTRY, StabilityMode, get_mode, register_mode

TRAINING = Path(__file__).resolve().parents[2] / "sago_train" / "training"


def test_every_mode_is_registered_with_its_own_fields():
    assert set(MODES) == {"centroid", "anchor", "relative", "consistency"}
    owned = [f for m in MODES_REGISTRY.values() for f in m.fields]
    assert len(owned) == len(set(owned))  # one owner per field
    names = {f.name for f in dataclasses.fields(StabilityConfig)}
    assert set(owned) <= names and len(owned) == 9
    assert [m.name for m in MODES_REGISTRY.values() if m.needs_teacher] == ["consistency"]
    assert [m.name for m in MODES_REGISTRY.values() if m.min_groups > 1] == ["relative"]
    assert StabilityConfig(mode="anchor").stability_mode is get_mode("anchor")


def test_a_mode_checks_its_own_fields_whatever_the_mode_in_use():
    with pytest.raises(SagoInputError, match="field 'teacher'"):
        StabilityConfig(mode="relative", teacher="teachr")
    with pytest.raises(SagoInputError, match="field 'temperature': expected a temperature > 0"):
        StabilityConfig(mode="consistency", temperature=0)
    with pytest.raises(SagoInputError, match="divergence 'js'"):
        StabilityConfig(mode="consistency", divergence="js", teacher="ema")
    with pytest.raises(SagoInputError, match="field 'unlabeled_task_loss': expected true or false"):
        StabilityConfig(mode="anchor", unlabeled_task_loss="no")
    with pytest.raises(SagoInputError, match="unknown mode"):
        get_mode("centriod")


def test_the_training_layer_asks_the_mode_instead_of_comparing_its_name():
    compared = [(p.name, line.strip()) for p in TRAINING.glob("*.py") for line in p.read_text().splitlines()
                if re.search(r"\bmode\s*(==|!=|in\s*\()", line) and "teacher" not in line]
    assert len(compared) <= 3, compared


def test_a_new_mode_registers_and_serves_the_loss_terms():
    @register_mode
    class Twice(StabilityMode):
        name = "twice-for-test"

        def activation(self, vectors, layout, config):
            return 2 * super().activation(vectors, layout, config)

    try:
        vectors = torch.randn(3, 4, 8)
        base = get_mode("centroid").activation(vectors, None, None)
        assert torch.allclose(get_mode("twice-for-test").activation(vectors, None, None), 2 * base)
        assert StabilityConfig(mode="twice-for-test").stability_mode.name == "twice-for-test"
        with pytest.raises(ValueError, match="new name"):
            register_mode(Twice)
    finally:
        MODES_REGISTRY.pop("twice-for-test")
