"""scripts/experiment_loss*.py (docs/loss-experiment.md): the held-out sets, the endpoints and the summary's
statistics against plain references on fabricated records with a known truth, and the pipeline end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import experiment_loss  # noqa: E402
import experiment_loss_sets as sets  # noqa: E402
import experiment_loss_summary as summ  # noqa: E402

from sago_train.functional.multiplicity import holm  # noqa: E402


def test_rotation_sets_hold_out_facts_and_the_kind():
    facts = sets.tiny_facts()
    assert len(facts) == 104 and len({f.id for f in facts}) == 104
    rot = sets.rotation_sets(facts, ["typo", "casing", "whitespace"], "casing", seed=0, draws=4)
    train_ids = {r["id"] for r in rot["train"]}
    held_facts = {r["meta"]["fact"] for r in rot["kinds"]}
    assert len(train_ids) == 52 and len(held_facts) == 52 and not train_ids & held_facts
    assert len(rot["kinds"]) == len(rot["instances"]) == 208  # >= 200 held-out groups per set
    assert all(r["kinds"] == ["canonical", "typo", "whitespace"] for r in rot["train"] + rot["instances"])
    assert all(r["kinds"] == ["canonical", "casing", "casing-2"] for r in rot["kinds"])
    assert {r["id"] for r in rot["kinds"]} == {r["id"] for r in rot["instances"]}
    # The same split and draws in every rotation, and again on a rebuild (seeded).
    other = sets.rotation_sets(facts, ["typo", "casing", "whitespace"], "typo", seed=0, draws=4)
    assert {r["id"] for r in other["train"]} == train_ids
    assert sets.rotation_sets(facts, ["typo", "casing", "whitespace"], "casing", seed=0, draws=4) == rot
    typo_groups = [r for r in other["kinds"] if r["meta"]["fact"] == rot["kinds"][0]["meta"]["fact"]]
    assert len({r["variants"][1] for r in typo_groups}) > 1  # each group its own draw
    with pytest.raises(ValueError, match="held-out kind"):
        sets.rotation_sets(facts, ["typo"], "casing", seed=0, draws=1)


def _row(arm, seed, rot, gid, kinds, correct, conf, part="kinds"):
    return {"model": "t", "arm": arm, "seed": seed, "run": rot, "rotation": rot, "set": part, "id": gid,
            "kinds": kinds, "correct": correct, "confidence": conf}


def test_group_endpoints_combine_rotations_by_hand():
    rows = [_row("a", 0, "typo", "g", ["canonical", "typo", "typo-2"], [1, 0, 1], 0.2),
            _row("a", 0, "casing", "g", ["canonical", "casing", "casing-2"], [1, 0, 0], 0.4)]
    e = summ.group_endpoints(rows)[("a", 0, "kinds")]
    assert e["accuracy"]["g"] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert e["worst_kind"]["g"] == 0.0  # typo 0.5, casing 0.0
    assert e["confidence"]["g"] == pytest.approx(0.3)
    assert e["canonical"]["g"] == 1.0


def test_an_arm_seed_missing_a_rotation_is_left_out():
    k = ["canonical", "typo"]
    rows = [_row("a", 0, "typo", "g", k, [1, 1], 0.1), _row("a", 0, "casing", "g", k, [1, 0], 0.1),
            _row("a", 1, "typo", "g", k, [1, 1], 0.1)]  # seed 1 was interrupted before its casing run
    kept, left = summ.complete(rows)
    assert kept == rows[:2] and left == ["a seed 1"]


def _fabricated(n_groups=40, seeds=(0, 1, 2), shift=0.1, seed=0):
    """Records of three arms on one rotation: 'same' equals the baseline; 'better' has a confidence instability
    lower by ``shift + 0.01 * (g % 5)`` on every group and seed and no more wrong variants than the baseline."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in seeds:
        for g in range(n_groups):
            conf = float(rng.uniform(0.2, 0.8))
            wrong = int(rng.integers(0, 3))  # variants 1..2 wrong in the baseline
            base_c = [1, int(wrong < 1), int(wrong < 2)]
            better_c = [1, 1, int(wrong < 2 or g % 3 == 0)]
            for arm, c, cf in (("augment-fresh", base_c, conf), ("same", base_c, conf),
                               ("better", better_c, conf - shift - 0.01 * (g % 5))):
                rows.append(_row(arm, s, "typo", f"g{g}", ["canonical", "typo", "typo-2"], c, cf))
    return rows


