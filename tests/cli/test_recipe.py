"""The shipped recipes (recipes/*.yaml), their data, and the command line around them.

- every recipe parses; the demo recipe dry-runs as it is;
- each GPU recipe runs for 2 steps offline, with its model swapped for a tiny model of the same architecture
  (built from config, saved with a byte-level tokenizer that has a chat template) and bf16 turned off;
- the committed variant sets are exactly what ``recipes/data/build_sets.sh`` writes from the examples;
- ``--help`` of every command, ``--version``, and the ``--section.key`` overrides.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sago_train.cli.main import COMMANDS, main
from sago_train.cli.recipe import load_recipe, parse_overrides
from sago_train.data.groups import VariantSet
from sago_train.errors import SagoInputError
from sago_train.version import __version__

from .._helpers.tiny import make_byte_tokenizer, make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
DEMO = RECIPES / "demo.yaml"
BUILD_SETS = RECIPES / "data" / "build_sets.sh"

# GPU recipe -> (tiny architecture standing in for its model, a word its model path must contain).
GPU_RECIPES = {
    "qwen2.5-0.5b-lora.yaml": ("qwen2", "qwen2.5"),
    "llama-3.2-1b-stability.yaml": ("llama", "llama"),
}
# Small, fast monitoring for the 2-step runs (the sets themselves are the recipe's committed files).
FAST_MONITOR = ["--monitor.options.max_groups=3", "--monitor.options.max_new_tokens=4",
                "--monitor.options.n_bootstrap=100", "--monitor.options.batch_size=16"]


def all_recipes() -> list[str]:
    return sorted(p.name for p in RECIPES.glob("*.yaml"))


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(args)
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


# ------------------------------------------------------------------ parsing
def test_the_gpu_recipes_are_shipped():
    assert set(GPU_RECIPES) <= set(all_recipes())


@pytest.mark.parametrize("name", all_recipes())
def test_recipe_parses(name):
    recipe = load_recipe(RECIPES / name)
    assert recipe.sago_train_version == __version__
    assert recipe.name
    for set_name, value in recipe.monitor.sets.items():  # monitoring sets are local files that load
        assert len(VariantSet.from_jsonl(recipe.resolve_path(value), name=set_name)) > 0


@pytest.mark.parametrize("name", sorted(GPU_RECIPES))
def test_gpu_recipe_contents(name):
    text = (RECIPES / name).read_text(encoding="utf-8")
    assert text.startswith("#")
    header = text[: text.index("sago_train_version:")]
    for needed in ("Hardware", f"sago-train run recipes/{name}", "sago-train variants", "build_sets.sh"):
        assert needed in header, f"{name}: the header comment lacks {needed!r}"
    recipe = load_recipe(RECIPES / name)
    assert recipe.model.lora is not None and recipe.model.dtype == "bfloat16"
    assert recipe.training["bf16"] is True
    assert recipe.training["report_to"] == ["tensorboard", "wandb"]
    assert recipe.early_stopping is not None
    assert recipe.early_stopping.metric.split("/")[1] in recipe.monitor.sets  # watches a monitored set
    assert GPU_RECIPES[name][1] in recipe.model.path.lower()


def test_stability_recipe_uses_anchor_mode_with_warmup_on_groups():
    recipe = load_recipe(RECIPES / "llama-3.2-1b-stability.yaml")
    s = recipe.stability
    assert s.mode == "anchor" and s.warmup_steps > 0 and s.act_weight > 0 and s.conf_weight > 0
    groups = [json.loads(line) for line in Path(recipe.resolve_path(recipe.data.train)).read_text().splitlines()]
    assert groups and all(len(g["variants"]) == len(groups[0]["variants"]) >= 2 and g["reference"] for g in groups)


def test_an_sft_recipe_exists():
    assert any(load_recipe(RECIPES / name).trainer == "sft" for name in GPU_RECIPES)


def test_demo_dry_runs_as_is(tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.chdir(tmp_path)  # its outputs (runs/demo) land here, not in the repository
    code, out, err = run_cli(["run", str(DEMO), "--dry-run"], capsys)
    assert code == 0, err
    assert "dry run of 'demo' OK" in out


# ------------------------------------------------------------------ the committed sets are up to date
def build_commands() -> list[list[str]]:
    lines = [ln.strip() for ln in BUILD_SETS.read_text(encoding="utf-8").splitlines()]
    return [shlex.split(ln)[2:] for ln in lines if ln.startswith("sago-train variants ")]


def test_committed_sets_match_build_script(tmp_path, monkeypatch, capsys):
    commands = build_commands()
    assert len(commands) == 4
    monkeypatch.chdir(ROOT)  # the script runs from the repository root
    for args in commands:
        out_index = args.index("--out") + 1
        committed = ROOT / args[out_index]
        args[out_index] = str(tmp_path / committed.name)
        code, _, err = run_cli(["variants", *args], capsys)
        assert code == 0, err
        assert (tmp_path / committed.name).read_bytes() == committed.read_bytes(), (
            f"{committed} is stale: run bash recipes/data/build_sets.sh")


# ------------------------------------------------------------------ 2-step runs with tiny models
def save_tiny(arch: str, path: Path) -> Path:
    """A tiny model of ``arch`` (Qwen2Config / LlamaConfig with tiny sizes) plus a byte tokenizer with a chat
    template, saved as a model folder."""
    model = make_tiny_model(arch, layers=2, hidden=32)
    assert model.config.model_type == arch
    model.save_pretrained(path)
    make_byte_tokenizer().save_pretrained(path)
    return path


def write_alpaca_like(path: Path, n: int = 8) -> Path:
    """Records with tatsu-lab/alpaca's columns (instruction, input, output, text)."""
    pre = "Below is an instruction that describes a task. Write a response that appropriately completes the request."
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            instruction, output = f"Add {i} and {i + 1}.", str(2 * i + 1)
            text = f"{pre}\n\n### Instruction:\n{instruction}\n\n### Response:\n{output}"
            f.write(json.dumps({"instruction": instruction, "input": "", "output": output, "text": text}) + "\n")
    return path


