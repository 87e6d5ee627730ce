"""benchmarks/study_power.py (docs/study.md#power): each simulated claim against a known truth (no effect is never
claimed beyond its error rate, a large one always is), the flips' smallest p against scipy's exact Wilcoxon, and
the family sizes read from a study folder equal to those its report corrects over."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tests._helpers.scripts import script_module


@pytest.fixture(scope="module")
def power():
    with script_module("benchmarks/study_power.py") as module:
        yield module


def test_no_effect_is_not_claimed_and_a_large_one_is(power):
    assert power.flip_power(45, 200, 0.0, 10) == 0.0
    assert power.flip_power(45, 200, 3.0, 10) == 1.0
    assert power.reliability_power(45, 1, 0.0, 40) <= 0.15  # nominal 0.05, 40 replicates
    assert power.reliability_power(45, 48, 0.95, 10) == 1.0
    distinct, related = power.relation_power(400, 1, 0.0, 10, n_resamples=300)
    assert distinct >= 0.9 and related <= 0.2  # 400 groups: the CI is about +-0.1 around 0
    distinct, related = power.relation_power(45, 1, 0.9, 10, n_resamples=300)
    assert distinct == 0.0 and related == 1.0


def test_power_grows_with_the_effect_and_falls_with_the_family(power):
    assert power.flip_power(45, 1, 0.5, 40) > power.flip_power(45, 1000, 0.5, 40)
    assert power.flip_power(45, 200, 0.8, 40) > power.flip_power(45, 200, 0.4, 40)


def test_the_smallest_wilcoxon_p_is_scipys_exact_one(power):
    n = 20
    exact = stats.wilcoxon(np.arange(1, n + 1), alternative="greater", method="exact").pvalue
    result = power.table({"groups": n, "reliability": 1, "relations": 1, "flips": 1}, 2, rhos=(0.0,), effects=(0.0,))
    assert result["smallest_wilcoxon_p"] == pytest.approx(exact)
    text = power.markdown(result)
    assert "| rho = 0 |" in text and "2^-20" in text


def test_study_sizes_reads_the_entries_the_study_compared(power, tmp_path):
    import json

    from sago_train.analysis.compare import compare_evaluations, load_sources
    from tests._helpers.results_dirs import axis_values, write_eval_dir

    for k, name in enumerate(("a", "b", "c")):
        write_eval_dir(tmp_path / name, {"s1": axis_values(k), "s2": axis_values(10 + k)}, model=name)
    with pytest.raises(SystemExit, match="no report/comparison.json"):
        power.study_sizes(tmp_path)
    cmp = compare_evaluations(load_sources([str(tmp_path / n) for n in "abc"], last_only=True))
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "comparison.json").write_text(json.dumps(cmp))
    # An earlier study's entry left in the folder (5 groups) is not one of this study's.
    write_eval_dir(tmp_path / "old", {"s1": axis_values(7, n=5), "s2": axis_values(8, n=5)}, model="old")
    sizes = power.study_sizes(tmp_path)
    assert sizes["groups"] == 12
    # 3 entries x 2 sets x the 3 pairs of the non-constant axes (mirroring is 0 everywhere: undefined).
    assert sizes["relations"] == 18
    # 3 entry pairs x 1 set pair x 4 axes (activation, confidence, generation, mirroring) could flip.
    assert sizes["flips"] == 12 == cmp["families"]["axes"]["tested"]
    assert sizes["reliability"] == 0  # these records have no split halves
