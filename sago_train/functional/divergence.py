"""Divergences between K next-token distributions: the confidence term of the stability loss.

Both functions take log-probabilities (``log_softmax`` outputs) of shape ``[..., K, V]`` and reduce over
the K variants and the vocabulary. They compute in float32 (float64 when given float64, so that the
gradient can be checked by finite differences), whatever autocast does, and stay finite for peaked,
identical and ``-inf``-containing distributions, in the value and in the gradient.
"""

from __future__ import annotations

import math

import torch

# Log-probabilities are floored here before use. ``exp(-1e4)`` is exactly 0 in float32 and float64, so for
# any finite input the floor changes nothing but the handling of ``-inf`` (and of masses too small to be
# represented): with it, ``logsumexp`` over a column that is ``-inf`` for every variant stays finite, and so
# does its gradient, where ``-inf - (-inf)`` would otherwise give NaN.
LOGPROB_FLOOR = -1.0e4


def _prepare(logprobs: torch.Tensor, floor: float) -> torch.Tensor:
    if logprobs.dim() < 2:
        raise ValueError(f"expected log-probabilities of shape [..., K, V], got shape {tuple(logprobs.shape)}")
    k = logprobs.shape[-2]
    if k < 2:
        raise ValueError(f"need at least 2 distributions along dim -2, got K={k}")
    dtype = torch.float64 if logprobs.dtype == torch.float64 else torch.float32
    return logprobs.to(dtype).clamp_min(floor)


def _canonical_index(canonical: int | torch.Tensor, batch_shape: torch.Size, k: int, device: torch.device) -> torch.Tensor:
    if isinstance(canonical, int):
        if not -k <= canonical < k:
            raise ValueError(f"canonical index {canonical} is out of range for K={k}")
        return torch.full(batch_shape, canonical % k, dtype=torch.long, device=device)
    idx = canonical.to(device=device, dtype=torch.long)
    return idx.expand(batch_shape) if idx.dim() == 0 else idx


def js_divergence(logprobs: torch.Tensor, floor: float = LOGPROB_FLOOR) -> torch.Tensor:
    """Generalized Jensen-Shannon divergence of K distributions with equal weights, in nats.

    ``logprobs`` ``[..., K, V]`` -> ``[...]``. With ``M = mean_k P_k``, the value is
    ``mean_k KL(P_k || M) = H(M) - mean_k H(P_k)``, which lies in ``[0, log K]``. Computed as the KL form
    with ``p log p`` taken as 0 where ``p = 0``, so ``-inf`` entries (masked tokens) contribute nothing.

    Example:
        >>> import math
        >>> lp = torch.log(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))  # two disjoint one-hot distributions
        >>> round(float(js_divergence(lp)), 6) == round(math.log(2), 6)
        True
        >>> float(js_divergence(torch.log_softmax(torch.zeros(3, 5), -1)))  # identical distributions
        0.0
    """
    lp = _prepare(logprobs, floor)
    k = lp.shape[-2]
    log_m = torch.logsumexp(lp, dim=-2, keepdim=True) - math.log(k)
    p = lp.exp()
    # ``where`` rather than multiplying by p alone: it makes the contribution (and its gradient) of a zero
    # probability exactly 0 instead of 0 * (a huge finite difference).
    kl = torch.where(p > 0, p * (lp - log_m), torch.zeros_like(p)).sum(-1)  # [..., K]
    return kl.mean(-1)


