"""benchmarks/confidence_auc.py: its AUC against a brute-force count, and docs/validity.md's tables equal to what
the script computes from the committed evaluations (benchmarks/results/confidence-auc)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from sago_train.results.evaluation import Evaluation
from tests._helpers.scripts import script_module

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "confidence-auc"


@pytest.fixture(scope="module")
def script():
    with script_module("benchmarks/confidence_auc.py") as module:
        yield module


@pytest.fixture(scope="module")
def evaluations():
    return {label: Evaluation.read(RESULTS / label) for label in ("base", "finetune")}


@pytest.fixture(scope="module")
def rows(script, evaluations):
    return script.table(evaluations)  # the bootstrap CIs: computed once (about 20 s)


def test_auc_is_the_share_of_pairs_ranked_right(script):
    rng = np.random.default_rng(3)
    pos, neg = rng.integers(0, 5, 13).astype(float), rng.integers(0, 5, 9).astype(float)
    brute = np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg)])
    assert script.auc(pos, neg) == pytest.approx(brute)


def test_committed_figures_are_recomputed_from_the_records(script, evaluations, rows):
    committed = json.loads((RESULTS / "auc.json").read_text())
    assert set(committed) <= set(rows)
    for axis, row in committed.items():
        for key, value in row.items():
            assert rows[axis][key] == pytest.approx(value, abs=1e-9), (axis, key)
    assert json.loads((RESULTS / "verdicts.json").read_text()) == json.loads(json.dumps(script.verdicts(evaluations)))


def test_docs_validity_quotes_the_committed_tables(script, evaluations, rows):
    doc = (ROOT / "docs" / "validity.md").read_text()
    assert script.verdict_table(script.verdicts(evaluations)) in doc
    for axis, r in rows.items():
        if axis in json.loads((RESULTS / "auc.json").read_text()):
            assert (f"| {axis} | {r['auc']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | {r['n_unstable']}: "
                    f"{r['mean_unstable']:.4f} | {r['n_stable']}: {r['mean_stable']:.4f} |") in doc, axis
    assert rows["confidence"]["auc"] >= 0.75 > rows["confidence_prob"]["auc"]  # the done-when of issue #30