@pytest.fixture
def one_thread():
    """Tiny models are fastest on one thread, and far slower on several when the cores are shared."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def check_run(out: Path, *, model_path: Path) -> list[dict]:
    history = [json.loads(line) for line in (out / "sago" / "history.jsonl").read_text().splitlines()]
    assert history[0]["step"] == 0, "no baseline evaluation"
    assert history[-1]["step"] == 2
    for entry in history:
        for set_name in ("paraphrase", "format", "noise"):
            axes = entry["sets"][set_name]
            assert axes and all(a["n"] == 3 for a in axes.values()), axes
    resolved = yaml.safe_load((out / "recipe.yaml").read_text())
    assert resolved["training"]["max_steps"] == 2 and resolved["training"]["bf16"] is False
    assert resolved["model"]["path"] == str(model_path)
    assert (out / "adapter_config.json").exists()  # the LoRA adapter was saved
    return history


@pytest.mark.slow
def test_qwen_sft_recipe_runs_two_steps(tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    import wandb

    # wandb caches its settings per process (WANDB_DIR may be another test's), so record the run's folder.
    run_dirs = []
    real_init = wandb.init

    def init(*a, **k):
        run = real_init(*a, **k)
        run_dirs.append(Path(run.dir).parent)
        return run

    monkeypatch.setattr(wandb, "init", init)
    model = save_tiny("qwen2", tmp_path / "tiny-qwen2")
    train = write_alpaca_like(tmp_path / "alpaca.jsonl")
    out = tmp_path / "run"
    code, _, err = run_cli([
        "run", str(RECIPES / "qwen2.5-0.5b-lora.yaml"),
        f"--model.path={model}", "--model.dtype=float32", f"--data.train={train}",
        "--training.max_steps=2", "--training.bf16=false", "--training.use_cpu=true",
        # per-key override of one monitoring set (an absolute path; relative ones are relative to the recipe)
        f"--monitor.sets.noise={RECIPES / 'data' / 'sets' / 'noise.jsonl'}",
        *FAST_MONITOR, "--output-dir", str(out),
    ], capsys)  # report_to stays [tensorboard, wandb] (W&B offline)
    assert code == 0, err
    check_run(out, model_path=model)
    assert len(run_dirs) == 1 and run_dirs[0].name.startswith("offline-run-"), run_dirs
    assert list(run_dirs[0].glob("*.wandb")), "no offline W&B run file"


@pytest.mark.slow
def test_llama_stability_recipe_runs_two_steps(tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.chdir(tmp_path)
    model = save_tiny("llama", tmp_path / "tiny-llama")
    out = tmp_path / "run"
    code, _, err = run_cli([
        "run", str(RECIPES / "llama-3.2-1b-stability.yaml"),
        f"--model.path={model}", "--model.dtype=float32", "--data.limit=8",
        "--training.max_steps", "2", "--training.bf16=false", "--training.use_cpu=true",
        "--training.logging_steps=1", "--training.report_to=[tensorboard]",  # W&B is covered by the qwen run
        *FAST_MONITOR, "--output-dir", str(out),
    ], capsys)
    assert code == 0, err
    check_run(out, model_path=model)
    # The stability terms were computed and logged (the recipe's save_steps > max_steps: saved at the end).
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    logged = [e for e in state["log_history"] if "sago_act_loss" in e]
    assert len(logged) == 2 and all("sago_conf_loss" in e and "sago_task_loss" in e for e in logged)
    # and the run's own folder keeps the whole training log (trainer.save_state(), as the HF examples do)
    final = json.loads((out / "trainer_state.json").read_text())
    assert [e["sago_task_loss"] for e in final["log_history"] if "sago_task_loss" in e] == \
        [e["sago_task_loss"] for e in logged]
    assert list((out / "runs").rglob("events.out.tfevents.*")), "no TensorBoard events"


# ------------------------------------------------------------------ --help and --version
HELP_OPTIONS = {
    "eval": ["--model", "--set", "--axes", "--layers", "--max-new-tokens", "--out"],
    "run": ["recipe", "--name", "--output-dir", "--dry-run", "--section.key", "examples:"],
    "report": ["RUN_DIR", "--out"],
    "compare": ["DIR", "--axis", "--json"],
    "variants": ["--input", "--out", "--templates", "--format", "--instructions", "--typo-rate", "--casing",
                 "--seed"],
    "study": ["--model", "--set", "--out", "--reuse"],
}


def test_help_covers_every_command():
    assert set(HELP_OPTIONS) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(HELP_OPTIONS))
def test_command_help(command, capsys):
    code, out, _ = run_cli([command, "--help"], capsys)
    assert code == 0
    assert f"usage: sago-train {command}" in out
    for option in HELP_OPTIONS[command]:
        assert option in out, f"sago-train {command} --help lacks {option}"


def test_top_level_help_lists_commands(capsys):
    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0
    for command in COMMANDS:
        assert command in out


def test_version(capsys):
    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0 and out.strip() == f"sago_train {__version__}"


def test_version_console_script():
    exe = Path(sys.executable).with_name("sago-train")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "sago_train.cli.main"]
    proc = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"sago_train {__version__}"


# ------------------------------------------------------------------ overrides
@pytest.mark.parametrize("tokens", [["--training.max_steps", "7"], ["--training.max_steps=7"]])
def test_override_both_forms(tokens):
    assert parse_overrides(tokens) == [(["training", "max_steps"], 7)]
    assert load_recipe(DEMO, tokens).training["max_steps"] == 7


def test_override_values_are_yaml():
    recipe = load_recipe(DEMO, ["--training.report_to=[tensorboard]", "--training.use_cpu", "false",
                                "--stability.act_weight=1e-3", "--monitor.sets={only: sago://demo/typo.jsonl}",
                                "--model.lora.r", "4", "--monitor.sets.extra=sago://demo/format.jsonl"])
    assert recipe.training["report_to"] == ["tensorboard"] and recipe.training["use_cpu"] is False
    assert recipe.stability.act_weight == pytest.approx(1e-3)
    assert recipe.monitor.sets == {"only": "sago://demo/typo.jsonl", "extra": "sago://demo/format.jsonl"}
    assert recipe.model.lora.r == 4


def test_every_stability_field_is_a_recipe_flag():
    """The stability section and its --stability.<field> flags come from StabilityConfig's fields, new ones too."""
    recipe = load_recipe(DEMO, ["--stability.mode=consistency", "--stability.unlabeled_task_loss=true",
                                "--stability.weight_scale", "relative"])
    assert (recipe.stability.unlabeled_task_loss, recipe.stability.weight_scale) == (True, "relative")
    with pytest.raises(SagoInputError, match="weight_scale.*Did you mean 'relative'"):
        load_recipe(DEMO, ["--stability.weight_scale=relativ"])
    with pytest.raises(SagoInputError, match="unlabeled_task_loss.*true or false"):
        load_recipe(DEMO, ["--stability.unlabeled_task_loss=maybe"])


