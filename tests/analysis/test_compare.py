"""`sago-train compare`: rankings per set, Kendall's tau, planted rank flips; RUN_DIR@STEP; labels; errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sago_train.analysis.compare import compare_evaluations, load_evaluation, load_sources, parse_spec
from sago_train.cli.main import main
from sago_train.errors import SagoInputError

from .._helpers.results_dirs import axis_values, run_cli, write_eval_dir, write_run_dir


def _const(n: int, **axes: float) -> dict[str, list[float]]:
    """Per-group values equal to a constant per axis (CIs collapse onto the mean)."""
    return {a: [v] * n for a, v in axes.items()}


def _model(tmp_path: Path, name: str, x: float, y: float, acc: float = 0.5, n: int = 6) -> Path:
    return write_eval_dir(tmp_path / name, {"setX": _const(n, activation=x, generation=0.5),
                                            "setY": _const(n, activation=y, generation=0.5)}, accuracy=acc)


def test_compare_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "RUN_DIR@STEP" in out and "--axis" in out and "--json" in out


def test_planted_rank_flip_is_found(tmp_path, capsys):
    # A is the most stable model on setX and the least stable on setY; B and C keep their order.
    # 10 groups: the smallest one-sided Wilcoxon p, 2^-10, passes Holm over the 6 flips that could occur
    # (3 pairs x 1 set pair x 2 axes); see test_six_groups_are_not_enough_for_six_possible_flips.
    a = _model(tmp_path, "A", x=0.1, y=0.9, n=10)
    b = _model(tmp_path, "B", x=0.3, y=0.2, n=10)
    c = _model(tmp_path, "C", x=0.5, y=0.4, n=10)
    out_json = tmp_path / "cmp.json"
    code, out, err = run_cli(["compare", str(a), str(b), str(c), "--json", str(out_json)], capsys)
    assert code == 0, err
    result = json.loads(out_json.read_text())
    act = result["axes"]["activation"]
    assert act["rankings"] == {"setX": ["A", "B", "C"], "setY": ["B", "C", "A"]}
    assert act["ranks"]["setY"] == {"A": 3, "B": 1, "C": 2}
    pairs = {tuple(f["models"]) for f in act["flips"]}
    assert pairs == {("A", "B"), ("A", "C")}
    flip = next(f for f in act["flips"] if f["models"] == ["A", "B"])
    assert flip["order"] == {"setX": ["A", "B"], "setY": ["B", "A"]}
    assert flip["robust"] is True  # constant values: the CIs are points, far apart
    assert act["tau"]["setX"]["setY"] == pytest.approx(-1 / 3)
    # Generation is tied everywhere: ties are not flips.
    assert result["axes"]["generation"]["flips"] == []
    assert "rank flip on activation: A beats B on 'setX', but B beats A on 'setY'" in out
    total = sum(len(r["flips"]) for r in result["axes"].values())
    assert total == 4  # activation and the instability scalar (mean of the axes) both flip
    # instability is a mean of the other axes: its flips are corrected and reported apart, not in the headline.
    assert "2 rank flip(s) in the means, 2 robust" in out
    assert "instability (the mean of the other axes, so corrected on its own and not in the headline): 2 flip(s)" in out
    assert result["axes"]["instability"]["family"] == "instability" and result["families"]["instability"]["tested"] == 3
    assert [e["label"] for e in result["entries"]] == ["A", "B", "C"]
    assert result["families"]["axes"]["tested"] == 6 and flip["p_holm"] == pytest.approx(6 * 2.0**-10)


def test_six_groups_are_not_enough_for_six_possible_flips(tmp_path, capsys):
    """With 6 groups the smallest one-sided paired p is 2^-6 = 0.0156; Holm over the 6 flips that could occur
    (3 pairs x 1 set pair x 2 axes) needs 6 x 0.0156 = 0.094 < 0.05: never a claim, and said so."""
    dirs = [_model(tmp_path, n, x=x, y=y) for n, x, y in (("A", 0.1, 0.9), ("B", 0.3, 0.2), ("C", 0.5, 0.4))]
    code, out, err = run_cli(["compare", *map(str, dirs)], capsys)
    assert code == 0, err
    act = compare_evaluations(load_sources(dirs, last_only=True))["axes"]["activation"]
    assert {f["verdict"] for f in act["flips"]} == {"not enough groups to test"}
    assert not any(f["robust"] for f in act["flips"])
    assert "2 rank flip(s) in the means: not enough groups to test whether any is robust" in out


def test_no_flip_when_the_orders_agree(tmp_path, capsys):
    a = _model(tmp_path, "A", x=0.1, y=0.2)
    b = _model(tmp_path, "B", x=0.3, y=0.4)
    c = _model(tmp_path, "C", x=0.5, y=0.6)
    code, out, err = run_cli(["compare", str(a), str(b), str(c), "--axis", "activation"], capsys)
    assert code == 0, err
    assert "no rank reversal" in out and "rank flip" not in out
    result = compare_evaluations(load_sources([a, b, c], last_only=True), axes=["activation"])
    assert list(result["axes"]) == ["activation"]
    assert result["axes"]["activation"]["flips"] == []
    assert result["axes"]["activation"]["tau"]["setX"]["setY"] == pytest.approx(1.0)


def test_accuracy_ranks_higher_first(tmp_path):
    a = _model(tmp_path, "A", x=0.1, y=0.2, acc=0.9)
    b = _model(tmp_path, "B", x=0.3, y=0.4, acc=0.4)
    result = compare_evaluations(load_sources([a, b], last_only=True), axes=["accuracy"])
    acc = result["axes"]["accuracy"]
    assert acc["higher_is_better"] is True and acc["rankings"]["setX"] == ["A", "B"]
    assert acc["flips"] == [] and acc["scores"]["setX"]["A"]["ci_low"] is None


def test_checkpoints_of_one_run_with_at_step(tmp_path, capsys):
    run = write_run_dir(tmp_path / "run", {
        0: {"p": _const(5, activation=0.5), "q": _const(5, activation=0.5)},
        2: {"p": _const(5, activation=0.2), "q": _const(5, activation=0.7)},
        4: {"p": _const(5, activation=0.3), "q": _const(5, activation=0.4)},
    })
    assert parse_spec(f"{run}@2") == (run, 2)
    out_json = tmp_path / "c.json"
    code, out, err = run_cli(["compare", f"{run}@2", f"{run}@4", str(run / "sago"), "--json", str(out_json)],
                             capsys)
    assert code == 0, err
    result = json.loads(out_json.read_text())
    labels = [e["label"] for e in result["entries"]]
    # The plain run dir (given as its sago/ folder) is its last evaluation, step 4, labelled by the run's name.
    assert labels == ["run@2", "run@4", "run"]
    assert [e["step"] for e in result["entries"]] == [2, 4, 4]
    flips = result["axes"]["activation"]["flips"]
    assert {tuple(f["models"]) for f in flips} == {("run@2", "run@4"), ("run", "run@2")}

    code, _, err = run_cli(["compare", f"{run}@3", str(run)], capsys)
    assert code == 2 and "no evaluation at step 3" in err and "0, 2, 4" in err


def test_duplicate_labels_are_disambiguated(tmp_path):
    a = write_eval_dir(tmp_path / "x" / "model", {"s": axis_values(0)})
    b = write_eval_dir(tmp_path / "y" / "model", {"s": axis_values(1)})
    labels = [e.label for e in load_sources([a, b, a], last_only=True)]
    assert labels == ["x/model", "y/model", "x/model#2"]
    run = write_run_dir(tmp_path / "z" / "model", {1: {"s": axis_values(0)}, 3: {"s": axis_values(2)}})
    labels = [e.label for e in load_sources([a, f"{run}@1", b], last_only=True)]
    assert labels == ["x/model", "model@1", "y/model"]


def test_mixed_eval_and_run_dirs_scored_on_the_common_groups_said_first(tmp_path, capsys):
    """Issue 13: compare ranked evaluations scored on different group subsets and noted it at the very end. Now
    the first line says which groups every entry is scored on, and the means are over those (hand-checked)."""
    ev = write_eval_dir(tmp_path / "ev", {"s": axis_values(0, n=8), "t": axis_values(1, n=8)})
    run = write_run_dir(tmp_path / "run", {5: {"s": axis_values(2, n=12), "u": axis_values(3)}})
    code, out, err = run_cli(["compare", str(ev), str(run)], capsys)
    assert code == 0, err
    first = "scored on 8 common groups of set 's' (dropped g8, g9, g10, g11 of run)"
    assert out.splitlines()[0] == first
    assert out.splitlines()[1:3] == ["set 't' was evaluated by one entry only (ev): left out",
                                     "set 'u' was evaluated by one entry only (run): left out"]
    result = compare_evaluations(load_sources([ev, run], last_only=True))
    assert result["sets"] == ["s"] and result["scope"][0] == first
    assert result["groups"]["s"] == {"common": True, "n_groups": 8, "dropped": {"run": ["g8", "g9", "g10", "g11"]},
                                     "line": first}
    # Hand computation: run's activation mean over its first 8 groups (g0..g7), not over all 12.
    act = result["axes"]["activation"]["scores"]["s"]
    run_values = axis_values(2, n=12)["activation"]
    assert act["run"]["mean"] == pytest.approx(sum(run_values[:8]) / 8, abs=1e-12) and act["run"]["n"] == 8
    assert act["run"]["mean"] != pytest.approx(sum(run_values) / 12)
    assert act["ev"]["mean"] == pytest.approx(sum(axis_values(0, n=8)["activation"]) / 8, abs=1e-12)
    assert act["run"]["ci_low"] <= act["run"]["mean"] <= act["run"]["ci_high"]
    assert "one shared set only" in out
    assert list(result["axes"]) == ["activation", "confidence", "generation", "mirroring", "instability"]
    assert load_evaluation(run).step == 5


def test_same_groups_keep_the_recorded_scores(tmp_path):
    a = _model(tmp_path, "A", x=0.1, y=0.9)
    b = _model(tmp_path, "B", x=0.3, y=0.2)
    result = compare_evaluations(load_sources([a, b], last_only=True), axes=["activation"])
    assert result["scope"] == ["scored on 6 common groups of set 'setX' (every entry has the same groups)",
                               "scored on 6 common groups of set 'setY' (every entry has the same groups)"]
    recorded = json.loads((a / "summary.json").read_text())["sets"]["setX"]["axes"]["activation"]
    assert result["axes"]["activation"]["scores"]["setX"]["A"] == recorded


def test_groups_that_cannot_be_matched_are_refused_without_the_flag(tmp_path, capsys):
    a = write_eval_dir(tmp_path / "A", {"s": axis_values(0, n=6)})
    b = write_eval_dir(tmp_path / "B", {"s": axis_values(1, n=6)})
    recs = [json.loads(x) for x in (b / "s.jsonl").read_text().splitlines()]
    for r in recs:
        r["id"] = "other-" + r["id"]
    (b / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    code, _, err = run_cli(["compare", str(a), str(b)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "the entries share no group of set 's' (A: 6, B: 6)" in err and "--allow-different-groups" in err
    code, out, err = run_cli(["compare", str(a), str(b), "--allow-different-groups"], capsys)
    assert code == 0, err
    assert out.splitlines()[0] == ("set 's' NOT scored on common groups (the entries share no group of set 's' "
                                   "(A: 6, B: 6)): each entry on its own groups (A: 6, B: 6) [--allow-different-groups]")


@pytest.mark.parametrize(
    "args,expected",
    [
        (["one"], "at least 2 directories"),
        (["A", "B", "--axis", "activaton"], "unknown axis 'activaton'. Did you mean 'activation'?"),
        (["A", "nope"], "directory not found"),
        (["A", "A@3"], "has no steps to pick with @3"),
        (["A", "other"], "share no variant set"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, expected):
    _model(tmp_path, "A", x=0.1, y=0.2)
    _model(tmp_path, "B", x=0.1, y=0.2)
    write_eval_dir(tmp_path / "other", {"elsewhere": axis_values(0)})
    argv = ["compare", *[str(tmp_path / a) if not a.startswith("-") and a != "activaton" else a for a in args]]
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert expected in err


def test_robust_flip_needs_the_paired_test_on_both_sets(tmp_path):
    """SPEC: a flip is robust when the paired test is significant on both sets; the headline counts model
    pairs (not pair x set-pair entries) and quotes the robust ones. Checked against scipy's Wilcoxon."""
    import numpy as np
    import scipy.stats as sps

    rng = np.random.default_rng(0)
    n = 20
    base = {s: rng.uniform(0.2, 0.6, n) for s in ("setX", "setY", "setZ")}
    noise = {s: rng.normal(0, 0.2, n) for s in base}
    # A vs B: B is clearly worse on setX and clearly better on setY (every group), and slightly better in its
    # mean but not by a consistent margin on setZ.
    a = {s: {"activation": list(base[s])} for s in base}
    b = {"setX": {"activation": list(base["setX"] + 0.1)}, "setY": {"activation": list(base["setY"] - 0.1)},
         "setZ": {"activation": list(base["setZ"] + noise["setZ"] - noise["setZ"].mean() - 0.001)}}
    ea, eb = write_eval_dir(tmp_path / "A", a), write_eval_dir(tmp_path / "B", b)
    result = compare_evaluations(load_sources([ea, eb], last_only=True), axes=["activation"])
    act = result["axes"]["activation"]
    flips = {tuple(f["sets"]): f for f in act["flips"]}
    assert set(flips) == {("setX", "setY"), ("setX", "setZ")}
    xy, xz = flips[("setX", "setY")], flips[("setX", "setZ")]
    assert xy["robust"] is True and xz["robust"] is False
    # B ranks first on setZ (lower mean), so "robust" needs the rule to call B better there: it does not.
    dz = np.array(b["setZ"]["activation"]) - base["setZ"]
    assert xz["tests"]["setZ"]["p_better"] == pytest.approx(sps.wilcoxon(dz, alternative="less").pvalue)
    assert xz["tests"]["setZ"]["verdict"] == "no significant difference"
    dy = np.array(b["setY"]["activation"]) - base["setY"]
    assert xy["tests"]["setY"]["p_better"] == pytest.approx(sps.wilcoxon(dy, alternative="less").pvalue)
    assert xy["tests"]["setY"]["verdict"] == "better" and xy["tests"]["setX"]["verdict"] == "worse"
    # Two entries: one pair; it flips (in two set pairs), robustly in one of them.
    assert act["reversal"] == {"pairs": 1, "flipped": 1, "robust": 1, "unknown": 0}


