"""Which process this is and what every process shares, through accelerate's process state and collectives (as
the Trainer itself uses them): shard groups across ranks, gather results, broadcast a decision, main-process
checks. Outside torch.distributed (one process) every answer is the single-process one and no accelerate state
is created, so importing or evaluating never starts a process group by itself."""

from __future__ import annotations

from typing import Any

import torch


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
