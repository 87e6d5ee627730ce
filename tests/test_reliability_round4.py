"""Reliability round 4 (issue 34): provenance on resume and reuse, group records never replaced, every number
bounded. Every case a real ``sago-train`` subprocess under the limits helper (tests/_helpers/limited.py), as in
round 3 (tests/test_reliability_round3.py), registered in :data:`CASES` with its class and kind; RELIABILITY.md
states the counts (:func:`test_reliability_md_states_the_counts`). Each case also checks that the protected files
(inputs, earlier results) are byte-identical afterwards, or, where old files are set aside, that they are kept
whole under the name the command printed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from ._helpers.full_disk import FULL_DISK
from ._helpers.limited import RUN_CPU_LIMIT_S, assert_one_error_line, run_cli_limited
from ._helpers.results_dirs import axis_values, write_eval_dir, write_run_dir
from .test_reliability_round3 import FAST_EVAL, Case, small_recipe, snapshot, write_set

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def _env_case(case: Case, env: dict[str, str | None]) -> Case:
    case.env = env  # type: ignore[attr-defined]
    return case


# ================================================================== 1. group records are results too
def _compare_json_is_a_step_records_file(tmp: Path) -> Case:
    """round 3 protected only history.jsonl: the step's group records were replaced by the comparison."""
    run = write_run_dir(tmp / "a", {0: {"s": axis_values(0)}, 2: {"s": axis_values(1)}})
    return Case(["compare", f"{run}@0", f"{run}@2", "--json", str(run / "sago" / "step-2" / "s.jsonl")],
                ["--json", "s.jsonl is a results file read from", "group records sago/step-2/s.jsonl",
                 "an input of this command"], [run])


def _compare_json_is_an_evaluations_records_file(tmp: Path) -> Case:
    a = write_eval_dir(tmp / "a", {"s": axis_values(0), "t": axis_values(1)})
    b = write_eval_dir(tmp / "b", {"s": axis_values(2), "t": axis_values(3)})
    return Case(["compare", str(a), str(b), "--json", str(b / "t.jsonl")],
                ["--json", "t.jsonl is a results file read from", "(group records t.jsonl)"], [a, b])


def _eval_out_locked(tmp: Path) -> Case:
    out = tmp / "res"
    return Case(["eval", "--set", f"s={write_set(tmp / 's.jsonl')}", "--out", str(out), *FAST_EVAL],
                ["is in use by process", f"(lock file {out / 'run.lock'})"], [tmp / "s.jsonl"])


def _study_out_locked(tmp: Path) -> Case:
    out = tmp / "study"
    return Case(["study", "--model", f"a={tmp / 'no-model-a'}", "--model", f"b={tmp / 'no-model-b'}", "--set",
                 f"s={write_set(tmp / 's.jsonl')}", "--out", str(out), *FAST_EVAL[1:]],
                ["is in use by process", f"(lock file {out / 'run.lock'})"], [tmp / "s.jsonl"])


def _eval_out_on_a_full_disk(tmp: Path) -> Case:
    """The all-or-nothing write worked, but the CLI ended in an 'OSError: [Errno 28]' traceback."""
    out = write_eval_dir(tmp / "res", {"s": axis_values(0)})
    inject = tmp / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(FULL_DISK)
    return _env_case(Case(["eval", "--set", f"s={write_set(tmp / 's.jsonl')}", "--out", str(out), *FAST_EVAL],
                          ["cannot write the evaluation: No space left on device", "nothing was replaced"],
                          [out, tmp / "s.jsonl"], before_model=False),
                     {"SAGO_TEST_FULL_DISK": str(out), "PYTHONPATH": os.pathsep.join([str(ROOT), str(inject)])})


# ================================================================== 3. silently wrong results, lost provenance
def _summary_means_edited(tmp: Path) -> Case:
    """compare took a summary.json's means as given: an edited mean ranked the models the other way."""
    a = write_eval_dir(tmp / "a", {"s": axis_values(0)})
    b = write_eval_dir(tmp / "b", {"s": axis_values(2)})
    summary = json.loads((b / "summary.json").read_text())
    summary["sets"]["s"]["axes"]["activation"]["mean"] = 0.001
    (b / "summary.json").write_text(json.dumps(summary))
    return Case(["compare", str(a), str(b)], ["summary.json against", "s.jsonl: field 'sets.s.axes.activation'",
                                              "the summary says n=", "mean=0.001; the group records give"], [a, b])