def test_summary_statistics_match_plain_references():
    rows = _fabricated()
    res = summ.summarize(rows, "augment-fresh")["sets"]["kinds"]
    ends = summ.group_endpoints(rows)
    ps = []
    for arm in ("same", "better"):
        for endpoint, (_, alt) in summ.PRIMARY.items():
            base = np.array([[ends[("augment-fresh", s, "kinds")][endpoint][f"g{g}"] for s in (0, 1, 2)]
                             for g in range(40)])
            other = np.array([[ends[(arm, s, "kinds")][endpoint][f"g{g}"] for s in (0, 1, 2)] for g in range(40)])
            d = other.mean(1) - base.mean(1)
            ref_p = 1.0 if np.all(d == 0) else st.wilcoxon(d, alternative=alt).pvalue
            got = res["tests"][arm][endpoint]
            assert got["p"] == pytest.approx(ref_p)
            assert got["diff"] == pytest.approx((other - base).mean())
            per_seed = (other - base).mean(0)  # the seeds' test: a training run as the unit
            if np.allclose(per_seed, per_seed[0]):
                ref_seeds = 0.0 if (per_seed[0] > 0) == (alt == "greater") and per_seed[0] != 0 else 1.0
            else:
                ref_seeds = st.ttest_1samp(per_seed, 0.0, alternative=alt).pvalue
            assert got["p_seeds"] == pytest.approx(ref_seeds)
            ps.append(max(ref_p, ref_seeds))
    # Holm by hand over the 2 arms x 3 endpoints, of the larger of the two p-values.
    order = np.argsort(ps, kind="stable")
    ref_holm, running = np.empty(len(ps)), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        ref_holm[i] = running
    got_holm = [res["tests"][a][e]["p_holm"] for a in ("same", "better") for e in summ.PRIMARY]
    np.testing.assert_allclose(got_holm, ref_holm, rtol=0, atol=1e-11)  # holm() rounds to 12 places
    # The known truth: 'better' lowers confidence instability by 0.1 + 0.01 * (g % 5) on every group and seed.
    conf = res["tests"]["better"]["confidence"]
    assert conf["diff"] == pytest.approx(-(0.1 + 0.01 * np.mean(np.arange(40) % 5)))
    assert conf["p_holm"] < 1e-6 and conf["signs"] == "---" and conf["ci_high"] < 0
    assert res["tests"]["same"]["accuracy"]["p"] == 1.0 and res["tests"]["same"]["accuracy"]["signs"] == "000"
    assert res["canonical"]["better"]["non_inferior"] and res["canonical"]["better"]["diff"] == 0.0


def test_the_glance_table_restates_the_summary():
    summary = summ.summarize(_fabricated(), "augment-fresh")
    rows = summ.glance(summary)
    assert rows[0].startswith("| arm (vs `augment-fresh`) |") and len(rows) == 2 + 2
    better = next(r for r in rows if r.startswith("| better |")).split(" | ")
    t = summary["sets"]["kinds"]["tests"]["better"]
    assert better[3] == f"{t['confidence']['diff']:+.3f} ({t['confidence']['p_holm']:.2g})"
    c = summary["sets"]["kinds"]["canonical"]["better"]
    assert better[4] == f"{c['diff']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]"
    assert better[5] == f"`{t['accuracy']['signs']}` |"
    assert summ.markdown(summary).startswith("### At a glance: held-out kinds")