def anchor_kl(
    logprobs: torch.Tensor,
    canonical: int | torch.Tensor = 0,
    floor: float = LOGPROB_FLOOR,
    *,
    teacher: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean over the non-canonical variants k of ``KL(stop_grad(P_canonical) || P_k)``, in nats.

    ``logprobs`` ``[..., K, V]`` -> ``[...]``. ``canonical`` is an index along K: an int, or a tensor of shape
    ``[...]`` with one index per distribution set. The canonical distribution is detached, so the gradient
    only moves the other variants towards it (the canonical phrasing is a fixed target). Where ``P_k`` is
    ``-inf`` but the canonical side has mass, the log-probability is read as the floor (-1e4 nats), which
    keeps the value finite instead of infinite.

    ``teacher`` (log-probabilities ``[..., V]``, detached) replaces ``P_canonical`` as the target: a tempered
    canonical distribution, or another model's (the consistency mode's teachers); the canonical variant still
    adds no term.

    Example:
        >>> lp = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.9, 0.1]]))
        >>> round(float(anchor_kl(lp, canonical=0)), 4)  # (0 + KL([.5,.5] || [.9,.1])) / 2
        0.2554
        >>> round(float(anchor_kl(lp, 0, teacher=lp[2])), 4)  # (KL([.9,.1] || [.5,.5]) + 0) / 2
        0.184
    """
    lp = _prepare(logprobs, floor)
    k = lp.shape[-2]
    idx = _canonical_index(canonical, lp.shape[:-2], k, lp.device)
    if teacher is None:
        anchor = torch.gather(lp, -2, idx[..., None, None].expand(*lp.shape[:-2], 1, lp.shape[-1])).detach()
    else:
        anchor = teacher.detach().to(lp.dtype).clamp_min(floor).unsqueeze(-2).expand(*lp.shape[:-2], 1, lp.shape[-1])
    p_anchor = anchor.exp()
    kl = torch.where(p_anchor > 0, p_anchor * (anchor - lp), torch.zeros_like(lp)).sum(-1)  # [..., K]
    # The canonical row's own term is 0 in value but not in gradient (it would pull P_canonical through the
    # non-detached side), so it is excluded rather than summed.
    is_canonical = torch.arange(k, device=lp.device) == idx[..., None]
    kl = torch.where(is_canonical, torch.zeros_like(kl), kl)
    return kl.sum(-1) / (k - 1)


# Rows of ``[K, V]`` processed at once by the fused functions: at most 1/8 of the input and at most 64 MiB of
# float32 per temporary, so that the float32 intermediates never add more than a fraction of the input; but
# never split below 1 MiB a chunk (smaller chunks bound nothing that matters and cost a Python loop per chunk).
_CHUNK_BYTES = 64 * 2**20
_CHUNK_MIN_BYTES = 2**20
_CHUNK_PARTS = 8
# Below this many elements ([..., K, V] in all) divergence_from_logits uses the plain autograd composition:
# there its memory is negligible (< 256 KiB) and the fused function's fixed cost (a custom autograd node, a
# check, a loop) made it up to 1.5x slower with bfloat16 input; from here up the fused path is 0.25-0.95x the
# composition's time (forward + backward, one CPU thread; BENCHMARKS.md "Stability loss").
FUSED_MIN_ELEMENTS = 2**16


def _chunks(rows: int, k: int, v: int) -> list[tuple[int, int]]:
    row_bytes = max(k * v * 4, 1)
    per = max(1, min(max(math.ceil(rows / _CHUNK_PARTS), _CHUNK_MIN_BYTES // row_bytes), _CHUNK_BYTES // row_bytes))
    return [(i, min(i + per, rows)) for i in range(0, rows, per)]


def _js_fast(z: torch.Tensor, want_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """JS divergence of ``log_softmax(z)`` ``[rows, K, V]`` and, if ``want_grad``, its gradient with respect to
    ``z`` per unit of output; ``None`` when a log-probability is below the floor or not finite (then the
    general path, with its clamps and masks, is needed).

    Measured on ``[2, 16, 4, 49152]`` float32, forward + backward, one CPU thread (best of 7): 48 ms, against
    71 ms for the general path and 87 ms for the autograd composition.

    Where every log-probability is finite and above the floor, the clamp and the ``p > 0`` / alive masks of
    :func:`js_divergence` and of the general backward change nothing, so this computes the same expressions,
    in the same order, without them, and shares ``log_softmax``, ``p`` and ``p * (lp - log m)`` between the
    value and the gradient.
    """
    lp = torch.log_softmax(z, -1)
    if not bool(lp.amin() >= LOGPROB_FLOOR):  # also False for NaN
        return None
    k = lp.shape[-2]
    log_m = torch.logsumexp(lp, dim=-2, keepdim=True) - math.log(k)
    p = lp.exp()
    pd = p * (lp - log_m)
    value = pd.sum(-1).mean(-1)
    if not want_grad:
        return value, None
    g_l = pd / k
    return value, g_l - p * g_l.sum(-1, keepdim=True)


def _unit_grad_general(
    z: torch.Tensor, canon: torch.Tensor | None, floor: float, teacher: torch.Tensor | None = None
) -> torch.Tensor:
    """Gradient of ``js_divergence`` / ``anchor_kl`` of ``log_softmax(z)`` ``[rows, K, V]`` with respect to
    ``z``, per unit of output, with the floor's clamp and the masks (any input); ``teacher`` ``[rows, V]``
    as in :func:`anchor_kl`."""
    k, v = z.shape[-2:]
    lp_raw = torch.log_softmax(z, -1)
    lp = lp_raw.clamp_min(floor)
    alive = lp_raw >= floor  # the floor (clamp) passes no gradient below it
    p = lp.exp()
    if canon is None:
        log_m = torch.logsumexp(lp, dim=-2, keepdim=True) - math.log(k)
        g_l = torch.where(p > 0, p * (lp - log_m), torch.zeros_like(p)) / k
    else:
        idx = canon.to(torch.long)
        if teacher is None:
            p_c = p.gather(1, idx[:, None, None].expand(-1, 1, v))  # [rows, 1, V]
        else:
            p_c = teacher.to(p.dtype).clamp_min(floor).exp()[:, None, :]
        g_l = (-p_c / (k - 1)).expand_as(p).clone()
        g_l[torch.arange(z.shape[0], device=p.device), idx] = 0.0
    g_l = torch.where(alive, g_l, torch.zeros_like(g_l))
    return g_l - lp_raw.exp() * g_l.sum(-1, keepdim=True)


class _FusedDivergence(torch.autograd.Function):
    """``js_divergence`` / ``anchor_kl`` of ``log_softmax(logits)``, saving only the logits.

    The autograd version keeps about six float32 copies of ``[..., K, V]`` alive until backward; this one
    computes in chunks and recomputes in backward, with the closed-form gradients
    ``dJS/dl_k = p_k (l_k - log m) / K`` and ``dKL_k/dl_k = -p_c / (K-1)`` (k != c), taken through the
    log-softmax as ``g_z = g_l - softmax(z) * sum_v g_l``. For the JS divergence, chunks whose
    log-probabilities are all finite and above the floor take :func:`_js_fast` (no clamps or masks, shared
    intermediates) in forward and backward.

    Computing the gradient in the forward into a new tensor would make backward one multiplication, but the
    logits and that gradient would then coexist at the end of the forward (on SmolLM2 with LoRA and a
    64-token target, +132 MiB, 5% of the step's peak); :class:`_FusedDivergenceConsuming` does it in the
    input's own storage when the caller can give it up.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, canonical: torch.Tensor | None, floor: float,  # type: ignore[override]
                teacher: torch.Tensor | None = None) -> torch.Tensor:
        k, v = logits.shape[-2:]
        flat = logits.reshape(-1, k, v)
        canon = None if canonical is None else canonical.reshape(-1)
        tflat = None if teacher is None else teacher.reshape(-1, v)
        out = torch.empty(flat.shape[0], dtype=torch.float64 if logits.dtype == torch.float64 else torch.float32,
                          device=logits.device)
        with torch.no_grad(), torch.autocast(device_type=logits.device.type, enabled=False):
            for a, b in _chunks(flat.shape[0], k, v):
                z = _upcast(flat[a:b])
                fast = _js_fast(z, False) if canon is None and floor == LOGPROB_FLOOR else None
                if fast is not None:
                    out[a:b] = fast[0]
                    continue
                lp = torch.log_softmax(z, -1)
                t = None if tflat is None else tflat[a:b]
                out[a:b] = js_divergence(lp, floor) if canon is None else anchor_kl(lp, canon[a:b], floor, teacher=t)
        ctx.save_for_backward(logits, canonical, teacher)
        ctx.floor = floor
        return out.reshape(logits.shape[:-2])

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:  # type: ignore[override]
        logits, canonical, teacher = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        k, v = logits.shape[-2:]
        flat = logits.reshape(-1, k, v)
        canon = None if canonical is None else canonical.reshape(-1)
        tflat = None if teacher is None else teacher.reshape(-1, v)
        g_out = grad_out.reshape(-1)
        grad = torch.empty_like(flat)
        with torch.no_grad(), torch.autocast(device_type=logits.device.type, enabled=False):
            for a, b in _chunks(flat.shape[0], k, v):
                fast = _js_fast(_upcast(flat[a:b]), True) if canon is None and ctx.floor == LOGPROB_FLOOR else None
                if fast is not None and fast[1] is not None:
                    grad[a:b] = (fast[1] * g_out[a:b, None, None].to(fast[1].dtype)).to(grad.dtype)
                    continue
                g_z = _unit_grad_general(_upcast(flat[a:b]), None if canon is None else canon[a:b], ctx.floor,
                                         None if tflat is None else tflat[a:b])
                grad[a:b] = (g_z * g_out[a:b, None, None].to(g_z.dtype)).to(grad.dtype)
        return grad.reshape(logits.shape), None, None, None


