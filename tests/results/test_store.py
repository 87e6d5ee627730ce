"""The results store: file names spelled once, one validated reader, and one evaluation record whether it
comes from memory (during training) or from disk (compare, report, resume)."""

from __future__ import annotations

import json

import pytest

from sago_train.errors import SagoInputError
from sago_train.functional.axes import GroupInputs  # noqa: F401 - registers the axes
from sago_train.results import layout, store
from sago_train.results.evaluation import Evaluation, GroupRecord, SetEvaluation


def _result() -> Evaluation:
    groups = [GroupRecord(id=f"g{i}", variants=["a", "b"], kinds=None, outputs=None, reference=None,
                          scored_reference=None, axes={"activation": 0.1 * (i + 1), "confidence": 0.05 * i},
                          per_variant={"activation": [0.1, 0.1], "confidence": [0.0, 0.0]}) for i in range(4)]
    sets = {"s": SetEvaluation.from_groups("s", ["activation", "confidence"], groups, None, {}, n_bootstrap=100)}
    return Evaluation(sets=sets, config={}, model="m")


def test_paths_are_spelled_here(tmp_path):
    assert layout.history_path(tmp_path) == tmp_path / "history.jsonl"
    assert layout.step_dir(tmp_path, 12) == tmp_path / "step-12"


def test_in_memory_and_on_disk_evaluations_agree(tmp_path):
    result = _result()
    sago = tmp_path / "sago"
    result.step = 3
    store.write_group_records(layout.step_dir(sago, 3), "s", result.sets["s"].groups)
    store.write_history(sago, [result.to_history_line()])
    run = store.Run(label="r", path=tmp_path, sago_dir=sago, history=store.read_history(sago).entries)
    on_disk = run.evaluation(3)
    in_memory = result.slim()  # what a training run keeps
    for axis in ("activation", "confidence", "instability"):
        assert in_memory.mean("s", axis) == pytest.approx(on_disk.mean("s", axis), rel=1e-12)
        assert in_memory.group_values("s", axis) == pytest.approx(on_disk.group_values("s", axis), rel=1e-12)
    want = sum(0.1 * (i + 1) for i in range(4)) / 4
    assert in_memory.mean("s", "activation") == pytest.approx(want, rel=1e-9)


def test_a_corrupt_history_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path, caplog):
    lines = [json.dumps({"step": s, "sets": {"s": {"activation": {"mean": 0.1 * s}}}}) for s in (0, 2, 4)]
    not_an_evaluation = json.dumps({"sets": {"s": {}}})  # valid JSON, no step
    (tmp_path / "history.jsonl").write_text(
        "\n".join([lines[0], lines[1][:20], lines[1], not_an_evaluation, lines[2]]) + "\n")
    with caplog.at_level("WARNING", logger="sago_train"):
        history = store.read_history(tmp_path)
    assert [h["step"] for h in history.entries] == [0, 2, 4]
    assert [h["sets"]["s"]["activation"]["mean"] for h in history.entries] == pytest.approx([0.0, 0.2, 0.4])
    assert [e.line for e in history.skipped] == [2, 4]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2
    assert f"{tmp_path / 'history.jsonl'}:2: malformed JSON" in warned[0]
    assert f"{tmp_path / 'history.jsonl'}:4: field 'step'" in warned[1]
    run = store.Run.read(tmp_path.parent, tmp_path)
    assert (run.steps, run.skipped_lines) == ([0, 2, 4], 2)


def test_a_history_without_a_valid_line_is_an_error(tmp_path):
    (tmp_path / "history.jsonl").write_text('{"step": 0, "sets": \n{"step": "x"}\n')
    with pytest.raises(SagoInputError, match=r"no evaluations in .*history.jsonl: all 2 line\(s\) are corrupt"):
        store.read_history(tmp_path, allow_empty=True)
    (tmp_path / "history.jsonl").write_text("\n")
    assert store.read_history(tmp_path, allow_empty=True).entries == []
    with pytest.raises(SagoInputError, match="no evaluations in .*history.jsonl"):
        store.read_history(tmp_path)