def test_non_inferiority_fails_when_canonical_accuracy_drops():
    rows = _fabricated(shift=0.0)
    for r in rows:
        if r["arm"] == "better" and int(r["id"][1:]) % 4 == 0:
            r["correct"] = [0, *r["correct"][1:]]  # a quarter of the groups lose the canonical
    canon = summ.summarize(rows, "augment-fresh")["sets"]["kinds"]["canonical"]["better"]
    assert canon["diff"] == pytest.approx(-0.25) and not canon["non_inferior"] and canon["ci_low"] < -0.02


def test_arms_share_everything_but_the_stability_section():
    for arm in experiment_loss.ARMS:
        assert all(o.startswith("--stability.") for o in experiment_loss.arm_overrides(arm, ["typo", "casing"]))
    fresh = experiment_loss.arm_overrides("augment-fresh", ["typo", "casing"])
    assert "--stability.fresh_kinds=[typo,casing]" in fresh and "--stability.conf_weight=0.0" in fresh
    kl = experiment_loss.arm_overrides("consistency-kl", ["typo", "casing"])
    assert set(fresh) - {"--stability.conf_weight=0.0"} <= set(kl)  # the same fresh data, plus the term
    with pytest.raises(SystemExit, match="unknown arm"):
        experiment_loss.arm_overrides("nope", [])


@pytest.mark.slow  # 20-80 s on 2 shared cores (twice: 6 tiny training runs, their evaluations and the base model's)
def test_pipeline_end_to_end_on_a_toy_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    code = experiment_loss.main(["--seeds", "0,1", "--arms", "canonical,augment-fresh", "--kinds", "typo,whitespace",
                                 "--draws", "1", "--max-train", "8", "--max-groups", "6", "--steps", "2",
                                 "--out", str(tmp_path)])
    assert code == 0
    rows = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    base = [r for r in rows if r["arm"] == "base"]  # the untrained model: once, on every rotation's sets
    assert len(base) == 2 * 2 * 6 and {r["seed"] for r in base} == {-1}
    rows = [r for r in rows if r["arm"] != "base"]
    # canonical: one run per seed evaluated on both rotations' sets; augment-fresh: one run per rotation.
    assert {(r["arm"], r["run"]) for r in rows} == {("canonical", "all"), ("augment-fresh", "typo"),
                                                    ("augment-fresh", "whitespace")}
    # 2 seeds x 2 arms x 2 rotations x 2 sets (kinds, instances) x 6 groups
    assert len(rows) == 2 * 2 * 2 * 2 * 6 and {r["seed"] for r in rows} == {0, 1}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["sets"]["kinds"]["tests"]["canonical"]["accuracy"]["seeds"] == 2
    assert "base" in summary["sets"]["kinds"]["levels"] and "base" not in summary["sets"]["kinds"]["tests"]
    assert "| canonical |" in (tmp_path / "summary.md").read_text()
    # A rerun resumes: nothing is trained again and the records are unchanged.
    before = (tmp_path / "records.jsonl").read_text()
    assert experiment_loss.main(["--seeds", "0,1", "--arms", "canonical,augment-fresh", "--kinds", "typo,whitespace",
                                 "--draws", "1", "--max-train", "8", "--max-groups", "6", "--steps", "2",
                                 "--out", str(tmp_path)]) == 0
    assert (tmp_path / "records.jsonl").read_text() == before
    # Two processes (--shards 2) record the same runs with the same values, merged into one file; a rerun resumes.
    sharded = tmp_path / "sharded"
    args = ["--seeds", "0,1", "--arms", "canonical,augment-fresh", "--kinds", "typo,whitespace", "--draws", "1",
            "--max-train", "8", "--max-groups", "6", "--steps", "2", "--shards", "2", "--out", str(sharded)]
    assert experiment_loss.main(args) == 0
    merged = (sharded / "records.jsonl").read_text()
    assert sorted(merged.splitlines()) == sorted(before.splitlines())
    assert not (sharded / "shard-1" / "records.jsonl").exists()  # merged into the experiment's own, then emptied
    assert len((sharded / "timings.jsonl").read_text().splitlines()) == 1 + 2 * 3  # base + 2 seeds x 3 runs
    assert experiment_loss.main(args) == 0 and (sharded / "records.jsonl").read_text() == merged


