"""js_divergence and anchor_kl against plain loop implementations, plus the numerical edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from sago_train.functional import anchor_kl, js_divergence
from sago_train.functional import divergence as divergence_module
from sago_train.functional.divergence import FUSED_MIN_ELEMENTS, LOGPROB_FLOOR, divergence_from_logits


@pytest.fixture
def fused_always(monkeypatch):
    """The fused function at any size, split into up to 8 chunks (small inputs otherwise take the
    composition, in one chunk)."""
    monkeypatch.setattr(divergence_module, "FUSED_MIN_ELEMENTS", 0)
    monkeypatch.setattr(divergence_module, "_CHUNK_MIN_BYTES", 0)


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
def test_fused_divergence_from_logits_matches_the_composition(canonical, fused_always):
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


def test_fused_divergence_gradcheck_and_low_precision(fused_always):
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


def _previous_general_path(z: torch.Tensor) -> torch.Tensor:
    """The fused function's general path (clamps, masks, recompute in backward), which it took everywhere
    before the fast path: a floor other than the default selects it, and with every log-probability above
    -5e3 that floor changes nothing."""
    return divergence_module._FusedDivergence.apply(z, None, -5.0e3)


def _count_fast_chunks(monkeypatch) -> list[int]:
    """Count the chunks the fast path served (forward, backward)."""
    served = []
    real = divergence_module._js_fast

    def counting(z, want_grad):
        out = real(z, want_grad)
        served.append(out is not None)
        return out

    monkeypatch.setattr(divergence_module, "_js_fast", counting)
    return served


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fast_path_equals_the_general_path_in_value_and_gradient(dtype, fused_always, monkeypatch):
    g = torch.Generator().manual_seed(3)
    z = (torch.randn(6, 5, 4, 300, generator=g) * 4).to(dtype)  # 30 rows: 8 chunks
    a, b = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    general = _previous_general_path(b)
    served = _count_fast_chunks(monkeypatch)
    fast = divergence_from_logits(a)
    assert len(served) == 8 and all(served)
    assert torch.allclose(fast, general, atol=1e-6, rtol=0)
    w = torch.rand(6, 5, generator=g, dtype=fast.dtype)
    (fast * w).sum().backward()
    assert len(served) == 16 and all(served)  # backward: the fast path too
    (general * w).sum().backward()
    assert torch.allclose(a.grad.double(), b.grad.double(), atol=1e-5, rtol=0)
    # and both equal the plain autograd composition
    c = z.clone().requires_grad_(True)
    ref = js_divergence(torch.log_softmax(c.double() if dtype == torch.float64 else c.float(), -1))
    (ref * w).sum().backward()
    assert torch.allclose(fast.double(), ref.double(), atol=1e-6, rtol=0)
    assert torch.allclose(a.grad.double(), c.grad.double(), atol=1e-5, rtol=0)


def test_a_chunk_below_the_floor_takes_the_general_path(fused_always, monkeypatch):
    g = torch.Generator().manual_seed(4)
    z = torch.randn(16, 3, 40, generator=g, dtype=torch.float64) * 3
    z[13, 1, :7] = -float("inf")  # only a late chunk needs the floor
    a, b = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    served = _count_fast_chunks(monkeypatch)
    out = divergence_from_logits(a)
    assert served == [True] * 6 + [False] + [True]  # 8 chunks of 2 rows; row 13 is in the 7th
    ref = js_divergence(torch.log_softmax(b, -1))
    assert torch.allclose(out, ref, atol=1e-12)
    out.sum().backward()
    ref.sum().backward()
    assert torch.isfinite(a.grad).all() and torch.allclose(a.grad, b.grad, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_path_is_chosen_by_size(dtype):
    # Under FUSED_MIN_ELEMENTS the composition (faster there); from it up the fused function; same values.
    g = torch.Generator().manual_seed(5)
    v_small = FUSED_MIN_ELEMENTS // 8 - 1
    v_large = FUSED_MIN_ELEMENTS // 8
    for v, fused in ((v_small, False), (v_large, True)):
        z = torch.randn(2, 4, v, generator=g).to(dtype).requires_grad_(True)
        out = divergence_from_logits(z)
        assert (type(out.grad_fn).__name__ == "_FusedDivergenceBackward") == fused, v
        ref = js_divergence(torch.log_softmax(z.detach().float(), -1))
        assert torch.allclose(out, ref, atol=1e-6, rtol=0)
        out.sum().backward()
        assert torch.isfinite(z.grad.float()).all()


def test_chunks_cover_the_rows_and_respect_the_size_bounds():
    for rows, k, v in ((1, 2, 10), (45, 3, 11), (32, 4, 49152), (4096, 4, 49152), (7, 2, 2**22)):
        chunks = divergence_module._chunks(rows, k, v)
        assert chunks[0][0] == 0 and chunks[-1][1] == rows
        assert all(a < b and b == c for (a, b), (c, _) in zip(chunks, chunks[1:] + [(rows, None)]))
        sizes = [(b - a) * k * v * 4 for a, b in chunks]
        # never above 64 MiB unless one row is; never under 1 MiB unless the input is (or a last remainder)
        assert all(s <= max(divergence_module._CHUNK_BYTES, k * v * 4) for s in sizes)
        assert all(s >= min(divergence_module._CHUNK_MIN_BYTES, rows * k * v * 4) for s in sizes[:-1])
        most_rows = max(divergence_module._CHUNK_BYTES // (k * v * 4), 1)
        assert len(chunks) <= max(divergence_module._CHUNK_PARTS, math.ceil(rows / most_rows))
    assert LOGPROB_FLOOR == -1.0e4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("canonical", [None, 1])
def test_consume_computes_the_gradient_in_the_forward_with_the_same_values(dtype, canonical, fused_always):
    # consume=True overwrites a disposable input with its gradient per unit of output; values and gradients
    # equal the non-consuming path, also where a chunk needs the general path (-inf).
    g = torch.Generator().manual_seed(6)
    base = (torch.randn(3, 10, 4, 50, generator=g) * 4).to(dtype)
    base[1, 7, 2, :9] = -float("inf")
    w = torch.rand(3, 10, generator=g, dtype=dtype)
    results = []
    for consume in (False, True):
        leaf = base.clone().requires_grad_(True)
        rows = leaf * 1.0  # a fresh non-leaf tensor that no node saved
        out = divergence_from_logits(rows, canonical, consume=consume)
        assert (type(out.grad_fn).__name__ == "_FusedDivergenceConsumingBackward") == consume
        (out * w).sum().backward()
        results.append((out.detach(), leaf.grad))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-6, rtol=0)
    assert torch.isfinite(results[1][1]).all()
    assert torch.allclose(results[0][1], results[1][1], atol=1e-5, rtol=0)


def test_consume_is_ignored_where_it_cannot_apply(fused_always):
    z = torch.randn(3, 4, 20, requires_grad=True)
    assert type(divergence_from_logits(z.to(torch.bfloat16), consume=True).grad_fn).__name__ == "_FusedDivergenceBackward"
    view = (z * 1.0)[:, :2]  # a view: its base may be in use
    assert type(divergence_from_logits(view, consume=True).grad_fn).__name__ == "_FusedDivergenceBackward"
    with torch.no_grad():
        x = z * 1.0
        before = x.clone()
        divergence_from_logits(x, consume=True)
        assert torch.equal(x, before)  # nothing to differentiate: the input is left alone


# ------------------------------------------------------------------------------- consistency mode's teacher
def _ref_teacher_kl(z: torch.Tensor, canon: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """Plain loops: mean over k != c of KL(softmax(teacher / T) || softmax(z_k)), with torch's kl_div."""
    out = torch.zeros(z.shape[0], dtype=torch.float64)
    for r in range(z.shape[0]):
        log_t = torch.log_softmax(teacher[r].double() / temperature, -1)
        terms = [torch.nn.functional.kl_div(torch.log_softmax(z[r, k].double(), -1), log_t, log_target=True,
                                            reduction="sum") for k in range(z.shape[1]) if k != int(canon[r])]
        out[r] = sum(terms) / len(terms)
    return out


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("consume", [False, True])
def test_teacher_kl_matches_kl_div_in_value_and_gradient(fused, consume, monkeypatch):
    if fused:
        monkeypatch.setattr(divergence_module, "FUSED_MIN_ELEMENTS", 0)
        monkeypatch.setattr(divergence_module, "_CHUNK_MIN_BYTES", 0)
    torch.manual_seed(0)
    z = torch.randn(6, 3, 11) * 2
    canon = torch.tensor([0, 1, 2, 0, 1, 2])
    teacher_logits = torch.randn(6, 11)
    teacher = torch.log_softmax(teacher_logits / 0.7, -1)
    zl = z.clone().requires_grad_(True)
    value = divergence_from_logits(zl.clone() if consume else zl, canon, teacher=teacher, consume=consume)
    ref_leaf = z.clone().double().requires_grad_(True)
    ref = _ref_teacher_kl(ref_leaf, canon, teacher_logits, 0.7)
    assert torch.allclose(value.double(), ref, atol=1e-6)
    weights = torch.rand(6)
    (value * weights).sum().backward()
    (ref * weights.double()).sum().backward()
    assert torch.allclose(zl.grad.double(), ref_leaf.grad, atol=1e-6)
    # The canonical variant adds no term and gets no gradient.
    assert float(zl.grad[torch.arange(6), canon].abs().max()) == 0.0


