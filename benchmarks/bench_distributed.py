"""What one SAGO evaluation adds under parameter sharding: the collectives it runs on each rank, counted by
kind with their bytes, against the cost model of docs/distributed.md ("The cost at scale").

Launch it the way training is launched (the shipped tiny model, the bundled sets):

    accelerate launch --config_file recipes/accelerate/fsdp.yaml --num_processes 2 benchmarks/bench_distributed.py
    python benchmarks/bench_distributed.py            # one process: the same evaluation, no collective

Under FSDP each forward all-gathers every sharded unit's parameters (FSDP2 ``fully_shard`` reshards after
the forward), so an evaluation's all-gathers are its forwards times the units, and its all-gathered bytes its
forwards times the parameter bytes; :func:`predicted` writes that down from the evaluation's shape. On a
CPU-only machine accelerate does not shard by itself (see tests/distributed/cpu_fsdp.py); this script lets it.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: The torch.distributed calls an evaluation can make (FSDP2 gathers with all_gather_single).
COLLECTIVES = ("all_gather_single", "all_gather_into_tensor", "_all_gather_base", "all_gather", "all_gather_object",
               "all_reduce", "broadcast", "broadcast_object_list", "reduce_scatter_single", "reduce_scatter_tensor",
               "barrier")


def _nbytes(name: str, args: tuple, kwargs: dict) -> int:
    if name == "all_gather_object":  # (output list, object): this rank's pickled share
        return len(pickle.dumps(args[1] if len(args) > 1 else kwargs.get("obj")))
    tensors = [a for a in args if isinstance(a, torch.Tensor)] + [v for v in kwargs.values()
                                                                  if isinstance(v, torch.Tensor)]
    return tensors[0].numel() * tensors[0].element_size() if tensors else 0


@contextmanager
def count_collectives() -> Iterator[dict[str, Counter]]:
    """Count the torch.distributed collectives called inside the block: ``{"calls": Counter, "bytes": Counter}``
    by function name (bytes: the first tensor argument, i.e. the output buffer of a gather; for an object gather,
    this rank's pickled object). Nested calls (an
    object gather made of tensor gathers) are counted once, at the outermost call."""
    import torch.distributed as dist

    seen: dict[str, Counter] = {"calls": Counter(), "bytes": Counter()}
    depth = [0]
    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def wrap(name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if depth[0] == 0:
                seen["calls"][name] += 1
                seen["bytes"][name] += _nbytes(name, args, kwargs)
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
        return counted

    for name, fn in originals.items():
        setattr(dist, name, wrap(name, fn))
    try:
        yield seen
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


@contextmanager
def count_forwards(model: torch.nn.Module) -> Iterator[list[int]]:
    """Count the model's top-level forwards inside the block (a ``generate`` step is one forward)."""
    n = [0]
    handle = model.register_forward_pre_hook(lambda *_: n.__setitem__(0, n[0] + 1))
    try:
        yield n
    finally:
        handle.remove()


