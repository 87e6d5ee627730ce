"""Cost of the stability loss: training-step time and peak memory, side by side in one run.

Four ways to train on the same batch of variant groups with the same tiny Llama:

- ``task``:  the task loss only (``model(**batch).loss``), the baseline;
- ``sago``:  task loss + lambda_act * L_act + lambda_conf * L_conf as sago_train computes them (forward hooks,
  the LM head applied to the target-predicting final hidden states only, a fused divergence that keeps only
  its input for backward);
- ``hs``:    the same computation fed from ``output_hidden_states=True`` instead of hooks (isolates the
  capture);
- ``naive``: the obvious implementation: ``output_hidden_states=True``, and the divergence by autograd from
  ``log_softmax`` of the model's logits.

A step is ``zero_grad -> forward -> backward -> AdamW step``. Each repeat runs the four arms back to back on
the same batch (task, sago, hs, naive, task, ...); the ratio of each arm to the task step *of the same repeat*
is taken, and the median and spread (min, max) of those per-repeat ratios are reported, for wall-clock time
and for the process's CPU time (which leaves out waiting for a core on a shared machine). The load average
before and after the timed repeats is printed with them. The stability settings are the library's defaults
(``StabilityConfig()``: mode relative / infonce, last-prompt-token pooling) unless ``--mode`` /
``--act-pooling`` say otherwise; the naive arm computes the same formulas the obvious way.

Memory: on CUDA, ``torch.cuda.max_memory_allocated`` over one step. On CPU there is no allocator counter, and
process RSS mixes in the allocator's caching, fragmentation and library pages, so the peak is measured the
way CUDA counts it: live tensor bytes. A ``TorchDispatchMode`` sees every tensor an op creates during the
step (forward, backward and optimizer; activations, temporaries, gradients) and a weak reference on its
storage sees it freed; parameters and optimizer state, which live across steps, are added as a constant.
"step" memory is the peak minus that constant, i.e. what the step itself adds.

Usage:
    python benchmarks/bench_loss.py                       # hidden 128, 4 layers (~1M parameters)
    python benchmarks/bench_loss.py --hidden 256 --layers 8 --device cuda --bf16
    python benchmarks/bench_loss.py --model sago://smollm2-135m-instruct --lora 8 --threads 1 --reps 9
    python benchmarks/bench_loss.py --model sago://smollm2-135m-instruct --lora 8 --threads 1 --bf16 --target-len 64
    python benchmarks/bench_loss.py --mode consistency --teacher frozen   # self-distillation, base-model teacher

In mode ``consistency`` the weights default to act 0, conf 1 (the self-distillation term alone); a ``frozen`` /
``ema`` teacher's extra no-grad forward is inside every timed step of the sago, hs and naive arms.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loss_measure import measure_memory, measure_time, ratio_summary  # noqa: E402

from sago_train.functional import (  # noqa: E402
    activation_dispersion,
    anchor_activation_distance,
    anchor_kl,  # noqa: E402
    js_divergence,
    relative_dispersion,
)
from sago_train.training.loss import (  # noqa: E402
    HiddenCapture,
    StabilityConfig,
    StabilityLoss,
    group_layout,
    pool_hidden,
    split_batch,
    target_logprobs,
)
from sago_train.training.teacher import Teacher  # noqa: E402

TARGETS = {"time": 1.10, "memory": 1.05}


def build_model(hidden: int, layers: int, vocab: int, seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 2),
        num_key_value_heads=max(hidden // 64, 2),
        vocab_size=vocab,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def load_model(name: str, lora: int, device: str) -> torch.nn.Module:
    """A real model (``sago://smollm2-135m-instruct`` or a path), with a LoRA adapter of rank ``lora`` on every
    projection when ``lora`` > 0 (only the adapter trains), else fully trainable."""
    from sago_train.model.loading import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(name, device=device)
    if lora:
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=lora, lora_alpha=2 * lora, target_modules=targets))
    return model


def make_batch(groups: int, k: int, prompt_len: int, target_len: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A batch in VariantGroupCollator's layout: K prompts of varied length per group, one shared target."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for gi in range(groups):
        target = torch.randint(3, vocab, (target_len,), generator=g).tolist()
        for _ in range(k):
            plen = int(torch.randint(prompt_len // 2, prompt_len + 1, (1,), generator=g))
            rows.append((torch.randint(3, vocab, (plen,), generator=g).tolist(), target, gi))
    width = max(len(p) + len(t) for p, t, _ in rows)
    n = len(rows)
    batch = {
        "input_ids": torch.zeros((n, width), dtype=torch.long),
        "attention_mask": torch.zeros((n, width), dtype=torch.long),
        "labels": torch.full((n, width), -100, dtype=torch.long),
        "target_mask": torch.zeros((n, width), dtype=torch.bool),
    }
    for r, (p, t, _) in enumerate(rows):
        batch["input_ids"][r, : len(p) + len(t)] = torch.tensor(p + t)
        batch["attention_mask"][r, : len(p) + len(t)] = 1
        batch["labels"][r, len(p) : len(p) + len(t)] = torch.tensor(t)
        batch["target_mask"][r, len(p) : len(p) + len(t)] = True
    batch["group_index"] = torch.tensor([gi for _, _, gi in rows])
    batch["variant_index"] = torch.arange(k).repeat(groups)
    batch["canonical_index"] = torch.zeros(n, dtype=torch.long)
    batch["prompt_length"] = torch.tensor([len(p) for p, _, _ in rows])
    batch["target_length"] = torch.tensor([len(t) for _, t, _ in rows])
    return batch


def naive_infonce(vectors: torch.Tensor, temperature: float) -> torch.Tensor:
    """Supervised InfoNCE ``[G, K, H] -> [G]`` the obvious way (normalize, similarity matrix, masked
    log-softmax), the reference the naive arm uses for mode ``relative`` / ``infonce``."""
    g, k, _ = vectors.shape
    u = torch.nn.functional.normalize(vectors.float().reshape(g * k, -1), dim=-1)
    z = u @ u.T / temperature
    eye = torch.eye(g * k, dtype=torch.bool)
    log_p = torch.log_softmax(z.masked_fill(eye, -math.inf), dim=-1)
    group = torch.arange(g * k) // k
    positive = (group[:, None] == group[None, :]) & ~eye
    per_anchor = -(log_p.masked_fill(~positive, 0.0)).sum(-1) / (k - 1) - math.log(k - 1)
    return per_anchor.view(g, k).mean(-1)


def naive_act(vectors: torch.Tensor, layout: Any, cfg: StabilityConfig) -> torch.Tensor:
    """L_act of one layer's pooled ``[G, K, H]`` vectors, per group, as the naive arm computes it."""
    if cfg.mode == "centroid":
        return activation_dispersion(vectors)
    if cfg.mode in ("anchor", "consistency"):
        return anchor_activation_distance(vectors, layout.canonical)
    if cfg.relative_form == "ratio":
        return relative_dispersion(vectors)
    return naive_infonce(vectors, cfg.temperature)


def loss_functions(model: torch.nn.Module, batch: dict[str, torch.Tensor], cfg: StabilityConfig) -> dict[str, Callable[[], torch.Tensor]]:
    model_inputs, groups = split_batch(batch)
    sago = StabilityLoss(cfg, model)
    teacher = Teacher(cfg.teacher, model, cfg.ema_decay) if cfg.mode == "consistency" else None

    def teacher_logits() -> torch.Tensor | None:
        return sago.teacher_logits(model, teacher, model_inputs, groups)

    def task() -> torch.Tensor:
        return model(**model_inputs).loss

    def with_hooks() -> torch.Tensor:
        out, terms = sago(model, batch, teacher=teacher)
        return out.loss + terms.weighted(cfg.act_weight, cfg.conf_weight)

    def hidden_states() -> torch.Tensor:
        t_logits = teacher_logits()
        out = model(**model_inputs, output_hidden_states=True)
        # hidden_states[l + 1] is block l's output (the last entry is after the final norm in transformers,
        # the same cost); hidden_states[-1] feeds the LM head.
        capture = HiddenCapture(model, sago.layers, final_hidden=True)
        capture.hidden = {layer: out.hidden_states[layer + 1] for layer in sago.layers}
        capture.final = out.hidden_states[-1]
        terms = sago.terms(groups, capture, input_ids=model_inputs["input_ids"], model=model, teacher_logits=t_logits)
        return out.loss + terms.weighted(cfg.act_weight, cfg.conf_weight)

    def naive() -> torch.Tensor:
        t_logits = teacher_logits()
        out = model(**model_inputs, output_hidden_states=True)
        layout = group_layout(groups, model_inputs["input_ids"])
        per_layer = [naive_act(pool_hidden(out.hidden_states[layer + 1], layout, cfg.act_pooling), layout, cfg).mean()
                     for layer in sago.layers]
        act = torch.stack(per_layer).mean() if per_layer else out.loss.new_zeros(())
        lp, mask = target_logprobs(out.logits, layout)
        w = mask.float()
        if cfg.mode == "consistency":
            if t_logits is None:  # teacher 'self': the canonical rows of the same logits
                rows = layout.order.view(layout.num_groups, -1)[torch.arange(layout.num_groups), layout.canonical]
                pos = layout.prompt_length[rows, None] - 1 + torch.arange(lp.shape[1])
                t_logits = out.logits[rows[:, None], pos.clamp(max=out.logits.shape[1] - 1)].detach()
            t_lp = torch.log_softmax(t_logits.float() / cfg.teacher_temperature, -1)
            per_pos = anchor_kl(lp, layout.canonical[:, None].expand_as(mask), teacher=t_lp)
        elif cfg.mode == "anchor":
            per_pos = anchor_kl(lp, layout.canonical[:, None].expand_as(mask))
        else:
            per_pos = js_divergence(lp)
        conf = ((per_pos * w).sum(-1) / w.sum(-1)).mean()
        return out.loss + cfg.act_weight * act + cfg.conf_weight * conf

    return {"task": task, "sago": with_hooks, "hs": hidden_states, "naive": naive}


def run_benchmark(
    hidden: int = 128,
    layers: int = 4,
    vocab: int = 1024,
    groups: int = 4,
    k: int = 4,
    prompt_len: int = 48,
    target_len: int = 16,
    reps: int = 15,
    warmup: int = 2,
    device: str = "cpu",
    bf16: bool = False,
    act_weight: float = 0.1,
    conf_weight: float = 0.1,
    memory: bool = True,
    model_name: str | None = None,
    lora: int = 0,
    mode: str | None = None,
    act_pooling: str | None = None,
    teacher: str = "self",
) -> dict[str, Any]:
    if model_name:
        model = load_model(model_name, lora, device).train()
        cfg_m = model.config
        hidden, layers, vocab = cfg_m.hidden_size, cfg_m.num_hidden_layers, cfg_m.vocab_size
    else:
        model = build_model(hidden, layers, vocab).to(device).train()
    batch = {key: value.to(device) for key, value in make_batch(groups, k, prompt_len, target_len, vocab).items()}
    # The library's defaults (mode relative / infonce, last-prompt-token pooling) unless told otherwise; the
    # naive arm spells out the same formulas (naive_act).
    overrides = {key: value for key, value in (("mode", mode), ("act_pooling", act_pooling)) if value is not None}
    if mode == "consistency":
        overrides["teacher"] = teacher
    cfg = StabilityConfig(act_weight=act_weight, conf_weight=conf_weight, **overrides)
    fns = loss_functions(model, batch, cfg)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    load_before = os.getloadavg()
    times = measure_time(model, opt, fns, reps=reps, warmup=warmup, autocast=bf16, device=device)
    load_after = os.getloadavg()
    mem = measure_memory(model, opt, fns, autocast=bf16, device=device) if memory else {}
    params = sum(p.numel() for p in model.parameters())
    return {
        "setup": {
            "model": model_name or "random Llama", "lora_rank": lora,
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "device": device, "bf16_autocast": bf16, "hidden": hidden, "layers": layers, "vocab": vocab,
            "parameters": params, "model_mb_fp32": params * 4 / 2**20, "groups": groups, "k": k,
            "sequences": groups * k, "seq_len": int(batch["input_ids"].shape[1]), "target_len": target_len,
            "stability_layers": StabilityLoss(cfg, model).layers, "threads": torch.get_num_threads(), "reps": reps,
            "mode": cfg.mode, "relative_form": cfg.relative_form, "act_pooling": cfg.act_pooling,
            "teacher": cfg.teacher if cfg.mode == "consistency" else None,
            "act_weight": cfg.act_weight, "conf_weight": cfg.conf_weight,
            "load_average_before": load_before, "load_average_after": load_after,
        },
        "samples_s": times,
        "time_s": {name: statistics.median(v["wall"]) for name, v in times.items()},
        "cpu_s": {name: statistics.median(v["cpu"]) for name, v in times.items()},
        "ratios": {clock: {arm: ratio_summary(times, arm, clock) for arm in times if arm != "task"}
                   for clock in ("wall", "cpu")},
        "memory_bytes": mem,
    }


def report(result: dict[str, Any]) -> bool:
    """Print the figures and ratios; return whether the targets are met (by the median per-repeat CPU-time
    ratio, the less noisy clock on a shared machine, and the peak memory ratio)."""
    s, t, c, m, r = result["setup"], result["time_s"], result["cpu_s"], result["memory_bytes"], result["ratios"]
    lora = f" + LoRA r={s['lora_rank']}" if s.get("lora_rank") else ""
    print(
        f"model: {s.get('model', 'random Llama')}{lora} "
        f"hidden={s['hidden']} layers={s['layers']} vocab={s['vocab']} "
        f"({s['parameters'] / 1e6:.2f}M params, {s['model_mb_fp32']:.1f} MB fp32) on {s['device']}"
        f"{' with bf16 autocast' if s['bf16_autocast'] else ''}, {s['threads']} thread(s)"
    )
    print(
        f"batch: {s['groups']} groups x K={s['k']} = {s['sequences']} sequences of {s['seq_len']} tokens, "
        f"target {s['target_len']} tokens; L_act ({s['mode']}"
        f"{'/' + s['relative_form'] if s['mode'] == 'relative' else ''}"
        f"{', teacher ' + s['teacher'] if s.get('teacher') else ''}, pooling {s['act_pooling']}) at layers "
        f"{s['stability_layers']} + L_conf (weights {s.get('act_weight')}, {s.get('conf_weight')}); "
        f"{s['reps']} interleaved repeats"
    )
    print("load average (1/5/15 min) before: {:.2f} {:.2f} {:.2f}, after: {:.2f} {:.2f} {:.2f}".format(
        *s["load_average_before"], *s["load_average_after"]))
    print(f"{'':8}{'wall med':>10}{'ratio med [min, max]':>24}{'cpu med':>10}{'ratio med [min, max]':>24}"
          + (f"{'peak MiB':>11}{'vs task':>9}" if m else ""))
    for name in ("task", "sago", "hs", "naive"):
        line = f"{name:8}{t[name] * 1e3:8.0f}ms"
        for clock, med in (("wall", None), ("cpu", c[name])):
            if med is not None:
                line += f"{med * 1e3:8.0f}ms"
            if name == "task":
                line += f"{'1.000x':>24}"
            else:
                q = r[clock][name]
                line += f"{q['median']:9.3f}x [{q['min']:.3f}, {q['max']:.3f}]"
        if m:
            line += f"{m[name]['peak'] / 2**20:11.1f}{m[name]['peak'] / m['task']['peak']:8.3f}x"
        print(line)
    cpu_ratio = r["cpu"]["sago"]["median"]
    ok = cpu_ratio <= TARGETS["time"]
    print(f"time   sago/task = {cpu_ratio:.3f}x CPU time, {r['wall']['sago']['median']:.3f}x wall "
          f"(median per-repeat ratio; target <= {TARGETS['time']:.2f}x)")
    sago_naive = [a / b for a, b in zip(result["samples_s"]["sago"]["cpu"], result["samples_s"]["naive"]["cpu"], strict=True)]
    print(f"time   sago/naive = {statistics.median(sago_naive):.3f}x CPU time "
          f"[{min(sago_naive):.3f}, {max(sago_naive):.3f}]")
    if m:
        ratio = m["sago"]["peak"] / m["task"]["peak"]
        ok = ok and ratio <= TARGETS["memory"]
        saved = m["naive"]["peak"] - m["sago"]["peak"]
        capture = m["hs"]["peak"] - m["sago"]["peak"]
        print(f"memory sago/task = {ratio:.3f}x peak (target <= {TARGETS['memory']:.2f}x); saved vs naive: "
              f"{saved / 2**20:.2f} MiB; hooks vs output_hidden_states with the same terms: {capture / 2**20:+.2f} MiB")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--target-len", type=int, default=16)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    ap.add_argument("--model", default=None, help="a real model instead of the random Llama, e.g. sago://smollm2-135m-instruct")
    ap.add_argument("--lora", type=int, default=0, help="with --model: train a LoRA adapter of this rank (0 = full)")
    ap.add_argument("--mode", default=None, help="StabilityConfig.mode (default: the library's default)")
    ap.add_argument("--act-pooling", default=None, help="StabilityConfig.act_pooling (default: the library's)")
    ap.add_argument("--teacher", default="self", help="mode consistency: StabilityConfig.teacher (self, frozen, ema)")
    ap.add_argument("--act-weight", type=float, default=None, help="default 0.1 (0 in mode consistency)")
    ap.add_argument("--conf-weight", type=float, default=None, help="default 0.1 (1 in mode consistency)")
    args = ap.parse_args(argv)
    consistency = args.mode == "consistency"
    act_weight = args.act_weight if args.act_weight is not None else (0.0 if consistency else 0.1)
    conf_weight = args.conf_weight if args.conf_weight is not None else (1.0 if consistency else 0.1)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run_benchmark(
        hidden=args.hidden, layers=args.layers, vocab=args.vocab, groups=args.groups, k=args.k,
        prompt_len=args.prompt_len, target_len=args.target_len, reps=args.reps, warmup=args.warmup,
        device=args.device, bf16=args.bf16, memory=not args.no_memory, model_name=args.model, lora=args.lora,
        mode=args.mode, act_pooling=args.act_pooling, teacher=args.teacher, act_weight=act_weight,
        conf_weight=conf_weight,
    )
    ok = report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print("targets met" if ok else "targets NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