def test_claim_history_sets_the_old_file_aside(tmp_path):
    (tmp_path / "history.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(SagoInputError, match="already holds"):
        store.claim_history(tmp_path, resuming=False, overwrite=False)
    store.claim_history(tmp_path, resuming=True, overwrite=False)  # resuming keeps it
    store.claim_history(tmp_path, resuming=False, overwrite=True)
    assert not (tmp_path / "history.jsonl").exists() and len(list(tmp_path.glob("history.jsonl.*.old"))) == 1
    assert store.recorded_evaluations(tmp_path) == 0


def test_accuracy_series_and_score_carry_the_recorded_ci(tmp_path):
    acc = {"n": 5, "accuracy": 0.6, "accuracy_ci_low": 0.4, "accuracy_ci_high": 0.8}
    lines = [{"step": 0, "sets": {"s": {"activation": {"mean": 0.1}}}, "correctness": {"s": acc}},
             {"step": 2, "sets": {"s": {"activation": {"mean": 0.2}}}, "correctness": {"s": {"n": 5, "accuracy": 0.5}}}]
    store.write_history(tmp_path, lines)
    run = store.Run.read(tmp_path.parent, tmp_path)
    # Lines written before the CI was recorded give no band, never a made-up one.
    assert [(step, sm.to_dict()) for step, sm in run.series("s", "accuracy")] == [
        (0, {"mean": 0.6, "ci_low": 0.4, "ci_high": 0.8, "n": 5}), (2, {"mean": 0.5, "ci_low": None, "ci_high": None,
                                                                           "n": 5})]
    assert run.evaluation(0).score("s", "accuracy").to_dict() == {"mean": 0.6, "ci_low": 0.4, "ci_high": 0.8, "n": 5}


def test_many_corrupt_history_lines_are_summarized_after_the_first_few(tmp_path, caplog):
    """300,000 corrupt lines printed 300,000 warnings; now MAX_REPEATED_WARNINGS of them and one count."""
    from sago_train.limits import MAX_REPEATED_WARNINGS

    result = _result()
    result.step = 0
    store.write_history(tmp_path, [result.to_history_line()])
    with open(layout.history_path(tmp_path), "a") as f:
        f.write("{torn\n" * 25)
    with caplog.at_level("WARNING", logger="sago_train"):
        history = store.read_history(tmp_path)
    assert len(history.entries) == 1 and history.n_skipped == 25 and len(history.skipped) == MAX_REPEATED_WARNINGS
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == MAX_REPEATED_WARNINGS + 1
    assert warnings[-1].startswith(f"sago: ... and {25 - MAX_REPEATED_WARNINGS:,} more corrupt lines in ")


def test_overwrite_sets_aside_under_a_new_name_each_time(tmp_path, monkeypatch):
    from sago_train import io as sio

    monkeypatch.setattr(sio.time, "strftime", lambda fmt: "20250101T000000")  # two overwrites in one second
    kept = []
    for i in range(2):
        layout.history_path(tmp_path).write_text(json.dumps({"step": i}) + "\n")
        store.claim_history(tmp_path, resuming=False, overwrite=True)
        kept.append(sorted(p.read_text() for p in tmp_path.glob("history.jsonl.*.old")))
    assert kept[-1] == ['{"step": 0}\n', '{"step": 1}\n']  # the first kept history is still there


@pytest.mark.parametrize("link", ["history.jsonl", "run.lock", "step-3"])
def test_a_link_in_the_run_folder_is_refused_before_and_at_each_write(tmp_path, link):
    sago, outside = tmp_path / "run" / "sago", tmp_path / "outside"
    sago.mkdir(parents=True)
    outside.mkdir()
    (sago / link).symlink_to(outside)
    with pytest.raises(SagoInputError, match=f"{link} is a symbolic link; sago_train never writes through one"):
        store.claim_history(sago, resuming=True, overwrite=False)
    if link == "step-3":
        with pytest.raises(SagoInputError, match="step-3 is a symbolic link"):
            store.write_group_records(layout.step_dir(sago, 3), "s", _result().sets["s"].groups)
    assert not list(outside.iterdir())


def test_hand_edited_numbers_are_refused_at_reading_naming_file_line_and_key(tmp_path):
    result = _result()
    result.step = 0
    line = result.to_history_line()
    line["sets"]["s"]["activation"]["mean"] = 1.7e308  # reached matplotlib: "arange: cannot compute length"
    good = result.to_history_line()
    good["step"] = 1
    good["correctness"] = {"s": {"n": [1], "accuracy": 0.5}}  # int([1]): a TypeError in report
    store.write_history(tmp_path, [line, good])
    with pytest.raises(SagoInputError) as err:
        store.read_history(tmp_path)
    assert "history.jsonl:1: field 'sets.s.activation.mean': expected a number or null of size at most 1e+09" \
        in str(err.value)
    with pytest.raises(SagoInputError, match=r"field 'correctness.s.n': expected a count"):
        Evaluation.from_history_line(good, source="h", lineno=2)
