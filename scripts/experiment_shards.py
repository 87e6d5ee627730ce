"""The experiments' processes (scripts/experiment_loss.py, experiment_pool.py, validity.py): which runs each shard
takes, the shard processes, and the merge of their records into the experiment's own.

A shard is one process of one thread (two of them on two cores halve the wall time). Every shard computes the same
assignment from the same inputs, so no run is done twice: the runs not yet recorded in the experiment's own
records, spread so that the shards' loads are even (:func:`balance`). Before the shards start, what an interrupted
earlier start left in the shards' files is merged into the experiment's records, so that every shard sees every
finished run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Hashable, Sequence
from pathlib import Path

Key = tuple[str, int, str]  # (arm, seed, run)


def balance(jobs: Sequence[Hashable], costs: Sequence[float], shards: int, preload: Sequence[float] = ()) -> list[int]:
    """The shard of each job: the longest first, each to the least loaded shard (ties: the lower shard, then the
    earlier job), so that the shards finish together. ``preload[i]`` is work shard ``i`` has besides the jobs.

    >>> balance(["canonical", "a", "b", "c", "d"], [6, 2, 2, 2, 2], 2, preload=[6])
    [1, 0, 1, 0, 1]
    """
    if shards < 1 or len(jobs) != len(costs):
        raise ValueError(f"balance: needs shards >= 1 and a cost per job, got {shards} shards, {len(jobs)} jobs, "
                         f"{len(costs)} costs")
    load = [float(preload[i]) if i < len(preload) else 0.0 for i in range(shards)]
    out = [0] * len(jobs)
    for j in sorted(range(len(jobs)), key=lambda j: (-costs[j], j)):
        i = min(range(shards), key=lambda i: (load[i], i))
        out[j] = i
        load[i] += costs[j]
    return out


def _keyed_lines(path: Path) -> list[tuple[Key, str]]:
    if not path.exists():
        return []
    return [((r["arm"], r["seed"], r["run"]), line) for line in path.read_text().splitlines() if line.strip()
            for r in [json.loads(line)]]


def merge_shards(out: Path, shards: int, names: tuple[str, ...] = ("records.jsonl", "timings.jsonl")) -> None:
    """Append the shards' runs to ``out``'s files ``names`` (the runs ``out`` has first; each (arm, seed, run)
    once, whichever shard recorded it), then empty the shards' files: ``out`` is the one record of what ran, so a
    run deleted from it runs again. Shard folders beyond ``shards`` (an earlier start with more) are merged too."""
    present = [int(p.name.split("-", 1)[1]) for p in out.glob("shard-*") if p.is_dir() and p.name[6:].isdigit()]
    count = max([shards - 1, *present]) + 1
    for name in names:
        lines = _keyed_lines(out / name)
        have = {key for key, _ in lines}
        for i in range(count):
            new = [(key, line) for key, line in _keyed_lines(out / f"shard-{i}" / name) if key not in have]
            have |= {key for key, _ in new}
            lines += new
        tmp = out / f".{name}.tmp"
        tmp.write_text("".join(line + "\n" for _, line in lines))
        tmp.replace(out / name)  # all or nothing: an interrupted merge leaves the old file
    for i in range(count):
        for name in names:
            (out / f"shard-{i}" / name).unlink(missing_ok=True)


def run_shards(args: argparse.Namespace, out: Path, *, script: str, common: list[str],
               extra: tuple[str, ...] = ("records.jsonl", "timings.jsonl")) -> int:
    """Run ``script`` with the flags ``common`` (its settings, ``--also-done out/records.jsonl`` among them) in
    ``args.shards`` processes (``--shard i/N`` each, one thread unless OMP_NUM_THREADS says otherwise, output
    under ``out/shard-i``), then merge the files ``extra`` into ``out``. Runs an interrupted start left in the
    shards' files are merged first, so every shard's assignment starts from the same finished runs."""
    merge_shards(out, args.shards, extra)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    procs = []
    for i in range(args.shards):
        log = (out / f"shard-{i}.log").open("a")
        procs.append((subprocess.Popen([sys.executable, script, *common, "--shard", f"{i}/{args.shards}",
                                        "--out", str(out / f"shard-{i}")], env=env, stdout=log,
                                       stderr=subprocess.STDOUT), log))
        print(f"shard {i}/{args.shards}: pid {procs[-1][0].pid}, log {out / f'shard-{i}.log'}", flush=True)
    codes = [proc.wait() for proc, _ in procs]
    for _, log in procs:
        log.close()
    merge_shards(out, args.shards, extra)
    failed = [i for i, code in enumerate(codes) if code]
    if failed:
        print(f"shard(s) {failed} failed (see their logs); the finished runs are merged, a rerun resumes", flush=True)
        return 1
    return 0
