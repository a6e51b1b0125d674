"""The error yardstick: a kernel's answer (and its gradients) against the float64 reference.

An output passes when its error is at most twice the error PyTorch makes computing the same
attention at the input precision (scores and ``P V`` in the input dtype, softmax in float32),
plus one unit in the last place at the output's largest magnitude (the store to the input dtype
alone can cost that where the kernel and PyTorch round ``P`` differently); both errors are
measured against :func:`fmha.reference.dense_attention`.  Rows whose reference is not finite
(a NaN or inf in a key they see) must be non-finite in the output too, and only those rows.
The LSE passes within 2e-3 (and 1e-3 of its magnitude) of the reference's, ``-inf`` exactly where it is, plus what
float32 accumulation may cost a score: one float32 unit of the row's largest ``scale * sum_d |q_d k_d|`` (scores that
cancel from terms of 1e7 come out a few tenths off in any float32 product).
"""
from __future__ import annotations

import numpy as np
import torch

from . import reference

# one unit in the last place at |o| = 1
ULP = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def to_bhsd(t, layout: str):
    return t if layout == "bhsd" else t.transpose(1, 2)


def _softmax_lowp(s, sinks):
    """float32 softmax over the last axis, ``sinks`` (one logit a head, on any device: a GPU call's checked against
    inputs on the CPU) joining the denominator."""
    if sinks is None:
        return torch.softmax(s, -1)
    col = sinks.to(s.device, torch.float32)[None, :, None, None].expand(*s.shape[:-1], 1)
    return torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]


def torch_lowp(q, k, v, causal, causal_align, scale=None, window=(-1, -1), softcap=0.0, alibi_slopes=None,
               sinks=None, attn_mask=None, dropout=None):
    """The same attention in PyTorch at the input precision (bhsd, float64 numpy out); ``dropout``: the factors
    that multiply the probabilities (:func:`fmha.reference.dense_attention`'s)."""
    dt = q.dtype
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)).float() * scale
    if softcap or alibi_slopes is not None:
        s = torch.from_numpy(reference.score_mods(s.cpu().double().numpy(), q.shape[2], k.shape[2], causal_align,
                                                  softcap, alibi_slopes)).float().to(q.device)
    s, mask = _joined(s, reference.visible(q.shape[2], k.shape[2], causal, causal_align, window), attn_mask)
    s = s.masked_fill(~mask, float("-inf"))
    p = _softmax_lowp(s, sinks).nan_to_num(0.0).to(dt)
    if dropout is not None:
        p = p * dropout.to(p.device, dt)
    return (p @ v).double().cpu().numpy()


def max_err(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - b), initial=0.0))


def of_rows(mods: dict, rows: slice) -> dict:
    """``mods`` for the batch rows (or packed sequences) ``rows`` alone: their rows of ``[batch, heads]`` ALiBi
    slopes (``[heads]`` ones, and the rest, as they are)."""
    slopes = mods.get("alibi_slopes")
    return {**mods, "alibi_slopes": slopes[rows]} if slopes is not None and slopes.dim() == 2 else mods


def check(o, q, k, v, causal, causal_align="top_left", layout="bhsd", scale=None, lse=None, **mods):
    """Assert ``o`` (in ``layout``) and ``lse`` (when given, ``[batch, heads, seqlen_q]``) pass the
    yardstick; ``mods``: window, softcap, alibi_slopes, attn_mask as the kernel got them.  Returns
    ``(error, PyTorch's error)``."""
    q, k, v, o = (to_bhsd(t, layout) for t in (q, k, v, o))
    o = o.detach().cpu().double().numpy()
    ref, ref_lse = reference.dense_attention(q, k, v, causal=causal, causal_align=causal_align, scale=scale,
                                             return_lse=True, **mods)
    bad_ref = ~np.isfinite(ref).all(axis=-1)
    bad_out = ~np.isfinite(o).all(axis=-1)
    assert (bad_out == bad_ref).all(), (f"non-finite output rows {np.argwhere(bad_out & ~bad_ref)[:4].tolist()} "
                                        f"(unwritten or a broken guard), finite where the reference is not: "
                                        f"{np.argwhere(bad_ref & ~bad_out)[:4].tolist()}")
    keep = ~bad_ref[..., None]
    ref, o = np.where(keep, ref, 0.0), np.where(keep, o, 0.0)
    err = max_err(o, ref)
    base = max_err(np.where(keep, torch_lowp(q, k, v, causal, causal_align, scale, **mods), 0.0), ref)
    ulp = ULP[q.dtype] * max(1.0, float(np.abs(ref).max(initial=0.0)))
    assert err <= 2 * base + ulp, f"error {err:.3g} > 2 x torch's {base:.3g} + {ulp:.3g}"
    if lse is not None:
        check_lse(lse, np.where(bad_ref, 0.0, ref_lse), skip=bad_ref, slack=_accumulation(q, k, scale))
    return err, base


