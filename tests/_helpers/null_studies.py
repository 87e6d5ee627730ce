"""Evaluations and studies with a known truth, for measuring the error rate of each finding (docs/findings.md):
under a global null nothing the findings claim is true, so every claim printed is a false one.

- :func:`null_evaluation` -- per-group values drawn independently of everything: the halves of each group are
  unrelated (no reliability), the axes are unrelated (no relation), the kinds are exchangeable (no kind effect).
- :func:`correlated_per_set` -- axes whose Spearman correlation is exactly at the "distinct" bound (0.5): the
  least favourable truth for a "distinct" claim.
- :func:`null_entries` -- entries (models) that do not differ on any set, or differ on one set only
  (``separated``: every flip involving that set is still false, the least favourable case for a flip claim).
- :func:`shuffled_entries` -- entries made from one real evaluation by shuffling group ids (no entry differs).
- :func:`pool_sets` -- variant sets whose groups are variants drawn at random from one pool of prompts (a real
  model's per-group instability is then noise).

Used by the tests and by ``benchmarks/findings_error_rates.py`` (which also runs them against older versions:
only constructors that every version has are used).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sago_train.results.evaluation import Evaluation, GroupRecord, SetEvaluation

AXES = ("activation", "activation_rel", "confidence", "generation", "mirroring")
KINDS = ("canonical", "paraphrase", "typo", "format")
# activation_rel = activation over the set's between-group dispersion (a constant of the set): one finding.
_BETWEEN = 0.4


def _groups(values: dict[str, np.ndarray], halves: dict[str, np.ndarray], per_variant: dict[str, np.ndarray],
            correct: np.ndarray | None, kinds: Sequence[str] | None, prefix: str = "g") -> list[GroupRecord]:
    n = next(iter(values.values())).shape[0]
    out = []
    for i in range(n):
        k = per_variant[next(iter(per_variant))].shape[1] if per_variant else 4
        out.append(GroupRecord(
            f"{prefix}{i}", [f"v{j}" for j in range(k)], list(kinds) if kinds else None,
            axes={a: float(v[i]) for a, v in values.items()},
            per_variant={a: [float(x) for x in v[i]] for a, v in per_variant.items()},
            correct=None if correct is None else [bool(x) for x in correct[i]],
            halves={a: [float(h[i, 0]), float(h[i, 1])] for a, h in halves.items()}))
    return out


def null_set(rng: np.random.Generator, name: str, n_groups: int = 24, axes: Sequence[str] = AXES,
             kinds: Sequence[str] = KINDS, n_bootstrap: int = 2000) -> SetEvaluation:
    """One set under the global null: every group's halves, per-variant values and correctness independent."""
    k = len(kinds)
    values, halves, per_variant = {}, {}, {}
    for a in axes:
        if a == "activation_rel":
            continue
        per_variant[a] = rng.random((n_groups, k))
        halves[a] = rng.random((n_groups, 2))
        values[a] = per_variant[a].mean(axis=1)
    if "activation_rel" in axes and "activation" in axes:
        for d in (values, halves, per_variant):
            d["activation_rel"] = d["activation"] / _BETWEEN
    correct = rng.random((n_groups, k)) < 0.5
    return SetEvaluation.from_groups(name, list(axes), _groups(values, halves, per_variant, correct, kinds), list(kinds),
                                     n_bootstrap=n_bootstrap)


def null_evaluation(rng: np.random.Generator, n_sets: int = 3, n_groups: int = 24, axes: Sequence[str] = AXES,
                    kinds: Sequence[str] = KINDS, n_bootstrap: int = 2000) -> Evaluation:
    """An evaluation of ``n_sets`` null sets (see :func:`null_set`)."""
    sets = {f"set{i}": null_set(rng, f"set{i}", n_groups, axes, kinds, n_bootstrap) for i in range(n_sets)}
    return Evaluation(sets, "null", {})


def correlated_per_set(rng: np.random.Generator, n_sets: int, n_groups: int, axes: Sequence[str] = AXES,
                       spearman: float = 0.5) -> dict[str, dict[str, np.ndarray]]:
    """Per-group values whose axes (but ``activation_rel``, a multiple of ``activation``) are equicorrelated
    Gaussians with population Spearman correlation ``spearman`` (Pearson ``2 sin(pi rho_s / 6)``)."""
    free = [a for a in axes if a != "activation_rel"]
    r = 2.0 * np.sin(np.pi * spearman / 6.0)
    cov = np.full((len(free), len(free)), r) + (1.0 - r) * np.eye(len(free))
    out = {}
    for i in range(n_sets):
        x = rng.multivariate_normal(np.zeros(len(free)), cov, size=n_groups)
        per = {a: x[:, j] for j, a in enumerate(free)}
        if "activation_rel" in axes and "activation" in per:
            per["activation_rel"] = per["activation"] / _BETWEEN
        out[f"set{i}"] = {a: per[a] for a in axes}
    return out


def null_entries(rng: np.random.Generator, n_entries: int = 6, n_sets: int = 3, n_groups: int = 24,
                 axes: Sequence[str] = AXES[:1] + AXES[2:], separated: float = 0.0,
                 n_bootstrap: int = 200) -> list[Evaluation]:
    """Entries with independent per-group values: no entry differs from another on any set, except that with
    ``separated > 0`` entry ``e`` is shifted by ``e * separated`` on ``set0`` (a true order there, none on the
    other sets: every flip is still false)."""
    base = {f"set{s}": {a: rng.random(n_groups) for a in axes} for s in range(n_sets)}
    entries = []
    for e in range(n_entries):
        sets = {}
        for s in range(n_sets):
            name = f"set{s}"
            shift = e * separated if s == 0 else 0.0
            values = {a: base[name][a] + shift + rng.normal(0.0, 0.2, n_groups) for a in axes}
            groups = _groups(values, {}, {}, None, None)
            sets[name] = SetEvaluation.from_groups(name, list(axes), groups, n_bootstrap=n_bootstrap)
        entries.append(Evaluation(sets, f"E{e}", {}, label=f"E{e}"))
    return entries


def shuffled_entries(ev: Evaluation, n_entries: int, rng: np.random.Generator) -> list[Evaluation]:
    """Entries made from one evaluation by giving each entry's group records a random permutation of the group
    ids, per set: each entry carries the same model's values on other groups, so no entry differs from another."""
    entries = []
    for e in range(n_entries):
        sets = {}
        for name, s in ev.sets.items():
            groups = list(s.groups or [])
            ids = [g.id for g in groups]
            perm = rng.permutation(len(ids))
            renamed = [GroupRecord(ids[perm[i]], axes=dict(g.axes), per_variant=dict(g.per_variant))
                       for i, g in enumerate(groups)]
            sets[name] = SetEvaluation.from_groups(name, list(s.axes), renamed, n_bootstrap=200)
        entries.append(Evaluation(sets, f"E{e}", {}, label=f"E{e}"))
    return entries


def pool_sets(pool: Sequence[str], rng: np.random.Generator, n_sets: int, n_groups: int, k: int = 4,
              prefix: str = "null") -> dict[str, list[dict]]:
    """Records of ``n_sets`` variant sets whose every group is ``k`` prompts drawn without replacement from one
    pool, kinds by position (so kind and group carry no information)."""
    out = {}
    for s in range(n_sets):
        out[f"{prefix}{s}"] = [{"id": f"g{i}", "variants": [pool[j] for j in rng.choice(len(pool), k, replace=False)],
                                "kinds": [f"k{j}" for j in range(k)]} for i in range(n_groups)]
    return out
