"""Where the stability loss's extra step time goes: the autograd profiler (CPU) on one training step of each
arm of ``bench_loss.py`` (same model, same batch, same settings), ops grouped by name and input shapes.

Wall-clock ratios on a shared machine are noisy; the ops a step runs are not. For each arm this prints its
op calls, matmul FLOPs and self CPU time, then the work it runs *beyond* the task-loss step: every (op,
shapes) pair it calls more often than the task arm does, with the time of those extra calls (the minimum
over ``--reps`` profiled steps, pro rata when the task arm also makes some of the calls), largest first.
The rest of the difference in total time is the same ops running slower (cache, memory bandwidth, page
faults, other processes), not extra work.

Usage:
    python benchmarks/profile_loss.py --model sago://smollm2-135m-instruct --lora 8 --threads 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_loss  # noqa: E402
from loss_measure import train_step  # noqa: E402

from sago_train.training.loss import StabilityConfig  # noqa: E402

Key = tuple[str, str]


def profile_arm(model, opt, fn, *, reps: int, autocast: bool, device: str) -> dict[Key, list[float]]:
    """``{(op, shapes): [min self CPU ms, calls, MFLOPs]}`` over ``reps`` profiled steps."""
    table: dict[Key, list[float]] = {}
    for _ in range(reps):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
            train_step(model, opt, fn, autocast, device)
        for e in prof.key_averages(group_by_input_shape=True):
            if e.key.startswith(("autograd::engine", "Optimizer.", "ProfilerStep")):
                continue  # wrappers: their children are counted
            key = (e.key, str(e.input_shapes))
            ms, calls, mflops = e.self_cpu_time_total / 1e3, e.count, e.flops / 1e6
            if key in table:
                table[key][0] = min(table[key][0], ms)
            else:
                table[key] = [ms, calls, mflops]
    return table


def attribute(arm: dict[Key, list[float]], task: dict[Key, list[float]]) -> list[tuple[float, int, float, Key]]:
    """The (op, shapes) pairs ``arm`` calls more often than ``task``: (time of the extra calls, extra calls,
    extra MFLOPs, key), largest time first."""
    extra = []
    for key, (ms, calls, mflops) in arm.items():
        base_calls = task.get(key, [0.0, 0, 0.0])[1]
        if calls > base_calls:
            share = (calls - base_calls) / calls
            extra.append((ms * share, int(calls - base_calls), mflops * share, key))
    return sorted(extra, reverse=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--lora", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--target-len", type=int, default=16)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=2, help="profiled steps per arm (the minimum time is kept)")
    ap.add_argument("--arms", default="task,sago,naive")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.model:
        model = bench_loss.load_model(args.model, args.lora, "cpu").train()
        vocab = model.config.vocab_size
    else:
        model, vocab = bench_loss.build_model(args.hidden, args.layers, args.vocab).train(), args.vocab
    batch = bench_loss.make_batch(args.groups, args.k, args.prompt_len, args.target_len, vocab)
    fns = bench_loss.loss_functions(model, batch, StabilityConfig(act_weight=0.1, conf_weight=0.1))
    arms = ["task"] + [a for a in args.arms.split(",") if a != "task"]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    for name in arms:  # warm-up (and the first batch's head check in the sago arm)
        train_step(model, opt, fns[name], args.bf16, "cpu")
    tables = {name: profile_arm(model, opt, fns[name], reps=args.reps, autocast=args.bf16, device="cpu")
              for name in arms}
    task = tables["task"]
    print(f"batch {tuple(batch['input_ids'].shape)}, vocab {vocab}, {args.threads} thread(s), bf16 autocast "
          f"{args.bf16}; min over {args.reps} profiled steps per arm")
    for name in arms:
        t = tables[name]
        total_ms = sum(v[0] for v in t.values())
        mm = sum(v[2] for k, v in t.items() if k[0] in ("aten::mm", "aten::bmm", "aten::addmm"))
        calls = sum(v[1] for v in t.values())
        print(f"{name:6} self CPU {total_ms:8.0f} ms  op calls {calls:6d}  matmul {mm / 1e3:8.2f} GFLOP")
    for name in arms[1:]:
        extra = attribute(tables[name], task)
        ms = sum(e[0] for e in extra)
        total = sum(v[0] for v in tables[name].values()) - sum(v[0] for v in task.values())
        print(f"\n{name} beyond task: {sum(e[1] for e in extra)} extra op calls, {ms:.0f} ms "
              f"({sum(e[2] for e in extra) / 1e3:.2f} GFLOP); total self-time difference {total:+.0f} ms "
              f"(the rest: the same ops running slower or faster)")
        for ms_i, n, _, (op, shapes) in extra[: args.top]:
            print(f"  {ms_i:8.1f} ms  {n:4d}x  {op:34} {shapes[:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