def _accumulation(q, k, scale) -> np.ndarray:
    """What float32 accumulation may cost a row's scores: one float32 unit of its largest ``|scale| * sum_d |q_d k_d|``
    (``[batch, heads, seqlen_q]``)."""
    group = q.shape[1] // k.shape[1]
    qa, ka = (t.detach().cpu().double().abs().nan_to_num(0.0, 0.0) for t in (q, k.repeat_interleave(group, 1)))
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    if ka.shape[2] == 0:
        return np.zeros(qa.shape[:3])
    return (np.finfo(np.float32).eps * abs(scale) * (qa @ ka.transpose(-1, -2)).amax(-1)).numpy()


def check_lse(lse, ref_lse, atol=2e-3, skip=None, slack=None):
    """``lse`` (a tensor) against the reference's: ``-inf`` exactly where it is, within ``atol``, 1e-3 of its
    magnitude and ``slack`` (per row, :func:`_accumulation`) elsewhere (rows in the boolean mask ``skip`` are not
    compared)."""
    got = lse.detach().cpu().double().numpy()
    assert got.shape == ref_lse.shape, (got.shape, ref_lse.shape)
    if skip is not None:
        got = np.where(skip, 0.0, got)
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    off = np.abs(got[fin] - ref_lse[fin])
    bound = atol + 1e-3 * np.abs(ref_lse[fin]) + (0.0 if slack is None else np.broadcast_to(slack, fin.shape)[fin])
    wrong = ~(off <= bound)  # (a NaN where the reference is finite is wrong too)
    if wrong.any():
        worst = np.argmax(np.where(wrong, np.nan_to_num(off - bound, nan=np.inf), -np.inf))
        raise AssertionError(f"LSE off by {off[worst]:.3g} at {ref_lse[fin][worst]:.6g} (bound {bound[worst]:.3g}); "
                             f"{wrong.sum()} of {off.size} rows")


def _modified(s, seqlen_k: int, causal, causal_align, window, softcap, alibi_slopes, attn_mask):
    """Float32 scores ``s`` ``[batch, heads, seqlen_q, seqlen_k]`` (already scaled) through the softcap and ALiBi,
    and the keys each row sees: ``(z, visible)``."""
    seqlen_q = s.shape[2]
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        offset = reference.causal_offset(seqlen_q, seqlen_k, causal_align)
        i = torch.arange(seqlen_q, device=s.device)[:, None] + offset
        dist = (i - torch.arange(seqlen_k, device=s.device)[None, :]).abs().float()
        slopes = alibi_slopes.float()  # [heads] or [batch, heads]
        s = s - (slopes[None] if slopes.dim() == 1 else slopes)[:, :, None, None] * dist
    return _joined(s, reference.visible(seqlen_q, seqlen_k, causal, causal_align, window), attn_mask)


def _joined(s, band, attn_mask):
    """Scores ``s`` and the keys each row sees (``band``, numpy) with ``attn_mask``: a boolean one joins the band,
    a float one is added to the scores (its ``-inf`` entries join the band instead, so that autograd through a row
    it leaves no key meets no NaN).  ``(s, visible)``."""
    mask = torch.from_numpy(band).to(s.device)
    if attn_mask is None:
        return s, mask
    attn_mask = attn_mask.to(s.device)
    if attn_mask.dtype == torch.bool:
        return s, mask & attn_mask
    hidden = torch.isneginf(attn_mask)
    return s + attn_mask.float().masked_fill(hidden, 0.0), mask & ~hidden


