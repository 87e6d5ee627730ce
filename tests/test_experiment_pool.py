"""scripts/experiment_pool*.py (docs/loss-experiment.md#the-pool-experiment): the split and the sets, the per-fact
endpoints by hand, the power calculation against a simulation, a known truth through the summary, and the
pipeline end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import experiment_pool as pool  # noqa: E402
import experiment_pool_sets as psets  # noqa: E402
import experiment_pool_summary as psumm  # noqa: E402


def test_the_split_is_a_partition_with_a_pool_three_times_the_labeled_set():
    parts = psets.split(psets.facts(), 0)
    ids = {k: {f.id for f in v} for k, v in parts.items()}
    assert [len(ids[k]) for k in ("labeled", "pool", "held_out")] == [16, 48, 40]
    assert not (ids["labeled"] & ids["pool"] or ids["labeled"] & ids["held_out"] or ids["pool"] & ids["held_out"])
    assert psets.split(list(reversed(psets.facts())), 0) == parts  # independent of the input order
    assert psets.split(psets.facts(), 1) != parts


def test_the_sets_carry_the_kinds_and_only_labeled_items_have_targets():
    b = psets.build(0, 2)
    assert all(r["target"].endswith(", indeed.") for r in b["train-labeled"])
    assert all("target" not in r and "reference" not in r for r in b["train-pool"])
    held = {r["meta"]["fact"] for r in b["instances"]}
    trained = {r["id"] for r in b["train-labeled"] + b["train-pool"]}
    assert len(b["instances"]) == len(b["kinds"]) == 80 and not held & trained
    assert all(r["kinds"] == ["canonical", "alt", "question", "terse", "typo", "whitespace"] for r in b["instances"])
    assert all(r["kinds"] == ["canonical", "alt2", "inverted", "casing", "template"] for r in b["kinds"])
    g = b["kinds"][0]
    assert g["variants"][3] == g["variants"][0].lower()
    assert g["variants"][4] in {f"Q: {g['variants'][0]}", f"Fact: {g['variants'][0]}"}
    # the two draws of a held-out fact differ in their noise, and a rebuild gives the same records
    d0, d1 = b["instances"][0], b["instances"][1]
    assert d0["meta"] == d1["meta"] and d0["variants"][4:] != d1["variants"][4:]
    assert psets.build(0, 2) == b


def test_smollm2_facts_are_the_real_sets_templated_families_asked_as_chat_questions():
    fs = psets.facts("smollm2")
    assert len(fs) == 135 and len({f.id for f in fs}) == 135  # 45 capitals, 45 opposites, 45 sums
    by_id = {f.id: f for f in fs}
    france = by_id["capital-france"]
    assert france.prompts["canonical"] == "What is the capital of France?"
    assert france.prompts["alt"] == "Which city is the capital city of France?"  # the real set's own paraphrase
    assert france.target == "Paris, indeed.<|im_end|>" and france.reference == "Paris, indeed"
    assert by_id["opposite-big"].reference == ["small, indeed", "little, indeed"]  # the set's aliases
    times = next(f for f in fs if "*" in f.prompts["canonical"])
    assert "multiply" in times.prompts["alt"] and " times " in times.prompts["inverted"]
    assert all(len(set(f.prompts.values())) == 6 for f in fs)  # six distinct phrasings per fact
    parts = psets.split(fs, 0)
    assert [len(parts[k]) for k in ("labeled", "pool", "held_out")] == [16, 48, 71]
    b = psets.build(0, 1, "smollm2")
    g = b["instances"][0]
    assert all(isinstance(v, list) and v[0]["role"] == "user" for v in g["variants"])
    assert g["variants"][0][0]["content"] == by_id[g["meta"]["fact"]].prompts["canonical"]
    assert b["train-labeled"][0]["target"].endswith(", indeed.<|im_end|>")
    with pytest.raises(ValueError, match="expected 'tiny' or 'smollm2'"):
        psets.facts("gpt2")


def test_smollm2_runs_the_tiny_models_best_term_arm(tmp_path):
    tests = {"canonical": {"diff": 0.09}, "pool-kl-0.3": {"diff": 0.04}, "pool-bct": {"diff": 0.05},
             "pool-kl-1": {"diff": -0.4}}
    (tmp_path / "summary.json").write_text(json.dumps({"tests": {"instances/accuracy": tests}}))
    assert pool.best_term_arm(tmp_path / "summary.json") == "pool-bct"  # canonical is not a term arm
    with pytest.raises(SystemExit, match="not published"):
        pool.best_term_arm(tmp_path / "missing.json")
    assert pool.recipe_batch("smollm2") == 4 and pool.recipe_batch("tiny") == 8
    assert pool.arms(4)["pool-kl-1"][1][-2] == "--training.per_device_train_batch_size=16"


def _rec(arm, seed, part, gid, correct, conf, kinds=("canonical", "a", "b")):
    return {"arm": arm, "seed": seed, "run": "all", "set": part, "id": gid, "fact": gid.split("#")[0],
            "kinds": list(kinds), "correct": correct, "confidence": conf, "step": 60}


def test_fact_endpoints_average_a_facts_draws_by_hand():
    rows = [_rec("augment", 0, "instances", "f#d0", [1, 0, 0], 0.2), _rec("augment", 0, "instances", "f#d1", [1, 1, 0], 0.4),
            _rec("augment", 0, "instances", "g#d0", [0, 0, 1], 0.1)]
    e = psumm.fact_endpoints(rows)[("augment", 0, "instances")]
    assert e["accuracy"] == {"f": pytest.approx(3 / 6), "g": pytest.approx(1 / 3)}
    assert e["confidence"]["f"] == pytest.approx(0.3) and e["canonical"] == {"f": 1.0, "g": 0.0}
    assert e["kind:a"]["f"] == pytest.approx(0.5) and e["kind:b"]["g"] == 1.0


def test_power_matches_a_simulated_t_test():
    """The detectable difference at 80% power is the one a simulated one-sided t-test over seeds detects 80% of the
    time (2000 simulated experiments), and the seeds needed for 0.02 are the fewest that reach it."""
    rng = np.random.default_rng(1)
    base = rng.normal(0.5, 0.1, (40, 10))
    sd = 0.015
    p = psumm.power(base, base + rng.normal(0, sd, (1, 10)) + rng.normal(0, 0.001, (40, 10)), m=7)
    n, d, sd_hat, alpha = p["seeds"]["n"], p["seeds"]["detectable"], p["seeds"]["sd"], p["alpha"]
    sims = rng.normal(d, sd_hat, (2000, n))
    hits = np.mean([st.ttest_1samp(x, 0.0, alternative="greater").pvalue < alpha for x in sims])
    assert abs(hits - 0.80) < 0.03
    need = p["seeds"]["needed"]  # the fewest seeds at which a true 0.02 is detected 80% of the time
    for n, at_least in ((need, True), (need - 1, False)):
        sims = rng.normal(psumm.EFFECT, sd_hat, (4000, n))
        rate = np.mean(st.ttest_1samp(sims, 0.0, axis=1, alternative="greater").pvalue < alpha)
        assert (rate > 0.78) if at_least else (rate < 0.82), (n, rate)
    assert alpha == pytest.approx(0.05 / 7)


def _fabricated(effect: float, seeds: int = 8, facts: int = 30, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    p_fact = rng.uniform(0.3, 0.7, facts)
    for arm, shift in (("augment", 0.0), ("pool-kl-1", effect), ("pool-bct", 0.0)):
        for s in range(seeds):
            run = rng.normal(0, 0.01)
            for f in range(facts):
                c = (rng.random(6) < np.clip(p_fact[f] + shift + run, 0, 1)).astype(int).tolist()
                rows.append({**_rec(arm, s, "instances", f"f{f}#d0", c, 0.1,
                                    ("canonical", "alt", "question", "terse", "typo", "whitespace"))})
    return rows


def test_a_known_effect_is_claimed_and_a_null_arm_is_not():
    s = psumm.summarize(_fabricated(0.25), "augment")
    t = s["tests"]["instances/accuracy"]
    assert t["pool-kl-1"]["p_holm"] < 0.01 and t["pool-kl-1"]["signs"] == "+" * 8
    assert 0.15 < t["pool-kl-1"]["diff"] < 0.35
    assert t["pool-bct"]["p_holm"] > 0.05
    assert set(s["power"]) == {"pool-kl-1", "pool-bct"} and s["power"]["pool-bct"]["alpha"] == 0.025
    text = psumm.markdown(s, [], {})
    assert "| pool-kl-1 |" in text and "Dose-response" in text and "Power of the primary test" in text


def test_arms_differ_only_in_the_stability_section_and_the_pool():
    table = pool.arms()
    assert set(table) == set(pool.ARMS) and pool.BASELINE in table and len(table) == 8
    for arm, (data, overrides) in table.items():
        other = [o for o in overrides if not o.startswith("--stability.")]
        assert other == (["--training.per_device_train_batch_size=32"] if data == "mixed" else []), arm
        assert data == ("mixed" if arm.startswith("pool-") else "labeled")
    assert "--stability.conf_weight=3" in table["pool-kl-3"][1]
    assert "--stability.unlabeled_task_loss=true" in table["pool-bct"][1]
    assert "--stability.task_loss_variants=canonical" in table["control-kl"][1]


@pytest.mark.slow  # about 60-120 s on 2 shared cores: 3 tiny training runs of 2 steps, their evaluations, the base model
def test_pipeline_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = ["--seeds", "0", "--arms", "augment,pool-kl-1,pool-bct", "--steps", "2", "--out", str(tmp_path)]
    assert pool.main(args) == 0
    rows = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    per_run = {(r["arm"], r["set"]) for r in rows}
    assert per_run == {(a, p) for a in ("augment", "pool-kl-1", "pool-bct", "base") for p in psumm.SETS}
    assert len([r for r in rows if r["arm"] == "augment"]) == 80 + 80 + 16 + 48
    assert all(r["fact"] == r["id"].split("#")[0] and len(r["logprobs"]) == len(r["kinds"]) for r in rows)
    losses = [json.loads(x) for x in (tmp_path / "losses.jsonl").read_text().splitlines()]
    by_arm = {r["arm"]: r for r in losses}
    assert set(by_arm) == {"augment", "pool-kl-1", "pool-bct"}
    assert by_arm["augment"].get("sago_unlabeled_share", 0) == 0 and by_arm["pool-kl-1"]["sago_unlabeled_share"] > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["tests"]["instances/accuracy"]) == {"pool-kl-1", "pool-bct"}
    timings = [json.loads(x) for x in (tmp_path / "timings.jsonl").read_text().splitlines()]  # 3 runs and the base
    assert len(timings) == 4 and all(t["peak_rss_mb"] > 100 and t["threads"] == 1 for t in timings)
    before = (tmp_path / "records.jsonl").read_text()
    assert pool.main(args) == 0 and (tmp_path / "records.jsonl").read_text() == before  # a rerun resumes


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the child's VmHWM from Linux /proc")
def test_a_runs_peak_rss_is_its_own_process_peak():
    """run_child's peak: what the child itself held (a 256 MiB buffer it touched shows), not this process's
    high-water mark (a 512 MiB buffer held here while the child runs does not), and its exit code."""
    here = bytearray(512 * 2**20)
    here[::4096] = b"x" * len(here[::4096])
    # the child holds its buffer a second: a run's peak lasts its training steps, read every 0.2 s
    touch = ("import time; b = bytearray({n} * 2**20); b[::4096] = b'y' * len(b[::4096]); time.sleep(1); "
             "raise SystemExit({code})")
    code, wall, small = pool.run_child([], command=(sys.executable, "-c", touch.format(n=1, code=0)))
    assert code == 0 and wall > 0 and small < 200
    code, _, big = pool.run_child([], command=(sys.executable, "-c", touch.format(n=256, code=3)))
    assert code == 3 and 240 < big - small < 300
    del here


def test_power_projects_the_facts_spread_to_more_seeds():
    """Differences built as fact effect (SD tau) + seed shift + residual (SD sigma): the two-way decomposition
    recovers tau and sigma, and the per-fact SD at S seeds is sqrt(tau^2 + sigma^2 / S), as measured on a grid
    simulated with S seeds."""
    rng = np.random.default_rng(3)
    tau, sigma, n_f = 0.08, 0.17, 400
    fact = rng.normal(0, tau, (n_f, 1))

    def grid(n_s):
        return fact + rng.normal(0, 0.02, (1, n_s)) + rng.normal(0, sigma, (n_f, n_s))

    p = psumm.power(np.zeros((n_f, 4)), grid(4), 1, seeds=20)
    assert p["facts"]["tau"] == pytest.approx(tau, rel=0.15) and p["facts"]["sigma"] == pytest.approx(sigma, rel=0.05)
    measured = grid(20).mean(1).std(ddof=1)
    assert p["facts"]["sd_at"] == pytest.approx(measured, rel=0.1)
    assert p["seeds_at"] == 20 and p["facts"]["detectable_at"] < p["facts"]["detectable"]


PILOT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "experiment-pool" / "pilot"


def test_the_committed_pilot_summary_is_computed_from_its_records(tmp_path):
    """benchmarks/results/experiment-pool/pilot: the summary the docs quote, recomputed from the committed
    records (planned at 20 seeds, as docs/loss-experiment.md states), is the committed one."""
    import shutil

    for name in ("records.jsonl.gz", "timings.jsonl", "losses.jsonl"):
        shutil.copyfile(PILOT / name, tmp_path / name)
    assert psumm.write_summary(tmp_path, baseline=pool.BASELINE, planned_seeds=20, order=pool.ARMS) == (PILOT / "summary.md").read_text()
    docs = (Path(__file__).resolve().parents[1] / "docs" / "loss-experiment.md").read_text()
    for row in (PILOT / "summary.md").read_text().splitlines():
        if row.startswith(("| 0.3 |", "| 1 |", "| pool-kl-0.3 | 0.0146")) or (
                row.startswith(("| pool-kl-0.3 | 0.", "| pool-kl-1 | 0.", "| pool-bct | 0.")) and "[" in row):
            assert row in docs, row


TINY = PILOT.parent / "tiny"
SMOLLM2 = PILOT.parent / "smollm2"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "loss-experiment.md"


def _recomputed(published: Path, tmp_path: Path) -> str:
    """The summary written from ``published``'s committed records, timings and losses, after checking it is the
    committed ``summary.md``."""
    import gzip

    (tmp_path / "records.jsonl").write_bytes(gzip.decompress((published / "records.jsonl.gz").read_bytes()))
    for name in ("timings.jsonl", "losses.jsonl"):
        (tmp_path / name).write_bytes((published / name).read_bytes())
    text = psumm.write_summary(tmp_path, baseline=pool.BASELINE, order=pool.ARMS)
    assert text == (published / "summary.md").read_text()
    return text


def test_the_published_tiny_summary_is_computed_from_its_records_and_quoted_in_the_docs(tmp_path):
    """benchmarks/results/experiment-pool/tiny: the 20-seed summary the docs and the README quote, recomputed from
    the committed records, is the committed one; the primary table's rows are in docs/loss-experiment.md."""
    text = _recomputed(TINY, tmp_path)
    docs = DOCS.read_text()
    primary = text.split("### Every set")[0]
    rows = [r for r in primary.splitlines() if r.startswith("| ") and "] |" in r and not r.startswith(("| base", "| arm"))]
    assert len(rows) == 8
    for row in rows:
        assert row in docs, row


