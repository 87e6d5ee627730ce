"""The recipe's YAML reader: merge keys as YAML defines them, and overrides held to the file's limits."""

from __future__ import annotations

import time

import pytest
import yaml

from sago_train.cli.recipe_yaml import MAX_YAML_DEPTH, parse_overrides, parse_yaml
from sago_train.errors import SagoInputError


def test_an_explicit_key_after_a_merge_key_overrides_it_as_yaml_says():
    text = "a: &a {x: 1, y: 2}\nb: &b {<<: [*a, {x: 3, w: 0}], z: 1}\nc: {<<: *b, z: 5}\nd: {<<: *a, x: 9}\n"
    assert parse_yaml(text) == yaml.safe_load(text)  # PyYAML's reading, which YAML's merge spec defines
    assert parse_yaml(text)["d"] == {"x": 9, "y": 2}
    with pytest.raises(SagoInputError, match="duplicate key 'y'"):  # a key written twice is still a mistake
        parse_yaml("d: {<<: {x: 1}, y: 1, y: 2}\n")


def test_merges_of_merges_stay_the_size_of_their_keys():
    text = "l0: &l0 {a: 1, b: 2}\n" + "".join(
        f"l{i}: &l{i} {{<<: [{', '.join([f'*l{i - 1}'] * 10)}]}}\n" for i in range(1, 40))
    start = time.process_time()
    assert parse_yaml(text)["l39"] == {"a": 1, "b": 2}  # 10**39 merged entries unflattened
    assert time.process_time() - start < 5


def test_overrides_are_held_to_the_recipe_files_limits():
    laughs = "{a: &a [x,x,x,x,x,x,x,x,x,x]" + "".join(
        f", l{i}: &l{i} [{','.join([f'*{p}'] * 10)}]" for i, p in zip(range(1, 9), ["a", *[f"l{j}" for j in range(1, 8)]])) + "}"
    start = time.process_time()
    with pytest.raises(SagoInputError, match=r"field '--training.x': the override --training.x expands to more than"):
        parse_overrides(["--training.x", laughs])
    with pytest.raises(SagoInputError, match=f"nested too deeply \\(more than {MAX_YAML_DEPTH} levels, MAX_YAML_DEPTH\\)"):
        parse_overrides(["--training.x", "[" * 20_000 + "]" * 20_000])
    assert time.process_time() - start < 5
    # Ordinary values as before: YAML scalars, lists, mappings; text that is not YAML stays text.
    assert parse_overrides(["--training.max_steps", "5", "--a.b={x: [1, 2]}", "--c.d", "a: b: c"]) == [
        (["training", "max_steps"], 5), (["a", "b"], {"x": [1, 2]}), (["c", "d"], "a: b: c")]
    assert parse_overrides(["--a.b", "{x: 1}"])[0][1].lines == {}  # no line of the recipe claimed
