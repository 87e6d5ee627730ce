"""Monitoring overhead: a short LoRA fine-tune with and without SAGOCallback.

    .venv/bin/python benchmarks/bench_monitoring.py [--steps 3000] [--repeats 2]
    .venv/bin/python benchmarks/bench_monitoring.py --model sago://smollm2-135m-instruct --steps 200 --threads 2

The shipped tiny model trains on the demo's data and is monitored on the demo sets; a real chat model
(``--model``) trains on ``demo-real/train.jsonl`` (chat-rendered, first variant + target) and is monitored
on the ``demo-real`` sets.

The callback's cost is measured two ways: inside each monitored run, the wall time spent in its event
handlers relative to the rest of that run (immune to the machine's drift between runs), and the ratio of
median wall times of monitored and unmonitored runs (which includes that drift). The callback runs at its
default settings: the Trainer has no eval dataset, so SAGO evaluates on the three
bundled demo monitoring sets at its automatic cadence (a baseline, periodic evaluations within a 5% time
budget, and a final one). Runs are interleaved (off, on, off, on, ...) and the medians compared, since only
ratios measured side by side mean something on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


ASSETS = Path(__file__).resolve().parents[1] / "sago_train" / "assets"


def build_dataset(tok, real: bool = False):
    from datasets import Dataset

    from sago_train.model.tokenize import encode_variant

    path = ASSETS / ("demo-real" if real else "demo") / "train.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ids, labels = [], []
    for r in rows:
        if real:  # a chat group: its first phrasing, rendered, then the target (which ends the turn)
            p = encode_variant(r["variants"][0], tok, chat=True)
            c = tok(r["target"], add_special_tokens=False)["input_ids"]
        else:
            p = tok(r["prompt"])["input_ids"]
            c = tok(r["completion"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids.append(p + c)
        labels.append([-100] * len(p) + c)
    return Dataset.from_dict({"input_ids": ids, "labels": labels})


def collate(tok):
    import torch

    def fn(batch):
        w = max(len(b["input_ids"]) for b in batch)
        pad = tok.pad_token_id
        return {
            "input_ids": torch.tensor([b["input_ids"] + [pad] * (w - len(b["input_ids"])) for b in batch]),
            "attention_mask": torch.tensor([[1] * len(b["input_ids"]) + [0] * (w - len(b["input_ids"])) for b in batch]),
            "labels": torch.tensor([b["labels"] + [-100] * (w - len(b["labels"])) for b in batch]),
        }

    return fn


class _Timed:
    """Accumulates the wall time spent inside the SAGOCallback's event handlers (its whole cost in the run)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.by_event: dict[str, float] = {}

    def wrap(self, cb):
        for name in ("on_init_end", "on_train_begin", "on_step_end", "on_evaluate", "on_train_end", "on_log"):
            method = getattr(cb, name)

            def timed(*a, _m=method, **k):
                t = time.perf_counter()
                try:
                    return _m(*a, **k)
                finally:
                    dt = time.perf_counter() - t
                    self.seconds += dt
                    self.by_event[_m.__name__] = self.by_event.get(_m.__name__, 0.0) + dt

            setattr(cb, name, timed)
        return cb


SET_NAMES = ("paraphrase", "format", "typo")


def run(steps: int, monitor: bool, out: str, model_name: str | None = None,
        options: dict | None = None, device: str = "cpu", bf16: bool = False,
        set_names: tuple[str, ...] = SET_NAMES) -> dict:
    """One fine-tune: its wall time, and for a monitored one the callback's time (all of it, and the baseline's
    part: on_train_begin) and each evaluation of the history (step, seconds, complete or not)."""
    import peft
    from transformers import Trainer, TrainingArguments

    from sago_train import SAGOCallback
    from sago_train.data import VariantSet
    from sago_train.model.loading import load_model_and_tokenizer
    from sago_train.model.tiny import tiny_model_path

    model, tok = load_model_and_tokenizer(model_name or tiny_model_path(), device=device)
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                                       lora_dropout=0.0))
    demo = ASSETS / ("demo-real" if model_name else "demo")
    callbacks = []
    timer = _Timed()
    if monitor:
        sets = {n: VariantSet.from_jsonl(demo / f"{n}.jsonl", name=n) for n in set_names}
        callbacks.append(timer.wrap(SAGOCallback(sets, **(options or {}))))
    args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=8, learning_rate=1e-3,
                             logging_steps=50, save_strategy="no", report_to=[], use_cpu=device == "cpu", bf16=bf16, disable_tqdm=True,
                             seed=0, remove_unused_columns=False)
    tr = Trainer(model=model, args=args, train_dataset=build_dataset(tok, real=model_name is not None), data_collator=collate(tok),
                 processing_class=tok, callbacks=callbacks)
    for cb in callbacks:
        if isinstance(getattr(cb, "inner", cb), SAGOCallback):
            getattr(cb, "inner", cb).attach(tr)
    t = time.perf_counter()
    tr.train()
    elapsed = time.perf_counter() - t
    hist = Path(out) / "sago" / "history.jsonl"
    evals = [json.loads(x) for x in hist.read_text().splitlines()] if monitor and hist.exists() else []
    return {"elapsed": elapsed, "callback": timer.seconds, "baseline": timer.by_event.get("on_train_begin", 0.0),
            "evals": [(h["step"], h["runtime_s"], "skipped_axes" not in h) for h in evals]}


