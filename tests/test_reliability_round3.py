"""Reliability round 3 (issue 22): every case a real ``sago-train`` subprocess under the limits helper
(tests/_helpers/limited.py: a 2 GiB address-space limit, a wall-clock hang guard, CPU seconds and peak RSS
measured on the child).

Each case is registered in :data:`CASES` with its class and what it is (a bad *input*, a *fault* planted in the
environment of a run, a *resume*); :func:`test_reliability_md_states_the_counts` checks that RELIABILITY.md
states the counts this module holds. Every case also checks that nothing outside the chosen directory changed
and that no earlier result was lost (the protected files are byte-identical afterwards).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from ._helpers.limited import (
    CPU_LIMIT_S,
    RUN_CPU_LIMIT_S,
    Limited,
    assert_bounded,
    assert_one_error_line,
    import_cpu_s,
    run_cli_limited,
)
from ._helpers.results_dirs import axis_values, write_run_dir

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
BAD = ROOT / "tests" / "fixtures" / "bad"
FAST_EVAL = ["--quiet", "--axes", "activation", "--max-new-tokens", "2"]


@dataclass
class Case:
    """One situation: the command, what its one error line must say (None: it must succeed), and the files or
    folders that must be byte-identical afterwards."""

    argv: list[str]
    expect: list[str] | None
    protected: list[Path] = field(default_factory=list)
    cwd: Path | None = None
    before_model: bool = True  # refused before any model loads


def snapshot(paths: list[Path]) -> dict[str, bytes | str]:
    """Every file under ``paths`` (links as their target), so that any change shows."""
    out: dict[str, bytes | str] = {}
    for root in paths:
        if root.is_symlink():
            out[str(root)] = f"-> {os.readlink(root)}"
        elif root.is_file():
            out[str(root)] = root.read_bytes()
        elif root.is_dir():
            for p in sorted(root.rglob("*")):
                out[str(p)] = f"-> {os.readlink(p)}" if p.is_symlink() else (p.read_bytes() if p.is_file() else "dir")
    return out


def write_set(path: Path, kinds: list[str] | None = None, ids: list[str] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"id": (ids or [f"g{i}" for i in range(3)])[i],
             "variants": [f"What is {i} plus one?", f"{i} + 1 =", f"Add one to {i}:"], "reference": f" {i + 1}",
             **({"kinds": kinds} if kinds else {})} for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def small_recipe(tmp: Path, set_file: str = "sago://demo/paraphrase.jsonl", *, monitor: bool = True) -> Path:
    path = tmp / "small.yaml"
    text = ('sago_train_version: "0.1.0"\nmodel:\n  path: sago://tiny-llama\n'
            "data:\n  train: sago://demo/groups.jsonl\n  limit: 4\n")
    if monitor:
        text += (f"monitor:\n  sets:\n    paraphrase: {json.dumps(set_file)}\n  eval_steps: 2\n"
                 "  options: {max_groups: 2, max_new_tokens: 2, axes: activation, n_bootstrap: 100}\n")
    text += ("training:\n  max_steps: 2\n  per_device_train_batch_size: 2\n  use_cpu: true\n  report_to: []\n"
             '  save_strategy: "no"\n  disable_tqdm: true\n')
    path.write_text(text, encoding="utf-8")
    return path


# ================================================================== 1. work lost or replaced, writes outside
def _eval_out_holds_the_input_set(tmp: Path) -> Case:
    out = tmp / "res"
    data = write_set(out / "s.jsonl")
    return Case(["eval", "--set", f"s={data}", "--out", str(out), *FAST_EVAL],
                ["--out", "s.jsonl is the set 's' (--set), an input of this command"], [out])


def _eval_summary_is_a_directory(tmp: Path) -> Case:
    out = tmp / "res"
    (out / "summary.json").mkdir(parents=True)
    return Case(["eval", "--set", f"s={write_set(tmp / 's.jsonl')}", "--out", str(out), *FAST_EVAL],
                ["summary.json is a directory, expected a file"], [out])


def _eval_records_file_is_a_link(tmp: Path) -> Case:
    out, outside = tmp / "res", tmp / "outside"
    out.mkdir()
    outside.mkdir()
    (outside / "precious.jsonl").write_text("the user's file\n")
    (out / "s.jsonl").symlink_to(outside / "precious.jsonl")
    return Case(["eval", "--set", f"s={write_set(tmp / 'in' / 's.jsonl')}", "--out", str(out), *FAST_EVAL],
                ["s.jsonl is a symbolic link; sago_train never writes through one"], [outside, out])


def _two_runs(tmp: Path) -> tuple[Path, Path]:
    return (write_run_dir(tmp / "a", {0: {"s": axis_values(0)}, 2: {"s": axis_values(1)}}),
            write_run_dir(tmp / "b", {0: {"s": axis_values(2)}}))


def _compare_json_is_a_run_history(tmp: Path) -> Case:
    a, b = _two_runs(tmp)
    return Case(["compare", str(a), str(b), "--json", str(a / "sago" / "history.jsonl")],
                ["--json", "history.jsonl is a results file read from", "an input of this command"], [a, b])


def _compare_json_is_a_directory(tmp: Path) -> Case:
    a, b = _two_runs(tmp)
    (tmp / "out.json").mkdir()
    return Case(["compare", str(a), str(b), "--json", str(tmp / "out.json")],
                ["--json", "out.json is a directory, expected a file"], [a, b, tmp / "out.json"])


def _compare_json_unwritable(tmp: Path) -> Case:
    a, b = _two_runs(tmp)
    return Case(["compare", str(a), str(b), "--json", "/proc/sago-no-such/cmp.json"], ["--json", "is not writable"],
                [a, b])


def _report_md_is_a_directory(tmp: Path) -> Case:
    a, _ = _two_runs(tmp)
    (tmp / "rep" / "report.md").mkdir(parents=True)
    return Case(["report", str(a), "--out", str(tmp / "rep")], ["report.md is a directory, expected a file"],
                [a, tmp / "rep"])


def _report_out_unwritable(tmp: Path) -> Case:
    a, _ = _two_runs(tmp)
    return Case(["report", str(a), "--out", "/proc/sago-no-such/rep"], ["--out", "is not writable"], [a])


def _variants_out_is_the_templates_file(tmp: Path) -> Case:
    examples = tmp / "ex.jsonl"
    examples.write_text('{"id": "e1", "prompt": "What is 2+2?"}\n')
    templates = tmp / "templates.txt"
    templates.write_text("Question: {prompt}\n---\n{prompt} Answer briefly.\n")
    return Case(["variants", "--input", str(examples), "--templates", str(templates), "--out", str(templates)],
                ["templates.txt is the --templates file, an input of this command"], [examples, templates])


def _variants_out_unwritable(tmp: Path) -> Case:
    examples = tmp / "ex.jsonl"
    examples.write_text('{"id": "e1", "prompt": "What is 2+2?"}\n')
    return Case(["variants", "--input", str(examples), "--typo-rate", "0.1", "--out", "/proc/sago-no-such/s.jsonl"],
                ["--out", "is not writable"], [examples])


def _run_with_a_link(tmp: Path, link: str) -> Case:
    out, outside = tmp / "out", tmp / "outside"
    (out / "sago").mkdir(parents=True)
    outside.mkdir()
    (outside / "precious.txt").write_text("the user's file\n")
    target = outside / "precious.txt" if link == "run.lock" else outside
    where = out / link if link == "sago" else out / "sago" / link
    if link == "sago":
        (out / "sago").rmdir()
    where.symlink_to(target)
    return Case(["run", str(small_recipe(tmp)), "--output-dir", str(out)],
                [f"{link} is a symbolic link; sago_train never writes through one"], [outside, out])


def _run_output_dir_holds_the_recipe(tmp: Path) -> Case:
    out = tmp / "out"
    out.mkdir()
    recipe = small_recipe(tmp)
    shutil.move(recipe, out / "recipe.yaml")
    return Case(["run", str(out / "recipe.yaml"), "--output-dir", str(out)],
                ["recipe.yaml is the recipe being run, an input of this command"], [out])


def _report_plot_in_the_way(tmp: Path, what: str) -> Case:
    """A directory (or a link leaving --out) where a plot goes: a traceback after the other plots were drawn."""
    a, _ = _two_runs(tmp)
    rep, outside = tmp / "rep", tmp / "outside"
    outside.mkdir()
    if what == "directory":
        (rep / "steps_s.png").mkdir(parents=True)
        return Case(["report", str(a), "--out", str(rep)], ["steps_s.png is a directory, expected a file"],
                    [a, rep, outside])
    rep.mkdir()
    (rep / "groups_s.png").symlink_to(outside / "plot.png")
    return Case(["report", str(a), "--out", str(rep)],
                ["groups_s.png is a symbolic link; sago_train never writes through one"], [a, rep, outside])


def _study(tmp: Path, data: Path, out: Path, expect: list[str], protected: list[Path]) -> Case:
    """A study whose models do not exist: a refusal must come from the output checks, before any model loads."""
    return Case(["study", "--model", f"a={tmp / 'no-model-a'}", "--model", f"b={tmp / 'no-model-b'}",
                 "--set", f"s={data}", "--out", str(out), *FAST_EVAL[1:]], expect, [data, *protected])


def _study_plot_is_a_directory(tmp: Path) -> Case:
    out = tmp / "study"
    (out / "report" / "groups_s.png").mkdir(parents=True)
    return _study(tmp, write_set(tmp / "s.jsonl"), out, ["groups_s.png is a directory, expected a file"], [out])


def _study_eval_dir_is_a_link(tmp: Path) -> Case:
    out, outside = tmp / "study", tmp / "outside"
    out.mkdir()
    outside.mkdir()
    (outside / "summary.json").write_text("{}\n")
    (out / "b").symlink_to(outside)
    return _study(tmp, write_set(tmp / "s.jsonl"), out, ["b is a symbolic link; sago_train never writes through one"],
                  [out, outside])


def _study_out_holds_the_input_set(tmp: Path) -> Case:
    out = tmp / "study"
    data = write_set(out / "a" / "s.jsonl")
    return _study(tmp, data, out, ["s.jsonl is the set 's' (--set), an input of this command"], [out])


def _recipe_number(tmp: Path, key: str, value: str, expect: str) -> Case:
    return Case(["run", str(small_recipe(tmp)), "--dry-run", "--output-dir", str(tmp / "o"), f"--{key}", value],
                [f"field '{key}': expected {expect}, got "])


# ================================================================== 4. unbounded work (refused up front)
def _laughs() -> str:
    levels = ["a: &a [x,x,x,x,x,x,x,x,x,x]"] + [
        f"l{i}: &l{i} [{','.join([f'*{prev}'] * 10)}]" for i, prev in enumerate(["a", *[f"l{j}" for j in range(1, 8)]],
                                                                                   start=1)]
    return "{" + ", ".join(levels) + "}"


def _override_billion_laughs(tmp: Path) -> Case:
    """~10**8 values once expanded: still growing after 200 s at 1.4 GB (the file's limit did not apply)."""
    return Case(["run", str(small_recipe(tmp)), "--dry-run", "--output-dir", str(tmp / "o"), "--training.x", _laughs()],
                ["field '--training.x': the override --training.x expands to more than 1,000,000"])


def _override_nested_20000_deep(tmp: Path) -> Case:
    return Case(["run", str(small_recipe(tmp)), "--dry-run", "--output-dir", str(tmp / "o"),
                 "--training.x", "[" * 20_000 + "]" * 20_000], ["invalid YAML: nested too deeply (more than 100 levels, MAX_YAML_DEPTH)"])


def _n_bootstrap_1e9(tmp: Path) -> Case:
    """Accepted, then a 7.45 GiB allocation after the whole evaluation."""
    return Case(["eval", "--set", f"s={write_set(tmp / 's.jsonl')}", "--n-bootstrap", "1000000000", *FAST_EVAL],
                ["field 'n_bootstrap': expected a positive integer up to 100,000 (MAX_BOOTSTRAP)"])


def _eval_seed_negative(tmp: Path) -> Case:
    return Case(["eval", "--set", f"s={write_set(tmp / 's.jsonl')}", "--seed", "-1", *FAST_EVAL],
                ["field 'seed': expected an integer in [0, 4,294,967,295] (MAX_SEED), got -1"])


def _history_of_3gb_without_a_newline(tmp: Path) -> Case:
    """claim_history counted lines with a plain loop: one 3 GB line read whole."""
    out = tmp / "out"
    (out / "sago").mkdir(parents=True)
    with open(out / "sago" / "history.jsonl", "wb") as f:
        f.truncate(3 * 1024**3)  # sparse: no disk used
    return Case(["run", str(small_recipe(tmp)), "--output-dir", str(out)],
                ["history.jsonl is 3072 MiB, over the limit of 128 MiB for a SAGO history"])


# ================================================================== 3. silently wrong
def _model_config_without_a_block_count(tmp: Path) -> Case:
    from sago_train.model.tiny import tiny_model_path

    model = tmp / "model"
    shutil.copytree(tiny_model_path(), model)
    config = json.loads((model / "config.json").read_text())
    del config["num_hidden_layers"]
    (model / "config.json").write_text(json.dumps(config))
    return Case(["eval", "--model", str(model), "--set", f"s={write_set(tmp / 's.jsonl')}", *FAST_EVAL],
                ["config.json: field 'num_hidden_layers': the model config gives no number of decoder blocks"])


def _checkpoint_leaves_weights_new(tmp: Path) -> Case:
    from sago_train.model.tiny import tiny_model_path

    model = tmp / "model"
    shutil.copytree(tiny_model_path(), model)
    config = json.loads((model / "config.json").read_text())
    config["num_hidden_layers"] = 6  # the checkpoint has 4 blocks: 2 would be random
    (model / "config.json").write_text(json.dumps(config))
    return Case(["eval", "--model", str(model), "--set", f"s={write_set(tmp / 's.jsonl')}", *FAST_EVAL],
                ["18 weight(s) are not in its checkpoint (or have another shape) and would be newly initialized"],
                before_model=False)


FAILING: dict[str, tuple[str, str, Callable[[Path], Case]]] = {  # name -> (class, kind, builder)
    "eval_out_holds_the_input_set": ("outputs", "input", _eval_out_holds_the_input_set),
    "eval_summary_is_a_directory": ("outputs", "fault", _eval_summary_is_a_directory),
    "eval_records_file_is_a_link": ("outputs", "fault", _eval_records_file_is_a_link),
    "compare_json_is_a_run_history": ("outputs", "input", _compare_json_is_a_run_history),
    "compare_json_is_a_directory": ("outputs", "fault", _compare_json_is_a_directory),
    "compare_json_unwritable": ("outputs", "fault", _compare_json_unwritable),
    "report_md_is_a_directory": ("outputs", "fault", _report_md_is_a_directory),
    "report_out_unwritable": ("outputs", "fault", _report_out_unwritable),
    "variants_out_is_the_templates_file": ("outputs", "input", _variants_out_is_the_templates_file),
    "variants_out_unwritable": ("outputs", "fault", _variants_out_unwritable),
    "run_lock_is_a_link": ("outputs", "fault", lambda t: _run_with_a_link(t, "run.lock")),
    "run_step_folder_is_a_link": ("outputs", "fault", lambda t: _run_with_a_link(t, "step-2")),
    "run_sago_folder_is_a_link": ("outputs", "fault", lambda t: _run_with_a_link(t, "sago")),
    "run_output_dir_holds_the_recipe": ("outputs", "input", _run_output_dir_holds_the_recipe),
    "override_billion_laughs": ("bounded", "input", _override_billion_laughs),
    "override_nested_20000_deep": ("bounded", "input", _override_nested_20000_deep),
    "n_bootstrap_1e9": ("bounded", "input", _n_bootstrap_1e9),
    "eval_seed_negative": ("bounded", "input", _eval_seed_negative),
    "history_of_3gb_without_a_newline": ("bounded", "fault", _history_of_3gb_without_a_newline),
    "model_config_without_a_block_count": ("silently_wrong", "input", _model_config_without_a_block_count),
    "checkpoint_leaves_weights_new": ("silently_wrong", "input", _checkpoint_leaves_weights_new),
    # round 3, last gaps: every file report and study write; recipe numbers in ranges
    "report_plot_is_a_directory": ("outputs", "fault", lambda t: _report_plot_in_the_way(t, "directory")),
    "report_plot_is_a_link": ("outputs", "fault", lambda t: _report_plot_in_the_way(t, "link")),
    "study_plot_is_a_directory": ("outputs", "fault", _study_plot_is_a_directory),
    "study_eval_dir_is_a_link": ("outputs", "fault", _study_eval_dir_is_a_link),
    "study_out_holds_the_input_set": ("outputs", "input", _study_out_holds_the_input_set),
    # a ZeroDivisionError and a ValueError after the model loaded; max_steps 0 ran one step
    "recipe_gradient_accumulation_0": ("after_the_work", "input", lambda t: _recipe_number(
        t, "training.gradient_accumulation_steps", "0", "a positive integer up to 65,536 (MAX_BATCH_SIZE)")),
    "recipe_learning_rate_nan": ("after_the_work", "input", lambda t: _recipe_number(
        t, "training.learning_rate", ".nan", "a finite number >= 0")),
    "recipe_max_steps_0": ("silently_wrong", "input", lambda t: _recipe_number(
        t, "training.max_steps", "0", "an integer in [1, 2,147,483,647] (MAX_TRAINING_STEPS) or -1 (num_train_epochs decides)")),
}


@pytest.mark.parametrize("name", sorted(FAILING))
def test_refused_in_one_line_before_any_work_and_nothing_changes(name: str, tmp_path: Path) -> None:
    case = FAILING[name][2](tmp_path)
    before = snapshot(case.protected)
    res = run_cli_limited(case.argv, cwd=case.cwd)
    assert case.expect is not None
    assert_one_error_line(res, *case.expect)
    if case.before_model:
        assert "Loading weights" not in res.stderr, "refused only after the model loaded"
    assert snapshot(case.protected) == before, "a file outside the chosen directory, or an input, changed"


# ------------------------------------------------------------------ the corpus files of issue 22, in a subprocess
ROUND3_CORPUS = {  # manifest file -> class
    "set_choice_orders_negative.jsonl": "silently_wrong", "set_choice_orders_too_short.jsonl": "silently_wrong",
    "set_choice_orders_strings.jsonl": "after_the_work", "set_choice_orders_out_of_range.jsonl": "after_the_work",
    "set_choice_orders_repeated.jsonl": "silently_wrong", "set_generation_not_object.jsonl": "after_the_work",
    "set_kinds_repeated.jsonl": "after_the_work", "set_duplicate_json_key.jsonl": "valid_input",
    "recipe_training_seed_negative.yaml": "after_the_work", "recipe_training_seed_huge.yaml": "after_the_work",
    "recipe_n_bootstrap_huge.yaml": "bounded", "recipe_lora_rank_too_large.yaml": "bounded",
    "recipe_merge_key_override.yaml": "valid_input",
}


@pytest.mark.parametrize("name", sorted(ROUND3_CORPUS))
def test_issue_22_corpus_in_a_limited_subprocess(name: str, tmp_path: Path) -> None:
    from .test_bad_inputs import ENTRIES, MANIFEST, cli_argv

    spec = MANIFEST[name]
    res = run_cli_limited(cli_argv(name, spec["entry"], tmp_path))
    if spec["outcome"] == "accepted":
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
        assert spec["stdout"] in res.stdout
        assert_bounded(res, cpu_limit_s=RUN_CPU_LIMIT_S)
        return
    # A recipe is parsed after transformers, TRL and peft are imported (see RUN_CPU_LIMIT_S).
    line = assert_one_error_line(res, name, spec["message"],
                                 cpu_limit_s=RUN_CPU_LIMIT_S if spec["entry"] == "recipe" else CPU_LIMIT_S)
    assert line.startswith(f"sago-train {ENTRIES[spec['entry']]}: error: ")


# ================================================================== 2. markup-safe, terminal-safe output
HOSTILE_KIND = "[/bold]"
OSC_TITLE = "\x1b]0;pwned\x07"


def _assert_inert(res: Limited) -> None:
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "\x1b" not in res.stdout and "\x1b" not in res.stderr and "\x07" not in res.stdout


def test_kinds_and_ids_print_as_written_never_as_markup_or_terminal_codes(tmp_path: Path) -> None:
    """A kind '[/bold]' crashed the kind table after the whole evaluation (exit 1, nothing written); ESC and OSC
    sequences in kinds and ids went raw to the terminal (clear screen, set title)."""
    data = write_set(tmp_path / "s.jsonl", kinds=[HOSTILE_KIND, f"t{OSC_TITLE}", "plain\x1b[2J"],
                     ids=["a\x1b[2J", "b", "c"])
    out = tmp_path / "o[/x]"  # a markup-like --out path too: the 'wrote' line failed after the evaluation
    res = run_cli_limited(["eval", "--set", f"s={data}", "--out", str(out), *FAST_EVAL])
    _assert_inert(res)
    assert HOSTILE_KIND in res.stdout and "t\\x1b]0;pwned\\x07" in res.stdout and "plain\\x1b[2J" in res.stdout
    assert f"wrote {out / 'summary.json'}" in res.stdout and (out / "summary.json").is_file()


def test_an_error_line_is_inert_text(tmp_path: Path) -> None:
    res = run_cli_limited(["eval", "--set", f"s={tmp_path / 'no-such'}\x1b[2J.jsonl", *FAST_EVAL])
    assert_one_error_line(res, "file not found:", "no-such\\x1b[2J.jsonl")
    assert "\x1b" not in res.stderr


def test_a_markup_like_output_dir_does_not_fail_the_run_banner(tmp_path: Path) -> None:
    out = tmp_path / "o[/x]"
    res = run_cli_limited(["run", str(small_recipe(tmp_path, monitor=False)), "--output-dir", str(out),
                           "--training.max_steps", "1"], wall_limit_s=300)
    _assert_inert(res)
    assert f"-> {out}" in res.stdout and (out / "recipe.yaml").is_file()


def test_study_labels_and_paths_print_as_written_never_as_markup_or_terminal_codes(tmp_path: Path) -> None:
    """A model path 'm[/x]' failed the 'evaluated' line after the evaluation (rich read it as a closing tag), and an
    ESC in a path, a kind or an id went raw to the terminal."""
    from sago_train.model.tiny import tiny_model_path

    markup, escape = tmp_path / "m[" / "x]", tmp_path / f"e{OSC_TITLE}"
    for model in (markup, escape):
        shutil.copytree(tiny_model_path(), model)
    data = write_set(tmp_path / "s.jsonl", kinds=[f"t{OSC_TITLE}", HOSTILE_KIND, "plain\x1b[2J"],
                     ids=["a\x1b[2J", "b", "c"])
    out = tmp_path / "study"
    res = run_cli_limited(["study", "--model", f"a={markup}", "--model", f"b={escape}", "--set", f"s={data}",
                           "--out", str(out), *FAST_EVAL[1:]], wall_limit_s=300)
    _assert_inert(res)
    assert f"study: a ({markup}) evaluated" in res.stdout
    assert f"study: b ({tmp_path}/e\\x1b]0;pwned\\x07) evaluated" in res.stdout
    assert (out / "report" / "report.md").is_file() and (out / "report" / "comparison.json").is_file()


def test_run_log_lines_show_kinds_as_their_escapes(tmp_path: Path) -> None:
    """The callback's change line (accuracy_worst_kind names the kind) printed an OSC sequence in a kind raw:
    a training run's terminal retitled, or cleared by ESC [2J."""
    data = write_set(tmp_path / "s.jsonl", kinds=[f"t{OSC_TITLE}", HOSTILE_KIND, "plain\x1b[2J"])
    res = run_cli_limited(["run", str(small_recipe(tmp_path, str(data))), "--output-dir", str(tmp_path / "out")],
                          wall_limit_s=300)
    _assert_inert(res)
    assert "accuracy_worst_kind (t\\x1b]0;pwned\\x07)" in res.stderr, res.stderr[-3000:]


def test_a_monitored_set_is_read_lazily(tmp_path: Path) -> None:
    """A recipe's monitor.sets were parsed whole although monitor.options.max_groups caps what is evaluated: here
    every line the capped subset does not run is malformed JSON (200 kB each), and the run goes on."""
    from ._helpers.lazy_sets import set_with_garbage_outside_the_subset

    data = tmp_path / "paraphrase.jsonl"
    set_with_garbage_outside_the_subset(data, n=200, max_groups=2, name="paraphrase")
    res = run_cli_limited(["run", str(small_recipe(tmp_path, str(data))), "--dry-run", "--output-dir",
                           str(tmp_path / "out")], wall_limit_s=300)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "dry run of 'small' OK" in res.stdout
    assert_bounded(res, cpu_limit_s=RUN_CPU_LIMIT_S)


# ================================================================== 3. resumes on a changed set; 4. bounded reads
def _history(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "sago" / "history.jsonl").read_text().splitlines()]


