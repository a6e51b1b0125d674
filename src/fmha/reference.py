"""The float64 reference: the specification of attention and the seed's recurrence.

Two independent computations of ``softmax(scale * Q K^T) V`` in NumPy float64:

* :func:`dense_attention` -- the definition (seed Section 1), the whole score
  matrix at once, with the same mask semantics as the kernels.
* :func:`online_attention` -- the tile-by-tile online-softmax recurrence (seed
  Sections 3, 5, 6, 9), step for step with the seed's names ``m``, ``l``,
  ``acc``, ``alpha``, ``p``, ``scale_log2``, and the tile width a parameter.
* :func:`dense_attention_backward` -- the gradients of the definition, as the backward
  kernels compute them (checked in the tests against float64 autograd).

Shapes are ``[batch, heads, seqlen, head_dim]`` (``bhsd``); ``k`` and ``v`` may
have fewer heads (GQA/MQA), ``heads`` a multiple of ``kv_heads``.  A query row
with no visible key returns 0 (the ``l == 0`` guard) and log-sum-exp ``-inf``.
This module imports nothing from the rest of fmha but its constants.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .constants import LOG2E


def causal_offset(seqlen_q: int, seqlen_k: int, causal_align: str) -> int:
    """Query ``i`` sees key ``j`` iff ``j <= i + offset``.

    ``top_left`` (torch SDPA's ``is_causal``): offset 0.
    ``bottom_right`` (FlashAttention 2.1+): offset ``seqlen_k - seqlen_q``.
    """
    if causal_align == "top_left":
        return 0
    if causal_align == "bottom_right":
        return seqlen_k - seqlen_q
    raise ValueError(f"causal_align must be 'top_left' or 'bottom_right', got {causal_align!r}")


def visible(seqlen_q: int, seqlen_k: int, causal: bool, causal_align: str = "top_left",
            window: tuple[int, int] = (-1, -1)) -> np.ndarray:
    """Boolean ``[seqlen_q, seqlen_k]``: True where query i may attend to key j.

    Around the diagonal ``d = i + offset`` (offset from ``causal_align``): causal keeps
    ``j <= d``; ``window = (left, right)`` keeps ``d - left <= j <= d + right``, -1 leaving
    that side open.
    """
    offset = causal_offset(seqlen_q, seqlen_k, causal_align)
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    keep = np.ones((seqlen_q, seqlen_k), dtype=bool)
    left, right = window
    if causal:
        keep &= j <= i + offset
    if right >= 0:
        keep &= j <= i + offset + right
    if left >= 0:
        keep &= j >= i + offset - left
    return keep


def score_mods(s: np.ndarray, seqlen_q: int, seqlen_k: int, causal_align: str, softcap: float = 0.0,
               alibi_slopes=None) -> np.ndarray:
    """Scores ``scale * q.k`` ``[B, H, Sq, Sk]`` with soft-capping (``softcap * tanh(s / softcap)``)
    and ALiBi (``- slope * |i + offset - j|``, the slopes ``[H]`` or ``[B, H]``) applied, in that order."""
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if alibi_slopes is not None:
        offset = causal_offset(seqlen_q, seqlen_k, causal_align)
        dist = np.abs(np.arange(seqlen_q)[:, None] + offset - np.arange(seqlen_k)[None, :])
        slopes = _as_f64(alibi_slopes)  # [heads] or [batch, heads]
        s = s - (slopes[None] if slopes.ndim == 1 else slopes)[:, :, None, None] * dist
    return s


def _as_f64(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, without importing torch here
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _expand_kv(q: np.ndarray, k: np.ndarray, v: np.ndarray):
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    group = heads // kv_heads
    return np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)


def _softmax(z: np.ndarray, sinks=None):
    """Rows of ``z`` ``[B, H, Sq, Sk]`` (``-inf`` masked) -> ``(P, natural-log LSE)``; ``sinks`` (one logit a
    head) join each row's denominator with no value.  A row with nothing visible: P = 0, LSE -inf (or the sink)."""
    row_max = z.max(axis=-1, keepdims=True, initial=-np.inf)
    extra = 0.0
    if sinks is not None:
        s = _as_f64(sinks)[None, :, None, None]
        row_max = np.maximum(row_max, s)
    row_max_safe = np.where(np.isfinite(row_max), row_max, 0.0)
    if sinks is not None:
        extra = np.exp(s - row_max_safe)
    w = np.exp(z - row_max_safe)
    denom = w.sum(axis=-1, keepdims=True) + extra
    p = w / np.where(denom == 0, 1.0, denom)
    with np.errstate(divide="ignore"):
        lse = (row_max_safe + np.log(denom))[..., 0]
    return p, lse


def _masked(z, causal: bool, causal_align: str, window, attn_mask) -> np.ndarray:
    """Scores ``z`` ``[B, H, Sq, Sk]`` with the band (:func:`visible`) and ``attn_mask`` (broadcastable to that
    shape: boolean, joined with the band; float, added to the scores), ``-inf`` where a key is hidden."""
    band = visible(z.shape[-2], z.shape[-1], causal, causal_align, window)
    if attn_mask is not None:
        boolean = str(attn_mask.dtype) in ("bool", "torch.bool")  # (numpy's or torch's, without importing torch)
        if boolean:
            band = band & np.asarray(attn_mask.cpu() if hasattr(attn_mask, "cpu") else attn_mask, dtype=bool)
        else:
            with np.errstate(invalid="ignore"):  # (an infinite score beside a -inf bias: NaN, as SDPA's sum gives)
                z = z + _as_f64(attn_mask)
    return np.where(band, z, -np.inf)


def dense_attention(q, k, v, *, causal: bool = False, scale: float | None = None,
                    causal_align: str = "top_left", return_lse: bool = False, window=(-1, -1),
                    softcap: float = 0.0, alibi_slopes=None, sinks=None, attn_mask=None, dropout=None):
    """(a) ``softmax(scale * Q K^T) V`` in float64, the whole score matrix at once.

    Returns ``o`` ``[B, H, Sq, D]`` float64 (and the natural-log LSE ``[B, H, Sq]``
    when ``return_lse``).  Rows with no visible key give 0 and LSE ``-inf``.  ``sinks``: one
    logit a head in every row's denominator, with no value (gpt-oss's attention sinks).  ``attn_mask``:
    broadcastable to ``[B, H, Sq, Sk]``, as SDPA takes it: boolean (True: the key takes part), joined with the
    band, or a float bias added to the scores (after the softcap and ALiBi).  ``dropout``: attention dropout's
    factors ``Z`` ``[B, H, Sq, Sk]`` (one over the share kept for a kept pair, 0 dropped:
    :func:`fmha.kernels.dropout.factors`), so ``o = (P * Z) V`` (the LSE is the softmax's).
    """
    q, k, v = _as_f64(q), _as_f64(k), _as_f64(v)
    k, v = _expand_kv(q, k, v)
    seqlen_q, seqlen_k, head_dim = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    s = score_mods(scale * (q @ k.swapaxes(-1, -2)), seqlen_q, seqlen_k, causal_align, softcap, alibi_slopes)
    p, lse = _softmax(_masked(s, causal, causal_align, window, attn_mask), sinks)
    o = (p if dropout is None else p * _as_f64(dropout)) @ v
    return (o, lse) if return_lse else o


def dense_attention_backward(q, k, v, do, *, causal: bool = False, scale: float | None = None,
                             causal_align: str = "top_left", window=(-1, -1), softcap: float = 0.0,
                             alibi_slopes=None, o=None, sinks=None, attn_mask=None, mask_grad: bool = False,
                             dropout=None):
    """(c) The gradients ``(dq, dk, dv)`` of :func:`dense_attention` for the incoming ``do``, in float64,
    written as the kernels compute them (docs/BACKWARD.md): ``P`` from the scores, ``dV = P^T dO``,
    ``dP = dO V^T``, ``delta = rowsum(dO * O)``, ``dZ = P (dP - delta)``, then through the softcap's
    ``1 - tanh^2`` and the scale to ``dQ = dS K``, ``dK = dS^T Q``; dK and dV summed over each KV head's
    query heads.  Rows with no visible key have ``P = 0``: zero gradients.  ``o``: the output to take
    ``delta`` from (default the exact one; the kernels take the stored, rounded one).  With ``sinks``
    also ``d sink_h = -sum_i P_sink,i delta_i``, a fourth result.  ``attn_mask``: as :func:`dense_attention`'s;
    ``mask_grad``: also the gradient of each score after the softcap, ``dZ`` ``[B, H, Sq, Sk]`` (a float bias's
    before it is summed to the bias's shape), last.  ``dropout``: :func:`dense_attention`'s factors ``Z``, so
    ``dV = (P Z)^T dO`` and ``dP = Z (dO V^T)``."""
    q, k, v, do = _as_f64(q), _as_f64(k), _as_f64(v), _as_f64(do)
    group = q.shape[1] // k.shape[1]
    ke, ve = _expand_kv(q, k, v)
    seqlen_q, seqlen_k, head_dim = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    raw = scale * (q @ ke.swapaxes(-1, -2))
    z = score_mods(raw, seqlen_q, seqlen_k, causal_align, softcap, alibi_slopes)
    z = _masked(z, causal, causal_align, window, attn_mask)
    p, lse = _softmax(z, sinks)
    kept = np.ones_like(p) if dropout is None else _as_f64(dropout)
    o = (p * kept) @ ve if o is None else _as_f64(o)
    dv = (p * kept).swapaxes(-1, -2) @ do
    dp = (do @ ve.swapaxes(-1, -2)) * kept
    delta = (do * o).sum(axis=-1, keepdims=True)
    ds = dz = p * (dp - delta)
    if softcap:
        ds = ds * (1.0 - np.tanh(raw / softcap) ** 2)
    ds = ds * scale
    dq = ds @ ke
    dk = ds.swapaxes(-1, -2) @ q

    def per_kv_head(g):  # [B, H, S, D] -> [B, H / group, S, D], summing each group
        return g.reshape(g.shape[0], g.shape[1] // group, group, *g.shape[2:]).sum(axis=2)
    grads = (dq, per_kv_head(dk), per_kv_head(dv))
    if sinks is not None:
        p_sink = np.exp(_as_f64(sinks)[None, :, None] - lse)
        grads += (-(p_sink * delta[..., 0]).sum(axis=(0, 2)),)
    return (*grads, dz) if mask_grad else grads


@dataclass
class RowTrace:
    """Per-tile values of the recurrence for one query row (base-2 domain)."""
    tile: list[int] = field(default_factory=list)
    m: list[float] = field(default_factory=list)
    l: list[float] = field(default_factory=list)
    alpha: list[float] = field(default_factory=list)


def online_attention(q, k, v, *, causal: bool = False, scale: float | None = None,
                     causal_align: str = "top_left", block_n: int = 16,
                     return_lse: bool = False, trace_row: tuple[int, int, int] | None = None):
    """(b) The seed's online-softmax recurrence, one key tile of width ``block_n`` at a time.

    Follows seed Section 9 line by line, in the base-2 domain of Section 8.1
    (``scale_log2 = scale * log2(e)``, ``exp2`` everywhere), with the causal early
    exit of Section 7 and the ``l == 0`` guard of Section 6.  ``trace_row =
    (batch, head, row)`` also returns a :class:`RowTrace` of ``m``, ``l`` and
    ``alpha`` per tile for that row.
    """
    q, k, v = _as_f64(q), _as_f64(k), _as_f64(v)
    k, v = _expand_kv(q, k, v)
    batch, heads, seqlen_q, head_dim = q.shape
    seqlen_k = k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    scale_log2 = scale * LOG2E                      # tau * log2(e), folded once (8.1)
    mask = visible(seqlen_q, seqlen_k, causal, causal_align)
    offset = causal_offset(seqlen_q, seqlen_k, causal_align) if causal else 0

    m = np.full((batch, heads, seqlen_q), -np.inf)  # running max (base 2)
    l = np.zeros((batch, heads, seqlen_q))          # running denominator
    acc = np.zeros((batch, heads, seqlen_q, head_dim))  # running un-normalised output
    trace = RowTrace() if trace_row is not None else None

    n_tiles = -(-seqlen_k // block_n)
    causal_stop = n_tiles
    if causal:  # Section 7: the last key any row of this problem can see
        causal_stop = min(n_tiles, max(0, -(-(seqlen_q + offset) // block_n)))
    for t in range(causal_stop):
        cols = slice(t * block_n, min((t + 1) * block_n, seqlen_k))
        # 5.1-5.2: scores of this tile, scaled into the base-2 domain, masked
        s = scale_log2 * (q @ k[:, :, cols].swapaxes(-1, -2))
        s = np.where(mask[:, cols], s, -np.inf)
        # 5.3: running max and the rescale factor; -inf rows keep a finite pivot
        m_new = np.maximum(m, s.max(axis=-1))
        m_safe = np.where(np.isfinite(m_new), m_new, 0.0)
        alpha = np.exp2(m - m_safe)
        # 5.4: this tile's weights and the running denominator
        p = np.exp2(s - m_safe[..., None])
        l = alpha * l + p.sum(axis=-1)
        # 5.5-5.6: rescale the accumulator, add P V
        acc = alpha[..., None] * acc + p @ v[:, :, cols]
        # 5.7: carry
        m = m_new
        if trace is not None:
            b, h, i = trace_row
            trace.tile.append(t)
            trace.m.append(float(m[b, h, i]))
            trace.l.append(float(l[b, h, i]))
            trace.alpha.append(float(alpha[b, h, i]))

    # Section 6: o = acc / l, with 1/l := 0 on an empty row
    inv_l = np.where(l == 0, 0.0, 1.0 / np.where(l == 0, 1.0, l))
    o = acc * inv_l[..., None]
    out = [o]
    if return_lse:
        with np.errstate(divide="ignore"):
            out.append(np.where(l == 0, -np.inf, (m + np.log2(np.where(l == 0, 1.0, l))) / LOG2E))
    if trace is not None:
        out.append(trace)
    return out[0] if len(out) == 1 else tuple(out)
