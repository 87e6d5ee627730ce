"""``activation_rel`` (SPEC "activation_rel") against a brute-force pairwise computation, and through the
evaluator: per layer within_g / between_S, mean over layers, between_S over all cross-group pairs."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from sago_train import SAGOEvaluator
from sago_train.data import VariantSet
from sago_train.functional.axes import (
    DEFAULT_AXES,
    activation_relative,
    get_axis,
    in_instability,
    parse_axes,
)
from sago_train.results.evaluation import GroupRecord


def _cos_dist(a: np.ndarray, b: np.ndarray) -> float:
    return 1.0 - float(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b))


def brute_force(groups: list[np.ndarray]) -> tuple[list[float], list[list[float]], list[float]]:
    """groups: each [K_g, L, H] float64 -> (value per group, R per group and layer, between per layer), with
    explicit loops over every pair of vectors."""
    n_layers = groups[0].shape[1]
    between = []
    for layer in range(n_layers):
        d = [_cos_dist(ga[i, layer], gb[j, layer])
             for a, ga in enumerate(groups) for b, gb in enumerate(groups) if a != b
             for i in range(ga.shape[0]) for j in range(gb.shape[0])]
        between.append(float(np.mean(d)))
    ratios = []
    for g in groups:
        ratios.append([float(np.mean([_cos_dist(g[i, layer], g[j, layer])
                                      for i, j in itertools.combinations(range(g.shape[0]), 2)])) / between[layer]
                       for layer in range(n_layers)])
    return [float(np.mean(r)) for r in ratios], ratios, between


def _random_groups(seed: int, ks: list[int], n_layers: int = 3, hidden: int = 24, shared: float = 2.0):
    rng = np.random.default_rng(seed)
    common = rng.normal(size=(1, n_layers, hidden)) * shared  # anisotropy: a direction every vector shares
    out = []
    for k in ks:
        centre = rng.normal(size=(1, n_layers, hidden))
        out.append(common + centre + 0.6 * rng.normal(size=(k, n_layers, hidden)))
    return out


@pytest.mark.parametrize(("seed", "ks"), [(0, [2, 3, 5, 4]), (1, [3, 3, 3])])
def test_per_group_between_matches_brute_force(seed, ks):
    groups = _random_groups(seed, ks, shared=3.0)
    values, between = activation_relative([torch.tensor(g, dtype=torch.float32) for g in groups])
    n_layers = groups[0].shape[1]
    weights = []
    for a, (ga, v) in enumerate(zip(groups, values)):
        want = np.mean([np.mean([_cos_dist(ga[i, layer], gb[j, layer]) for b, gb in enumerate(groups) if b != a
                                 for i in range(ga.shape[0]) for j in range(gb.shape[0])])
                        for layer in range(n_layers)])
        assert v.extra["between"] == pytest.approx(want, abs=1e-6)
        weights.append(ga.shape[0] * (sum(ks) - ga.shape[0]))
    # Weighted by the number of cross pairs, the groups' values average to the set's dispersion.
    assert np.average([v.extra["between"] for v in values], weights=weights) == pytest.approx(np.mean(between))


@pytest.mark.parametrize(("seed", "ks", "shared"), [(0, [2, 3, 5, 4], 2.0), (1, [2, 2], 0.0), (2, [6, 3, 2, 7, 4], 8.0)])
def test_matches_brute_force_pairwise(seed, ks, shared):
    groups = _random_groups(seed, ks, shared=shared)
    blocks = [3 * i + 2 for i in range(groups[0].shape[1])]  # hidden[:, l] came from decoder block 3l+2
    values, between = activation_relative([torch.tensor(g, dtype=torch.float32) for g in groups], blocks)
    want_values, want_ratios, want_between = brute_force(groups)
    np.testing.assert_allclose(between, want_between, atol=1e-5)
    for got, want, ratios in zip(values, want_values, want_ratios):
        assert got.value == pytest.approx(want, abs=1e-5)
        assert sorted(k for k in got.extra if k.startswith("layer_")) == sorted(f"layer_{b}" for b in blocks)
        assert [got.extra[f"layer_{b}"] for b in blocks] == pytest.approx(ratios, abs=1e-5)
        # The per-variant shares average to the value (no clipping: the ratio is reported as it is).
        assert float(np.mean(got.per_variant)) == pytest.approx(got.value, abs=1e-6)


def test_exceeds_one_when_variants_differ_more_than_unrelated_prompts():
    # Two groups whose variants are opposite while the groups share a direction: within > between.
    g1 = torch.tensor([[[1.0, 0.0, 0.0]], [[-1.0, 0.0, 0.0]]])
    g2 = torch.tensor([[[1.0, 0.1, 0.0]], [[-1.0, 0.1, 0.0]]])
    values, between = activation_relative([g1, g2])
    _, _, want_between = brute_force([g1.double().numpy(), g2.double().numpy()])
    assert between[0] == pytest.approx(want_between[0], abs=1e-6)
    assert values[0].value == pytest.approx(2.0 / want_between[0], abs=1e-5)
    assert values[0].value > 1.5


def test_collapse_does_not_lower_it():
    """Pulling *every* representation towards one direction lowers raw activation but not the ratio much:
    the test that raw activation cannot tell the two apart and activation_rel can."""
    from sago_train.functional.axes import activation_instability

    groups = _random_groups(3, [4, 4, 4, 4, 4, 4], shared=0.0)
    rng = np.random.default_rng(9)
    direction = rng.normal(size=(1, 3, 24))
    collapsed = [g + 6.0 * direction for g in groups]
    raw = [np.mean([activation_instability(torch.tensor(g, dtype=torch.float32)).value for g in gs])
           for gs in (groups, collapsed)]
    rel = [np.mean([v.value for v in activation_relative([torch.tensor(g, dtype=torch.float32) for g in gs])[0]])
           for gs in (groups, collapsed)]
    assert raw[1] < 0.05 * raw[0]  # raw activation "improves" 26-fold (0.273 -> 0.011)
    assert rel[1] == pytest.approx(rel[0], rel=0.03)  # relative to unrelated prompts: 0.271 -> 0.266


def test_fewer_than_two_groups_is_nan():
    values, between = activation_relative([torch.randn(3, 2, 8)])
    assert math.isnan(values[0].value) and all(math.isnan(b) for b in between)


def test_registered_and_selectable():
    axis = get_axis("activation_rel")
    assert axis.needs == frozenset({"hidden"}) and axis.higher_is_better is False
    assert axis.set_level is not None and axis.in_instability is False
    assert "activation_rel" not in DEFAULT_AXES  # opt-in: it reads a successful fine-tune as less stable (docs/validity.md)
    assert parse_axes("activation_rel,activation") == ["activation_rel", "activation"]
    assert in_instability("activation") and not in_instability("activation_rel")


def test_instability_leaves_the_ratio_out():
    g = GroupRecord("x", ["a", "b"], None, None, None, None,
                    {"activation": 0.2, "activation_rel": 3.0, "confidence": 0.4}, {})
    assert g.instability == pytest.approx(0.3)


# ------------------------------------------------------------------------------------------ through the evaluator
RECORDS = [
    {"id": "a", "variants": ["What is the capital of France?", "france capital is which", "Name the capital of France.",
                             "capital of france?"], "reference": " Paris"},
    {"id": "b", "variants": ["Two plus two equals", "2 + 2 ="], "reference": " 4"},
    {"id": "c", "variants": ["The sky is", "Colour of the sky:", "the skyy is"], "reference": " blue"},
    {"id": "d", "variants": ["Dogs say", "A dog goes", "dgos say", "What do dogs say?", "dog sound:"]},
]


def _reference_hidden(model, tok, rec, layers):
    vecs = []
    with torch.no_grad():
        for v in rec["variants"]:
            o = model(torch.tensor([tok(v)["input_ids"]]), output_hidden_states=True)
            vecs.append([o.hidden_states[layer + 1][0, -1].double().numpy() for layer in layers])
    return np.array(vecs)  # [K, L, H]


def test_evaluator_matches_brute_force_and_is_batch_size_independent(byte_tokenizer, tiny_llama, tmp_path):
    layers = [0, 1, 3]  # blocks; the evaluator is given [0, 1, -1] (the last of the tiny model's 4 blocks)
    vs = VariantSet.from_records(RECORDS, name="t")
    want_values, want_ratios, want_between = brute_force(
        [_reference_hidden(tiny_llama, byte_tokenizer, r, layers) for r in RECORDS])
    results = {}
    for bs in (1, 3, 64):
        ev = SAGOEvaluator(tiny_llama, byte_tokenizer, layers=[0, 1, -1], axes="activation,activation_rel",
                           batch_size=bs, max_new_tokens=2)
        results[bs] = ev.evaluate(vs)
    s = results[3].sets["t"]
    for g, want, ratios in zip(s.groups, want_values, want_ratios):
        assert g.axes["activation_rel"] == pytest.approx(want, abs=1e-5), g.id
        # Per-layer values are recorded under their decoder block (3, not the position 2 or the index -1).
        rel_keys = sorted(k for k in g.extra if k.startswith("activation_rel_layer_"))
        assert rel_keys == ["activation_rel_layer_0", "activation_rel_layer_1", "activation_rel_layer_3"]
        assert [g.extra[f"activation_rel_layer_{b}"] for b in layers] == pytest.approx(ratios, abs=1e-5)
        assert sorted(k for k in g.extra if k.startswith("activation_layer_")) == [
            "activation_layer_0", "activation_layer_1", "activation_layer_3"]
    info = s.set_level["activation_rel"]["between_dispersion"]
    assert info["per_layer"] == pytest.approx(want_between, abs=1e-5)
    assert info["layers"] == layers
    assert info["mean"] == pytest.approx(np.mean(want_between), abs=1e-5)
    assert (info["n_groups"], info["n_variants"]) == (4, 14)
    assert s.between_dispersion == pytest.approx(np.mean(want_between), abs=1e-5)
    # Each group's own distance to the other groups, recorded for paired tests between models.
    assert all(0 < g.extra["activation_rel_between"] < 2 for g in s.groups)
    assert s.summaries["activation_rel"].mean == pytest.approx(np.mean(want_values), abs=1e-5)
    for bs in (1, 64):
        other = results[bs].sets["t"]
        for a, b in zip(s.groups, other.groups):
            assert b.axes["activation_rel"] == pytest.approx(a.axes["activation_rel"], abs=1e-4), (bs, a.id)
        assert other.between_dispersion == pytest.approx(s.between_dispersion, abs=1e-4)
    # Every output: summary.json (mean, CI, n and the set's between-group dispersion), records, log metrics.
    out = results[3].write(tmp_path / "ev")
    summary = json.loads((out / "summary.json").read_text())
    entry = summary["sets"]["t"]["axes"]["activation_rel"]
    assert entry["mean"] == pytest.approx(np.mean(want_values), abs=1e-5) and entry["n"] == 4
    assert entry["ci_low"] <= entry["mean"] <= entry["ci_high"]
    assert summary["sets"]["t"]["set_level"]["activation_rel"]["between_dispersion"]["per_layer"] == pytest.approx(
        want_between, abs=1e-5)
    assert summary["sets"]["t"]["set_level"]["activation_rel"]["between_dispersion"]["layers"] == layers
    rec = json.loads((out / "t.jsonl").read_text().splitlines()[0])
    assert rec["extra"]["activation_rel_layer_3"] == pytest.approx(want_ratios[0][2], abs=1e-5)
    assert "activation_rel_layer_2" not in rec["extra"]
    assert rec["axes"]["activation_rel"] == pytest.approx(want_values[0], abs=1e-5)
    assert rec["instability"] == pytest.approx(rec["axes"]["activation"], abs=1e-7)  # the ratio is left out
    from sago_train.integrations.keys import evaluation_metrics

    metrics = evaluation_metrics(results[3], {}, 0.0)
    assert metrics["eval_sago/t/activation_rel"] == pytest.approx(np.mean(want_values), abs=1e-5)
    assert metrics["eval_sago/t/between_dispersion"] == pytest.approx(np.mean(want_between), abs=1e-5)


def test_one_group_set_records_a_note_not_a_number(byte_tokenizer, tiny_llama):
    vs = VariantSet.from_records(RECORDS[:1], name="one")
    res = SAGOEvaluator(tiny_llama, byte_tokenizer, layers=[0], axes="activation,activation_rel",
                        max_new_tokens=2).evaluate(vs)
    s = res.sets["one"]
    assert math.isnan(s.groups[0].axes["activation_rel"])
    assert s.summaries["activation_rel"].n == 0
    assert any("at least 2 groups" in n for n in s.notes)
    assert any("at least 2 groups" in n for n in s.to_summary()["notes"])
    assert not math.isnan(s.groups[0].axes["activation"])


def test_cli_eval_shows_the_ratio_and_the_between_dispersion(tmp_path, capsys):
    from sago_train.cli.main import main

    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    code = main(["eval", "--set", f"s={path}", "--axes", "activation,activation_rel", "--max-new-tokens", "2",
                 "--quiet", "--out", str(tmp_path / "o")])
    assert code == 0
    out = capsys.readouterr().out
    assert "activation_rel" in out and "between-group activation dispersion" in out
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["sets"]["s"]["axes"]["activation_rel"]["n"] == 4
    # compare and report take it like any axis (lower = more stable).
    path2 = tmp_path / "s2.jsonl"
    path2.write_text("".join(json.dumps(r) + "\n" for r in RECORDS[:3]))
    for out, layers in (("o", "0,-1"), ("p", "0")):
        assert main(["eval", "--set", f"s={path}", "--set", f"t={path2}", "--axes", "activation,activation_rel",
                     "--layers", layers, "--max-new-tokens", "2", "--quiet", "--out", str(tmp_path / out)]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "o"), str(tmp_path / "p"), "--axis", "activation_rel",
                 "--json", str(tmp_path / "cmp.json")]) == 0
    cmp = json.loads((tmp_path / "cmp.json").read_text())["axes"]["activation_rel"]
    want = json.loads((tmp_path / "p" / "summary.json").read_text())["sets"]["t"]["axes"]["activation_rel"]["mean"]
    assert cmp["higher_is_better"] is False and cmp["scores"]["t"]["p"]["mean"] == pytest.approx(want)
    assert main(["report", str(tmp_path / "o"), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "activation_rel" in md and "except `activation_rel`" in md


def test_identical_variants_give_zero_never_negative():
    rng = np.random.default_rng(5)
    same = torch.tensor(rng.normal(size=(1, 2, 16)), dtype=torch.float32).expand(5, -1, -1).clone()
    same += 30.0  # a large shared offset: float32 unit vectors would give 1 - mean cos of about -1e-7
    others = [torch.tensor(g, dtype=torch.float32) for g in _random_groups(6, [3, 4], n_layers=2, hidden=16)]
    values, between = activation_relative([same, *others])
    assert 0.0 <= values[0].value < 1e-9 and all(0.0 <= v < 1e-9 for v in values[0].per_variant)
