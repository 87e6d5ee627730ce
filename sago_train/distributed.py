"""torch.distributed helpers: shard groups across ranks, gather results, main-process checks."""

from __future__ import annotations

from typing import Any

import torch


def _initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    return torch.distributed.get_rank() if _initialized() else 0


def world_size() -> int:
    return torch.distributed.get_world_size() if _initialized() else 1


def is_main_process() -> bool:
    return rank() == 0


def shard_indices(n: int) -> list[int]:
    """This rank's share of ``range(n)``: a strided split, so shards differ in size by at most one."""
    return list(range(rank(), n, world_size()))


def gather_objects(items: list[Any]) -> list[Any]:
    """Concatenate every rank's list (rank order) on every rank; the identity without distributed."""
    if world_size() == 1:
        return items
    out: list[list[Any]] = [[] for _ in range(world_size())]
    torch.distributed.all_gather_object(out, items)
    return [x for part in out for x in part]


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` from rank ``src`` on every rank; the identity without distributed."""
    if world_size() == 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=src)
    return box[0]
