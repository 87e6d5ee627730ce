"""Timing and peak-memory measurement of training steps for ``bench_loss.py`` (one step = zero_grad,
forward, backward, optimizer step).

Memory: on CUDA, ``torch.cuda.max_memory_allocated`` over one step. On CPU there is no allocator counter, and
process RSS mixes in the allocator's caching, fragmentation and library pages, so the peak is measured the
way CUDA counts it: live tensor bytes. A ``TorchDispatchMode`` sees every tensor an op creates during the
step (forward, backward and optimizer; activations, temporaries, gradients) and a weak reference on its
storage sees it freed; parameters and optimizer state, which live across steps, are added as a constant.
The count is deterministic (the same ops allocate the same bytes), so one measured step per arm suffices.
"""

from __future__ import annotations

import gc
import statistics
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, fn: Callable[[], torch.Tensor], autocast: bool, device: str) -> None:
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast):
        loss = fn()
    loss.backward()
    opt.step()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure_time(model, opt, fns, *, reps: int, warmup: int, autocast: bool, device: str) -> dict[str, dict[str, list[float]]]:
    """Per-repeat wall-clock and process CPU seconds of one step per arm, arms interleaved within a repeat.

    CPU time (``time.process_time``: this process's user + system time) leaves out the time the process
    waited for a core, which on a shared machine is most of the noise in wall-clock time; with one torch
    thread it is the work the step did. (It still includes cache and memory-bandwidth contention.)
    """
    for _ in range(warmup):
        for fn in fns.values():
            train_step(model, opt, fn, autocast, device)
    samples: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            train_step(model, opt, fn, autocast, device)
            sync(device)
            samples[name]["wall"].append(time.perf_counter() - t0)
            samples[name]["cpu"].append(time.process_time() - c0)
    return samples


def ratio_summary(samples: dict[str, dict[str, list[float]]], arm: str, clock: str) -> dict[str, float]:
    """Median and spread (min, max) of the per-repeat ratios ``arm / task`` (same repeat, adjacent steps)."""
    ratios = sorted(a / b for a, b in zip(samples[arm][clock], samples["task"][clock], strict=True))
    return {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1],
            "q1": ratios[len(ratios) // 4], "q3": ratios[(3 * len(ratios)) // 4]}


def static_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    total += sum(b.numel() * b.element_size() for b in model.buffers())
    for state in opt.state.values():
        total += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    return total


def existing_storages(model: torch.nn.Module, opt: torch.optim.Optimizer) -> set[int]:
    """Keys of the storages that live across steps (see :func:`static_bytes`)."""
    tensors = [*model.parameters(), *model.buffers()]
    for state in opt.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return {t.untyped_storage()._cdata for t in tensors}


class LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of the tensor storages created while active and still alive (like CUDA's allocated bytes,
    without the caching allocator's rounding)."""

    def __init__(self, existing: set[int] | None = None) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._live: dict[int, tuple[int, Any]] = {}
        # Storages that exist before the step (parameters, buffers, optimizer state): an op returning a view
        # of one (``weight.t()`` in every linear layer) creates no memory, and they are counted as a constant.
        self._existing = existing or set()

    def _free(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            self.current -= entry[0]

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._live or key in self._existing:
            return
        nbytes = storage.nbytes()
        # The weak reference's callback runs when the storage is freed (torch keeps one Python object per
        # live storage, so the reference dies with the storage, not with a temporary wrapper).
        self._live[key] = (nbytes, weakref.ref(storage, lambda _ref, key=key: self._free(key)))
        self.current += nbytes
        self.peak = max(self.peak, self.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._track(t)
        return out


def measure_memory(model, opt, fns, *, autocast: bool, device: str) -> dict[str, dict[str, int]]:
    """Peak live tensor bytes over one step, per variant (after a warm-up step created the optimizer state)."""
    out: dict[str, dict[str, int]] = {}
    for name, fn in fns.items():
        train_step(model, opt, fn, autocast, device)  # optimizer state exists from here on
        opt.zero_grad(set_to_none=True)
        gc.collect()
        static = static_bytes(model, opt)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            train_step(model, opt, fn, autocast, device)
            torch.cuda.synchronize()
            step = torch.cuda.max_memory_allocated() - base
        else:
            tracker = LiveTensorBytes(existing_storages(model, opt))
            with tracker:
                train_step(model, opt, fn, autocast, device)
            step = tracker.peak
        opt.zero_grad(set_to_none=True)
        out[name] = {"peak": static + step, "step": step}
    return out