def test_resume_after_the_monitored_set_changed_is_refused_unless_a_new_baseline(tmp_path: Path) -> None:
    """Same ids, new text: the resumed run compared new evaluations with the old baseline, a fake +0.20 regression
    at p ~ 6e-6 that early stopping would act on."""
    data = tmp_path / "paraphrase.jsonl"
    shutil.copy(ROOT / "sago_train" / "assets" / "demo" / "paraphrase.jsonl", data)
    recipe, out = small_recipe(tmp_path, str(data)), tmp_path / "out"
    save = ["--training.save_strategy", "steps", "--training.save_steps", "2"]
    first = run_cli_limited(["run", str(recipe), "--output-dir", str(out), *save], wall_limit_s=300)
    assert first.returncode == 0, first.stderr[-3000:]
    kept = (out / "sago" / "history.jsonl").read_bytes()
    assert [h["step"] for h in _history(out)] == [0, 2] and all("fingerprints" in h for h in _history(out))

    edited = data.read_text().replace("What is the opposite of", "Which word means the reverse of")
    assert edited != data.read_text() and [json.loads(x)["id"] for x in edited.splitlines()] == [
        json.loads(x)["id"] for x in data.read_text().splitlines()]
    data.write_text(edited)  # same ids, other prompts
    refused = run_cli_limited(["run", str(recipe), "--output-dir", str(out), "--resume", "--training.max_steps", "4",
                               *save], wall_limit_s=300)
    assert_one_error_line(refused, "cannot resume: the monitored set 'paraphrase'", "measured at step 2",
                          "--new-baseline", cpu_limit_s=RUN_CPU_LIMIT_S)
    assert "Loading weights" not in refused.stderr  # refused before the model loads
    assert (out / "sago" / "history.jsonl").read_bytes() == kept

    fresh = run_cli_limited(["run", str(recipe), "--output-dir", str(out), "--resume", "--new-baseline",
                             "--training.max_steps", "4", *save], wall_limit_s=300)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    (old,) = (out / "sago").glob("history.jsonl.*.old")
    assert old.read_bytes() == kept  # nothing lost: the old history is whole beside the new one
    new = _history(out)
    assert [h["step"] for h in new] == [2, 4] and new[0]["baseline"] is True  # measured at the resumed step
    assert new[0]["fingerprints"] != json.loads(kept.splitlines()[0])["fingerprints"]