def fsdp_units(model: torch.nn.Module) -> dict[str, int]:
    """The FSDP2 units of ``model``: those resharded after each forward (all-gathered again at the next one:
    decoder blocks, the embedding) and those kept gathered once they are (accelerate keeps the final norm and the
    LM head), with the full size of their parameters. Zero everywhere for a model not sharded by ``fully_shard``."""
    import torch.distributed.fsdp as fsdp

    out = {"resharded": 0, "resharded_bytes": 0, "kept": 0, "kept_bytes": 0}
    kind = getattr(fsdp, "FSDPModule", None)
    units = {}
    for name, module in model.named_modules() if kind is not None else ():
        group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, kind) else None
        if group is not None:
            units[name] = "resharded" if group.post_forward_mesh_info is not None else "kept"
            out[units[name]] += 1
    world = torch.distributed.get_world_size() if units else 1
    for pname, p in model.named_parameters():
        # A parameter belongs to the innermost unit whose name prefixes its own. Its gathered size is its full
        # size (a DTensor's shape is the full one) with dim 0 padded to a multiple of the ranks, as sharded.
        owner = max((u for u in units if not u or pname.startswith(u + ".")), key=len, default=None)
        if owner is not None and p.dim():
            rows = -(-p.shape[0] // world) * world
            out[f"{units[owner]}_bytes"] += rows * (p.numel() // p.shape[0]) * p.element_size()
    return out


def predicted(*, forwards: int, decode_forwards: int, generate_calls: int, batches: int, sets: int,
              units: dict[str, int], passes: int = 2) -> dict[str, tuple[int, int]]:
    """The collectives of one evaluation on each rank, as ``(at least, at most)``, from its shape
    (docs/distributed.md, "The cost at scale"):

    - all-gathers: every forward gathers each resharded unit; a kept unit is gathered at most once;
    - bytes all-gathered (the gathered buffers; a rank receives ``(W-1)/W`` of them): likewise;
    - all-reduces: with ``synced_gpus`` one per decoding step and one more per ``generate`` call (has every rank
      finished?), one per batch (the ranks agree on a prefix pass and the continuation width), and per set one
      for the number of batches of each extraction pass (``passes``: the prompts, the continuations scored after
      generation, and with ``confidence`` the reference after the model's lead-in; ``batches`` counts every
      pass's batches);
    - object gathers: 3 per set (group records, skip counts, set-level statistics).
    """
    gathers = forwards * units["resharded"]
    gathered = forwards * units["resharded_bytes"]
    reduces = decode_forwards + generate_calls + batches + passes * sets
    return {"all_gather_single": (gathers, gathers + units["kept"]),
            "all_gather_bytes": (gathered, gathered + units["kept_bytes"]),
            "all_reduce": (reduces, reduces),
            "all_gather_object": (3 * sets, 3 * sets)}


def measure(model: torch.nn.Module, evaluate: Any) -> dict[str, Any]:
    """Run ``evaluate()`` and return what :func:`predicted` needs and what it predicts, as measured on this rank:
    forwards, the forwards inside ``generate`` and its calls, collectives (calls and bytes by name)."""
    from sago_train.eval.extraction import Extractor

    decoding = {"calls": 0, "forwards": 0}
    original = Extractor._generate

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = forwards[0]
        out = original(self, *args, **kwargs)
        decoding["calls"] += 1
        decoding["forwards"] += forwards[0] - before
        return out

    with count_collectives() as seen, count_forwards(model) as forwards:
        Extractor._generate = counted
        try:
            evaluate()
        finally:
            Extractor._generate = original
    return {"forwards": forwards[0], "decode_forwards": decoding["forwards"], "generate_calls": decoding["calls"],
            "calls": dict(seen["calls"]), "bytes": dict(seen["bytes"])}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", default="1,5,9", help="max_groups per set, comma-separated (one evaluation each)")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--sets", default="paraphrase", help="bundled sets, comma-separated")
    args = ap.parse_args(argv)
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sago_train import SAGOEvaluator, bundled_sets, distributed, tiny_model_path
    from tests.distributed.cpu_fsdp import allow_fsdp_on_cpu

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    allow_fsdp_on_cpu()
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tiny_model_path(), local_files_only=True)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # FSDP2 through accelerate prepares both together
    model, _ = accelerator.prepare(model, optimizer)
    model.eval()
    world, units = distributed.world_size(), fsdp_units(model)
    wanted = set(args.sets.split(","))
    sets = {n: s for n, s in bundled_sets().items() if n in wanted}
    rows = []
    for groups in [int(g) for g in args.groups.split(",")]:
        ev = SAGOEvaluator(model, tok, max_groups=groups, max_new_tokens=args.max_new_tokens,
                           batch_size=args.batch_size, n_bootstrap=100)
        row = measure(model, lambda ev=ev: ev.evaluate(sets))
        # Every bundled group has a reference: one batch of the prompt pass per generate call.
        row["predicted"] = predicted(forwards=row["forwards"], decode_forwards=row["decode_forwards"],
                                     generate_calls=row["generate_calls"], batches=row["generate_calls"],
                                     sets=len(sets), units=units, passes=3)  # the default axes score confidence
        rows.append({"groups": groups, **row})
    every = distributed.gather_objects([rows])
    if not distributed.is_main_process():
        return
    print(f"world size {world}, parameters {param_bytes / 2**20:.2f} MiB, FSDP units resharded after each forward "
          f"{units['resharded']} ({units['resharded_bytes'] / 2**20:.2f} MiB), kept {units['kept']} "
          f"({units['kept_bytes'] / 2**20:.2f} MiB); sets {sorted(sets)}, batch size {args.batch_size}, "
          f"max_new_tokens {args.max_new_tokens}")
    for rank, rank_rows in enumerate(every):
        for row in rank_rows:
            calls, pred = row["calls"], row["predicted"]
            gathered = row["bytes"].get("all_gather_single", 0)
            print(f"rank {rank} groups {row['groups']:>3}: forwards {row['forwards']:>4} (decoding "
                  f"{row['decode_forwards']}, {row['generate_calls']} batches)  all-gathers "
                  f"{calls.get('all_gather_single', 0):>5} (model {pred['all_gather_single']})  gathered "
                  f"{gathered / 2**20:8.2f} MiB = {gathered / max(param_bytes, 1):.1f} x the parameters  all-reduces "
                  f"{calls.get('all_reduce', 0):>4} (model {pred['all_reduce'][0]})  object gathers "
                  f"{calls.get('all_gather_object', 0)} (model {pred['all_gather_object'][0]}, "
                  f"{row['bytes'].get('all_gather_object', 0) / 1024:.1f} KiB sent)")


if __name__ == "__main__":
    main()