def test_the_training_overrides_reach_every_run_and_every_shard(tmp_path, monkeypatch):
    """--learning-rate / --steps become recipe overrides of each run, and a shard process gets them too (the
    first SmolLM2 run is reproduced with --learning-rate 3e-3 --data-seed 0)."""
    seen = []
    monkeypatch.setattr(experiment_loss, "run_shards", lambda args, out, **kw: seen.append(args) or 1)
    assert experiment_loss.main(["--model", "smollm2", "--arms", "augment-fixed,augment-fresh", "--shards", "2",
                                 "--learning-rate", "3e-3", "--steps", "5", "--out", str(tmp_path)]) == 1
    args = seen[0]
    assert args.seeds == [0, 1, 2, 3] and args.data_seed == 1 and args.draws == 1  # SmolLM2's defaults
    assert experiment_loss.training_overrides(args, 2) == [
        "--training.seed=2", "--training.max_steps=5", "--training.learning_rate=0.003"]
    flags = experiment_loss.shard_args(args, tmp_path)
    assert flags[flags.index("--learning-rate") + 1] == "0.003" and flags[flags.index("--steps") + 1] == "5"
    assert flags[flags.index("--data-seed") + 1] == "1" and flags[flags.index("--arms") + 1] == "augment-fixed,augment-fresh"
    # The shard parses its flags back to the same settings.
    seen.clear()
    monkeypatch.setattr(experiment_loss, "run_all", lambda args, out, sets: seen.append(args) or 1)
    monkeypatch.setattr(experiment_loss, "build_sets", lambda *a: {})
    assert experiment_loss.main([*flags, "--shard", "1/2", "--out", str(tmp_path / "shard-1")]) == 1
    assert experiment_loss.training_overrides(seen[0], 2) == experiment_loss.training_overrides(args, 2)
    seen.clear()
    experiment_loss.main(["--model", "tiny", "--arms", "augment-fresh", "--out", str(tmp_path / "tiny")])
    assert (seen[0].seeds, seen[0].data_seed, seen[0].draws) == ([0, 1, 2, 3, 4], 0, 4)  # the tiny model's


def test_real_facts_ask_the_plain_question():
    """SmolLM2's facts are the bundled sets' last few-shot question, asked alone as one user message."""
    from experiment_loss_sets import plain_question, real_facts

    facts = real_facts(max_per_set=2)
    assert len(facts) == 8
    for f in facts:
        content = f.prompt[0]["content"]
        assert f.prompt[0]["role"] == "user" and "Question:" not in content and "Answer:" not in content
        assert content.endswith("?") and f.target.endswith("<|im_end|>") and f.target.startswith(f.reference)
    assert plain_question("no scaffold here") == "no scaffold here"


def _null_rows(rng, run_sd, n_groups=25, seeds=(0, 1, 2, 3, 4), arms=("augment-fresh", "a", "b")):
    """Arms that do not differ: every arm's groups drawn alike; each training run (arm, seed) shifts all of its
    groups by one N(0, run_sd) draw, as training runs do."""
    level, p_right = rng.uniform(0.2, 0.8, n_groups), rng.uniform(0.3, 0.95, n_groups)
    rows = []
    for arm in arms:
        for s in seeds:
            shift = rng.normal(0, run_sd)
            for g in range(n_groups):
                right = [int(rng.random() < min(1.0, max(0.0, p_right[g] + shift))) for _ in range(3)]
                rows.append(_row(arm, s, "typo", f"g{g}", ["canonical", "typo", "typo-2"], right,
                                 float(level[g] + shift + rng.normal(0, 0.05))))
    return rows


