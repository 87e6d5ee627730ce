"""scripts/run_demo.py and scripts/demo_analysis.py: arm parsing, the canonical index, the relative values."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import demo_analysis  # noqa: E402
import run_demo  # noqa: E402


def test_canonical_accuracy_uses_the_groups_canonical_index():
    # The audit: the demo took correct[0]. Here variant 0 is wrong and the canonical (index 2) right.
    records = [{"id": "a", "correct": [False, False, True]}, {"id": "b", "correct": [True, False, False]}]
    canonical = {"a": 2, "b": 0}
    assert demo_analysis.canonical_accuracy(records, canonical) == 1.0
    assert demo_analysis.canonical_accuracy(records, {}) == 0.5  # default index 0 (SPEC)
    assert np.isnan(demo_analysis.canonical_accuracy([{"id": "c", "correct": None}], {}))


def test_parse_arms_defaults_selection_and_definitions():
    arms = run_demo.parse_arms(None, [])
    assert list(arms) == ["canonical", "augment", "stability", "augment+stability", "relative", "augment+relative"]
    # The arms differ only in the stability section, and each fixes every setting it depends on.
    assert all(all(o.startswith("--stability.") for o in v) for v in arms.values())
    assert "--stability.task_loss_variants=all" in arms["augment"]
    assert "--stability.act_weight=0.0" in arms["augment"] and "--stability.mode=relative" in arms["relative"]
    chosen = run_demo.parse_arms("augment,mine", ["mine=--stability.act_weight=2 --training.max_steps=5"])
    assert chosen == {"augment": arms["augment"], "mine": ["--stability.act_weight=2", "--training.max_steps=5"]}
    with pytest.raises(SystemExit, match="unknown arm"):
        run_demo.parse_arms("augment,nope", [])
    with pytest.raises(SystemExit, match="NAME=OVERRIDES"):
        run_demo.parse_arms(None, ["no-equals-sign"])


def _cos_dist(a, b):
    return 1 - float(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b))


def test_relative_values_match_pair_loops():
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(4, 3, 2, 5))  # [G, K, L, H]
    act, rel, own_between, set_between = demo_analysis.relative_values(hidden)
    g, k, n_layers, _ = hidden.shape
    for layer in range(n_layers):
        x = hidden[:, :, layer]
        pairs = [_cos_dist(x[p, i], x[q, j]) for p in range(g) for q in range(g) if p != q
                 for i in range(k) for j in range(k)]
        assert set_between[layer] == pytest.approx(np.mean(pairs), abs=1e-12)
    for grp in range(g):
        within = [np.mean([_cos_dist(hidden[grp, i, li], hidden[grp, j, li])
                           for i, j in itertools.combinations(range(k), 2)]) for li in range(n_layers)]
        assert act[grp] == pytest.approx(np.mean(within), abs=1e-12)
        assert rel[grp] == pytest.approx(np.mean([w / b for w, b in zip(within, set_between)]), abs=1e-12)
        own = [np.mean([_cos_dist(hidden[grp, i, li], hidden[q, j, li]) for q in range(g) if q != grp
                        for i in range(k) for j in range(k)]) for li in range(n_layers)]
        assert own_between[grp] == pytest.approx(np.mean(own), abs=1e-12)


def test_headline_tables_cover_every_arm_with_paired_tests():
    rng = np.random.default_rng(1)
    base = {m: rng.uniform(0.2, 0.8, 12) for m in ("activation_rel", "activation", "between", "confidence")}

    def arm(shift):
        a = demo_analysis.ArmSet(ids=[f"g{i}" for i in range(12)], kinds=["canonical", "other"],
                                 rel_source="recomputed from the adapter")
        for m, v in base.items():
            a.values[m] = v + shift + rng.uniform(-0.01, 0.01, 12)
        a.values["accuracy"] = rng.integers(0, 2, 12).astype(float)
        a.values["accuracy_canonical"] = rng.integers(0, 2, 12).astype(float)
        a.values["kind:other"] = rng.integers(0, 2, 12).astype(float)
        return {"s": a}

    text = demo_analysis.headline_tables({"augment": arm(0.0), "better": arm(-0.5), "same": arm(0.0)},
                                         "augment", 10, 0)
    header = [line for line in text.splitlines() if line.startswith("| set | metric |")]
    assert header[0] == "| set | metric | augment | better | same |"
    assert header[1] == "| set | metric | better | same |"
    rel_row = [line for line in text.splitlines() if line.startswith("| s | activation_rel |")][-1]  # paired
    better, same = rel_row.split(" | ")[2:4]
    # 12 groups all lower by about 0.5: the exact one-sided Wilcoxon p is 1/2^12.
    assert better.startswith("-0.5") and better.split(" Holm=")[0].endswith("p=0.00024")
    assert float(same.split("p=")[1].split(" Holm=")[0]) > 0.001
    assert "accuracy, kind other" in text
    # Holm over every test of the paired table, against a plain step-down computed here from the printed p's.
    paired = text.split("Paired tests")[1]
    cells = [c for line in paired.splitlines() if line.startswith("| s |") for c in line.split(" | ")[2:]]
    pairs = [(float(c.split("p=")[1].split(" Holm=")[0]), float(c.split("Holm=")[1].rstrip(" |"))) for c in cells]
    assert len(pairs) == 7 * 2 and f"all {len(pairs)} tests" in paired
    ps = sorted(p for p, _ in pairs)
    for p, got in pairs:
        want = min(1.0, max(min(1.0, (len(ps) - r) * q) for r, q in enumerate(ps) if q <= p))
        assert got == pytest.approx(want, rel=0.06)  # both printed to 2 significant digits


ROOT = SCRIPTS.parent


def _run_demo(tmp_path, *args):
    """scripts/run_demo.py as `make demo` runs it (a subprocess, in a directory of its own: nothing may land in
    the current directory), on a reduced setting: the point is that every arm runs end to end."""
    import os

    from tests._helpers.proc import run

    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    env.pop("WANDB_DIR", None)
    work = tmp_path / "cwd"
    work.mkdir()
    res = run([sys.executable, str(SCRIPTS / "run_demo.py"), "--out", str(tmp_path / "demo"), *args], cwd=work,
              env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert list(work.iterdir()) == [], "the demo wrote into the current directory"
    return tmp_path / "demo", res


def _check_arms(out, arms, steps):
    import json

    assert (out / "headline.md").is_file() and (out / "report" / "report.md").is_file()
    assert "| set | metric | " + " | ".join(arms) + " |" in (out / "headline.md").read_text()  # every arm tabled
    for arm in arms:
        history = [json.loads(line) for line in (out / arm / "sago" / "history.jsonl").read_text().splitlines()]
        assert [h["step"] for h in history] == [0, steps], arm
        assert not (out / arm / "sago" / "run.lock").exists(), arm  # released cleanly
        assert any((out / arm / "wandb").iterdir()), arm  # W&B files under the arm, not the current directory


@pytest.mark.slow
def test_make_demo_runs_every_arm_on_a_reduced_setting(tmp_path):
    # Every arm of `make demo` (their names included: a run-name check once refused 'augment+stability').
    out, _ = _run_demo(tmp_path, "--steps", "2", "--override",
                       "--monitor.eval_steps=2 --monitor.options.max_groups=4 --training.logging_steps=1")
    _check_arms(out, list(run_demo.DEFAULT_ARMS), steps=2)


@pytest.mark.slow
def test_make_demo_real_runs_its_arms_on_a_reduced_setting(tmp_path, real_smollm):
    # The arms of `make demo-real` on its recipe (the real model), one step, 3 groups per set.
    arms = ["canonical", "augment", "relative"]
    out, _ = _run_demo(tmp_path, "--recipe", str(ROOT / "recipes" / "demo-real.yaml"), "--arms", ",".join(arms),
                       "--baseline", "augment", "--steps", "1", "--override",
                       "--monitor.eval_steps=1 --monitor.options.max_groups=3 --monitor.options.max_new_tokens=4")
    _check_arms(out, arms, steps=1)


@pytest.mark.slow  # 300 tables: about 7 s
def test_a_claim_read_off_the_demo_table_holds_its_family_wise_error_rate():
    """Arms that do not differ from the baseline (seeded, through headline_tables): a cell with Holm < 0.05 turns up
    in at most alpha + 2 SE of the simulated demos, while the raw p-values would claim something in most of them."""
    rng = np.random.default_rng(0)
    metrics = ("activation_rel", "activation", "between", "confidence")

    def arm(level):
        a = demo_analysis.ArmSet(ids=[f"g{i}" for i in range(24)], kinds=["canonical", "other"], rel_source="x")
        for m in metrics:
            a.values[m] = level[m] + rng.normal(0, 0.1, 24)
        a.values["accuracy"] = (rng.random(24) < level["p"]).astype(float)
        return {"s": a}

    n, holm_hits, raw_hits = 300, 0, 0
    for _ in range(n):
        level = {m: rng.uniform(0.2, 0.8, 24) for m in (*metrics, "p")}
        text = demo_analysis.headline_tables({name: arm(level) for name in ("augment", "a", "b", "c")}, "augment", 1, 0)
        cells = [c for c in text.split("Paired tests")[1].split(" | ") if "Holm=" in c]
        assert len(cells) == 5 * 3
        holm_hits += min(float(c.split("Holm=")[1].split()[0]) for c in cells) < 0.05
        raw_hits += min(float(c.split("p=")[1].split()[0]) for c in cells) < 0.05
    se = (0.05 * 0.95 / n) ** 0.5
    assert holm_hits / n <= 0.05 + 2 * se, holm_hits
    assert raw_hits / n > 0.2, raw_hits  # the uncorrected table: the reason for the Holm column