def _summary_of_other_groups(tmp: Path) -> Case:
    a = write_eval_dir(tmp / "a", {"s": axis_values(0)})
    b = write_eval_dir(tmp / "b", {"s": axis_values(2)})
    records = (b / "s.jsonl").read_text().splitlines()[:-1]  # a group fewer than the summary counted
    (b / "s.jsonl").write_text("\n".join(records) + "\n")
    return Case(["compare", str(a), str(b)], ["field 'sets.s.n_groups': the summary says", "the group records hold"],
                [a, b])


def _recipe_number(tmp: Path, key: str, value: str, expect: str) -> Case:
    return Case(["run", str(small_recipe(tmp)), "--dry-run", "--output-dir", str(tmp / "o"), f"--{key}", value],
                [f"field '{key}': expected {expect}, got "])


# ================================================================== 5. tracebacks after the work started
def _study_reuse_summary_not_an_object(tmp: Path) -> Case:
    out = tmp / "study"
    (out / "a").mkdir(parents=True)
    (out / "a" / "summary.json").write_text("[1]\n")
    return Case(["study", "--model", f"a={tmp / 'no-model-a'}", "--model", f"b={tmp / 'no-model-b'}", "--set",
                 f"s={write_set(tmp / 's.jsonl')}", "--out", str(out), "--reuse", *FAST_EVAL[1:]],
                ["summary.json: cannot reuse: expected an object with 'config', got list"], [out, tmp / "s.jsonl"])


def _sft_record_not_an_object(tmp: Path) -> Case:
    data = tmp / "sft.jsonl"
    data.write_text('{"prompt": "What is 2+2?", "completion": " 4"}\n5\n')
    return Case(["run", str(small_recipe(tmp, monitor=False)), "--dry-run", "--output-dir", str(tmp / "o"),
                 "--data.train", str(data)], ["sft.jsonl:2: expected a training record", "got integer"], [data])


def _eval_env(tmp: Path, env: dict[str, str | None], expect: list[str]) -> Case:
    return _env_case(Case(["eval", "--set", f"s={write_set(tmp / 's.jsonl')}", *FAST_EVAL], expect), env)