@pytest.mark.slow  # 120 summaries: about 60 s
def test_a_claim_against_the_baseline_holds_its_error_rate_under_run_to_run_variation():
    """No arm differs; training runs vary (run_sd 0.03, about the tiny experiment's per-seed spread). The share of
    simulated experiments with any claim (Holm p < 0.05) stays within alpha + 2 SE; the group-level Wilcoxon alone
    (the previous rule) claims far more often, because a run's shift shared by its groups reads as an effect."""
    rng = np.random.default_rng(0)
    runs, claimed, group_only = 60, {0.0: 0, 0.03: 0}, 0
    for run_sd in claimed:
        for _ in range(runs):
            tests = summ.summarize(_null_rows(rng, run_sd), "augment-fresh")["sets"]["kinds"]["tests"]
            claimed[run_sd] += any(r["p_holm"] < 0.05 for t in tests.values() for r in t.values())
            if run_sd:
                ps = [r["p"] for t in tests.values() for r in t.values()]
                group_only += any(p < 0.05 for p in holm(ps))
    bound = 0.05 + 2 * (0.05 * 0.95 / runs) ** 0.5
    assert claimed[0.0] / runs <= bound and claimed[0.03] / runs <= bound, claimed
    assert group_only / runs > 0.2, group_only


@pytest.mark.parametrize("model", ["tiny", "smollm2-lr3e-3", "smollm2"])
def test_the_docs_paste_the_committed_summaries(model):
    """docs/loss-experiment.md quotes what the code computed: every table row of the committed summary.md."""
    root = SCRIPTS.parent
    summary = (root / "benchmarks" / "results" / "experiment-loss" / model / "summary.md").read_text()
    docs = (root / "docs" / "loss-experiment.md").read_text()
    rows = [line for line in summary.splitlines() if line.startswith("| ") and not line.startswith("| arm")]
    assert rows
    missing = [r for r in rows if r not in docs]
    assert not missing, f"{len(missing)} rows of {model}'s summary.md are not in the docs, e.g. {missing[0]}"


def test_the_readme_quotes_the_committed_loss_summaries():
    """The README's paragraph on the loss experiments: each figure it gives is in the committed summary it comes
    from (the pool experiment's on the tiny model, and the first experiment's cost of the old default)."""
    import re

    root = SCRIPTS.parent
    readme = (root / "README.md").read_text()
    para = readme[readme.index("**`make experiment-loss`**"):readme.index("**Two real models offline**")]
    pool = (root / "benchmarks" / "results" / "experiment-pool" / "tiny" / "summary.md").read_text()
    real = (root / "benchmarks" / "results" / "experiment-pool" / "smollm2" / "summary.md").read_text()
    first = (root / "benchmarks" / "results" / "experiment-loss" / "tiny" / "summary.md").read_text()
    cis = re.findall(r"[+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]", para)
    assert len(cis) == 3, cis
    assert cis[0] == "+0.054 [+0.022, +0.088]" and f"| {cis[0]} | 0.00019 | 1.9e-06 | 0.0013 |" in pool
    assert f"| pool-kl-0.3 | 0.220 [0.146, 0.303] | {cis[1]} | 0.95 | 0.72 | 1 |" in real and "Holm p 1)" in para
    assert "243 min" in para and "total 242.6 min" in real
    assert cis[2] in first
    assert "| pool-bct | 0.207 [0.118, 0.319] | -0.284 [" in pool and "(-0.284)" in para
    assert "18\nof 20 seeds" in para or "18 of 20 seeds" in para.replace("\n", " ")
    assert pool.split("pool-kl-0.3 | 0.545")[1].split("`")[1].count("+") == 18