def test_cost_is_the_median_of_the_runs_measured_alone():
    """The cost table's figures by hand: runs without ``threads`` are left out, and so is a run that followed
    another in its process (its time and peak are partly the earlier run's); medians, ratios to the baseline, none
    without a baseline; the docstring example runs too."""
    import doctest

    timings = [{"arm": "augment", "wall_s": w, "threads": 2, "peak_rss_mb": m} for w, m in ((250, 4700), (260, 4800))]
    timings += [{"arm": "augment", "wall_s": 900.0},  # shared cores, before threads were recorded
                {"arm": "pool", "wall_s": 1200, "threads": 2, "peak_rss_mb": 18000, "rss_start_mb": 287},
                {"arm": "pool", "wall_s": 1300, "threads": 2, "peak_rss_mb": 17000},
                {"arm": "pool", "wall_s": 1500, "threads": 2, "peak_rss_mb": 30000, "rss_start_mb": 9000}]
    c = psumm.cost(timings, baseline="augment")
    assert c["augment"]["runs"] == 2 and c["augment"]["wall_s"] == 255 and c["augment"]["peak_mb"] == 4750
    assert c["pool"]["runs"] == 2 and c["pool"]["wall_s"] == 1250 and c["pool"]["peak_runs"] == 2
    assert c["pool"]["peak_mb"] == 17500 and c["pool"]["wall_x"] == pytest.approx(1250 / 255)
    assert c["pool"]["peak_x"] == pytest.approx(17500 / 4750)
    assert psumm.cost(timings, baseline="missing")["pool"]["wall_x"] is None
    result = doctest.DocTestRunner().run(doctest.DocTestFinder().find(psumm.cost)[0])
    assert result.failed == 0 and result.attempted == 2


