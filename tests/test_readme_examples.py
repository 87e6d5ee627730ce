"""The README's stability-loss examples run as written (on the shipped tiny model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks_after(heading: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index(heading):]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.mark.slow
def test_stability_trainer_examples_run_as_written(tmp_path, monkeypatch):
    blocks = _python_blocks_after("## Train for stability")
    assert len(blocks) == 2 and "StabilityTrainer(" in blocks[0] and "StabilitySFTTrainer(" in blocks[1]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(blocks[0], "README.md (StabilityTrainer)", "exec"), namespace)  # noqa: S102
    assert namespace["trainer"].state.global_step == 20
    exec(compile(blocks[1], "README.md (StabilitySFTTrainer)", "exec"), namespace)  # noqa: S102
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 20
    assert any("sago_act_loss" in h for h in trainer.state.log_history)
