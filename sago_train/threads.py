"""Torch CPU threads: one sensible count per process, chosen once, never oversubscribing the machine.

Torch's default is one thread per core for every process. When several processes share the cores
(torchrun/accelerate workers, pytest-xdist workers), each then runs as many threads as there are cores and
they slow each other down many times over. So, unless the user chose (``OMP_NUM_THREADS`` set, or
``torch.set_num_threads`` called with a value other than torch's default), sago_train gives each process
``cores // local processes`` threads and says so once.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("sago_train")

_done = False
#: Environment variables that count as the user's choice of thread count.
USER_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def local_processes() -> int:
    """Processes sharing this machine's cores: torchrun/accelerate's LOCAL_WORLD_SIZE or pytest-xdist's
    worker count, else 1."""
    counts = [1]
    for var in ("LOCAL_WORLD_SIZE", "PYTEST_XDIST_WORKER_COUNT"):
        try:
            counts.append(int(os.environ.get(var, "1")))
        except ValueError:
            continue
    return max(counts)


def planned_threads(current: int, default: int, cores: int, processes: int, env: dict[str, str]) -> int | None:
    """The thread count to set, or None to leave torch as it is (a pure function, for tests).

    Example:
        >>> planned_threads(current=16, default=16, cores=16, processes=4, env={})
        4
        >>> planned_threads(current=2, default=16, cores=16, processes=4, env={}) is None  # the user's choice
        True
    """
    if any(env.get(v) for v in USER_THREAD_VARS) or current != default:
        return None
    share = max(1, cores // max(1, processes))
    return share if share < current else None


def configure_torch_threads() -> int:
    """Set torch's intra-op threads to this process's share of the cores, once per process, unless the user
    chose; return the count in use."""
    global _done
    import torch

    current = torch.get_num_threads()
    if _done:
        return current
    _done = True
    cores, processes = available_cores(), local_processes()
    # Torch's own default is one thread per (physical) core, capped by the affinity mask.
    target = planned_threads(current, current if _looks_default(current, cores) else -1, cores, processes,
                             dict(os.environ))
    if target is not None:
        torch.set_num_threads(target)
        logger.warning("sago_train: torch uses %d CPU thread(s) per process (%d cores shared by %d processes); "
                       "set OMP_NUM_THREADS to choose", target, cores, processes)
        return target
    return current


def _looks_default(current: int, cores: int) -> bool:
    # Torch picks the physical core count (<= the logical cores in the affinity mask); a larger value, or
    # 1 on a multi-core machine, was set by someone.
    return 1 < current <= cores or cores == 1