FAILING: dict[str, tuple[str, str, Callable[[Path], Case]]] = {  # name -> (class, kind, builder)
    "compare_json_is_a_step_records_file": ("outputs", "input", _compare_json_is_a_step_records_file),
    "compare_json_is_an_evaluations_records_file": ("outputs", "input", _compare_json_is_an_evaluations_records_file),
    "eval_out_locked_by_another_process": ("outputs", "fault", _eval_out_locked),
    "study_out_locked_by_another_process": ("outputs", "fault", _study_out_locked),
    "eval_out_on_a_full_disk": ("after_the_work", "fault", _eval_out_on_a_full_disk),
    "summary_means_edited": ("silently_wrong", "fault", _summary_means_edited),
    "summary_of_other_groups": ("silently_wrong", "fault", _summary_of_other_groups),
    "recipe_weight_decay_nan": ("silently_wrong", "input", lambda t: _recipe_number(
        t, "training.weight_decay", ".nan", "a finite number >= 0")),
    "recipe_adam_epsilon_nan": ("after_the_work", "input", lambda t: _recipe_number(
        t, "training.adam_epsilon", ".nan", "a finite number >= 0")),
    "recipe_max_grad_norm_inf": ("silently_wrong", "input", lambda t: _recipe_number(
        t, "training.max_grad_norm", ".inf", "a finite number >= 0")),
    "recipe_adam_beta1_1": ("after_the_work", "input", lambda t: _recipe_number(
        t, "training.adam_beta1", "1.0", "a number in [0, 1)")),
    "recipe_label_smoothing_nan": ("after_the_work", "input", lambda t: _recipe_number(
        t, "training.label_smoothing_factor", ".nan", "a number in [0, 1)")),
    "stability_fresh_variants_1e8": ("bounded", "input", lambda t: _recipe_number(
        t, "stability.fresh_variants", "100000000", "an integer in [0, 64] (MAX_FRESH_VARIANTS)")),
    "stability_warmup_steps_1e26": ("silently_wrong", "input", lambda t: _recipe_number(
        t, "stability.warmup_steps", "100000000000000000000000000", "an integer in [0, 2,147,483,647] (MAX_TRAINING_STEPS)")),
    "stability_unlabeled_max_new_tokens_huge": ("bounded", "input", lambda t: _recipe_number(
        t, "stability.unlabeled_max_new_tokens", "1000000000", "an integer in [1, 262,144] (MAX_NEW_TOKENS)")),
    "stability_act_weight_1e300": ("silently_wrong", "input", lambda t: _recipe_number(
        t, "stability.act_weight", "1.0e+300", "a number in [0, 1e+06] (MAX_LOSS_WEIGHT)")),
    "monitor_similarity_nested_list": ("after_the_work", "input", lambda t: _recipe_number(
        t, "monitor.options.similarity", "[[1]]", "a string")),
    "monitor_correctness_nested_list": ("after_the_work", "input", lambda t: _recipe_number(
        t, "monitor.options.correctness", "[[1]]", "a string")),
    "monitor_stop_strings_5": ("after_the_work", "input", lambda t: _recipe_number(
        t, "monitor.options.stop_strings", "[5]", "a list of non-empty strings")),
    "monitor_generation_every_1e13": ("bounded", "input", lambda t: _recipe_number(
        t, "monitor.generation_every", "10000000000000", "a positive integer up to 2,147,483,647 (MAX_TRAINING_STEPS)")),
    "study_reuse_summary_not_an_object": ("after_the_work", "fault", _study_reuse_summary_not_an_object),
    "sft_record_not_an_object": ("after_the_work", "input", _sft_record_not_an_object),
    "eval_world_size_abc": ("after_the_work", "fault", lambda t: _eval_env(
        t, {"WORLD_SIZE": "abc"}, ["field 'WORLD_SIZE': expected an integer >= 1", "got 'abc'"])),
    "eval_world_size_stale_2": ("after_the_work", "fault", lambda t: _eval_env(
        t, {"WORLD_SIZE": "2", "RANK": None, "LOCAL_RANK": None, "MASTER_ADDR": None, "MASTER_PORT": None},
        ["WORLD_SIZE is 2 but RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not set"])),
}


@pytest.mark.parametrize("name", sorted(FAILING))
def test_refused_in_one_line_and_nothing_changes(name: str, tmp_path: Path) -> None:
    from sago_train.io import acquire_run_lock, release_run_lock

    case = FAILING[name][2](tmp_path)
    before = snapshot(case.protected)
    held = tmp_path / ("res" if name.startswith("eval_out_locked") else "study") if "locked" in name else None
    if held is not None:  # this test process holds the directory, as a running eval or study would
        acquire_run_lock(held)
    try:
        res = run_cli_limited(case.argv, cwd=case.cwd, env=getattr(case, "env", None))
    finally:
        if held is not None:
            release_run_lock(held)
    assert case.expect is not None
    line = assert_one_error_line(res, *case.expect, cpu_limit_s=RUN_CPU_LIMIT_S)
    if held is not None:
        assert f"process {os.getpid()}" in line
    if case.before_model:
        assert "Loading weights" not in res.stderr, "refused only after the model loaded"
    assert snapshot(case.protected) == before, "an input or an earlier result changed"
    assert not list(tmp_path.rglob("*.tmp")), "a temporary file was left"


def test_report_refuses_a_history_compare_block_of_the_wrong_shape(tmp_path: Path) -> None:
    """report read the compare block unchecked: a list where the set's changes go was an AttributeError."""
    run = write_run_dir(tmp_path / "run", {0: {"s": axis_values(0)}})
    path = run / "sago" / "history.jsonl"
    line = json.loads(path.read_text())
    line["compare"] = {"s": [1]}
    path.write_text(json.dumps(line) + "\n")
    res = run_cli_limited(["report", str(run), "--out", str(tmp_path / "rep")])
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("sago-train report: error: no evaluations in ") and "history.jsonl:1: field 'compare.s'" in last
    assert not (tmp_path / "rep" / "report.md").exists()


# ================================================================== handled with nothing lost: the old files kept, named
def _kept_folder(stdout: str, pattern: str) -> Path:
    m = re.search(pattern, stdout)
    assert m, stdout[-3000:]
    return Path(m.group(1))