def test_override_creates_a_missing_section():
    recipe = load_recipe(DEMO, ["--early_stopping.metric=sago/typo/activation"])
    assert recipe.early_stopping is not None and recipe.early_stopping.metric == "sago/typo/activation"
    # accuracy, a guard against forgetting, is accepted here; whether the set scores it is checked at train start
    recipe = load_recipe(DEMO, ["--early_stopping.metric=sago/typo/accuracy", "--early_stopping.reference_step=10"])
    assert recipe.early_stopping.metric == "sago/typo/accuracy" and recipe.early_stopping.reference_step == 10


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("--training.max_step=7", "Did you mean 'max_steps'"),
        ("--trainig.max_steps=7", "Did you mean 'training'"),
        ("--stability.act_wieght=1", "Did you mean 'act_weight'"),
        ("--monitor.eval_step=5", "Did you mean 'eval_steps'"),
    ],
)
def test_misspelled_override_exit_2(override, expected, capsys):
    code, _, err = run_cli(["run", str(DEMO), override, "--dry-run"], capsys)
    assert code == 2
    assert expected in err and err.startswith("sago-train run: error:") and len(err.strip().splitlines()) == 1


def test_override_of_a_non_section(capsys):
    code, _, err = run_cli(["run", str(DEMO), "--name.x", "1", "--dry-run"], capsys)
    assert code == 2
    assert "cannot set 'name.x': 'name' is not a section" in err
    with pytest.raises(SagoInputError, match="'name' is not a section"):
        load_recipe(DEMO, ["--name.x", "1"])


