"""StabilityConfig validation and the stability terms against plain references, gradients and checkpointing."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop
from transformers import HfArgumentParser

from sago_train.errors import SagoInputError
from sago_train.training.collator import VariantGroupCollator
from sago_train.training.loss import HiddenCapture, StabilityConfig, StabilityLoss, group_layout, split_batch
from tests._helpers.tiny import (
    SPECIALS_FIRST,
    make_tiny_model,
    tiny_groups,
)


@pytest.fixture(scope="module")
def batch(tok):
    return VariantGroupCollator(tok)(tiny_groups(3))


# ------------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"act_weight": -0.1}, "act_weight.*>= 0"),
        ({"conf_weight": float("nan")}, "conf_weight.*finite"),
        ({"act_weight": float("inf")}, "act_weight.*finite"),
        ({"act_weight": True}, "act_weight.*number"),
        ({"conf_weight": "0.1"}, "conf_weight.*number"),
        ({"mode": "centriod"}, "Did you mean 'centroid'"),
        ({"mode": "anchr"}, "Did you mean 'anchor'"),
        ({"pooling": "targt"}, "Did you mean 'target'"),
        ({"task_loss_variants": "canonicl"}, "Did you mean 'canonical'"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"warmup_steps": 1.5}, "warmup_steps"),
        ({"layers": []}, "layers"),
        ({"layers": [0, "1"]}, "layers"),
        ({"mode": "relativ"}, "Did you mean 'relative'"),
        ({"relative_form": "infonse"}, "Did you mean 'infonce'"),
        ({"temperature": 0.0}, "temperature.*> 0"),
        ({"temperature": -1.0}, "temperature"),
        ({"mode": "consistncy"}, "Did you mean 'consistency'"),
        ({"divergence": "kld"}, "Did you mean 'kl'"),
        ({"teacher": "frozn"}, "Did you mean 'frozen'"),
        ({"divergence": "js", "teacher": "frozen"}, "teacher.*'js'.*no teacher"),
        ({"ema_decay": 1.0}, r"ema_decay.*\[0, 1\)"),
        ({"teacher_temperature": 0.0}, "teacher_temperature.*> 0"),
        ({"confidence_threshold": 1.0}, r"confidence_threshold.*\[0, 1\)"),
        ({"confidence_threshold": -0.1}, "confidence_threshold"),
        ({"fresh_variants": -1}, "fresh_variants.*\\[0, 64\\]"),
        ({"fresh_variants": 2, "fresh_kinds": ["tpyo"]}, "Did you mean 'typo'"),
        ({"fresh_variants": 2, "fresh_kinds": ["option_shuffle"]}, "free-text prompt.*Usable: typo, casing, whitespace"),
        ({"fresh_variants": 2, "fresh_kinds": "typo"}, "fresh_kinds.*list"),
        ({"fixed_variants": False}, "fixed_variants.*fresh_variants >= 1"),
        ({"unlabeled_max_new_tokens": 0}, "unlabeled_max_new_tokens"),
        ({"unlabeled_task_loss": "yes"}, "unlabeled_task_loss.*true or false"),
        ({"unlabeled_task_loss": 1}, "unlabeled_task_loss.*true or false"),
        ({"fixed_variants": 0, "fresh_variants": 1}, "fixed_variants.*true or false"),
        ({"weight_scale": "relativ"}, "weight_scale.*Did you mean 'relative'"),
        ({"weight_scale": None}, "weight_scale"),
    ],
)
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(SagoInputError, match=match):
        StabilityConfig(**kwargs)


def test_config_warmup_and_parser():
    cfg = StabilityConfig(act_weight=0.4, conf_weight=0.2, warmup_steps=4)
    assert cfg.weights_at(0) == (0.0, 0.0)
    assert cfg.weights_at(2) == pytest.approx((0.2, 0.1))
    assert cfg.weights_at(100) == (0.4, 0.2)
    assert StabilityConfig(layers=-1).layers == [-1]
    (parsed,) = HfArgumentParser(StabilityConfig).parse_args_into_dataclasses(
        ["--act_weight", "0.5", "--mode", "anchor", "--layers", "0", "-1"]
    )
    assert parsed.act_weight == 0.5 and parsed.mode == "anchor" and parsed.layers == [0, -1]
    (parsed,) = HfArgumentParser(StabilityConfig).parse_args_into_dataclasses(
        ["--mode", "consistency", "--teacher", "ema", "--fresh_variants", "2", "--fresh_kinds", "typo", "casing",
         "--fixed_variants", "false", "--confidence_threshold", "0.3"])
    assert (parsed.mode, parsed.teacher, parsed.fresh_variants, parsed.fresh_kinds, parsed.fixed_variants,
            parsed.confidence_threshold) == ("consistency", "ema", 2, ["typo", "casing"], False, 0.3)
    assert StabilityConfig().kinds_to_draw == ["typo", "casing", "whitespace"]
    (parsed,) = HfArgumentParser(StabilityConfig).parse_args_into_dataclasses(
        ["--mode", "consistency", "--unlabeled_task_loss", "true", "--weight_scale", "relative"])
    assert (parsed.unlabeled_task_loss, parsed.weight_scale) == (True, "relative")
    assert (StabilityConfig().unlabeled_task_loss, StabilityConfig().weight_scale) == (False, "absolute")
    with pytest.raises(SagoInputError, match="out of range"):
        StabilityLoss(StabilityConfig(layers=[0, 4]), make_tiny_model("llama", layers=4, ids=SPECIALS_FIRST, eval_mode=False))
    assert StabilityLoss(StabilityConfig(act_weight=0.1), make_tiny_model("llama", layers=8, ids=SPECIALS_FIRST, eval_mode=False)).layers == [1, 3, 5, 7]
    assert StabilityLoss(StabilityConfig(act_weight=0.0), make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False)).layers == []


# ------------------------------------------------------------------------------------------- references
def _cos_dist(a: torch.Tensor, b: torch.Tensor) -> float:
    return 1.0 - float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


def _kl(p: torch.Tensor, q: torch.Tensor) -> float:
    p, q = p.double(), q.double()
    return float(sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p.tolist(), q.tolist()) if pi > 0))


def _relative_reference(pooled_by_group, n_layers, form, temperature):
    """Per layer, loops over all pairs of the batch: within / between (ratio) or SupCon (infonce)."""
    g = len(pooled_by_group)
    per_layer = []
    for li in range(n_layers):
        vec = [[v[li] for v in grp] for grp in pooled_by_group]
        if form == "ratio":
            between = [_cos_dist(a, b) for p in range(g) for q in range(g) if p != q for a in vec[p] for b in vec[q]]
            b = sum(between) / len(between)
            within = [sum(_cos_dist(x[i], x[j]) for i in range(len(x)) for j in range(i + 1, len(x)))
                      / (len(x) * (len(x) - 1) / 2) for x in vec]
            per_layer.append(sum(w / b for w in within) / g)
        else:
            flat = [(p, v) for p in range(g) for v in vec[p]]
            k = len(vec[0])
            total = 0.0
            for i, (gi, vi) in enumerate(flat):
                sims = [(1 - _cos_dist(vi, vj)) / temperature for j, (_, vj) in enumerate(flat) if j != i]
                lse = math.log(sum(math.exp(z) for z in sims))
                pos = [(1 - _cos_dist(vi, vj)) / temperature for j, (gj, vj) in enumerate(flat) if j != i and gj == gi]
                total += lse - sum(pos) / len(pos) - math.log(k - 1)
            per_layer.append(total / len(flat))
    return sum(per_layer) / len(per_layer)


def _reference(model, tok, items, *, layers, mode, pooling, form="ratio", temperature=0.1):
    """Each variant run alone (no padding), hidden states from output_hidden_states, loops over pairs."""
    act_groups, conf_groups, pooled_by_group = [], [], []
    for item in items:
        k = len(item["variants"])
        c = item.get("canonical", 0)
        target = tok(item["target"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        pooled, dists = [], []
        for variant in item["variants"]:
            prompt = tok(variant)["input_ids"]
            ids = torch.tensor([prompt + target])
            with torch.no_grad():
                out = model(ids, output_hidden_states=True)
            p, t = len(prompt), len(target)
            if pooling == "target":
                pooled.append([out.hidden_states[layer + 1][0, p : p + t].mean(0) for layer in layers])
            else:
                pooled.append([out.hidden_states[layer + 1][0, p - 1] for layer in layers])
            dists.append(torch.softmax(out.logits[0, p - 1 : p - 1 + t].double(), -1))
        pooled_by_group.append(pooled)
        per_layer = []
        for li in range(len(layers)):
            if mode != "anchor":
                pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
                per_layer.append(sum(_cos_dist(pooled[i][li], pooled[j][li]) for i, j in pairs) / len(pairs))
            else:
                per_layer.append(sum(_cos_dist(pooled[j][li], pooled[c][li]) for j in range(k) if j != c) / (k - 1))
        act_groups.append(sum(per_layer) / len(per_layer))
        per_pos = []
        for pos in range(len(target)):
            ps = [dists[j][pos] for j in range(k)]
            if mode != "anchor":
                m = sum(ps) / k
                per_pos.append(sum(_kl(p, m) for p in ps) / k)
            else:
                per_pos.append(sum(_kl(ps[c], ps[j]) for j in range(k) if j != c) / (k - 1))
        conf_groups.append(sum(per_pos) / len(per_pos))
    act = sum(act_groups) / len(act_groups)
    if mode == "relative":
        act = _relative_reference(pooled_by_group, len(layers), form, temperature)
    return act, sum(conf_groups) / len(conf_groups)


@pytest.mark.parametrize(("mode", "form"), [("centroid", "ratio"), ("anchor", "ratio"), ("relative", "ratio"),
                                            ("relative", "infonce")])
@pytest.mark.parametrize("pooling", ["target", "last"])
def test_terms_match_unbatched_reference(tok, mode, form, pooling):
    model = make_tiny_model("llama", layers=3, seed=1, ids=SPECIALS_FIRST, eval_mode=False)
    items = tiny_groups(3)  # different target lengths across groups, canonical=1 in one group
    cfg = StabilityConfig(act_weight=1.0, conf_weight=1.0, mode=mode, pooling=pooling, layers=[0, 1],
                          relative_form=form, temperature=0.5)
    batch = VariantGroupCollator(tok)(items)
    with torch.no_grad():
        _, terms = StabilityLoss(cfg, model)(model, batch)
    ref_act, ref_conf = _reference(model, tok, items, layers=[0, 1], mode=mode, pooling=pooling, form=form,
                                   temperature=0.5)
    assert terms.act.dtype == torch.float32 and terms.conf.dtype == torch.float32
    assert float(terms.act) == pytest.approx(ref_act, abs=2e-5)
    assert float(terms.conf.detach()) == pytest.approx(ref_conf, abs=2e-6)


def test_last_layer_is_the_block_output_before_the_final_norm(tok, batch):
    model = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False)
    model_inputs, _ = split_batch(batch)
    with HiddenCapture(model, [1]) as cap, torch.no_grad():
        out = model(**model_inputs, output_hidden_states=True)
    assert torch.allclose(model.model.norm(cap.hidden[1]), out.hidden_states[-1])


def test_confidence_from_final_hidden_equals_confidence_from_logits(batch):
    # Projecting the captured final hidden states (the default; TRL's fused head builds no logits) gives the
    # same term as the model's own logits; the first batch with logits checks it and keeps the hidden path.
    model = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False)
    loss = StabilityLoss(StabilityConfig(act_weight=0.0, conf_weight=1.0, mode="anchor"), model)
    model_inputs, groups = split_batch(batch)
    with loss.capture(model) as cap, torch.no_grad():
        out = model(**model_inputs)
    with torch.no_grad():
        from_hidden = loss.terms(groups, cap, model=model).conf
        assert loss.head_from_hidden is None
        checked = loss.terms(groups, cap, model=model, logits=out.logits).conf
        assert loss.head_from_hidden is True
        loss.head_from_hidden = False
        from_logits = loss.terms(groups, cap, logits=out.logits).conf
    assert float(from_hidden) == pytest.approx(float(from_logits), abs=1e-6)
    assert float(checked) == float(from_hidden)


def test_falls_back_to_the_logits_when_the_head_differs(batch):
    model = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False)
    loss = StabilityLoss(StabilityConfig(act_weight=0.0, conf_weight=1.0), model)
    model_inputs, groups = split_batch(batch)
    with loss.capture(model) as cap, torch.no_grad():
        out = model(**model_inputs)
    model.config.final_logit_softcapping = 0.5  # the projection now differs from the returned logits
    with torch.no_grad(), pytest.warns(UserWarning, match="uses the logits instead"):
        fallback = loss.terms(groups, cap, model=model, logits=out.logits).conf
    assert loss.head_from_hidden is False
    model.config.final_logit_softcapping = None
    with torch.no_grad():
        assert float(fallback) == pytest.approx(float(loss.terms(groups, cap, logits=out.logits).conf), abs=1e-7)


@pytest.mark.parametrize("mode", ["centroid", "anchor", "relative", "consistency"])
def test_terms_are_float64_for_a_float64_model(batch, mode):
    model = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False).double()
    with torch.no_grad():
        _, terms = StabilityLoss(StabilityConfig(act_weight=1.0, conf_weight=1.0, mode=mode), model)(model, batch)
    assert terms.act.dtype == torch.float64 and terms.conf.dtype == torch.float64


def test_relative_mode_with_a_single_group_adds_zero_and_warns(tok):
    model = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False)
    loss_fn = StabilityLoss(StabilityConfig(act_weight=1.0, conf_weight=0.0, mode="relative"), model)
    with pytest.warns(UserWarning, match="single group"):
        _, terms = loss_fn(model, VariantGroupCollator(tok)(tiny_groups(1)))
    assert float(terms.act) == 0.0 and loss_fn.single_group_batches == 1
    _, terms = loss_fn(model, VariantGroupCollator(tok)(tiny_groups(2)))
    assert float(terms.act.detach()) > 0 and loss_fn.single_group_batches == 1


@pytest.mark.parametrize("mode", ["centroid", "anchor", "relative", "consistency"])
def test_terms_are_float32_under_bf16_autocast(batch, mode):
    model = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, terms = StabilityLoss(StabilityConfig(act_weight=1.0, conf_weight=1.0, mode=mode), model)(model, batch)
    assert out.logits.dtype == torch.bfloat16
    assert terms.act.dtype == torch.float32 and terms.conf.dtype == torch.float32
    (out.loss + terms.weighted(1.0, 1.0)).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("settings", [{"teacher_temperature": 2.0, "confidence_threshold": 0.005},
                                      {"divergence": "js"}, {"teacher": "frozen"}])
def test_consistency_under_bf16_autocast_is_close_to_float32(batch, settings):
    from peft import LoraConfig, get_peft_model

    from sago_train.training.teacher import Teacher

    model = get_peft_model(make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    cfg = StabilityConfig(act_weight=0.0, conf_weight=1.0, mode="consistency", **settings)
    loss, teacher = StabilityLoss(cfg, model), Teacher(cfg.teacher, model)
    _, reference = loss(model, batch, teacher=teacher)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, terms = loss(model, batch, teacher=teacher)
    assert out.logits.dtype == torch.bfloat16 and terms.conf.dtype == torch.float32
    assert float(terms.conf.detach()) == pytest.approx(float(reference.conf.detach()), rel=0.1, abs=1e-4)
    terms.conf.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


# -------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize(("term", "mode", "form"), [("act", "centroid", "ratio"), ("conf", "centroid", "ratio"),
                                                    ("act", "relative", "ratio"), ("act", "relative", "infonce")])
def test_gradient_matches_finite_differences(tok, term, mode, form):
    # Both terms stay float64 for a float64 model (the loss's docstring says so; the audit found L_act cast
    # to float32, whose rounding would swamp a finite difference). Anchor mode detaches the canonical side,
    # so its loss-level gradient is not the derivative of the value; its functions are gradchecked with the
    # canonical side held fixed in test_functional.py and test_divergence.py.
    model = make_tiny_model("llama", layers=2, hidden=16, seed=2, ids=SPECIALS_FIRST, eval_mode=False).double()
    batch = VariantGroupCollator(tok)(tiny_groups(2))
    cfg = StabilityConfig(act_weight=1.0 if term == "act" else 0.0, conf_weight=1.0 if term == "conf" else 0.0,
                          pooling="target", layers=[0, 1], mode=mode, relative_form=form, temperature=0.5)
    loss_fn = StabilityLoss(cfg, model)

    def value() -> torch.Tensor:
        result = getattr(loss_fn(model, batch)[1], term)
        assert result.dtype == torch.float64
        return result

    params = [model.model.layers[0].mlp.down_proj.weight, model.model.layers[1].self_attn.q_proj.weight]
    if term == "conf":
        params.append(model.lm_head.weight)
    model.zero_grad()
    value().backward()
    # Llama's RMSNorm computes in float32 even in a float64 model (~3e-10 of noise on the value here), so the
    # step is 1e-3 (truncation error ~1e-5 relative) rather than a float64-sized one.
    eps = 1e-3
    for param in params:
        # The three entries with the largest gradient, so the comparison is not between two zeros.
        for flat in param.grad.abs().flatten().topk(3).indices.tolist():
            idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), param.shape))
            analytic = float(param.grad[idx])
            with torch.no_grad():
                old = float(param[idx])
                param[idx] = old + eps
                plus = float(value())
                param[idx] = old - eps
                minus = float(value())
                param[idx] = old
            numeric = (plus - minus) / (2 * eps)
            assert analytic == pytest.approx(numeric, rel=2e-4, abs=1e-7), (term, idx)


# ------------------------------------------------------------------------------- capture and checkpointing
def _old_style_checkpointing(model, use_reentrant: bool) -> None:
    """Emulate transformers<5 GradientCheckpointingLayer: the checkpoint wraps the block's whole ``__call__``,
    so module hooks run inside it and fire again when backward recomputes the block."""
    for layer in model.model.layers:
        base = type(layer)

        def __call__(self, *args, **kwargs):  # noqa: N807
            call = functools.partial(torch.nn.Module.__call__, self, **kwargs)
            return checkpoint(call, *args, use_reentrant=use_reentrant)

        layer.__class__ = type(f"OldStyle{base.__name__}", (base,), {"__call__": __call__})


def _loss_and_grads(model, batch, cfg):
    model.zero_grad()
    # use_cache=False as under any activation checkpointing: a recomputed block would append to the cache.
    out, terms = StabilityLoss(cfg, model)(model, batch, use_cache=False)
    total = out.loss + terms.weighted(1.0, 1.0)
    total.backward()
    return float(total.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_recomputed_blocks_are_counted_once(batch):
    cfg = StabilityConfig(act_weight=1.0, conf_weight=1.0, layers=[0, 1])
    model = make_tiny_model("llama", layers=2, seed=3, ids=SPECIALS_FIRST, eval_mode=False).train()
    ref_loss, ref_grads = _loss_and_grads(model, batch, cfg)
    _old_style_checkpointing(model, use_reentrant=False)
    fired = []
    model.model.layers[0].register_forward_hook(lambda *_: fired.append(torch.is_grad_enabled()))
    # Without early stop, the recomputation runs the whole block, forward hooks included.
    with set_checkpoint_early_stop(False):
        loss, grads = _loss_and_grads(model, batch, cfg)
    assert len(fired) == 2  # forward + recomputation in backward: the hook really fires twice
    assert loss == pytest.approx(ref_loss, abs=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        assert torch.allclose(grads[name], ref_grads[name], atol=1e-6), name


def test_reentrant_checkpoint_around_hooks_is_a_clear_error(batch):
    model = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False).train()
    _old_style_checkpointing(model, use_reentrant=True)
    model.enable_input_require_grads()
    with pytest.raises(SagoInputError, match="use_reentrant"):
        StabilityLoss(StabilityConfig(act_weight=0.1, layers=[0]), model)(model, batch, use_cache=False)


def test_first_capture_wins_within_one_window(batch):
    model = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False).train()
    model_inputs, _ = split_batch(batch)
    with HiddenCapture(model, [0, 1]) as cap:
        model(**model_inputs)
        with torch.no_grad():
            model(**model_inputs)  # e.g. a metrics-only forward of the trainer
    assert cap.repeats == 2
    assert cap.hidden[0].requires_grad and cap.hidden[1].requires_grad
    cap.check()


# ---------------------------------------------------------------------------------------- batch errors
def _groups(batch):
    return split_batch(batch)[1]


def test_bad_batches_raise_clear_errors(batch):
    ids = batch["input_ids"]
    # A group whose variants do not share the target tokens.
    bad = dict(batch, input_ids=ids.clone())
    p = int(batch["prompt_length"][1])
    bad["input_ids"][1, p] = (bad["input_ids"][1, p] + 1) % 200
    with pytest.raises(SagoInputError, match="different target tokens"):
        group_layout(_groups(bad), bad["input_ids"])
    # Different target lengths within a group.
    bad = dict(batch, target_length=batch["target_length"].clone())
    bad["target_length"][0] -= 1
    with pytest.raises(SagoInputError, match="different lengths"):
        group_layout(_groups(bad))
    # An empty target.
    bad = dict(batch, target_length=torch.zeros_like(batch["target_length"]))
    with pytest.raises(SagoInputError, match="empty target"):
        group_layout(_groups(bad))
    # K < 2: one row per group.
    one = {k: v[::3] for k, v in batch.items()}
    one["variant_index"] = torch.zeros_like(one["variant_index"])
    with pytest.raises(SagoInputError, match="at least 2 variants"):
        group_layout(_groups(one))
    # A group split (a batch sliced across devices).
    cut = {k: v[:4] for k, v in batch.items()}
    with pytest.raises(SagoInputError, match="split"):
        group_layout(_groups(cut))
    # A canonical index out of range.
    bad = dict(batch, canonical_index=torch.full_like(batch["canonical_index"], 3))
    with pytest.raises(SagoInputError, match="canonical"):
        group_layout(_groups(bad))
    with pytest.raises(SagoInputError, match="group_index"):
        StabilityLoss(StabilityConfig(), make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False))(make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False), {"input_ids": ids})


@pytest.mark.parametrize("arch", ["gpt2", "qwen2", "gpt_neox"])
def test_other_architectures(tok, batch, arch):
    import transformers as tf

    torch.manual_seed(0)
    common = dict(vocab_size=len(tok), bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=3, n_head=2, n_positions=256, **common))
    elif arch == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                                   num_attention_heads=2, num_key_value_heads=2, **common))
    else:
        model = tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                                       num_attention_heads=2, **common))
    loss = StabilityLoss(StabilityConfig(act_weight=1.0, conf_weight=1.0, layers=[0, -1]), model)
    out, terms = loss(model, batch)
    assert loss.head_from_hidden is True  # the projection of the final hidden states matched the logits
    (out.loss + terms.weighted(1.0, 1.0)).backward()
    assert torch.isfinite(terms.act) and torch.isfinite(terms.conf) and terms.act > 0


# ------------------------------------------------------------------------------------------ consistency
def _consistency_reference(student, teacher, tok, items, temperature, threshold, divergence="kl"):
    """Each variant run alone (no padding): per position, torch's kl_div from the tempered teacher given the
    canonical prompt to each other variant (or the pair JS), positions below the threshold dropped."""
    per_group = []
    for item in items:
        c = item.get("canonical", 0)
        target = tok(item["target"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        t = len(target)

        def dists(model, prompt_text, target=target, t=t):
            prompt = tok(prompt_text)["input_ids"]
            with torch.no_grad():
                logits = model(torch.tensor([prompt + target])).logits[0].double()
            return logits[len(prompt) - 1 : len(prompt) - 1 + t]

        teacher_logits = dists(teacher, item["variants"][c]) / temperature
        students = [dists(student, v) for j, v in enumerate(item["variants"]) if j != c]
        log_t = torch.log_softmax(teacher_logits, -1)
        keep = log_t.exp().amax(-1) >= threshold
        values = []
        for pos in range(t):
            if not keep[pos]:
                continue
            per_k = []
            for z in students:
                log_s = torch.log_softmax(z[pos], -1)
                if divergence == "kl":
                    per_k.append(float(torch.nn.functional.kl_div(log_s, log_t[pos], log_target=True, reduction="sum")))
                else:
                    m = torch.log((log_s.exp() + log_t[pos].exp()) / 2)
                    per_k.append(0.5 * float(torch.nn.functional.kl_div(m, log_s, log_target=True, reduction="sum")
                                             + torch.nn.functional.kl_div(m, log_t[pos], log_target=True, reduction="sum")))
            values.append(sum(per_k) / len(per_k))
        per_group.append(sum(values) / max(len(values), 1))
    return sum(per_group) / len(per_group)


@pytest.mark.parametrize(("divergence", "temperature", "quantile"), [("kl", 1.0, None), ("kl", 2.0, 0.5),
                                                                      ("js", 1.5, 0.3)])
def test_consistency_term_matches_kl_div_reference(tok, divergence, temperature, quantile):
    model = make_tiny_model("llama", layers=4, ids=SPECIALS_FIRST, eval_mode=True)
    items = tiny_groups(3)
    items[1] = dict(items[1], canonical=2)
    batch = VariantGroupCollator(tok)(items)
    threshold = 0.0
    if quantile is not None:  # a threshold that drops some positions and keeps others
        with torch.no_grad():
            probs = torch.softmax(model(input_ids=batch["input_ids"]).logits / temperature, -1).amax(-1)
        threshold = float(torch.quantile(probs[batch["target_mask"]], quantile))
    cfg = StabilityConfig(act_weight=0.0, conf_weight=1.0, mode="consistency", divergence=divergence,
                          teacher_temperature=temperature, confidence_threshold=threshold)
    _, terms = StabilityLoss(cfg, model)(model, batch)
    expected = _consistency_reference(model, model, tok, items, temperature, threshold, divergence)
    assert float(terms.conf.detach()) == pytest.approx(expected, abs=1e-6)
    assert float(terms.conf.detach()) > 0


def test_consistency_with_a_frozen_lora_teacher_matches_the_base_model_reference(tok):
    from peft import LoraConfig, get_peft_model

    from sago_train.training.teacher import Teacher

    base = make_tiny_model("llama", layers=4, ids=SPECIALS_FIRST, eval_mode=True)
    student = get_peft_model(make_tiny_model("llama", layers=4, ids=SPECIALS_FIRST, eval_mode=True),
                             LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(3)
    with torch.no_grad():  # a trained-looking adapter, so that student and base differ
        for name, p in student.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    items = tiny_groups(2)
    batch = VariantGroupCollator(tok)(items)
    cfg = StabilityConfig(act_weight=0.1, conf_weight=1.0, mode="consistency", teacher="frozen", teacher_temperature=1.3)
    _, terms = StabilityLoss(cfg, student)(student, batch, teacher=Teacher("frozen", student))
    assert float(terms.conf.detach()) == pytest.approx(_consistency_reference(student, base, tok, items, 1.3, 0.0), abs=1e-6)
    # ... and not the self-teacher's value (the teacher really is the base model).
    assert float(terms.conf.detach()) != pytest.approx(_consistency_reference(student, student, tok, items, 1.3, 0.0), abs=1e-4)
    assert terms.act is not None and float(terms.act.detach()) > 0  # the anchor activation term stays on


@pytest.mark.parametrize(("divergence", "flows"), [("kl", False), ("js", True)])
def test_consistency_gradient_reaches_the_canonical_rows_only_with_js(tok, divergence, flows):
    """Through the model: the logits of the canonical rows get no gradient from L_conf with the stop-gradient KL,
    and do with the symmetric JS control; the other rows get one either way."""
    model = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False)
    batch = VariantGroupCollator(tok)(tiny_groups(2))
    cfg = StabilityConfig(act_weight=0.0, conf_weight=1.0, mode="consistency", divergence=divergence)
    kept = {}

    def keep(module, inputs, output):
        output.retain_grad()
        kept["logits"] = output

    handle = model.lm_head.register_forward_hook(keep)
    try:
        _, terms = StabilityLoss(cfg, model)(model, batch)
    finally:
        handle.remove()
    terms.conf.backward()
    # The confidence term's rows: the LM head applied to the target-predicting hidden states, [G, T, K, V].
    grad = kept["logits"].grad
    assert grad.shape[:3] == (2, int(batch["target_length"].max()), 3)
    canonical = torch.zeros(grad.shape[:3], dtype=torch.bool)
    for g, c in enumerate(batch["canonical_index"].view(2, 3)[:, 0].tolist()):
        canonical[g, :, c] = True
    assert (float(grad[canonical].abs().max()) > 0) == flows
    assert float(grad[~canonical].abs().max()) > 0


# ------------------------------------------------------------------------------------------ weight_scale
def test_relative_weight_scale_rescales_each_term_to_the_task_loss_with_the_last_ratio_as_fallback():
    """lambda * L * stopgrad(task / L): the value lambda * task, the gradient grad(task) + lambda * (task / L)
    * grad(L) (by hand with autograd); a micro-batch without a task loss, or with a term at 0, uses the last
    ratio that had both (1 before any); 'absolute' is lambda * L."""
    from sago_train.training.loss import StabilityTerms

    def pieces(x):
        return (x ** 2).sum(), x.sin().sum().abs() * 0.01, x.exp().sum() * 0.1  # task, act, conf

    lam_act, lam_conf = 0.3, 2.0
    cfg = StabilityConfig(act_weight=lam_act, conf_weight=lam_conf, weight_scale="relative")
    model = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST)  # only resolves the layers here
    loss_fn = StabilityLoss(cfg, model)
    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    task, act, conf = pieces(x)
    total = task + loss_fn.weighted(StabilityTerms(act=act, conf=conf), task, lam_act, lam_conf)
    (grad,) = torch.autograd.grad(total, x)
    task, act, conf = pieces(x)
    by_hand = [torch.autograd.grad(v, x)[0] for v in (task, act, conf)]
    r_act, r_conf = float((task / act).detach()), float((task / conf).detach())
    assert float(total.detach()) == pytest.approx(float(task.detach()) * (1 + lam_act + lam_conf), rel=1e-12)
    assert torch.allclose(grad, by_hand[0] + lam_act * r_act * by_hand[1] + lam_conf * r_conf * by_hand[2],
                          rtol=1e-12)
    assert [float(r) for r in loss_fn.last_ratios] == pytest.approx([r_act, r_conf], rel=1e-12)
    # No task loss (a micro-batch of unlabeled prompts): the last ratios, not task / L = 0.
    act2, conf2 = torch.tensor(0.7, dtype=torch.float64), torch.tensor(0.2, dtype=torch.float64)
    zero = torch.zeros((), dtype=torch.float64)
    got = loss_fn.weighted(StabilityTerms(act=act2, conf=conf2), zero, lam_act, lam_conf)
    assert float(got) == pytest.approx(lam_act * r_act * 0.7 + lam_conf * r_conf * 0.2, rel=1e-12)
    # A term at 0 (every position masked out) keeps its last ratio; the other term takes this batch's.
    task3 = torch.tensor(4.0, dtype=torch.float64)
    got = loss_fn.weighted(StabilityTerms(act=zero, conf=conf2), task3, lam_act, lam_conf)
    assert float(got) == pytest.approx(lam_conf * 4.0, rel=1e-12)
    assert [float(r) for r in loss_fn.last_ratios] == pytest.approx([r_act, 4.0 / 0.2], rel=1e-12)
    # Evaluation does not move the ratios (update=False).
    loss_fn.weighted(StabilityTerms(act=act2, conf=conf2), task3, lam_act, lam_conf, update=False)
    assert [float(r) for r in loss_fn.last_ratios] == pytest.approx([r_act, 4.0 / 0.2], rel=1e-12)
    # Before any micro-batch with both: ratio 1.
    fresh = StabilityLoss(cfg, model)
    assert float(fresh.weighted(StabilityTerms(conf=conf2), zero, 0.0, lam_conf)) == pytest.approx(lam_conf * 0.2)
    # 'absolute' (the default): lambda * L whatever the task loss.
    plain = StabilityLoss(StabilityConfig(act_weight=lam_act, conf_weight=lam_conf), model)
    got = plain.weighted(StabilityTerms(act=act2, conf=conf2), task3, lam_act, lam_conf)
    assert float(got) == pytest.approx(lam_act * 0.7 + lam_conf * 0.2, rel=1e-12)
