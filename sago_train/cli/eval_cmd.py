"""``sago-train eval``: SAGO evaluation of a model on variant sets."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch

from ..eval.config import SAGOConfig
from ..io import acquire_run_lock, check_output_path, read_escapes, release_run_lock
from ..model.tiny import tiny_model_path
from ..results.layout import SUMMARY
from .dataclass_args import add_dataclass_arguments, dataclass_options


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "eval",
        help="measure SAGO of a model on variant sets",
        description="Measure SAGO (per-group instability across variants) of a model on variant sets. With no "
        "--model the shipped tiny model is used; with no --set the bundled sets for that model (the 'real' "
        "collection for the real models sago://smollm2-135m-instruct and sago://gemma-3-270m, else the 'tiny' one).",
    )
    p.add_argument("--model", help="model folder (full model or PEFT adapter), sago://tiny-llama, "
                   "sago://smollm2-135m-instruct (a real instruct model) or sago://gemma-3-270m (a real base model; "
                   "both converted once on first use); default: the shipped tiny model")
    p.add_argument("--set", dest="sets", action="append", metavar="NAME=FILE",
                   help="a variant set (JSONL), 'tiny' / 'real' for a bundled collection, or one of its sets "
                   "('real/capitals'); repeat for several; default: the bundled sets for the model")
    # Every evaluation option, its help and its default come from SAGOConfig's fields (declared once there).
    add_dataclass_arguments(p, SAGOConfig, flags={"stop_strings": "--stop"})
    p.add_argument("--dtype", default=None, help="float32|bfloat16|float16 (default: the model's)")
    p.add_argument("--device", default=None, help="cpu|cuda|cuda:N (default: cuda if available)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom model code (off by default)")
    p.add_argument("--out", default=None, metavar="DIR", help="write summary.json and NAME.jsonl here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def stops_text(stops: list[str]) -> str:
    """Stops as typed on a command line ("\\n\\n", "\\nQuestion:"), or "EOS only"."""
    return " ".join(repr(s)[1:-1] for s in stops) or "EOS only"


def config_from_args(args: argparse.Namespace) -> SAGOConfig:
    return SAGOConfig(**dataclass_options(args, SAGOConfig, convert={
        "axes": ",".join,  # --axes a,b and --axes a --axes b
        "stop_strings": lambda values: [read_escapes(v, key="stop") for v in values],
    }))


def _sets_for(values: list[str] | None, model: str | None, config: SAGOConfig | None = None) -> Any:
    """``--set`` values (files, NAME=FILE, or a bundled collection name), or the default for the model; with
    ``--max-groups`` only the groups evaluated are parsed."""
    from ..data.sources import bundled_sets, sets_from_specs
    from ..model.real import real_model_for

    if not values:
        return bundled_sets("real" if model and real_model_for(model) else "tiny")
    config = config or SAGOConfig()
    return sets_from_specs(values, key="set", max_groups=config.max_groups, seed=config.seed)


def _init_distributed() -> None:
    """Join the process group when launched by torchrun/accelerate (WORLD_SIZE > 1)."""
    from ..distributed import launch_env

    world, _, local_rank = launch_env()
    if world <= 1 or torch.distributed.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group(backend)


def check_outputs(out: str | Path, sets: dict[str, Any], *, root: str | Path | None = None) -> None:
    """``--out`` and every file the evaluation will write in it, checked before the model loads: a file where a
    directory goes (or the reverse), an unwritable place, a link, or a file that is one of the input sets (``--out``
    holding ``s.jsonl`` would replace the set with group records) fail now, not after the evaluation. ``root``:
    the directory the user chose, when ``out`` is inside it (``sago-train study``: OUT/NAME; a link there is
    refused too)."""
    from ..results.evaluation import Evaluation

    check_output_path(out, what="--out", directory=True, root=root)
    inputs = {f"the set '{name}' (--set)": vs.source for name, vs in sets.items() if vs.source}
    for path in Evaluation.output_files(out, list(sets)):
        check_output_path(path, what="--out", inputs=inputs, root=root if root is not None else out)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)  # validate options before loading anything heavy
    from ..distributed import launch_env

    _, rank, _ = launch_env()  # WORLD_SIZE=abc, or a stale WORLD_SIZE=2: one line now, not a traceback or a wait
    if args.out:  # an existing file or an unwritable folder fails now, before the sets are even read
        check_output_path(args.out, what="--out", directory=True)
    sets = _sets_for(args.sets, args.model, config)
    if args.out:
        check_outputs(args.out, sets)
    locked = bool(args.out) and rank == 0  # one process per output directory, as a run's (only rank 0 writes)
    if locked:
        acquire_run_lock(args.out)
    try:
        return _evaluate(args, config, sets)
    finally:
        if locked:
            release_run_lock(args.out)


def _evaluate(args: argparse.Namespace, config: SAGOConfig, sets: Any) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .. import distributed
    from ..analysis.display import print_result
    from ..eval.evaluator import SAGOEvaluator
    from ..integrations.measure import SetProgress, stderr_is_terminal
    from .console import make_console, user_text

    _init_distributed()
    device = args.device
    if device is None and distributed.world_size() > 1:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if torch.cuda.is_available() else "cpu"
    if args.model:
        model_path = args.model
    else:
        model_path = tiny_model_path()
    evaluator = SAGOEvaluator.from_pretrained(
        model_path, dtype=args.dtype, device=device, trust_remote_code=args.trust_remote_code, config=config
    )
    evaluator.remedy_style = "cli"  # warnings name flags
    main = distributed.is_main_process()
    console = make_console()
    if args.quiet or not main:
        result = evaluator.evaluate(sets)
    elif not stderr_is_terminal():  # a log file: the bar would draw nothing, so one line per set instead
        from ..data.sources import resolve_sets

        counts = {name: evaluator.count_sequences({name: vs}) for name, vs in resolve_sets(sets).items()}
        result = evaluator.evaluate(sets, progress=SetProgress(counts, lambda line: print(line, file=sys.stderr),
                                                               label="sago eval"))
    else:
        with Progress(
            TextColumn("SAGO eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=Console(stderr=True), transient=True,
        ) as bar:
            task = bar.add_task("eval", total=evaluator.count_sequences(sets))
            result = evaluator.evaluate(sets, progress=lambda n: bar.advance(task, n))
    if main:
        result.model = str(model_path) if args.model else "sago_train tiny model (shipped)"
        from ..data.sources import resolve_sets
        from ..integrations.fingerprint import FINGERPRINT_KEY, set_fingerprints

        result.config[FINGERPRINT_KEY] = set_fingerprints(resolve_sets(sets), config)  # what the numbers measured
        print_result(result, console)
        resolved = result.config["resolved"]
        console.print(user_text(
            f"prompts: chat template {resolved['chat_template']}; correctness "
            f"{', '.join(f'{k}: {v}' for k, v in resolved['correctness'].items()) or '-'}; answer stops "
            f"{', '.join(f'{k}: {stops_text(v)}' for k, v in resolved['answer_stops'].items()) or '-'}"))
        for note in result.warnings:
            console.print(f"[bold yellow]warning[/bold yellow]: {user_text(note)}")
        if args.out:
            out = result.write(args.out)
            console.print(f"wrote {user_text(out / SUMMARY)} and one JSONL of group records per set")
            if result.kept_previous:
                folder, n = result.kept_previous
                console.print(f"kept the evaluation that was in {user_text(out)}: its {n} files moved to "
                              f"{user_text(folder)}")
    if distributed.world_size() > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0