def test_override_without_value(capsys):
    code, _, err = run_cli(["run", str(DEMO), "--training.max_steps"], capsys)
    assert code == 2 and "has no value" in err


def test_override_before_the_recipe_says_so(capsys):
    code, _, err = run_cli(["run", "--training.max_steps", "7", str(DEMO)], capsys)
    assert code == 2
    assert "recipe not found: 7" in err and "put the recipe first" in err


def test_relative_override_paths_are_relative_to_the_current_directory(tmp_path, monkeypatch):
    from sago_train.cli.recipe import apply_overrides, load_yaml, parse_recipe

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.jsonl").write_text('{"prompt": "a", "completion": " b"}\n')
    data = apply_overrides(load_yaml(ROOT / "recipes" / "demo.yaml"),
                           parse_overrides(["--data.train=mine.jsonl", "--monitor.sets.extra=mine.jsonl"]))
    recipe = parse_recipe(data, source=str(ROOT / "recipes" / "demo.yaml"))
    assert recipe.resolve_path(recipe.data.train) == str(tmp_path / "mine.jsonl")
    assert recipe.resolve_path(recipe.monitor.sets["extra"]) == str(tmp_path / "mine.jsonl")
    # Inside the recipe, relative paths stay relative to the recipe file.
    assert recipe.resolve_path("data/x.jsonl") == str(ROOT / "recipes" / "data" / "x.jsonl")