def test_the_published_smollm2_summary_is_computed_from_its_records_and_quoted_in_the_docs(tmp_path):
    """benchmarks/results/experiment-pool/smollm2: the 6-seed summary the docs and the README quote, recomputed
    from the committed records, is the committed one; its primary, non-inferiority, power and cost rows are in
    docs/loss-experiment.md."""
    text = _recomputed(SMOLLM2, tmp_path)
    docs = DOCS.read_text()
    quoted = [s for s in text.split("### ") if s.startswith(("Primary", "Canonical accuracy", "Power", "Cost"))]
    rows = [r for s in quoted for r in s.splitlines()
            if r.startswith(("| canonical |", "| pool-kl-0.3 |", "| augment |"))]
    assert len(quoted) == 4 and len(rows) == 10, rows
    for row in rows:
        assert row in docs, row


def test_every_difference_the_smollm2_result_states_is_the_summarys():
    """docs/loss-experiment.md's SmolLM2 result, prose included: each Δ with its CI is one the committed
    summary.json holds (any set, endpoint and arm), and the README's and docs' cost ratios are its cost table's."""
    import re

    summary = json.loads((SMOLLM2 / "summary.json").read_text())
    known = {f"{t['diff']:+.3f} [{t['ci_low']:+.3f}, {t['ci_high']:+.3f}]"
             for by_arm in summary["tests"].values() for t in by_arm.values()}
    docs = DOCS.read_text()
    section = " ".join(docs[docs.index("### Result on SmolLM2-135M-Instruct"):docs.index("## The first experiment")].split())
    stated = re.findall(r"[+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]", section)
    assert len(stated) >= 12, stated
    assert not [s for s in stated if s not in known], [s for s in stated if s not in known]
    pool_cost = summary["cost"]["pool-kl-0.3"]
    ratios = f"{pool_cost['wall_x']:.1f}x", f"{pool_cost['peak_x']:.1f}x"
    root = Path(__file__).resolve().parents[1]
    for text in (section, " ".join((root / "README.md").read_text().split()),
                 " ".join((root / "docs" / "stability-loss.md").read_text().split())):
        assert f"{ratios[0]} " in text and f"{ratios[1]} " in text, ratios
    assert f"{pool_cost['wall_s']:.0f} s and a {pool_cost['peak_mb'] / 1024:.1f} GiB peak" in section
