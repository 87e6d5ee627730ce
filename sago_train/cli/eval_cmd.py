"""``sago-train eval``: SAGO evaluation of a model on variant sets."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..config import CHAT_TEMPLATE_MODES, SAGOConfig, parse_int_list
from ..errors import SagoInputError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "eval",
        help="measure SAGO of a model on variant sets",
        description="Measure SAGO (per-group instability across variants) of a model on variant sets. With no "
        "--model the shipped tiny model is used; with no --set the bundled sets for that model (the 'real' "
        "collection for sago://smollm2-135m-instruct, else the 'tiny' one).",
    )
    p.add_argument("--model", help="model folder (full model or PEFT adapter), sago://tiny-llama or "
                   "sago://smollm2-135m-instruct (a real instruct model, converted once on first use); "
                   "default: the shipped tiny model")
    p.add_argument("--set", dest="sets", action="append", metavar="NAME=FILE",
                   help="a variant set (JSONL), or 'tiny' / 'real' for a bundled collection; repeat for several; "
                   "default: the bundled sets for the model")
    p.add_argument("--axes", default=None, help="comma-separated axes (default: all five)")
    p.add_argument("--layers", default=None, help="comma-separated decoder blocks, e.g. 0,-1")
    p.add_argument("--pooling", choices=None, default=None, help="last|mean (default last)")
    p.add_argument("--similarity", default=None, help="exact|token_f1|embedding (default token_f1)")
    p.add_argument("--embedding-model", default=None, help="sentence-transformers model for --similarity embedding")
    p.add_argument("--max-new-tokens", type=int, default=None, help="greedy generation length (default 32)")
    p.add_argument("--stop", action="append", default=None, metavar="STRING",
                   help="stop string that ends a generation, cut from the output (repeatable; backslash escapes "
                   "such as '\\n' are read)")
    p.add_argument("--chat-template", default=None, choices=CHAT_TEMPLATE_MODES,
                   help="feed string variants through the tokenizer's chat template: always|never|auto (default "
                   "auto: when the template marks turns with special tokens, as instruct models' do)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per batch (default 32)")
    p.add_argument("--max-groups", type=int, default=None, help="evaluate at most N groups per set (seeded)")
    p.add_argument("--seed", type=int, default=None, help="seed for subsets and the bootstrap (default 0)")
    p.add_argument("--correctness", default=None,
                   help="auto|prefix|contains|exact (default auto: contains for chat-rendered prompts, else prefix)")
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
                 "correctness", "chat_template"):
        value = getattr(args, name)
        if value is not None:
            options[name] = value
    if args.stop:
        options["stop_strings"] = [_unescape(s) for s in args.stop]
    options["strict"] = bool(args.strict)
    return SAGOConfig(**options)


def _unescape(text: str) -> str:
    """``\\n`` typed on a shell means a newline."""
    try:
        return text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError as err:
        raise SagoInputError(f"cannot read the escapes in {text!r}: {err}", key="stop") from None


def _sets_for(values: list[str] | None, model: str | None) -> Any:
    """``--set`` values (files, NAME=FILE, or a bundled collection name), or the default for the model."""
    from ..data.groups import BUNDLED_COLLECTIONS, bundled_sets, resolve_sets
    from ..real_model import real_model_for

    if not values:
        return bundled_sets("real" if model and real_model_for(model) else "tiny")
    out: dict[str, Any] = {}
    for value in values:
        part = bundled_sets(value) if value in BUNDLED_COLLECTIONS and not os.path.exists(value) else resolve_sets(value)
        for name, vs in part.items():
            if name in out:
                raise SagoInputError(f"two variant sets are named '{name}'", key="set",
                                     hint="give each set a unique name with NAME=FILE")
            out[name] = vs
    return out


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
    if args.out:  # an existing file or an unwritable folder fails now, not after the whole evaluation
        from ..io import check_output_dir

        check_output_dir(args.out, what="--out")
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .. import distributed
    from ..display import print_result
    from ..evaluator import SAGOEvaluator

    sets = _sets_for(args.sets, args.model)
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
        console.print(f"prompts: chat template {result.config['resolved']['chat_template']}; correctness "
                      f"{', '.join(f'{k}: {v}' for k, v in result.config['resolved']['correctness'].items()) or '-'}")
        for note in result.warnings:
            console.print(f"[bold yellow]warning[/bold yellow]: {note}")
        if args.out:
            out = result.write(args.out)
            console.print(f"wrote {out / 'summary.json'} and one JSONL of group records per set")
    if distributed.world_size() > 1:
        import torch

        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0
