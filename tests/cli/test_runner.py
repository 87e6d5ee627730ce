"""The recipe runner: one default per setting, the same as the Python API's, and ``layers`` walked from a
recipe to the stability loss (checked once on construction, defaulted once against the model)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sago_train.cli.recipe import load_recipe
from sago_train.cli.runner import build_trainer
from sago_train.errors import SagoInputError
from sago_train.eval.config import SAGOConfig
from sago_train.model.layers import default_layers
from sago_train.training.config import StabilityConfig

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"
NO_MONITOR = ["--training.report_to=[]", "--monitor.sets={}"]


def _demo_without_stability(tmp_path: Path, *overrides: str) -> Path:
    text = DEMO.read_text()
    head, _, tail = text.partition("\nstability:\n")
    rest = tail.split("\n")
    while rest and (rest[0].startswith(" ") or not rest[0].strip()):  # drop the section's indented lines
        rest.pop(0)
    path = tmp_path / "no_stability.yaml"
    path.write_text(head + "\n" + "\n".join(rest))
    assert "stability:" not in path.read_text()
    return path


def test_a_recipe_without_a_stability_section_uses_the_api_defaults(tmp_path):
    recipe = load_recipe(_demo_without_stability(tmp_path), NO_MONITOR)
    assert recipe.stability is None
    trainer = build_trainer(recipe, output_dir=str(tmp_path / "run"))
    declared = {f.name: f.default for f in dataclasses.fields(StabilityConfig)}
    # Both weights 0 (augmentation, what docs/loss-experiment.md recommends): no term, no layers to hook.
    assert declared["act_weight"] == 0.0 and declared["conf_weight"] == 0.0
    got = dataclasses.asdict(trainer.stability_config)
    assert got == dataclasses.asdict(StabilityConfig())  # what StabilityTrainer uses without stability_config
    assert (got["act_weight"], got["conf_weight"]) == (0.0, 0.0)
    assert not trainer.stability_config.enabled and trainer._sago_loss.layers == []
    # With a weight, the layers default once, against the model: 4 evenly spaced blocks of the tiny model's 4.
    on = build_trainer(dataclasses.replace(recipe, stability=StabilityConfig(act_weight=0.1)),
                       output_dir=str(tmp_path / "run-on"))
    assert on._sago_loss.layers == default_layers(4) == [0, 1, 2, 3]


def test_recipe_layers_reach_the_loss_as_block_indices(tmp_path):
    recipe = load_recipe(DEMO, [*NO_MONITOR, "--stability.layers=[1, -1]", "--stability.act_weight=1.0"])
    assert recipe.stability.layers == [1, -1]  # checked on construction, kept as written
    trainer = build_trainer(recipe, output_dir=str(tmp_path / "run"))
    assert trainer._sago_loss.layers == [1, 3]  # resolved once against the model's 4 blocks


@pytest.mark.parametrize("cls", [StabilityConfig, SAGOConfig])
@pytest.mark.parametrize(("value", "message"), [
    ("1,x", "expected comma-separated integers"), ([], "non-empty list"), ([1, True], "must be integers"),
    ([0.5], "must be integers"), ({"a": 1}, "non-empty list"),
])
def test_layers_are_checked_by_one_function(cls, value, message):
    with pytest.raises(SagoInputError, match=message) as err:
        cls(layers=value)
    assert err.value.key == "layers"


@pytest.mark.parametrize("cls", [StabilityConfig, SAGOConfig])
def test_layers_accepts_one_int_a_string_or_a_list(cls):
    assert cls(layers=-1).layers == [-1]
    assert cls(layers="0, -1").layers == [0, -1]
    assert cls(layers=(2, 3)).layers == [2, 3]
    assert cls().layers is None


def test_a_recipe_names_one_bundled_set(tmp_path):
    from sago_train.cli.runner import _load_set
    from sago_train.data.sources import bundled_sets

    path = tmp_path / "r.yaml"
    path.write_text(f'sago_train_version: "{__import__("sago_train").__version__}"\nname: r\n'
                    "model:\n  path: sago://tiny-llama\ndata:\n  train: sago://demo/groups.jsonl\n"
                    "monitor:\n  sets:\n    caps: real/capitals\n")
    recipe = load_recipe(path)
    vs = _load_set(recipe, "caps", recipe.monitor.sets["caps"], SAGOConfig())
    assert vs.name == "caps" and len(vs) == len(bundled_sets("real")["capitals"])


def test_a_recipes_monitored_sets_are_read_lazily(tmp_path, monkeypatch):
    """Issue 22: monitor.sets were parsed whole although monitor.options.max_groups caps what is evaluated."""
    from sago_train import SAGOCallback

    from .._helpers.lazy_sets import parsed_bytes, set_with_garbage_outside_the_subset

    path = tmp_path / "s.jsonl"
    ids, kept_bytes = set_with_garbage_outside_the_subset(path, n=50, max_groups=3)
    recipe = load_recipe(DEMO, ["--training.report_to=[]", f"--monitor.sets={{s: {path}}}",
                                "--monitor.options.max_groups=3"])
    with parsed_bytes(monkeypatch) as seen:
        trainer = build_trainer(recipe, output_dir=str(tmp_path / "run"))
    (cb,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, SAGOCallback)]
    assert [g.id for g in cb.sets["s"]] == ids
    assert seen[str(path)] == kept_bytes