def test_two_overwrites_in_the_same_second_keep_both_histories(tmp_path: Path) -> None:
    """history.jsonl.<time>.old was reused by a second --overwrite within a second: the first kept history lost.
    Every name the run could pick for the next minutes is taken here; all stay as they were."""
    import time

    recipe, out = small_recipe(tmp_path), tmp_path / "out"
    (out / "sago").mkdir(parents=True)
    history = out / "sago" / "history.jsonl"
    history.write_text(json.dumps({"step": 0, "sets": {"p": {}}}) + "\n")
    now = time.time()
    taken = [history.with_name(f"history.jsonl.{time.strftime('%Y%m%dT%H%M%S', time.localtime(now + s))}.old")
             for s in range(-1, 600)]
    for i, p in enumerate(taken):
        p.write_text(f"earlier history {i}\n")
    before = snapshot(taken) | snapshot([history])
    res = run_cli_limited(["run", str(recipe), "--output-dir", str(out), "--overwrite"], wall_limit_s=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert snapshot(taken) == {k: v for k, v in before.items() if k != str(history)}
    (aside,) = set((out / "sago").glob("history.jsonl.*.old")) - set(taken)
    assert aside.read_bytes() == before[str(history)] and [h["step"] for h in _history(out)] == [0, 2]


def test_many_corrupt_history_lines_are_summarized(tmp_path: Path) -> None:
    """300,000 corrupt lines printed 300,000 warnings (and kept 300,000 exceptions: 1.3 GB)."""
    run = write_run_dir(tmp_path / "run", {0: {"s": axis_values(0)}})
    with open(run / "sago" / "history.jsonl", "a") as f:
        f.write("{torn\n" * 300_000)
    res = run_cli_limited(["report", str(run), "--out", str(tmp_path / "rep")], wall_limit_s=300)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    warnings = [x for x in res.stderr.splitlines() if x.startswith("sago: ")]
    assert len(warnings) == 11 and warnings[-1].startswith("sago: ... and 299,990 more corrupt lines in "), warnings
    assert res.peak_rss < 1024**3, f"peak RSS {res.peak_rss / 2**20:.0f} MiB"
    assert (tmp_path / "rep" / "report.md").is_file()


def test_a_set_capped_by_max_groups_is_read_lazily(tmp_path: Path) -> None:
    """A 127 MiB set with --max-groups 2 was parsed whole (~270 MiB more memory, and its CPU time)."""
    row = {"variants": ["What is the capital of France? " * 8, "Name the capital of France. " * 8],
           "reference": " Paris"}
    big = tmp_path / "big.jsonl"
    with open(big, "w") as f:
        i = 0
        while f.tell() < 127 * 1024**2 - 4096:
            f.write(json.dumps({"id": f"g{i}", **row}) + "\n")
            i += 1
    small = write_set(tmp_path / "small.jsonl")
    capped = ["--max-groups", "2", *FAST_EVAL]
    reference = run_cli_limited(["eval", "--set", f"s={small}", *capped])
    res = run_cli_limited(["eval", "--set", f"s={big}", *capped])
    for r in (reference, res):
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "set 's': 2 groups" in res.stdout
    assert res.peak_rss < reference.peak_rss + 100 * 2**20, (res.peak_rss / 2**20, reference.peak_rss / 2**20)
    assert_bounded(res)


def test_a_group_of_1024_long_variants_is_skipped_before_it_is_tokenized(tmp_path: Path) -> None:
    """1024 variants of 60,000 characters (each under MAX_VARIANT_CHARS, together far over the context) were
    tokenized whole before the group was skipped: still running after 120 s."""
    data = tmp_path / "wide.jsonl"
    with open(data, "w") as f:
        f.write(json.dumps({"id": "wide", "variants": ["word " * 12_000] * 1024}) + "\n")
        f.write(json.dumps({"id": "ok", "variants": ["What is 2+2?", "Compute two plus two."]}) + "\n")
    res = run_cli_limited(["eval", "--set", f"s={data}", *FAST_EVAL])
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "set 's': 1 groups, 1 skipped" in res.stdout
    assert_bounded(res)


# ================================================================== 5. values read back after the work
@pytest.mark.parametrize("edit, key", [
    (lambda line: line["sets"]["s"]["activation"].update(mean=1.7e308, ci_high=1.7e308), "sets.s.activation.mean"),
    (lambda line: line["correctness"]["s"].update(n=[1]), "correctness.s.n"),
], ids=["mean_1.7e308", "correctness_n_a_list"])
def test_hand_edited_history_values_end_in_one_line(edit: Callable, key: str, tmp_path: Path) -> None:
    """A mean of 1.7e308 reached matplotlib ('arange: cannot compute length'); a list where a count goes was an
    int() TypeError: both tracebacks after the report's work."""
    run = write_run_dir(tmp_path / "run", {0: {"s": axis_values(0)}})
    path = run / "sago" / "history.jsonl"
    line = json.loads(path.read_text())
    edit(line)
    path.write_text(json.dumps(line) + "\n")
    res = run_cli_limited(["report", str(run), "--out", str(tmp_path / "rep")])
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("sago-train report: error: no evaluations in ") and f"history.jsonl:1: field '{key}'" in last
    assert not (tmp_path / "rep" / "report.md").exists()
    assert_bounded(res)


# ================================================================== the counts RELIABILITY.md states
TESTS_OUTSIDE_THE_TABLES = {  # name -> (class, kind)
    "kinds_and_ids_markup_and_escapes": ("markup", "input"),
    "error_line_escapes": ("markup", "input"),
    "output_dir_markup": ("markup", "input"),
    "resume_after_the_set_changed": ("silently_wrong", "resume"),
    "resume_with_a_new_baseline": ("silently_wrong", "resume"),
    "two_overwrites_in_one_second": ("outputs", "fault"),
    "corrupt_history_lines_300000": ("bounded", "fault"),
    "set_127mib_max_groups_2": ("bounded", "input"),
    "group_1024_variants_of_60k_characters": ("bounded", "input"),
    "history_mean_1.7e308": ("after_the_work", "fault"),
    "history_correctness_n_a_list": ("after_the_work", "fault"),
    "study_labels_markup_and_escapes": ("markup", "input"),
    "run_log_lines_kinds_escapes": ("markup", "input"),
    "monitored_set_read_lazily": ("bounded", "input"),
    # through the callback (tests/integrations/test_early_stopping.py), not a subprocess
    "early_stopping_after_a_new_baseline": ("silently_wrong", "resume"),
}
CASES: dict[str, tuple[str, str]] = {**{n: (c, k) for n, (c, k, _) in FAILING.items()},
                                     **{n: (c, "input") for n, c in ROUND3_CORPUS.items()}, **TESTS_OUTSIDE_THE_TABLES}


def round3_counts() -> dict[str, int]:
    kinds = [k for _, k in CASES.values()]
    return {"inputs": kinds.count("input"), "faults": kinds.count("fault"), "resumes": kinds.count("resume"),
            "classes": len({c for c, _ in CASES.values()})}


def test_reliability_md_states_the_counts() -> None:
    text = (ROOT / "RELIABILITY.md").read_text(encoding="utf-8")
    c = round3_counts()
    m = re.search(r"Round 3 \(issue 22\): (\d+) inputs tried, (\d+) faults injected, (\d+) resumes checked, "
                  r"in (\d+) classes", text)
    assert m, "RELIABILITY.md has no 'Round 3 (issue 22): N inputs tried, ...' sentence"
    assert tuple(map(int, m.groups())) == (c["inputs"], c["faults"], c["resumes"], c["classes"]), c
    assert yaml.safe_load((BAD / "EXPECTED.yaml").read_text()).keys() >= ROUND3_CORPUS.keys()


def test_the_cpu_bound_scales_with_this_machines_imports_but_still_catches_work():
    """The bound of a refusal: the fixed limit, or the imports' CPU on this machine plus half of it; a child that
    did real work (1000 CPU seconds) fails it either way."""
    assert 0.5 < import_cpu_s() < 120
    assert_bounded(Limited(2, "", "", 1.0, 1.0, 0))
    with pytest.raises(AssertionError, match="took 1000.0 CPU seconds"):
        assert_bounded(Limited(2, "", "", 1000.0, 1000.0, 0))


def test_the_measured_peak_rss_is_the_childs_own_not_the_workers():
    """A pytest worker that grew (here by 1.2 GB) must not inflate the child's measured peak: Linux keeps the
    forking process's high-water mark in ru_maxrss across exec, which once failed the corrupt-history test in CI."""
    import numpy as np

    from ._helpers.limited import run_cli_limited as measured

    small = measured(["--version"]).peak_rss
    ballast = np.ones(int(1.2e9) // 8)
    after = measured(["--version"]).peak_rss
    assert ballast.sum() > 0 and after < small + 200 * 2**20 and after < 2**30, (small, after)