def test_consistency_divergence_kl_and_js_against_references():
    from sago_train.functional.divergence import consistency_divergence

    torch.manual_seed(1)
    z = torch.randn(2, 4, 3, 9, requires_grad=True)  # [G, T, K, V]
    canon = torch.tensor([1, 0])[:, None].expand(2, 4)
    for temperature in (1.0, 2.0):
        kl, top = consistency_divergence(z, canon, temperature=temperature)
        flat_z, flat_c = z.detach().reshape(8, 3, 9), canon.reshape(8)
        teacher = flat_z[torch.arange(8), flat_c]
        assert torch.allclose(kl.reshape(8).double(), _ref_teacher_kl(flat_z, flat_c, teacher, temperature), atol=1e-6)
        assert torch.allclose(top.reshape(8), torch.softmax(teacher / temperature, -1).amax(-1), atol=1e-6)
    js, _ = consistency_divergence(z, canon, divergence="js", temperature=2.0)
    flat_z = z.detach().reshape(8, 3, 9)
    for r in range(8):
        c = int(canon.reshape(8)[r])
        p_c = torch.softmax(flat_z[r, c] / 2.0, -1)
        pairs = [ref_js([p_c.tolist(), torch.softmax(flat_z[r, k], -1).tolist()]) for k in range(3) if k != c]
        assert float(js.detach().reshape(8)[r]) == pytest.approx(sum(pairs) / 2, abs=1e-6)


def test_consistency_gradient_stops_at_the_canonical_side_with_kl_not_with_js():
    from sago_train.functional.divergence import consistency_divergence

    torch.manual_seed(2)
    canon = torch.tensor([[0, 0], [2, 2]])
    rows = torch.arange(2)[:, None], torch.arange(2)[None, :], canon
    for divergence, flows in (("kl", False), ("js", True)):
        z = torch.randn(2, 2, 3, 7, requires_grad=True)
        value, _ = consistency_divergence(z, canon, divergence=divergence, temperature=1.5)
        value.sum().backward()
        canonical_grad = float(z.grad[rows].abs().max())
        assert (canonical_grad > 1e-6) == flows
        assert float(z.grad.abs().max()) > 1e-6
