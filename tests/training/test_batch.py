"""The batch layout's target-predicting rows (training/batch.py), and their selection during the forward
(model/hooks.py's tap, used by StabilityLoss) against the previous selection from the returned logits."""

from __future__ import annotations

import pytest
import torch

from sago_train.training.batch import group_layout, predicting_index, predicting_rows, split_batch
from sago_train.training.collator import VariantGroupCollator
from sago_train.training.loss import StabilityConfig, StabilityLoss
from tests._helpers.tiny import (
    SPECIALS_FIRST,
    TAGGED_TEMPLATE,
    make_byte_tokenizer,
    make_tiny_model,
    tiny_groups,
)


@pytest.fixture(scope="module")
def batch():
    return VariantGroupCollator(make_byte_tokenizer(TAGGED_TEMPLATE, SPECIALS_FIRST))(tiny_groups(3))


def test_predicting_rows_match_a_loop_over_groups_positions_and_variants(batch):
    model_inputs, groups = split_batch(batch)
    ids = model_inputs["input_ids"]
    layout = group_layout(groups, ids)
    x = torch.randn(*ids.shape, 5)
    rows, mask = predicting_rows(x, layout)
    row_index, pos_index, mask2 = predicting_index(layout, ids.shape[1])
    assert torch.equal(mask, mask2) and torch.equal(rows, x[row_index, pos_index])
    g, k, t = layout.num_groups, layout.group_size, layout.max_target
    assert rows.shape == (g, t, k, 5)
    order = layout.order.view(g, k)
    for gi in range(g):
        for j in range(t):
            for vi in range(k):
                r = int(order[gi, vi])
                plen, tlen = int(layout.prompt_length[r]), int(layout.target_length[r])
                assert bool(mask[gi, j]) == (j < tlen)
                if j < tlen:  # the distribution predicting target token j sits at prompt_length - 1 + j
                    assert torch.equal(rows[gi, j, vi], x[r, plen - 1 + j])
                    assert int(ids[r, plen + j]) == int(ids[int(order[gi, 0]), int(layout.prompt_length[order[gi, 0]]) + j])


# ------------------------------------------------------------------ target rows selected in the forward
def _step_grads(model, loss, batch, *, tap: bool, autocast: bool, logits_copy: bool = False):
    model.zero_grad(set_to_none=True)
    model_inputs, groups = split_batch(batch)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        extra = (groups, model_inputs["input_ids"]) if tap else ()
        with loss.capture(model, *extra) as cap:
            out = model(**model_inputs)
        logits = out.logits.clone() if logits_copy else out.logits
        terms = loss.terms(groups, cap, input_ids=model_inputs["input_ids"], logits=logits, model=model)
    (out.loss + terms.weighted(1.0, 1.0)).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return cap, out, terms, grads


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("mode", ["relative", "anchor"])
def test_rows_selected_in_the_forward_equal_the_rows_selected_afterwards(batch, autocast, mode):
    # With the batch given to capture(), the LM head's target-predicting rows are selected during the forward
    # (an identity autograd function whose backward adds their gradient into the task loss's); without it,
    # the previous path selects them from the returned logits. Same values, same gradients.
    model = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False)
    loss = StabilityLoss(StabilityConfig(act_weight=1.0, conf_weight=1.0, mode=mode), model)
    loss.head_from_hidden = False  # the logits path (what the first batch's check leaves for a plain head)
    cap, out, tapped, g_tapped = _step_grads(model, loss, batch, tap=True, autocast=autocast)
    assert type(out.logits.grad_fn).__name__ == "_TapRowsBackward" and cap.head_output is out.logits
    assert cap.head_rows is None  # handed to the divergence, which may overwrite them (consume=True)
    cap_ref, out_ref, ref, g_ref = _step_grads(model, loss, batch, tap=False, autocast=autocast)
    assert cap_ref.head_rows is None and type(out_ref.logits.grad_fn).__name__ != "_TapRowsBackward"
    assert torch.equal(out.logits, out_ref.logits)
    for name in ("act", "conf"):
        assert abs(float(getattr(tapped, name).detach()) - float(getattr(ref, name).detach())) <= 1e-6, name
    assert g_tapped.keys() == g_ref.keys() and g_tapped
    for name, g in g_tapped.items():
        assert torch.allclose(g, g_ref[name], atol=1e-5, rtol=0), name
    # logits that are not the head's output (a copy) take the previous path, with the same result
    _, _, copied, g_copied = _step_grads(model, loss, batch, tap=True, autocast=autocast, logits_copy=True)
    assert abs(float(copied.conf.detach()) - float(ref.conf.detach())) <= 1e-6
    for name, g in g_copied.items():
        assert torch.allclose(g, g_ref[name], atol=1e-5, rtol=0), name


def test_forward_selects_rows_in_the_forward_and_skips_sliced_or_gradless_head_outputs(batch):
    model = make_tiny_model("llama", layers=2, ids=SPECIALS_FIRST, eval_mode=False)
    loss = StabilityLoss(StabilityConfig(act_weight=0.0, conf_weight=1.0), model)
    out, _ = loss(model, batch)
    assert type(out.logits.grad_fn).__name__ == "_TapRowsBackward"
    model_inputs, groups = split_batch(batch)
    with loss.capture(model, groups, model_inputs["input_ids"]) as cap:
        # a slice of the sequence (no loss): not the rows' positions
        model(**{k: v for k, v in model_inputs.items() if k != "labels"}, logits_to_keep=1)
    assert cap.head_output is None and cap.head_rows is None
    with loss.capture(model, groups, model_inputs["input_ids"]) as cap, torch.no_grad():
        out = model(**model_inputs)  # no graph: the rows are plain indexing, the output is untouched
    assert cap.head_output is out.logits and out.logits.grad_fn is None
    rows, _ = loss._logit_rows(cap, out.logits, group_layout(groups, model_inputs["input_ids"]))
    assert rows is cap.head_rows