def torch_lowp_grads(q, k, v, do, causal, causal_align, scale=None, window=(-1, -1), softcap=0.0,
                     alibi_slopes=None, sinks=None, attn_mask=None, dropout=None):
    """The gradients of :func:`torch_lowp`'s attention by PyTorch's autograd at the input precision
    (bhsd; float64 numpy out); a float ``attn_mask``'s too, fourth, in its shape."""
    dt = q.dtype
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    leaves = [q, k, v]
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.detach().clone().requires_grad_(True)
        leaves.append(attn_mask)
    group = q.shape[1] // k.shape[1]
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    s = (q @ k.repeat_interleave(group, 1).transpose(-1, -2)).float() * scale
    s, mask = _modified(s, k.shape[2], causal, causal_align, window, softcap, alibi_slopes, attn_mask)
    p = _softmax_lowp(s.masked_fill(~mask, float("-inf")), sinks).nan_to_num(0.0).to(dt)
    if dropout is not None:
        p = p * dropout.to(p.device, dt)
    (p @ v.repeat_interleave(group, 1)).backward(do.to(dt))
    return tuple(t.grad.double().cpu().numpy() for t in leaves)


def flash_grads32(q, k, v, do, o, lse, causal, causal_align, scale=None, window=(-1, -1), softcap=0.0,
                  alibi_slopes=None, attn_mask=None, sinks=None, dropout=None):
    """The gradients as a flash backward computes them, in float32 from the input-precision tensors: the scores
    computed again, ``P`` from the forward's stored LSE (natural log, ``[batch, heads, seqlen_q]``) and ``delta``
    from its stored output ``o`` (bhsd; float64 numpy out).  Where a score is large the two computations of it
    differ by float32's rounding of a large number, and ``P`` by as much relatively (a row whose LSE is 1000 and
    whose scores are summed again in another order: ``P`` 1e-3 off).  ``sinks``: in the stored LSE already."""
    group = q.shape[1] // k.shape[1]
    q, k, v, do, o = (t.detach().float().to(q.device) for t in (q, k, v, do, o))
    ke, ve = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    raw = (q @ ke.transpose(-1, -2)) * scale
    z, mask = _modified(raw, k.shape[2], causal, causal_align, window, softcap, alibi_slopes, attn_mask)
    lse = lse.detach().float().to(q.device)[..., None]
    p = torch.where(mask & torch.isfinite(lse), torch.exp(z - lse), 0.0)
    kept = torch.ones_like(p) if dropout is None else dropout.to(p.device, torch.float32)
    dv = (p * kept).transpose(-1, -2) @ do
    ds = p * ((do @ ve.transpose(-1, -2)) * kept - (do * o).sum(-1, keepdim=True))
    if softcap:
        ds = ds * (1.0 - torch.tanh(raw / softcap) ** 2)
    ds = ds * scale
    dq, dk = ds @ ke, ds.transpose(-1, -2) @ q

    def per_kv_head(g):  # [B, H, S, D] -> [B, H / group, S, D], summing each group
        return g.reshape(g.shape[0], g.shape[1] // group, group, *g.shape[2:]).sum(dim=2)
    return tuple(g.double().cpu().numpy() for g in (dq, per_kv_head(dk), per_kv_head(dv)))


def check_grads(grads, q, k, v, do, causal, causal_align="top_left", layout="bhsd", scale=None, o=None, lse=None,
                **mods):
    """Assert the gradients ``(dq, dk, dv)`` (in ``layout``) of attention on ``q, k, v`` for ``do`` pass the
    yardstick against :func:`fmha.reference.dense_attention_backward`: each within twice the sum of
    PyTorch's own error at the input precision and the error that taking ``delta = rowsum(dO * O)`` from
    the output as stored (as every flash backward does) causes in float64, plus one unit in the last place
    at its largest magnitude; and finite.  ``o``: the output as the forward stored it (in ``layout``; its
    own check is the forward's), else the float64 output rounded to the input dtype.  ``lse`` (with ``o``):
    the forward's stored LSE, ``[batch, heads, seqlen_q]``; the sum then also holds the error of the same
    backward in float32 from the stored O and LSE (:func:`flash_grads32`: ``P`` computed again from scores that
    are computed again), which inputs with scores in the hundreds make larger than PyTorch's.  Where a row's
    probability sits on one key, ``dO . (V - O)`` cancels and dQ follows O's rounding, times K: a forward's O
    one unit off (P rounded to 16 bits before P V) then moves dQ twice as far as the rounded output does.
    Returns the errors."""
    q, k, v, do = (to_bhsd(t, layout).detach() for t in (q, k, v, do))
    kw = dict(causal=causal, causal_align=causal_align, scale=scale, **mods)
    refs = reference.dense_attention_backward(q, k, v, do, **kw)[:3]
    stored = (to_bhsd(o, layout).detach().cpu() if o is not None
              else torch.from_numpy(reference.dense_attention(q, k, v, **kw)).to(q.dtype))
    from_stored = reference.dense_attention_backward(q, k, v, do, o=stored, **kw)[:3]
    lowp = torch_lowp_grads(q, k, v, do, causal, causal_align, scale, **mods)
    flash = ((None,) * 3 if lse is None or o is None
             else flash_grads32(q, k, v, do, stored, lse, causal, causal_align, scale, **mods))
    errs = []
    for name, g, ref, base, rounded, ours32 in zip("qkv", grads, refs, lowp, from_stored, flash):
        got = to_bhsd(g, layout).detach().cpu().double().numpy()
        assert got.shape == ref.shape, (name, got.shape, ref.shape)
        assert np.isfinite(got).all(), f"d{name} is not finite"
        err, torch_err, o_err = max_err(got, ref), max_err(base, ref), max_err(rounded, ref)
        flash_err = 0.0 if ours32 is None else max_err(ours32, ref)
        ulp = ULP[q.dtype] * max(1.0, float(np.abs(ref).max(initial=0.0)))
        assert err <= 2 * (torch_err + o_err + flash_err) + ulp, (
            f"d{name}: error {err:.3g} > 2 x (torch's {torch_err:.3g} + the stored O's {o_err:.3g} + float32's "
            f"from the stored O and LSE {flash_err:.3g}) + {ulp:.3g}")
        errs.append(err)
    return errs


def check_mask_grad(got, q, k, v, do, causal, causal_align="top_left", layout="bhsd", scale=None, o=None,
                    attn_mask=None, **mods):
    """Assert a float ``attn_mask``'s gradient ``got`` (in the bias's own shape, ``attn_mask`` its values in that
    shape) against the float64 gradient of each score (:func:`fmha.reference.dense_attention_backward`'s ``dZ``)
    summed over the dimensions the bias broadcast: within twice the sum of PyTorch's own error at the input
    precision and the error that ``delta`` from the stored output ``o`` causes, plus one unit in the last place of
    the gradient's dtype at its largest magnitude; and finite.  Returns the error."""
    q, k, v, do = (to_bhsd(t, layout).detach() for t in (q, k, v, do))
    full = attn_mask.detach().expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    kw = dict(causal=causal, causal_align=causal_align, scale=scale, attn_mask=full, **mods)

    def summed(dz):
        return torch.from_numpy(np.ascontiguousarray(dz)).sum_to_size(attn_mask.shape).numpy()
    ref = summed(reference.dense_attention_backward(q, k, v, do, mask_grad=True, **kw)[-1])
    stored = (to_bhsd(o, layout).detach().cpu() if o is not None
              else torch.from_numpy(reference.dense_attention(q, k, v, **kw)).to(q.dtype))
    rounded = summed(reference.dense_attention_backward(q, k, v, do, o=stored, mask_grad=True, **kw)[-1])
    base = summed(torch_lowp_grads(q, k, v, do, causal, causal_align, scale, attn_mask=full, **mods)[3])
    g = got.detach().cpu().double().numpy()
    assert g.shape == ref.shape, (g.shape, ref.shape)
    assert np.isfinite(g).all(), "the mask's gradient is not finite"
    err, torch_err, o_err = max_err(g, ref), max_err(base, ref), max_err(rounded, ref)
    ulp = ULP.get(got.dtype, 2.0 ** -23) * max(1.0, float(np.abs(ref).max(initial=0.0)))
    acc = _score_grad_accumulation(v, do) * (full.numel() // max(attn_mask.numel(), 1))
    assert err <= 2 * (torch_err + o_err) + ulp + acc, (
        f"the mask's gradient: error {err:.3g} > 2 x (torch's {torch_err:.3g} + the stored O's {o_err:.3g}) + "
        f"{ulp:.3g} + {acc:.3g}")
    return err


def check_sinks_grad(got, q, k, v, do, causal, causal_align="top_left", layout="bhsd", o=None, *, sinks, **mods):
    """Assert the sinks' gradient ``got`` (``[heads]``) against the float64 reference's, ``-sum`` over a head's rows
    of ``exp(sink - LSE) * delta`` (:func:`fmha.reference.dense_attention_backward`): within twice the error that
    ``delta`` from the stored output ``o`` (at the input precision) causes, plus 1e-4 of that sum over the rows'
    magnitudes, ``exp(sink - LSE) * rowsum(|dO O|)`` (float32 sums and LSE); and finite.  Returns the error."""
    q, k, v, do = (to_bhsd(t, layout).detach() for t in (q, k, v, do))
    kw = dict(causal=causal, causal_align=causal_align, sinks=sinks.detach(), **mods)
    ref = reference.dense_attention_backward(q, k, v, do, **kw)[3]
    exact, lse = reference.dense_attention(q, k, v, return_lse=True, **kw)
    stored = to_bhsd(o, layout).detach().cpu() if o is not None else torch.from_numpy(exact).to(q.dtype)
    rounded = reference.dense_attention_backward(q, k, v, do, o=stored, **kw)[3]
    weight = np.exp(sinks.detach().cpu().double().numpy()[None, :, None] - lse)
    magnitude = (weight * np.abs(do.cpu().double().numpy() * exact).sum(-1)).sum(axis=(0, 2))
    g = got.detach().cpu().double().numpy()
    assert np.isfinite(g).all(), "the sinks' gradient is not finite"
    err, o_err = np.abs(g - ref), np.abs(rounded - ref)
    bound = 2 * o_err + 1e-4 * magnitude + 1e-6
    assert (err <= bound).all(), (f"the sinks' gradient: error {err.max():.3g} past {bound[err.argmax()]:.3g} (the "
                                  f"stored O's {o_err[err.argmax()]:.3g})")
    return float(err.max())


def _score_grad_accumulation(v, do) -> float:
    """What float32 accumulation may cost one score's gradient ``P (dO . v_j - dO . o)``: a float32 unit of
    ``sum_d |dO_d| max_j |v_jd|`` for each product, at the largest row (``P`` at most 1, ``|o_d|`` at most
    ``max_j |v_jd|``).  Where each row sees one key both products are equal and the gradient is 0 in exact
    arithmetic, and torch's own (the same products in the same order) is exactly 0 too: the bound cannot lean on
    it there."""
    group = do.shape[1] // v.shape[1]
    vmax = v.detach().cpu().double().abs().nan_to_num(0.0, 0.0).amax(2).repeat_interleave(group, 1)  # [b, h, d]
    rows = (do.detach().cpu().double().abs().nan_to_num(0.0, 0.0) * vmax[:, :, None, :]).sum(-1)
    return 2 * float(np.finfo(np.float32).eps) * float(rows.max()) if rows.numel() else 0.0


def greedy_partings(got, want, model, mask=None) -> list[tuple[int, int, float, float]]:
    """Where greedy tokens ``got`` (a model run with fmha) first part from ``want`` (the same model with SDPA),
    row by row, and how close ``model`` (SDPA's) rates the two tokens there: ``(row, index, gap, step)``, with
    ``step`` one bfloat16 unit at the largest logit.  Random weights give near-ties that rounding decides; a
    ``gap`` within ``step`` is one of those, a larger one is not (after several bf16 layers a parting just past
    one step has been seen, not examined).  ``got``/``want``: prompt and new
    tokens; ``mask``: the prompt's attention mask (left padding placed as generate() places it)."""
    out = []
    for row in range(got.shape[0]):
        differ = (got[row] != want[row]).nonzero()
        if not len(differ):
            continue
        at = int(differ[0, 0])
        prefix = want[row:row + 1, :at]
        keep = None if mask is None else torch.cat([mask[row:row + 1], mask.new_ones(1, at - mask.shape[1])], 1)
        place = None if keep is None else (keep.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = model(prefix, attention_mask=keep, position_ids=place).logits[0, -1].float()
        gap = (logits[got[row, at]] - logits[want[row, at]]).abs().item()
        out.append((row, at, gap, ULP[torch.bfloat16] * logits.abs().max().item()))
    return out