def test_flip_without_records_is_untested(tmp_path):
    a = write_eval_dir(tmp_path / "A", {"setX": _const(6, activation=0.1), "setY": _const(6, activation=0.9)},
                       records=False)
    b = write_eval_dir(tmp_path / "B", {"setX": _const(6, activation=0.3), "setY": _const(6, activation=0.2)},
                       records=False)
    with pytest.raises(SagoInputError, match="no per-group records of set 'setX'"):
        compare_evaluations(load_sources([a, b], last_only=True), axes=["activation"])
    result = compare_evaluations(load_sources([a, b], last_only=True), axes=["activation"],
                                 allow_different_groups=True)
    assert result["scope"][0].startswith("set 'setX' NOT scored on common groups (A, B have no per-group records")
    act = result["axes"]["activation"]
    assert [f["robust"] for f in act["flips"]] == [None]
    assert act["reversal"] == {"pairs": 1, "flipped": 1, "robust": 0, "unknown": 1}


def test_a_flip_carried_by_wilcoxon_alone_is_not_robust(tmp_path):
    """Issue 13's disagreement in compare: on setY, B's lower mean comes with a one-sided Wilcoxon p of 0.017
    (two-sided 0.034, which the old rule called significant) but a 95% CI spanning 0: not robust."""
    import numpy as np
    import scipy.stats as sps

    from .._helpers import verdict_case as case

    x = np.linspace(0.2, 0.5, case.N)
    a = write_eval_dir(tmp_path / "A", {"setX": {"activation": list(x)}, "setY": {"activation": list(case.after())}})
    b = write_eval_dir(tmp_path / "B", {"setX": {"activation": list(x + 0.1)},
                                        "setY": {"activation": list(case.before())}})
    act = compare_evaluations(load_sources([a, b], last_only=True), axes=["activation"])["axes"]["activation"]
    (flip,) = act["flips"]
    assert flip["order"] == {"setX": ["A", "B"], "setY": ["B", "A"]}
    t = flip["tests"]["setY"]
    assert t["p_better"] == pytest.approx(sps.wilcoxon(-case.DIFF, alternative="less").pvalue) and t["p_better"] < 0.05
    assert sps.wilcoxon(-case.DIFF).pvalue < 0.05  # the old two-sided test
    assert t["ci_low"] < 0 < t["ci_high"] and t["verdict"] == "no significant difference"
    assert flip["tests"]["setX"]["verdict"] == "worse" and flip["robust"] is False
    assert act["reversal"]["robust"] == 0


