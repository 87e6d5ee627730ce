"""``sago-train run``: a whole monitored fine-tune from a recipe."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import torch

from ..errors import SagoInputError
from ..formatting import printable
from ..io import acquire_run_lock, check_output_path, release_run_lock
from ..results.layout import RESOLVED_RECIPE, SAGO_DIR, history_path
from ..results.store import check_run_dir, claim_history


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "run",
        help="run a recipe (monitored fine-tune, optional stability loss)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a YAML recipe: model (+LoRA), training data, monitoring sets, early stopping, stability\n"
        "loss and TrainingArguments (recipes/demo.yaml runs on a CPU; recipes/*.yaml has GPU recipes).\n\n"
        "Override any key after the recipe with --section.key VALUE or --section.key=VALUE (e.g.\n"
        "--training.max_steps 50, --stability.act_weight=0.5, --monitor.sets.extra=/abs/extra.jsonl); values\n"
        "are read as YAML (numbers, true/false, null, [lists], {mappings}). Relative paths in the recipe are\n"
        "relative to the recipe file; in overrides, an existing relative path is relative to the current\n"
        "directory; sago://... names files shipped with the package.",
        epilog="examples:\n"
        "  sago-train run recipes/demo.yaml --dry-run            # build everything, one batch, no training\n"
        "  sago-train run recipes/demo.yaml --name with-loss --stability.act_weight 1.0 --stability.conf_weight=0.5\n"
        "  sago-train run recipes/qwen2.5-0.5b-lora.yaml --training.max_steps=200 --output-dir runs/qwen-200\n"
        "  sago-train run recipes/llama-3.2-1b-stability.yaml --model.path=Qwen/Qwen2.5-1.5B-Instruct\n"
        "then: sago-train report runs/<name>",
    )
    p.add_argument("recipe", help="the recipe YAML file")
    p.add_argument("--name", help="run name (default: the recipe's); outputs go to runs/<name> unless "
                                  "training.output_dir is set")
    p.add_argument("--output-dir", help="where the run writes (overrides training.output_dir)")
    p.add_argument("--dry-run", action="store_true", help="build everything and compute one batch's loss, no training")
    p.add_argument("--resume", action="store_true",
                   help="resume from the last checkpoint-* in the output directory (its SAGO history is kept)")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh in an output directory that holds another run's SAGO history (the old "
                        "history.jsonl is kept beside it as history.jsonl.<time>.old)")
    p.add_argument("--new-baseline", action="store_true",
                   help="with --resume: when a monitored set (or a setting that changes its numbers) differs from "
                        "what the run's SAGO history measured, set that history aside (history.jsonl.<time>.old) and "
                        "measure a new baseline at the resumed step (without it such a resume is refused)")
    p.add_argument("--allow-recipe-change", action="store_true",
                   help="with --resume: go on although the model, LoRA shape, data files or training numbers that "
                        "change results differ from what the run recorded (recipe.provenance.json); the recorded "
                        "recipe.yaml and provenance are kept as .<time>.old (without it such a resume is refused)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace, overrides: list[str] | None = None) -> int:
    from .console import make_console, user_text
    from .recipe_sections import validate_run_name
    from .recipe_yaml import apply_overrides, load_yaml, parse_overrides

    overrides = list(overrides or getattr(args, "overrides", []) or [])
    from ..distributed import launch_env

    launch_env()  # a WORLD_SIZE that is not a count, or one left from another launch: one line now
    if not Path(args.recipe).is_file():
        # `sago-train run --training.max_steps 7 recipe.yaml` makes "7" the recipe: say what to do instead.
        misplaced = next((t for t in overrides if t.endswith((".yaml", ".yml")) and Path(t).is_file()), None)
        if misplaced is not None:
            raise SagoInputError(f"recipe not found: {args.recipe}",
                                 hint=f"put the recipe first: sago-train run {misplaced} --section.key VALUE ...")
    if args.resume and args.overwrite:
        raise SagoInputError("--resume and --overwrite contradict each other", hint="resume keeps the history")
    if getattr(args, "allow_recipe_change", False) and not args.resume:
        raise SagoInputError("--allow-recipe-change goes with --resume", hint="a fresh run records its own recipe")
    if args.new_baseline and not args.resume:
        raise SagoInputError("--new-baseline goes with --resume", hint="a fresh run measures its own baseline")
    if args.name is not None:
        validate_run_name(args.name, key="--name")
    data = apply_overrides(load_yaml(args.recipe), parse_overrides(overrides))
    if args.name:
        data["name"] = args.name
    if args.output_dir:  # known already: checked before the recipe's parser imports transformers and peft
        check_run_outputs(args.output_dir, args.recipe)
    from .provenance import check_resume_recipe, recipe_provenance, save_resolved
    from .recipe import parse_recipe
    from .runner import build_trainer, dry_run

    recipe = parse_recipe(data, source=args.recipe)
    console = make_console()
    output_dir = str(args.output_dir or recipe.training.get("output_dir") or Path("runs") / recipe.name)
    check_run_outputs(output_dir, args.recipe)
    sago_dir = Path(output_dir) / SAGO_DIR
    resume = _resume_checkpoint(output_dir) if args.resume else recipe.training.get("resume_from_checkpoint")
    if not args.dry_run:
        acquire_run_lock(sago_dir)
    try:
        if args.resume:  # another model, LoRA shape, data or learning rate: refused before the model loads
            changed = check_resume_recipe(output_dir, recipe_provenance(recipe), allowed=bool(
                getattr(args, "allow_recipe_change", False) or args.new_baseline))
            if changed:
                console.print(f"resuming with a changed recipe ({len(changed)} change(s)): "
                              + user_text("; ".join(changed)))
        if not (resume or args.overwrite):  # refused here, before the model loads; the callback moves it aside
            claim_history(sago_dir, resuming=False, overwrite=False)
        trainer = build_trainer(recipe, output_dir=output_dir, overwrite=args.overwrite,
                                new_baseline=args.new_baseline, resume_step=_checkpoint_step(resume))
        if args.dry_run:
            loss = dry_run(trainer)
            console.print(f"dry run of '{user_text(recipe.name)}' OK: {type(trainer).__name__}, one batch loss "
                          f"{loss:.4f}")
            return 0
        for kept in save_resolved(recipe, data, output_dir):
            console.print(f"the run's earlier recipe is kept as {user_text(kept)}")
        console.print(f"[bold]sago-train run[/bold] '{user_text(recipe.name)}' -> {user_text(output_dir)}"
                      + (f" (resuming from {user_text(resume)})" if resume else ""))
        try:
            trainer.train(resume_from_checkpoint=resume)
            trainer.save_model(output_dir)
            trainer.save_state()  # trainer_state.json: the training log (task and term losses per logging step)
        finally:
            _finish_wandb(trainer)
    finally:
        if not args.dry_run:
            release_run_lock(sago_dir)
    from ..integrations.callback import SAGOCallback

    cb = next((c for c in trainer.callback_handler.callbacks if isinstance(c, SAGOCallback)), None)
    if cb is not None and cb.last_result is not None and trainer.is_world_process_zero():
        from ..analysis.display import print_result

        console.print(f"last SAGO evaluation (step {trainer.state.global_step}):")
        print_result(cb.last_result, console)
        console.print(f"history: {user_text(history_path(Path(output_dir) / SAGO_DIR))}; report: sago-train report "
                      f"{user_text(output_dir)}")
    if cb is not None and cb.failures and trainer.is_world_process_zero():
        console.print(f"[yellow]{len(cb.failures)} SAGO evaluation(s) failed and were skipped:[/yellow] "
                      + user_text("; ".join(f"step {f['step']}: {f['error'][:300]}" for f in cb.failures)))

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


def check_run_outputs(output_dir: str, recipe_path: str) -> None:
    """Outputs are checked before the model loads: an unwritable or occupied directory fails in a second, and so
    does a link that a write would follow out of it (``sago/``, its history, lock or step folders) or a
    ``recipe.yaml`` there that is the recipe being run (it would be replaced by the resolved recipe)."""
    check_output_path(output_dir, what="output directory", directory=True)
    check_run_dir(Path(output_dir) / SAGO_DIR)
    from .provenance import PROVENANCE

    for name in (RESOLVED_RECIPE, PROVENANCE):
        check_output_path(Path(output_dir) / name, what="output directory", root=output_dir,
                          inputs={"the recipe being run": recipe_path})


def _resume_checkpoint(output_dir: str) -> str:
    """The last ``checkpoint-*`` folder of the output directory, for ``--resume``."""
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
    if last is None:
        raise SagoInputError(f"--resume: no checkpoint-* folder in {output_dir}",
                             hint="a run saves checkpoints with training.save_strategy: steps")
    return last


def _checkpoint_step(checkpoint: Any) -> int | None:
    """The step a Trainer checkpoint folder holds (``checkpoint-<step>``), else None."""
    match = re.fullmatch(r"checkpoint-(\d+)", Path(checkpoint).name) if isinstance(checkpoint, str) else None
    return int(match.group(1)) if match else None


def _finish_wandb(trainer: Any) -> None:
    """Close the W&B run the Trainer opened: the Trainer leaves it open, and a second run in the same process
    (the demo runs two) would otherwise log into the first one."""
    if "wandb" not in (trainer.args.report_to or []):
        return
    try:
        import wandb

        if wandb.run is not None:
            wandb.finish()
        # W&B reads WANDB_DIR once per process setup: tear it down so that the next run in this process (the
        # demo's next arm) writes its files under its own output directory.
        wandb.teardown()
    except Exception as err:  # noqa: BLE001 - closing a reporter must not fail a finished run
        print(f"sago-train run: W&B could not be closed cleanly ({type(err).__name__}: {printable(err)})",
              file=sys.stderr)