@pytest.mark.parametrize("metric,match", [("sago/nope/activation", "not in monitor.sets"),
                                          ("sago/paraphrase/mirroring", "not computed"),
                                          # several metrics: each one is checked (issue 33)
                                          ("sago/paraphrase/activation,sago/nope/accuracy", "not in monitor.sets")])
def test_recipe_early_stopping_target_must_be_monitored(metric, match):
    from sago_train.cli.recipe import apply_overrides, load_yaml, parse_recipe

    data = apply_overrides(load_yaml(ROOT / "recipes" / "demo.yaml"),
                           parse_overrides([f"--early_stopping.metric={metric}",
                                            "--monitor.options.axes=[activation, confidence]"]))
    with pytest.raises(SagoInputError, match=match):
        parse_recipe(data, source="demo.yaml")


def test_recipe_early_stopping_over_stability_and_accuracy():
    from sago_train.cli.recipe import apply_overrides, load_yaml, parse_recipe

    data = apply_overrides(load_yaml(ROOT / "recipes" / "demo.yaml"),
                           parse_overrides(["--early_stopping.metric=sago/paraphrase/activation,sago/paraphrase/accuracy"]))
    recipe = parse_recipe(data, source="demo.yaml")
    assert recipe.early_stopping.metric == "sago/paraphrase/activation,sago/paraphrase/accuracy"


def test_same_recipe_same_seed_same_lora_initialization():
    """LoRA adapters are random at creation: the runner seeds before building the model, so two builds of one
    recipe start from the same adapter whatever the process's torch RNG state was."""
    import torch

    from sago_train.cli.runner import build_trainer

    recipe = load_recipe(ROOT / "recipes" / "demo.yaml", ["--training.report_to=[]"])
    weights = []
    for seed in (1, 2):
        torch.manual_seed(seed)  # a different RNG state each time, as in two fresh processes
        tr = build_trainer(recipe, output_dir="/tmp/unused-sago-seed-test")
        weights.append({n: p.detach().clone() for n, p in tr.model.named_parameters() if "lora" in n})
    assert weights[0] and weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][n], weights[1][n]) for n in weights[0])


STEPS_OR_SHARE = "an integer in [1, 2,147,483,647] (MAX_TRAINING_STEPS), or a share of the total steps in (0, 1)"


@pytest.mark.parametrize("key, value, expected", [
    ("training.max_steps", "0", "an integer in [1, 2,147,483,647] (MAX_TRAINING_STEPS) or -1 (num_train_epochs "
                                "decides), got 0"),
    ("training.max_steps", "3000000000", "(num_train_epochs decides), got 3000000000"),
    ("training.num_train_epochs", ".inf", "a number in [0, 2,147,483,647] (MAX_TRAINING_STEPS), got inf"),
    ("training.per_device_train_batch_size", "0", "a positive integer up to 65,536 (MAX_BATCH_SIZE), got 0"),
    ("training.per_device_eval_batch_size", "100000", "a positive integer up to 65,536 (MAX_BATCH_SIZE), got 100000"),
    ("training.gradient_accumulation_steps", "0", "a positive integer up to 65,536 (MAX_BATCH_SIZE), got 0"),
    ("training.logging_steps", "0", f"{STEPS_OR_SHARE}, got 0"),
    ("training.eval_steps", "2.5", f"{STEPS_OR_SHARE}, got 2.5"),
    ("training.save_steps", "1e12", f"{STEPS_OR_SHARE}, got 1000000000000.0"),
    ("training.warmup_steps", "-1", "an integer in [0, 2,147,483,647] (MAX_TRAINING_STEPS), or a share of the total "
                                    "steps in (0, 1), got -1"),
    ("training.learning_rate", ".nan", "a finite number >= 0, got nan"),
    ("training.learning_rate", "-1e-3", "a finite number >= 0, got -0.001"),
    ("training.seed", "-1", "an integer in [0, 4,294,967,295] (MAX_SEED), got -1"),
    ("training.data_seed", "4294967296", "an integer in [0, 4,294,967,295] (MAX_SEED), got 4294967296"),
    ("data.max_length", "0", "a positive integer up to 262,144 (MAX_VARIANT_TOKENS), got 0"),
    ("data.max_length", "100000000000000000000", "(MAX_VARIANT_TOKENS), got 100000000000000000000"),
    ("monitor.eval_steps", "3000000000", "a positive integer up to 2,147,483,647 (MAX_TRAINING_STEPS), got 3000000000"),
])
def test_recipe_numbers_out_of_range_name_key_range_and_value(key, value, expected):
    """Issue 22: gradient_accumulation_steps 0 was a ZeroDivisionError and learning_rate .nan a ValueError, both
    tracebacks after the model loaded; max_steps 0 ran one step."""
    with pytest.raises(SagoInputError) as err:
        load_recipe(DEMO, [f"--{key}={value}"])
    assert str(err.value).startswith(f"{DEMO}") and f"field '{key}': expected " in str(err.value)
    assert str(err.value).endswith(expected), str(err.value)
    if key in ("training.max_steps", "training.learning_rate", "training.logging_steps", "training.seed"):
        line = DEMO.read_text().splitlines().index(next(x for x in DEMO.read_text().splitlines()
                                                        if x.strip().startswith(key.split(".")[1] + ":"))) + 1
        assert str(err.value).startswith(f"{DEMO}:{line}: ")  # the line of the value it overrides


