"""The measurements behind the demo's comparison of training arms (used by scripts/run_demo.py).

Per arm and held-out set, per group: ``activation_rel`` (SPEC: within-group dispersion / the set's
between-group dispersion, per layer, mean over layers), raw ``activation``, the group's between-group
dispersion (mean cosine distance of its variants to the other groups' variants: did the arm collapse the
representation?), ``confidence``, and accuracy on all variants, on the canonical phrasing (the group's own
canonical index) and per kind. Then paired tests of every arm against a baseline arm on the same groups.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# metric -> (label, alternative of the paired test "arm vs baseline", what the alternative means)
METRICS: dict[str, tuple[str, str]] = {
    "activation_rel": ("activation_rel", "less"),
    "activation": ("activation (raw)", "less"),
    "between": ("between-group dispersion", "less"),
    "confidence": ("confidence", "less"),
    "accuracy": ("accuracy, all variants", "greater"),
    "accuracy_canonical": ("accuracy, canonical", "greater"),
}


@dataclass
class ArmSet:
    """Per-group values of one arm on one set (index i = the same group in every arm)."""

    ids: list[str]
    values: dict[str, np.ndarray] = field(default_factory=dict)
    kinds: list[str] | None = None
    rel_source: str = ""


def read_records(run: Path, step: int, set_name: str) -> list[dict[str, Any]]:
    path = run / "sago" / f"step-{step}" / f"{set_name}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def last_step(run: Path) -> int:
    lines = (run / "sago" / "history.jsonl").read_text().splitlines()
    return int(json.loads(lines[-1])["step"])


def canonical_accuracy(records: Sequence[dict[str, Any]], canonical: dict[str, int]) -> float:
    """Share of groups whose canonical variant is right; the canonical index comes from the group (SPEC
    ``canonical``, default 0), never assumed to be 0."""
    rows = [r for r in records if r.get("correct")]
    if not rows:
        return math.nan
    return sum(bool(r["correct"][canonical.get(r["id"], 0)]) for r in rows) / len(rows)


def hidden_vectors(run: Path, variant_set: Any, layers: Sequence[int] | None, pooling: str,
                   chat_template: str = "auto") -> tuple[np.ndarray, list[str]]:
    """Pooled hidden states ``[G, K, L, H]`` of the arm's final model (adapter folder ``run``) on every group of
    ``variant_set``, with the evaluator's encoding (chat rendering), layers and pooling; and the group ids."""
    import torch

    from sago_train.eval.extraction import Extractor
    from sago_train.model.layers import get_decoder_layers, resolve_layers
    from sago_train.model.loading import load_model_and_tokenizer
    from sago_train.model.tokenize import encode_variant, resolve_chat_template

    model, tok = load_model_and_tokenizer(run, device="cpu")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    resolved = resolve_layers(list(layers) if layers else None, len(get_decoder_layers(model)))
    ex = Extractor(model, tok, layers=resolved, pooling=pooling, batch_size=32)
    groups = list(variant_set)
    ks = {len(g.variants) for g in groups}
    if len(ks) != 1:
        raise ValueError(f"{len(groups)} groups: they have different K {sorted(ks)}; the analysis needs one K")
    chat = resolve_chat_template(chat_template, tok) == "always"
    prompts = [encode_variant(v, tok, chat=chat) for g in groups for v in g.variants]
    with torch.no_grad():
        out = ex.score(prompts).hidden  # [G*K, L, H]
    k = ks.pop()
    return out.view(len(groups), k, out.shape[1], out.shape[2]).numpy(), [g.id for g in groups]