def test_eval_over_an_existing_evaluation_keeps_it_whole(tmp_path: Path) -> None:
    """eval --out DIR replaced summary.json and left the other set's group file orphaned beside the new one."""
    out = write_eval_dir(tmp_path / "res", {"s": axis_values(0), "other": axis_values(1)})
    before = snapshot([out])
    res = run_cli_limited(["eval", "--set", f"s={write_set(tmp_path / 's.jsonl')}", "--out", str(out), *FAST_EVAL])
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    folder = _kept_folder(res.stdout, r"its 3 files moved to (\S+previous-\S+)")
    assert folder.parent == out
    kept = {str(out / Path(k).name): v for k, v in snapshot([folder]).items()}
    assert kept == before  # every old file, byte for byte
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["s.jsonl", "summary.json"]  # none orphaned
    res = run_cli_limited(["compare", str(out), str(folder)])  # the kept evaluation is still one
    assert res.returncode == 0, res.stderr[-3000:]


def test_overwrite_sets_the_old_runs_step_folders_aside(tmp_path: Path) -> None:
    """--overwrite kept the old history but let the new run write over sago/step-<N>/<set>.jsonl: the kept
    history pointed at another run's records."""
    out = write_run_dir(tmp_path / "out", {0: {"paraphrase": axis_values(0)}, 2: {"paraphrase": axis_values(1)}})
    before = snapshot([out / "sago"])
    res = run_cli_limited(["run", str(small_recipe(tmp_path)), "--output-dir", str(out), "--overwrite"],
                          wall_limit_s=300)
    assert res.returncode == 0, res.stderr[-3000:]
    steps = _kept_folder(res.stderr, r"its step folders to (\S+steps\.\S+\.old)")
    (history,) = (out / "sago").glob("history.jsonl.*.old")
    assert steps.name == "steps" + history.name[len("history.jsonl"):]  # named together
    kept = snapshot([history]) | snapshot([steps])
    assert sorted(kept.values(), key=repr) == sorted(before.values(), key=repr)  # every old file, whole
    assert (out / "sago" / "step-2" / "paraphrase.jsonl").read_bytes() != before[str(
        out / "sago" / "step-2" / "paraphrase.jsonl")]


SAVE = ["--training.save_strategy", "steps", "--training.save_steps", "2"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """One LoRA run of 4 steps, evaluated at 0, 2 and 4, with checkpoints at 2 and 4: (recipe, data, out)."""
    tmp = tmp_path_factory.mktemp("run4")
    data = tmp / "train.jsonl"
    shutil.copy(ROOT / "sago_train" / "assets" / "demo" / "groups.jsonl", data)
    recipe = small_recipe(tmp)
    recipe.write_text(recipe.read_text().replace("sago://demo/groups.jsonl", str(data)).replace(
        "  path: sago://tiny-llama\n", "  path: sago://tiny-llama\n  lora: {r: 2, alpha: 4}\n"))
    out = tmp / "out"
    res = run_cli_limited(["run", str(recipe), "--output-dir", str(out), "--training.max_steps", "4", *SAVE],
                          wall_limit_s=400)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / "recipe.provenance.json").is_file() and (out / "checkpoint-2").is_dir()
    return recipe, data, out


def _copy_run(out: Path, tmp: Path) -> Path:
    shutil.copytree(out, tmp / "out")
    return tmp / "out"


@pytest.mark.parametrize("change, expect", [
    (["--training.learning_rate", "0.001"], "training.learning_rate: (unset) -> 0.001"),
    (["--model.lora", "{r: 4, alpha: 4}"], "model.lora.r: 2 -> 4"),
    (["--data.limit", "3"], "data.limit: 4 -> 3"),
], ids=["learning_rate", "lora_rank", "data_limit"])
def test_a_resume_with_another_recipe_is_refused_naming_the_change(change: list[str], expect: str,
                                                                   trained_run: tuple[Path, Path, Path],
                                                                   tmp_path: Path) -> None:
    """run --resume checked only the monitored sets: another learning rate went on silently (another LoRA rank
    failed with a traceback after the model loaded), and recipe.yaml was replaced by the new one."""
    recipe, _, trained = trained_run
    out = _copy_run(trained, tmp_path)
    before = snapshot([out])
    res = run_cli_limited(["run", str(recipe), "--output-dir", str(out), "--resume", "--training.max_steps", "6",
                           *SAVE, *change], wall_limit_s=300)
    assert_one_error_line(res, "cannot resume: the recipe differs from the one this run was trained with", expect,
                          "--allow-recipe-change", cpu_limit_s=RUN_CPU_LIMIT_S)
    assert "Loading weights" not in res.stderr
    assert snapshot([out]) == before


