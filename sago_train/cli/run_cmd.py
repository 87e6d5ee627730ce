"""``sago-train run``: a whole monitored fine-tune from a recipe."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "run",
        help="run a recipe (monitored fine-tune, optional stability loss)",
        description="Run a YAML recipe: model (+LoRA), training data, monitoring sets, early stopping, stability "
        "loss and TrainingArguments. Override any key with --section.key VALUE (e.g. --training.max_steps 50 "
        "--stability.act_weight 0.5).",
        epilog="Example: sago-train run recipes/demo.yaml --name with-loss --stability.act_weight 1.0",
    )
    p.add_argument("recipe", help="the recipe YAML file")
    p.add_argument("--name", help="run name (default: the recipe's); outputs go to runs/<name> unless "
                                  "training.output_dir is set")
    p.add_argument("--output-dir", help="where the run writes (overrides training.output_dir)")
    p.add_argument("--dry-run", action="store_true", help="build everything and compute one batch's loss, no training")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace, overrides: list[str] | None = None) -> int:
    from rich.console import Console

    from ..recipe import apply_overrides, load_yaml, parse_overrides, parse_recipe
    from ..runner import build_trainer, dry_run, save_resolved

    overrides = list(overrides or getattr(args, "overrides", []) or [])
    data = apply_overrides(load_yaml(args.recipe), parse_overrides(overrides))
    if args.name:
        data["name"] = args.name
    recipe = parse_recipe(data, source=args.recipe)
    console = Console(width=None if sys.stdout.isatty() else 110)
    output_dir = args.output_dir or recipe.training.get("output_dir") or f"runs/{recipe.name}"
    trainer = build_trainer(recipe, output_dir=output_dir)
    if args.dry_run:
        loss = dry_run(trainer)
        console.print(f"dry run of '{recipe.name}' OK: {type(trainer).__name__}, one batch loss {loss:.4f}")
        return 0
    save_resolved(recipe, data, output_dir)
    console.print(f"[bold]sago-train run[/bold] '{recipe.name}' -> {output_dir}")
    trainer.train()
    trainer.save_model(output_dir)
    from ..callback import SAGOCallback

    cb = next((c for c in trainer.callback_handler.callbacks if isinstance(c, SAGOCallback)), None)
    if cb is not None and cb.last_result is not None and trainer.is_world_process_zero():
        from ..display import print_result

        console.print(f"last SAGO evaluation (step {trainer.state.global_step}):")
        print_result(cb.last_result, console)
        console.print(f"history: {output_dir}/sago/history.jsonl; report: sago-train report {output_dir}")
    return 0
