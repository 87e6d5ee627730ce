"""Which process this is and what every process shares, through accelerate's process state and collectives (as
the Trainer itself uses them): shard groups across ranks, gather results, broadcast a decision, main-process
checks. Outside torch.distributed (one process) every answer is the single-process one and no accelerate state
is created, so importing or evaluating never starts a process group by itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

#: What torchrun / accelerate set for every process of a launch; WORLD_SIZE > 1 without them is a stale variable.
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launch_env(env: Any = None) -> tuple[int, int, int]:
    """``(world_size, rank, local_rank)`` from the launcher's environment variables, checked: a value that is
    not an integer (``WORLD_SIZE=abc``), out of range, or a ``WORLD_SIZE`` > 1 left over from another shell with
    none of the launcher's other variables (which would wait for processes that never start) is a
    :class:`~sago_train.errors.SagoInputError` naming the variable.

    Example:
        >>> launch_env({})
        (1, 0, 0)
        >>> launch_env({"WORLD_SIZE": "abc"})
        Traceback (most recent call last):
        ...
        sago_train.errors.SagoInputError: field 'WORLD_SIZE': expected an integer >= 1 (the number of processes torchrun or accelerate started), got 'abc' (unset it, or launch with torchrun)
    """
    import os

    from .errors import SagoInputError, short_repr

    env = os.environ if env is None else env
    fix = "unset it, or launch with torchrun"

    def number(name: str, default: str, low: int, what: str) -> int:
        raw = env.get(name, default)
        try:
            value = int(str(raw).strip())
        except ValueError:
            value = None
        if value is None or value < low:
            raise SagoInputError(f"expected an integer >= {low} ({what}), got {short_repr(raw)}", key=name, hint=fix)
        return value

    world = number("WORLD_SIZE", "1", 1, "the number of processes torchrun or accelerate started")
    if world == 1:
        return 1, 0, 0
    missing = [v for v in LAUNCH_VARS if not str(env.get(v, "")).strip()]
    if missing:
        raise SagoInputError(f"WORLD_SIZE is {world} but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                             "not set: a variable left from another launch (this process would wait for "
                             f"{world - 1} others that never start)", key="WORLD_SIZE", hint=fix)
    rank = number("RANK", "0", 0, "this process's index")
    local = number("LOCAL_RANK", "0", 0, "this process's index on its machine")
    if rank >= world:
        raise SagoInputError(f"RANK {rank} is not below WORLD_SIZE {world}", key="RANK", hint=fix)
    return world, rank, local


def _initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _state() -> Any:
    from accelerate import PartialState

    # The state is shared (the Trainer's, when a Trainer made it first). Made here, it must describe the process
    # group that exists: accelerate would otherwise take a gloo group on a CPU machine for no distribution.
    return PartialState(cpu=torch.distributed.get_backend() == "gloo")


def rank() -> int:
    return _state().process_index if _initialized() else 0


def world_size() -> int:
    return _state().num_processes if _initialized() else 1


def is_main_process() -> bool:
    return rank() == 0


def shard_indices(n: int) -> list[int]:
    """This rank's share of ``range(n)``: a strided split, so shards differ in size by at most one.

    Example:
        >>> shard_indices(3)  # one process: everything
        [0, 1, 2]
    """
    return list(range(rank(), n, world_size()))


def gather_objects(items: list[Any]) -> list[Any]:
    """Every rank's list concatenated in rank order, on every rank (``accelerate.utils.gather_object``); the
    identity in one process."""
    if world_size() == 1:
        return items
    from accelerate.utils import gather_object

    return list(gather_object(items))


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` from rank ``src`` on every rank (``accelerate.utils.broadcast_object_list``); the identity in one
    process."""
    if world_size() == 1:
        return obj
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([obj], from_process=src)[0]


def max_over_ranks(values: Sequence[int]) -> list[int]:
    """The element-wise maximum of ``values`` over the ranks (the values themselves in one process): how ranks
    agree on how many forwards to run and which path to take.

    Example:
        >>> max_over_ranks([3, 0])  # one process
        [3, 0]
    """
    if world_size() == 1:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.long)
    if torch.distributed.get_backend() == "nccl":
        t = t.cuda()
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return [int(x) for x in t.tolist()]


def forward_is_collective(model: torch.nn.Module) -> bool:
    """Whether a forward of ``model`` runs collectives, so that every rank must call it the same number of
    times: parameters sharded by FSDP (``fully_shard`` or ``FullyShardedDataParallel``) or DeepSpeed ZeRO-3 are
    gathered block by block inside the forward. False in one process and under DDP (whose forward gathers
    nothing).

    Example:
        >>> forward_is_collective(torch.nn.Linear(2, 2))  # one process
        False
    """
    if world_size() == 1:
        return False
    import torch.distributed.fsdp as fsdp

    # FSDPModule (fully_shard's modules) is exported here from torch 2.6 on; FullyShardedDataParallel always.
    kinds = tuple(k for k in (getattr(fsdp, "FSDPModule", None), getattr(fsdp, "FullyShardedDataParallel", None))
                  if k is not None)
    if any(isinstance(m, kinds) for m in model.modules()):
        return True
    # DeepSpeed ZeRO-3 tags every partitioned parameter with its id (``ds_id``); its forward fetches them.
    return any(hasattr(p, "ds_id") for p in model.parameters())