class _FusedDivergenceConsuming(torch.autograd.Function):
    """:class:`_FusedDivergence` for a float32/float64 input nobody else needs after this call: each chunk's
    gradient per unit of output is computed in the forward (sharing ``log_softmax`` and ``p`` with the
    value) and written over that chunk of the input, which is marked dirty and saved; backward is one
    multiplication. No tensor beyond the input's size is kept, and there is no recompute."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, canonical: torch.Tensor | None, floor: float,  # type: ignore[override]
                teacher: torch.Tensor | None = None):
        k, v = logits.shape[-2:]
        flat = logits.view(-1, k, v)
        canon = None if canonical is None else canonical.reshape(-1)
        tflat = None if teacher is None else teacher.reshape(-1, v)
        out = torch.empty(flat.shape[0], dtype=logits.dtype, device=logits.device)
        with torch.no_grad(), torch.autocast(device_type=logits.device.type, enabled=False):
            for a, b in _chunks(flat.shape[0], k, v):
                z = flat[a:b]
                fast = _js_fast(z, True) if canon is None and floor == LOGPROB_FLOOR else None
                if fast is not None and fast[1] is not None:
                    out[a:b], unit = fast
                else:
                    lp = torch.log_softmax(z, -1)
                    c = None if canon is None else canon[a:b]
                    t = None if tflat is None else tflat[a:b]
                    out[a:b] = js_divergence(lp, floor) if c is None else anchor_kl(lp, c, floor, teacher=t)
                    unit = _unit_grad_general(z, c, floor, t)
                z.copy_(unit)
        ctx.mark_dirty(logits)
        ctx.save_for_backward(logits)
        return out.reshape(logits.shape[:-2]), logits

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor, _grad_consumed: torch.Tensor | None):  # type: ignore[override]
        (unit,) = ctx.saved_tensors
        return unit * grad_out[..., None, None].to(unit.dtype), None, None, None


def _upcast(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()


def divergence_from_logits(
    logits: torch.Tensor,
    canonical: int | torch.Tensor | None = None,
    floor: float = LOGPROB_FLOOR,
    *,
    consume: bool = False,
    teacher: torch.Tensor | None = None,
) -> torch.Tensor:
    """Memory-lean ``js_divergence(log_softmax(logits))`` (``canonical=None``) or
    ``anchor_kl(log_softmax(logits), canonical, teacher=teacher)``: ``[..., K, V] -> [...]``.

    Same values and gradients as the composition (float32, or float64 for float64 input), but only the
    logits are kept for backward (in their own dtype) and the float32 work is done in chunks, which is what
    lets the stability loss add little to the training step's peak memory. Inputs under
    ``FUSED_MIN_ELEMENTS`` elements take the composition itself (faster there, and their memory is negligible).

    ``consume=True`` declares that nothing else uses ``logits`` after this call (and that no autograd node
    saved it): a float32/float64 contiguous input is then overwritten with the gradient, computed in the
    forward, so backward is one multiplication with nothing recomputed and no extra memory. The stability
    loss passes the target rows it selected for this call only. Other inputs ignore the flag.

    Example:
        >>> z = torch.randn(2, 3, 7)
        >>> torch.allclose(divergence_from_logits(z), js_divergence(torch.log_softmax(z, -1)), atol=1e-6)
        True
    """
    if logits.dim() < 2 or logits.shape[-2] < 2:
        raise ValueError(f"expected logits of shape [..., K>=2, V], got shape {tuple(logits.shape)}")
    canon = None
    if canonical is not None:
        canon = _canonical_index(canonical, logits.shape[:-2], logits.shape[-2], logits.device)
    if teacher is not None:
        if canon is None:
            raise ValueError("a teacher distribution needs the canonical index (the variant left out of the KL)")
        if teacher.shape != logits.shape[:-2] + logits.shape[-1:]:
            raise ValueError(f"expected teacher log-probabilities of shape {tuple(logits.shape[:-2] + logits.shape[-1:])}, "
                             f"got {tuple(teacher.shape)}")
        teacher = teacher.detach()
    if logits.numel() < FUSED_MIN_ELEMENTS:
        with torch.autocast(device_type=logits.device.type, enabled=False):
            lp = torch.log_softmax(_upcast(logits), -1)
            return js_divergence(lp, floor) if canon is None else anchor_kl(lp, canon, floor, teacher=teacher)
    if (consume and logits.requires_grad and torch.is_grad_enabled() and logits._base is None
            and logits.is_contiguous() and logits.dtype in (torch.float32, torch.float64)):
        return _FusedDivergenceConsuming.apply(logits, canon, floor, teacher)[0]
    return _FusedDivergence.apply(logits, canon, floor, teacher)


def consistency_divergence(
    logits: torch.Tensor,
    canonical: torch.Tensor,
    *,
    divergence: str = "kl",
    teacher_logits: torch.Tensor | None = None,
    temperature: float = 1.0,
    consume: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The consistency mode's per-position divergence and the teacher's largest probability.

    ``logits`` ``[..., K, V]`` (the K variants' next-token logits at one response position), ``canonical``
    ``[...]`` the canonical variant's index. Returns ``(value [...], teacher_max_prob [...])``:

    - ``"kl"``: mean over the variants k != canonical of ``KL(P_t || P_k)``, ``P_t = softmax(teacher / T)``
      detached, where ``teacher`` is ``teacher_logits`` ``[..., V]`` when given, else the canonical row;
    - ``"js"``: mean over k != canonical of the Jensen-Shannon divergence of the pair ``(softmax(z_c / T),
      P_k)``, with gradient through both sides (no teacher).

    Example:
        >>> z = torch.tensor([[[2.0, 0.0], [0.0, 2.0]]])  # one position, K=2, V=2
        >>> kl, top = consistency_divergence(z, torch.tensor([0]))
        >>> round(float(kl), 4), round(float(top), 4)  # KL(softmax([2,0]) || softmax([0,2])), max p of the canonical
        (1.5232, 0.8808)
    """
    if divergence not in ("kl", "js"):
        raise ValueError(f"unknown divergence {divergence!r}: expected 'kl' or 'js'")
    k, v = logits.shape[-2:]
    canon = _canonical_index(canonical, logits.shape[:-2], k, logits.device)
    with torch.autocast(device_type=logits.device.type, enabled=False):
        if teacher_logits is None:
            side = logits.gather(-2, canon[..., None, None].expand(*logits.shape[:-2], 1, v)).squeeze(-2)
        else:
            side = teacher_logits
        tempered = _upcast(side) / temperature
        with torch.no_grad():
            teacher_lp = torch.log_softmax(tempered, -1)
            top = teacher_lp.amax(-1).exp()
        if divergence == "js":
            others = torch.arange(k, device=logits.device) != canon[..., None]  # [..., K]
            students = logits[others].view(*logits.shape[:-2], k - 1, v)
            pair = torch.stack([tempered.unsqueeze(-2).expand_as(students).to(students.dtype), students], dim=-2)
            return divergence_from_logits(pair).mean(-1), top
        if teacher_logits is None and temperature == 1.0:
            # Exactly the anchor KL: its fused path needs no teacher tensor.
            return divergence_from_logits(logits, canon, consume=consume), top
        return divergence_from_logits(logits, canon, consume=consume, teacher=teacher_lp), top
