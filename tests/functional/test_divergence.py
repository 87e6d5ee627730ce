"""js_divergence and anchor_kl against plain loop implementations, plus the numerical edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from sago_train.functional import anchor_kl, js_divergence
from sago_train.functional.divergence import divergence_from_logits


def _kl(p: list[float], q: list[float]) -> float:
    return sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q) if pi > 0)


def ref_js(probs: list[list[float]]) -> float:
    """Generalized JS with equal weights: mean_k KL(P_k || M), M the mean distribution."""
    k = len(probs)
    m = [sum(p[v] for p in probs) / k for v in range(len(probs[0]))]
    return sum(_kl(p, m) for p in probs) / k


def ref_anchor_kl(probs: list[list[float]], canonical: int) -> float:
    others = [p for i, p in enumerate(probs) if i != canonical]
    return sum(_kl(probs[canonical], q) for q in others) / len(others)


def _random_logprobs(*shape: int, seed: int = 0, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(*shape, generator=g, dtype=torch.float64) * scale, dim=-1)


def test_js_matches_reference():
    lp = _random_logprobs(4, 3, 7)
    got = js_divergence(lp)
    assert got.shape == (4,)
    for b in range(4):
        probs = lp[b].exp().tolist()
        assert got[b].item() == pytest.approx(ref_js(probs), abs=1e-10)


def test_anchor_kl_matches_reference_with_int_and_per_group_canonical():
    lp = _random_logprobs(5, 4, 6, seed=1)
    got = anchor_kl(lp, canonical=2)
    for b in range(5):
        assert got[b].item() == pytest.approx(ref_anchor_kl(lp[b].exp().tolist(), 2), abs=1e-10)
    canon = torch.tensor([0, 3, 1, 2, 0])
    got = anchor_kl(lp, canonical=canon)
    for b in range(5):
        assert got[b].item() == pytest.approx(ref_anchor_kl(lp[b].exp().tolist(), int(canon[b])), abs=1e-10)
    assert anchor_kl(lp, canonical=-1).allclose(anchor_kl(lp, canonical=3))


def test_known_values():
    # K disjoint one-hot distributions: JS reaches its maximum log K.
    for k in (2, 3, 5):
        lp = torch.log(torch.eye(k, dtype=torch.float64))
        assert js_divergence(lp).item() == pytest.approx(math.log(k), abs=1e-9)
    same = torch.log_softmax(torch.randn(4, 1, 9), -1).expand(4, 3, 9)  # 3 identical per row
    assert js_divergence(same).abs().max().item() < 1e-6
    assert anchor_kl(same).abs().max().item() < 1e-6


def test_inf_peaked_and_identical_are_finite_in_value_and_gradient():
    cases = []
    # -inf entries: masked vocabulary, shared and unshared across variants.
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.25, 0.75, 0.0], [1.0, 0.0, 0.0, 0.0]]))
    cases.append(lp)
    # Peaked: log_softmax of huge logits (probabilities that underflow to exactly 0).
    cases.append(torch.log_softmax(torch.randn(3, 6) * 1e4, -1))
    # Identical one-hots.
    one_hot = torch.full((3, 5), -float("inf"))
    one_hot[:, 1] = 0.0
    cases.append(one_hot)
    for lp in cases:
        for fn in (js_divergence, lambda x: anchor_kl(x, 0)):
            x = lp.clone().requires_grad_(True)
            value = fn(x)
            value.backward()
            assert torch.isfinite(value).all(), (fn, lp)
            assert torch.isfinite(x.grad).all(), (fn, lp)
    # The -inf case against the reference (0 log 0 = 0); anchor KL is infinite there mathematically only
    # where the canonical side has mass that a variant lacks, which the floor turns into a finite penalty.
    probs = cases[0].exp().tolist()
    assert js_divergence(cases[0]).item() == pytest.approx(ref_js(probs), abs=1e-6)
    assert anchor_kl(cases[0], 0).item() > 1.0


def test_float32_under_autocast_and_low_precision_inputs():
    lp64 = _random_logprobs(2, 3, 11, seed=3)
    lp_bf16 = lp64.to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        js = js_divergence(lp_bf16)
        kl = anchor_kl(lp_bf16, 1)
    assert js.dtype == torch.float32 and kl.dtype == torch.float32
    # Against the float64 value of the same (bf16-rounded) inputs.
    assert js.double().allclose(js_divergence(lp_bf16.double()), atol=1e-6)
    assert kl.double().allclose(anchor_kl(lp_bf16.double(), 1), atol=1e-6)
    assert js_divergence(lp64.half()).dtype == torch.float32


def test_gradcheck_float64():
    lp = _random_logprobs(2, 3, 5, seed=4).requires_grad_(True)
    assert torch.autograd.gradcheck(js_divergence, (lp,))
    # anchor_kl with the canonical side detached is not the gradient of the plain function; gradcheck
    # the non-canonical part by holding the canonical distribution fixed.
    canon = lp.detach()[:, :1]
    rest = lp.detach()[:, 1:].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda r: anchor_kl(torch.cat([canon, r], 1), 0), (rest,))


def test_gradcheck_float64_anchor_kl_per_group_canonical():
    # Per-group canonical indices (the loss's case): finite differences on the non-canonical rows with the
    # canonical rows held fixed, and the detached gradient of the real function equals that gradient.
    lp = _random_logprobs(3, 4, 5, seed=6)
    canon = torch.tensor([3, 0, 1])
    keep = torch.zeros(3, 4, 1, dtype=torch.bool)
    keep[torch.arange(3), canon] = True

    def anchored(x: torch.Tensor) -> torch.Tensor:
        return anchor_kl(torch.where(keep, lp, x), canon)

    rows = lp.clone().requires_grad_(True)
    assert anchor_kl(rows, canon).dtype == torch.float64
    assert torch.autograd.gradcheck(anchored, (rows,))
    x = lp.clone().requires_grad_(True)
    anchor_kl(x, canon).sum().backward()
    y = lp.clone().requires_grad_(True)
    anchored(y).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)


def test_anchor_kl_stops_gradient_at_the_canonical_side():
    lp = _random_logprobs(1, 3, 4, seed=5).float().requires_grad_(True)
    anchor_kl(lp, canonical=1).sum().backward()
    assert lp.grad[0, 1].abs().max().item() == 0.0
    assert lp.grad[0, 0].abs().max().item() > 0.0


def test_bad_shapes():
    with pytest.raises(ValueError, match="K=1"):
        js_divergence(torch.zeros(2, 1, 4))
    with pytest.raises(ValueError, match="shape"):
        anchor_kl(torch.zeros(4))
    with pytest.raises(ValueError, match="out of range"):
        anchor_kl(torch.zeros(2, 3, 4), canonical=3)


@pytest.mark.parametrize("canonical", [None, 2, "per-row"])
def test_fused_divergence_from_logits_matches_the_composition(canonical):
    g = torch.Generator().manual_seed(7)
    z = torch.randn(5, 9, 3, 11, generator=g, dtype=torch.float64) * 3  # 45 rows: several chunks
    z[0, 0, 1, :4] = -float("inf")  # masked vocabulary in one variant
    z[1, 2, :, 5] = -float("inf")  # masked in every variant
    z[2, 3, 0] = torch.linspace(-2e4, 0, 11, dtype=torch.float64)  # peaked
    canon = torch.randint(0, 3, (5, 9), generator=g) if canonical == "per-row" else canonical

    def reference(x):
        lp = torch.log_softmax(x, -1)
        return js_divergence(lp) if canon is None else anchor_kl(lp, canon)

    a = z.clone().requires_grad_(True)
    b = z.clone().requires_grad_(True)
    fused, ref = divergence_from_logits(a, canon), reference(b)
    assert fused.shape == (5, 9) and torch.allclose(fused, ref, atol=1e-12)
    w = torch.rand(5, 9, generator=g, dtype=torch.float64)
    (fused * w).sum().backward()
    (ref * w).sum().backward()
    assert torch.isfinite(a.grad).all()
    assert torch.allclose(a.grad, b.grad, atol=1e-12)


def test_fused_divergence_gradcheck_and_low_precision():
    z = torch.randn(2, 3, 4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(divergence_from_logits, (z,))
    zb = torch.randn(4, 3, 50, dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = divergence_from_logits(zb, 0)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert zb.grad.dtype == torch.bfloat16 and torch.isfinite(zb.grad.float()).all()
    ref = anchor_kl(torch.log_softmax(zb.detach().float(), -1), 0)
    assert torch.allclose(out, ref, atol=1e-6)