def test_headline_claims_only_robust_flips(tmp_path, capsys):
    # A beats B on setX and B beats A on setY in the means, but the per-group differences change sign from
    # group to group: no significant paired difference, so no claim that the best entry depends on the set.
    u = [0.1, 0.9, 0.2, 0.8, 0.3, 0.7]
    v = [0.9, 0.1, 0.8, 0.2, 0.7, 0.35]
    g = [0.5] * 6
    a = write_eval_dir(tmp_path / "A", {"setX": {"activation": u, "generation": g},
                                        "setY": {"activation": v, "generation": g}})
    b = write_eval_dir(tmp_path / "B", {"setX": {"activation": v, "generation": g},
                                        "setY": {"activation": u, "generation": g}})
    code, out, err = run_cli(["compare", str(a), str(b), "--axis", "activation"], capsys)
    assert code == 0, err
    assert "rank flip on activation: A beats B on 'setX', but B beats A on 'setY' (not robust" in out
    assert "1 rank flip(s) in the means, none robust" in out and "no evidence" in out
    assert "which entry is best depends on the variant set" not in out
    assert "0 of 1 entry pair(s) flip robustly" in out and "1 pair(s) flip in their means" in out
    # The planted robust flip keeps the claim, with its count.
    c = _model(tmp_path, "C", x=0.1, y=0.9)
    d = _model(tmp_path, "D", x=0.3, y=0.2)
    code, out, err = run_cli(["compare", str(c), str(d), "--axis", "activation"], capsys)
    assert code == 0, err
    # C is first on setX and D on setY, and their flip is robust: the top entry changes.
    assert ("1 rank flip(s) in the means, 1 robust (paired tests on both sets, Holm-corrected over the 1 flips that "
            "could occur): the best entry depends on the set: C is first on 'setX', D on 'setY' (activation).") in out


