"""``sago-train eval``: SAGO evaluation of a model on variant sets."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..config import SAGOConfig, parse_int_list


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "eval",
        help="measure SAGO of a model on variant sets",
        description="Measure SAGO (per-group instability across variants) of a model on variant sets. With no "
        "--model the shipped tiny model is used; with no --set the bundled example sets.",
    )
    p.add_argument("--model", help="model folder (full model or PEFT adapter); default: the shipped tiny model")
    p.add_argument("--set", dest="sets", action="append", metavar="NAME=FILE",
                   help="a variant set (JSONL); repeat for several; default: the bundled example sets")
    p.add_argument("--axes", default=None, help="comma-separated axes (default: all five)")
    p.add_argument("--layers", default=None, help="comma-separated decoder blocks, e.g. 0,-1")
    p.add_argument("--pooling", choices=None, default=None, help="last|mean (default last)")
    p.add_argument("--similarity", default=None, help="exact|token_f1|embedding (default token_f1)")
    p.add_argument("--embedding-model", default=None, help="sentence-transformers model for --similarity embedding")
    p.add_argument("--max-new-tokens", type=int, default=None, help="greedy generation length (default 32)")
    p.add_argument("--stop", action="append", default=None, metavar="STRING", help="extra stop string (repeatable)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per batch (default 32)")
    p.add_argument("--max-groups", type=int, default=None, help="evaluate at most N groups per set (seeded)")
    p.add_argument("--seed", type=int, default=None, help="seed for subsets and the bootstrap (default 0)")
    p.add_argument("--correctness", default=None, help="prefix|exact|contains (default prefix)")
    p.add_argument("--strict", action="store_true", help="error on prompts longer than the context instead of skipping")
    p.add_argument("--dtype", default=None, help="float32|bfloat16|float16 (default: the model's)")
    p.add_argument("--device", default=None, help="cpu|cuda|cuda:N (default: cuda if available)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom model code (off by default)")
    p.add_argument("--out", default=None, metavar="DIR", help="write summary.json and NAME.jsonl here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def config_from_args(args: argparse.Namespace) -> SAGOConfig:
    options: dict[str, Any] = {}
    if args.axes is not None:
        options["axes"] = args.axes
    if args.layers is not None:
        options["layers"] = parse_int_list(args.layers, "layers")
    for name in ("pooling", "similarity", "embedding_model", "max_new_tokens", "batch_size", "max_groups", "seed",
                 "correctness"):
        value = getattr(args, name)
        if value is not None:
            options[name] = value
    if args.stop:
        options["stop_strings"] = list(args.stop)
    options["strict"] = bool(args.strict)
    return SAGOConfig(**options)


def _init_distributed() -> None:
    """Join the process group when launched by torchrun/accelerate (WORLD_SIZE > 1)."""
    import torch

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or torch.distributed.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.distributed.init_process_group(backend)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)  # validate options before loading anything heavy
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .. import distributed
    from ..data.groups import bundled_sets, resolve_sets
    from ..display import print_result
    from ..evaluator import SAGOEvaluator

    sets = resolve_sets(args.sets) if args.sets else bundled_sets()
    _init_distributed()
    device = args.device
    if device is None and distributed.world_size() > 1:
        import torch

        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if torch.cuda.is_available() else "cpu"
    if args.model:
        model_path = args.model
    else:
        from ..tiny_model import tiny_model_path

        model_path = tiny_model_path()
    evaluator = SAGOEvaluator.from_pretrained(
        model_path, dtype=args.dtype, device=device, trust_remote_code=args.trust_remote_code, config=config
    )
    main = distributed.is_main_process()
    # Tables are wide; outside a terminal (logs, CI) rich would wrap them at 80 columns.
    console = Console(stderr=False, width=None if sys.stdout.isatty() else 110)
    if args.quiet or not main:
        result = evaluator.evaluate(sets)
    else:
        with Progress(
            TextColumn("SAGO eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=Console(stderr=True), transient=True,
        ) as bar:
            task = bar.add_task("eval", total=evaluator.count_sequences(sets))
            result = evaluator.evaluate(sets, progress=lambda n: bar.advance(task, n))
    if main:
        result.model = str(model_path) if args.model else "sago_train tiny model (shipped)"
        print_result(result, console)
        if args.out:
            out = result.write(args.out)
            console.print(f"wrote {out / 'summary.json'} and one JSONL of group records per set")
    if distributed.world_size() > 1:
        import torch

        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0