@pytest.mark.parametrize("override", ["--training.max_steps=-1", "--training.logging_steps=0.1",
                                      "--training.warmup_steps=0", "--training.learning_rate=0",
                                      "--data.max_length=262144", "--training.eval_steps=null"])
def test_recipe_numbers_at_the_edges_of_their_ranges_are_taken(override):
    key, _, value = override[2:].partition("=")
    section, name = key.split(".")
    recipe = load_recipe(DEMO, [override])
    got = recipe.training.get(name) if section == "training" else getattr(recipe.data, name)
    assert got == yaml.safe_load(value)


def test_the_real_model_recipe_is_the_experiments_supported_configuration():
    """recipes/smollm2-augment.yaml trains with `StabilityConfig()` (augmentation, no term: the loss experiment's
    result) and monitors a set the model knew before training beside the held-out phrasings."""
    from sago_train import StabilityConfig

    recipe = load_recipe(RECIPES / "smollm2-augment.yaml")
    assert recipe.stability == StabilityConfig()
    assert StabilityConfig().act_weight == 0 and StabilityConfig().conf_weight == 0
    assert StabilityConfig().task_loss_variants == "all"
    assert {"paraphrase", "typo", "capitals"} <= set(recipe.monitor.sets)
    assert recipe.model.path == "sago://smollm2-135m-instruct" and recipe.model.lora is not None


def test_a_training_file_may_mix_labeled_groups_and_unlabeled_prompts_in_the_consistency_mode(
        tmp_path, monkeypatch, capsys, one_thread):
    """`sago-train run` takes an unlabeled pool in the training file where the mode trains on it, and refuses it
    before the model loads (file, line, how to fix) where nothing would train on it."""
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "mixed.jsonl"
    data.write_text(json.dumps({"id": "a", "variants": ["The opposite of hot is", "The antonym of hot is"],
                                "target": " cold."}) + "\n" +
                    json.dumps({"id": "b", "variants": ["The opposite of up is", "The antonym of up is"]}) + "\n")
    common = ["run", str(DEMO), f"--data.train={data}", "--data.eval=null", "--training.per_device_train_batch_size=2",
              "--dry-run"]
    code, out, err = run_cli([*common, "--stability.mode=consistency", "--stability.conf_weight=1.0",
                              "--stability.unlabeled_max_new_tokens=4"], capsys)
    assert code == 0, err
    assert "dry run of 'demo' OK" in out
    code, _, err = run_cli([*common, "--stability.mode=anchor"], capsys)
    assert code != 0 and "mixed.jsonl:2" in err and "missing field 'target'" in err and "consistency" in err