def relative_values(hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """From ``[G, K, L, H]``: per group ``activation`` (mean over layers of within), ``activation_rel`` (mean
    over layers of within / the set's between), ``between`` (mean over layers of the group's own
    between-group dispersion); and the set's between-group dispersion per layer ``[L]``."""
    import torch

    from sago_train.functional import (
        activation_dispersion,
        between_group_dispersion,
        group_between_dispersion,
    )

    h = torch.from_numpy(hidden).double().permute(2, 0, 1, 3)  # [L, G, K, H]
    within = activation_dispersion(h)  # [L, G]
    set_between = between_group_dispersion(h)  # [L]
    rel = within / set_between[:, None]
    own_between = group_between_dispersion(h)  # [L, G]
    return (within.mean(0).numpy(), rel.mean(0).numpy(), own_between.mean(0).numpy(), set_between.numpy())


def arm_set_values(run: Path, set_name: str, variant_set: Any, layers: Sequence[int] | None, pooling: str,
                   step: int | None = None, chat_template: str = "auto") -> ArmSet:
    """Every per-group metric of one arm on one set, at the arm's last evaluation."""
    step = last_step(run) if step is None else step
    recs = {r["id"]: r for r in read_records(run, step, set_name)}
    # The groups the evaluation scored (all of them, or its seeded max_groups subset): activation_rel is relative
    # to those groups' between-group dispersion, so the recomputation must use the same ones.
    variant_set = [g for g in variant_set if g.id in recs]
    if not variant_set:
        raise ValueError(f"{run}: step {step} of set {set_name} has no record for any group of the set")
    hidden, ids = hidden_vectors(run, variant_set, layers, pooling, chat_template)
    act, rel, between, _ = relative_values(hidden)
    # The activation axis clips each layer's value to [0, 1] (anti-aligned states, which a loss pushing groups
    # apart can produce); activation_rel does not. Compare like with like.
    act_clipped = np.mean([relative_values(hidden[:, :, [i]])[0].clip(0, 1) for i in range(hidden.shape[2])], 0)
    canonical = {g.id: g.canonical for g in variant_set}
    rows = [recs[i] for i in ids]
    logged_act = np.array([r["axes"]["activation"] for r in rows], float)
    # The recomputation must reproduce the evaluator's activation axis, or its ratio is not the axis's.
    if np.nanmax(np.abs(logged_act - act_clipped)) > 1e-4:
        raise ValueError(f"{run} {set_name}: recomputed activation differs from the logged axis by "
                         f"{np.nanmax(np.abs(logged_act - act_clipped)):.2g}; the encoding/layers/pooling do not match")
    out = ArmSet(ids=ids, kinds=variant_set[0].kinds if variant_set[0].kinds else None)
    logged_rel = [r["axes"].get("activation_rel") for r in rows]
    if all(v is not None for v in logged_rel):
        out.values["activation_rel"] = np.array(logged_rel, float)
        out.rel_source = "logged axis"
        if np.nanmax(np.abs(out.values["activation_rel"] - rel)) > 1e-4:
            raise ValueError(f"{run} {set_name}: logged activation_rel differs from the recomputation")
    else:
        out.values["activation_rel"] = rel
        out.rel_source = "recomputed from the adapter"
    out.values["activation"] = logged_act
    out.values["between"] = between
    out.values["confidence"] = np.array([r["axes"]["confidence"] for r in rows], float)
    correct = [r.get("correct") for r in rows]
    if all(c is not None for c in correct):
        c = np.array(correct, float)  # [G, K]
        out.values["accuracy"] = c.mean(1)
        out.values["accuracy_canonical"] = np.array([c[i, canonical[g]] for i, g in enumerate(ids)])
        if out.kinds:
            for j, kind in enumerate(out.kinds):
                if any(canonical[g] != j for g in ids):  # the canonical kind is the row above
                    out.values[f"kind:{kind}"] = c[:, j]
    return out


def _label(metric: str) -> tuple[str, str]:
    if metric.startswith("kind:"):
        return f"accuracy, kind {metric[5:]}", "greater"
    return METRICS[metric]


def _ordered_metrics(values: dict[str, np.ndarray]) -> list[str]:
    return [m for m in METRICS if m in values] + [m for m in values if m.startswith("kind:")]


def headline_tables(results: dict[str, dict[str, ArmSet]], baseline: str, steps: int, seed: int) -> str:
    """Markdown: means [95% CI] of every metric for every arm, then paired tests of each arm vs ``baseline``."""
    from sago_train.functional import multiplicity, stats

    arms = list(results)
    sets = list(results[arms[0]])
    lines = [f"Every arm: same recipe, {steps} steps, seed {seed}, same LoRA initialization; held-out sets at the "
             "last step. Mean over groups [95% bootstrap CI]; instabilities: lower is better; between-group "
             "dispersion: a drop means the representation collapsed.", ""]
    lines += ["| set | metric | " + " | ".join(arms) + " |", "|---|---|" + "---:|" * len(arms)]
    for s in sets:
        for metric in _ordered_metrics(results[arms[0]][s].values):
            cells = []
            for arm in arms:
                summ = stats.bootstrap_ci(results[arm][s].values[metric])
                cells.append(f"{summ.mean:.3f} [{summ.ci_low:.3f}, {summ.ci_high:.3f}]")
            lines.append(f"| {s} | {_label(metric)[0]} | " + " | ".join(cells) + " |")
    others = [a for a in arms if a != baseline]
    tests = {}
    for s in sets:
        base = results[baseline][s]
        for metric in _ordered_metrics(base.values):
            for arm in others:
                tests[(s, metric, arm)] = stats.paired_comparison(base.values[metric], results[arm][s].values[metric],
                                                                  alternative=_label(metric)[1])
    # One family: every test of the table, so a claim read off any cell keeps its family-wise error rate.
    holm_p = dict(zip(tests, multiplicity.holm([r.p_value for r in tests.values()])))
    lines += ["", f"Paired tests against `{baseline}` on the same groups: Δ = arm − {baseline} [95% paired-bootstrap "
              "CI], p = one-sided Wilcoxon signed-rank (instabilities and between-group dispersion: that the arm "
              f"is lower; accuracy: that it is higher), Holm = adjusted over all {len(tests)} tests of this table "
              "(a claim needs Holm < 0.05).", ""]
    lines += ["| set | metric | " + " | ".join(others) + " |", "|---|---|" + "---:|" * len(others)]
    for s in sets:
        for metric in _ordered_metrics(results[baseline][s].values):
            cells = []
            for arm in others:
                res = tests[(s, metric, arm)]
                cells.append(f"{res.mean_diff:+.3f} [{res.ci_low:+.3f}, {res.ci_high:+.3f}] p={res.p_value:.2g} "
                             f"Holm={holm_p[(s, metric, arm)]:.2g}")
            lines.append(f"| {s} | {_label(metric)[0]} | " + " | ".join(cells) + " |")
    source = {results[a][s].rel_source for a in arms for s in sets}
    lines += ["", f"activation_rel: {', '.join(sorted(source))}; n = {len(results[arms[0]][sets[0]].ids)} groups "
              "per set."]
    return "\n".join(lines) + "\n"