def test_a_resume_with_other_training_data_is_refused(trained_run: tuple[Path, Path, Path], tmp_path: Path) -> None:
    recipe, data, trained = trained_run
    out = _copy_run(trained, tmp_path)
    edited = tmp_path / "recipe.yaml"
    other = tmp_path / "other.jsonl"
    other.write_text(data.read_text().replace("opposite", "reverse"))
    edited.write_text(recipe.read_text().replace(str(data), str(other)))
    res = run_cli_limited(["run", str(edited), "--output-dir", str(out), "--resume", "--training.max_steps", "6",
                           *SAVE], wall_limit_s=300)
    assert_one_error_line(res, "cannot resume: the recipe differs", "data.train.sha256: ",
                          cpu_limit_s=RUN_CPU_LIMIT_S)


def test_an_allowed_recipe_change_keeps_the_recorded_recipe(trained_run: tuple[Path, Path, Path],
                                                            tmp_path: Path) -> None:
    recipe, _, trained = trained_run
    out = _copy_run(trained, tmp_path)
    old_recipe, old_provenance = (out / "recipe.yaml").read_bytes(), (out / "recipe.provenance.json").read_bytes()
    res = run_cli_limited(["run", str(recipe), "--output-dir", str(out), "--resume", "--allow-recipe-change",
                           "--training.max_steps", "6", *SAVE, "--training.learning_rate", "0.001"], wall_limit_s=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming with a changed recipe (1 change(s)): training.learning_rate: (unset) -> 0.001" in res.stdout
    (kept_recipe,) = out.glob("recipe.yaml.*.old")
    (kept_provenance,) = out.glob("recipe.provenance.json.*.old")
    assert (kept_recipe.read_bytes(), kept_provenance.read_bytes()) == (old_recipe, old_provenance)
    assert f"the run's earlier recipe is kept as {kept_recipe}" in res.stdout
    assert "learning_rate: 0.001" in (out / "recipe.yaml").read_text()


def test_a_resume_from_an_earlier_checkpoint_sets_the_later_history_aside(trained_run: tuple[Path, Path, Path],
                                                                          tmp_path: Path) -> None:
    """Resuming from checkpoint-2 rewrote history.jsonl keeping steps 0 and 2: the step-4 line was deleted."""
    recipe, _, trained = trained_run
    out = _copy_run(trained, tmp_path)
    history = (out / "sago" / "history.jsonl").read_bytes()
    step4 = snapshot([out / "sago" / "step-4"])
    shutil.move(out / "checkpoint-4", tmp_path / "checkpoint-4")  # the last checkpoint lost: --resume takes 2
    res = run_cli_limited(["run", str(recipe), "--output-dir", str(out), "--resume", *SAVE,
                           "--training.max_steps", "4"], wall_limit_s=300)
    assert res.returncode == 0, res.stderr[-3000:]
    said = [x for x in res.stderr.splitlines() if "resuming at step 2" in x]
    assert len(said) == 1 and "1 later evaluation(s) (steps 4) were set aside" in said[0], res.stderr[-3000:]
    (aside,) = (out / "sago").glob("history.jsonl.*.old")
    assert aside.read_bytes() == history  # the whole history, the step-4 line too
    steps = _kept_folder(said[0], r"their step folders in (\S+)$")
    assert {k.replace(str(steps), str(out / "sago")): v for k, v in snapshot([steps / "step-4"]).items()} == step4
    assert [json.loads(x)["step"] for x in (out / "sago" / "history.jsonl").read_text().splitlines()] == [0, 2, 4]


def test_a_resume_whose_baseline_records_are_missing_is_refused(trained_run: tuple[Path, Path, Path],
                                                                tmp_path: Path) -> None:
    """A history whose step-0 folder was gone dropped the baseline silently and compared with step 2."""
    recipe, _, trained = trained_run
    out = _copy_run(trained, tmp_path)
    shutil.rmtree(out / "sago" / "step-0")
    history = (out / "sago" / "history.jsonl").read_bytes()
    res = run_cli_limited(["run", str(recipe), "--output-dir", str(out), "--resume", *SAVE,
                           "--training.max_steps", "6"], wall_limit_s=300)
    assert_one_error_line(res, "the baseline (step 0) of", "has no group records",
                          "step-0/paraphrase.jsonl is missing", "--new-baseline", cpu_limit_s=3 * RUN_CPU_LIMIT_S)
    assert (out / "sago" / "history.jsonl").read_bytes() == history
    assert not (out / "sago" / "run.lock").exists()  # the lock given back


def test_study_reuse_over_other_sets_evaluates_again_and_keeps_the_old_one(tmp_path: Path) -> None:
    """study --reuse reused an evaluation whose model and options matched, although the set (same name) held
    other prompts."""
    from sago_train.model.tiny import tiny_model_path

    data = write_set(tmp_path / "s.jsonl")
    out = tmp_path / "study"
    argv = ["study", "--model", f"a={tiny_model_path()}", "--model", f"b={tiny_model_path()}", "--set", f"s={data}",
            "--out", str(out), "--reuse", *FAST_EVAL[1:]]
    first = run_cli_limited(argv, wall_limit_s=300)
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_cli_limited(argv, wall_limit_s=300)
    assert again.returncode == 0 and "study: a: reusing" in again.stdout, again.stderr[-3000:]
    old = (out / "a" / "summary.json").read_bytes()
    data.write_text(data.read_text().replace("plus one", "and one more"))  # same name and ids, other prompts
    third = run_cli_limited(argv, wall_limit_s=300)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "study: a: not reusing" in third.stdout and "the set 's' differs from the one it was evaluated on" in \
        third.stdout
    folder = _kept_folder(third.stdout, r"study: a: kept the evaluation that was in \S+: its 2 files moved to (\S+)")
    assert (folder / "summary.json").read_bytes() == old


# ================================================================== the counts RELIABILITY.md states
TESTS_OUTSIDE_THE_TABLE = {  # name -> (class, kind)
    "report_history_compare_block_wrong_shape": ("after_the_work", "fault"),
    "eval_over_an_existing_evaluation": ("outputs", "fault"),
    "overwrite_over_step_folders": ("outputs", "fault"),
    "resume_learning_rate_changed": ("silently_wrong", "resume"),
    "resume_lora_rank_changed": ("after_the_work", "resume"),
    "resume_data_limit_changed": ("silently_wrong", "resume"),
    "resume_training_data_changed": ("silently_wrong", "resume"),
    "resume_recipe_change_allowed": ("silently_wrong", "resume"),
    "resume_from_an_earlier_checkpoint": ("outputs", "resume"),
    "resume_baseline_records_missing": ("silently_wrong", "resume"),
    "study_reuse_over_other_sets": ("silently_wrong", "input"),
    # through the Python API (tests/training/test_resume.py), not a subprocess
    "ema_state_truncated": ("after_the_work", "fault"),
    "ema_state_nan": ("silently_wrong", "fault"),
    "ema_state_other_dtype": ("silently_wrong", "fault"),
}
CASES: dict[str, tuple[str, str]] = {**{n: (c, k) for n, (c, k, _) in FAILING.items()}, **TESTS_OUTSIDE_THE_TABLE}


def round4_counts() -> dict[str, int]:
    kinds = [k for _, k in CASES.values()]
    return {"inputs": kinds.count("input"), "faults": kinds.count("fault"), "resumes": kinds.count("resume"),
            "classes": len({c for c, _ in CASES.values()})}


def test_reliability_md_states_the_counts() -> None:
    text = (ROOT / "RELIABILITY.md").read_text(encoding="utf-8")
    c = round4_counts()
    m = re.search(r"Round 4 \(issue 34\): (\d+) inputs tried, (\d+) faults injected, (\d+) resumes checked, "
                  r"in (\d+) classes", text)
    assert m, "RELIABILITY.md has no 'Round 4 (issue 34): N inputs tried, ...' sentence"
    assert tuple(map(int, m.groups())) == (c["inputs"], c["faults"], c["resumes"], c["classes"]), c