def test_two_entries_give_the_paired_verdict_per_set_and_quantity_not_tau(tmp_path, capsys):
    """Issue 33: `compare A B` (base vs fine-tune) printed Kendall tau matrices of +-1.00 and no paired verdict."""
    base = write_eval_dir(tmp_path / "base", {"setX": axis_values(0), "setY": axis_values(1)}, accuracy=0.5)
    tuned = write_eval_dir(tmp_path / "tuned", {"setX": axis_values(0, shift=0.3), "setY": axis_values(1)},
                           accuracy=0.5)
    for path in (base, tuned):  # per-group correctness: accuracy is compared beside stability
        for s in ("setX", "setY"):
            recs = [json.loads(x) for x in (path / f"{s}.jsonl").read_text().splitlines()]
            for i, r in enumerate(recs):
                r["correct"] = [i % 2 == 0, True]
            (path / f"{s}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    out_json = tmp_path / "cmp.json"
    code, out, err = run_cli(["compare", str(base), str(tuned), "--json", str(out_json)], capsys)
    assert code == 0, err
    assert "Kendall's tau" not in out
    assert "paired: tuned against base, per set and quantity" in out
    rows = {(r["set"], r["axis"]): r for r in json.loads(out_json.read_text())["paired"]}
    assert {("setX", a) for a in ("activation", "confidence", "generation", "instability")} <= set(rows)
    assert ("setX", "accuracy") in rows and ("setY", "accuracy") in rows  # accuracy beside stability
    assert rows[("setX", "activation")]["verdict"] == "tuned less stable than base"
    assert rows[("setY", "activation")]["verdict"] == "no significant difference"
    assert "tuned less stable than base" in out
    three = write_eval_dir(tmp_path / "third", {"setX": axis_values(2), "setY": axis_values(3)})
    code, out, err = run_cli(["compare", str(base), str(tuned), str(three)], capsys)
    assert code == 0, err
    assert "Kendall's tau" in out and "paired:" not in out  # several entries: rankings and reversals