def cost_split(model_name: str | None, options: dict, repeats: int, device: str = "cpu") -> None:
    """One evaluation of the monitoring sets with and without generation (interleaved, medians): the share
    of an evaluation that ``generation_every`` saves on the evaluations that skip generation."""
    import peft

    from sago_train import SAGOEvaluator
    from sago_train.data import VariantSet
    from sago_train.model.loading import load_model_and_tokenizer
    from sago_train.model.tiny import tiny_model_path

    model, tok = load_model_and_tokenizer(model_name or tiny_model_path(), device=device)
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                                       lora_dropout=0.0))
    demo = ASSETS / ("demo-real" if model_name else "demo")
    sets = {n: VariantSet.from_jsonl(demo / f"{n}.jsonl", name=n) for n in ("paraphrase", "format", "typo")}
    from sago_train.integrations.callback import SAGOCallback

    config = SAGOCallback(sets, **options).config  # the callback's resolved settings (its max_groups default)
    ev = SAGOEvaluator(model, tok, config=config)
    ev.evaluate(sets, generation=False)  # warm-up
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(repeats):
        for gen in (True, False):
            t = time.perf_counter()
            ev.evaluate(sets, generation=gen)
            times[gen].append(time.perf_counter() - t)
    full, cheap = statistics.median(times[True]), statistics.median(times[False])
    n = sum(min(len(v), config.max_groups or len(v)) for v in sets.values())
    print(f"one evaluation of {model_name or 'the shipped tiny model'} (LoRA) on {n} groups, max_new_tokens="
          f"{config.max_new_tokens}, threads={__import__('torch').get_num_threads()}: full {full:.1f} s "
          f"(runs {', '.join(f'{x:.1f}' for x in times[True])}), without generation {cheap:.1f} s "
          f"(runs {', '.join(f'{x:.1f}' for x in times[False])}); generation's share {100 * (1 - cheap / full):.0f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", default=None, help="a real chat model, e.g. sago://smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (the same in every run)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16", action="store_true", help="train with bf16 mixed precision")
    ap.add_argument("--max-groups", type=int, default=None, help="SAGOCallback max_groups (default: its own)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="SAGOCallback max_new_tokens (default: its own)")
    ap.add_argument("--sets", default=",".join(SET_NAMES),
                    help="comma-separated monitoring sets of the demo (default: all three)")
    ap.add_argument("--no-unmonitored", action="store_true",
                    help="skip the runs without the callback (the in-run share needs only the monitored runs)")
    ap.add_argument("--split", type=int, default=0, metavar="N",
                    help="only measure one evaluation with and without generation, N times each, and exit")
    args = ap.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    options = {k: v for k, v in (("max_groups", args.max_groups), ("max_new_tokens", args.max_new_tokens)) if v}
    if args.split:
        cost_split(args.model, options, args.split, args.device)
        return
    set_names = tuple(x.strip() for x in args.sets.split(",") if x.strip())
    unknown = [x for x in set_names if x not in SET_NAMES]
    if unknown or not set_names:
        ap.error(f"--sets: expected names from {', '.join(SET_NAMES)}, got {args.sets!r}")
    name = args.model
    times: dict[str, list[float]] = {"off": [], "on": []}
    runs = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        run(2, True, f"{d}/warm", name, {**options, "max_groups": 2}, args.device, args.bf16)  # imports and lazy initialisation
        for i in range(args.repeats):
            if not args.no_unmonitored:
                times["off"].append(run(args.steps, False, f"{d}/off{i}", name, None, args.device, args.bf16)["elapsed"])
            r = run(args.steps, True, f"{d}/on{i}", name, options, args.device, args.bf16, set_names)
            times["on"].append(r["elapsed"])
            runs.append(r)
    print(f"LoRA fine-tune of {name or 'the shipped tiny model'}: {args.steps} steps, batch 8, "
          f"threads={torch.get_num_threads()}, repeats={args.repeats}, sets {', '.join(set_names)}, "
          f"callback options {options or 'default'}; "
          f"load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f} (on {os.cpu_count()} CPUs)")
    for i, r in enumerate(runs):
        train = r["elapsed"] - r["callback"]
        evs = ", ".join(f"step {s} {t:.1f} s{'' if full else ' (no generation)'}" for s, t, full in r["evals"])
        print(f"  monitored run {i}: {r['elapsed']:.1f} s wall, training {train:.1f} s ({train / args.steps:.2f} s/step), "
              f"callback {r['callback']:.1f} s of which the baseline {r['baseline']:.1f} s; evaluations: {evs}")
    inside = [r["callback"] / (r["elapsed"] - r["callback"]) for r in runs]
    after = [(r["callback"] - r["baseline"]) / (r["elapsed"] - r["callback"]) for r in runs]
    in_run, in_run_after = statistics.median(inside), statistics.median(after)
    print(f"time inside SAGOCallback / the rest of the same run: {100 * in_run:.1f}% "
          f"(runs: {', '.join(f'{100 * x:.1f}%' for x in inside)}) (target <= 5%) {'OK' if in_run <= 0.05 else 'MISSED'}")
    print(f"the same without the baseline (a set-up cost before the first step): {100 * in_run_after:.1f}% "
          f"(runs: {', '.join(f'{100 * x:.1f}%' for x in after)}) {'OK' if in_run_after <= 0.05 else 'MISSED'}")
    if times["off"]:
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        print(f"  without SAGOCallback: median {off:7.2f} s  runs: {', '.join(f'{x:.2f}' for x in times['off'])}")
        print(f"  with SAGOCallback   : median {on:7.2f} s  runs: {', '.join(f'{x:.2f}' for x in times['on'])}")
        print(f"wall-time ratio of the medians, monitored vs not: {100 * (on / off - 1):+.1f}% (between-run noise on "
              f"this machine: the unmonitored runs spread {100 * (max(times['off']) / min(times['off']) - 1):.1f}%)")


if __name__ == "__main__":
    main()
