"""Autograd: :func:`fmha.attention` and :func:`fmha.attention_varlen` are differentiable.

A call that autograd records (grad mode on, q, k, v, the sinks or a float attn_mask requiring grad) runs the
forward with its LSE, saves only q, k, v, O and the LSE (memory O(seqlen), no score matrix; the attn_mask as the
caller holds it), and its backward runs :mod:`fmha.backward` (a bias's gradient is the gradient of each score,
``[batch, heads, seqlen_q, seqlen_k]`` in float32 before autograd sums it to the bias's shape).  The LSE a caller
asks for is not differentiable; a second derivative is refused.  :func:`fmha.attention_paged` (paged caches, split
decoding) is inference-only: a call that autograd would record refuses its backward with :data:`PAGED_MESSAGE`.
"""
from __future__ import annotations

import functools

import torch

from . import backward, forward, sinks as sink_mod
from .checks import attn_mask_view

PAGED_MESSAGE = ("fmha.attention_paged is inference-only (paged KV caches and split decoding have no backward): "
                 "run it under torch.no_grad() / torch.inference_mode(), or train with fmha.attention or "
                 "fmha.attention_varlen.")


def needs_grad(*tensors) -> bool:
    """True when autograd records this call: grad mode on and a tensor (None: absent) that requires grad."""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if t is not None and t.requires_grad:
            return True
    return False


SECOND_ORDER = "fmha's backward is first-order only: a second derivative (create_graph=True) is not supported"


def _first_order_only() -> None:
    """Raise :data:`SECOND_ORDER` when the backward itself is being recorded (``create_graph=True``)."""
    if torch.is_grad_enabled():
        raise RuntimeError(SECOND_ORDER)


def dense(q, k, v, alibi_slopes, seqused_k, sinks, kw, attn_mask=None):
    """:func:`fmha.forward.dense` with the sinks attached (:mod:`fmha.sinks`): ``(o, lse)``."""
    o, lse = forward.dense(q, k, v, return_lse=True, alibi_slopes=alibi_slopes, seqused_k=seqused_k,
                           attn_mask=attn_mask, **kw)
    return (o, lse) if sinks is None else sink_mod.attach(o, lse, sinks, kw["layout"])


def packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, sinks, kw):
    """:func:`fmha.forward.packed` with the sinks attached: ``(o, lse)``."""
    o, lse = forward.packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            return_lse=True, alibi_slopes=alibi_slopes, **kw)
    return (o, lse) if sinks is None else sink_mod.attach(o, lse, sinks, "packed")


def _full(attn_mask, q, k, layout: str):
    """The attn_mask as the kernels read it, ``[batch, heads, seqlen_q, seqlen_k]`` (:func:`.checks.attn_mask_view`)."""
    return None if attn_mask is None else attn_mask_view(attn_mask, q, k, layout)


class Attention(torch.autograd.Function):
    """:func:`dense` with its backward; ``kw`` the forward's keyword arguments but the tensors; ``attn_mask`` as the
    caller passed it (broadcastable), so that a bias's gradient is summed to its shape in float32."""

    @staticmethod
    def forward(ctx, q, k, v, alibi_slopes, seqused_k, sinks, kw, deterministic, attn_mask=None):
        o, lse = dense(q, k, v, alibi_slopes, seqused_k, sinks, kw, _full(attn_mask, q, k, kw["layout"]))
        ctx.save_for_backward(q, k, v, o, lse, alibi_slopes, seqused_k, sinks, attn_mask)
        ctx.kw, ctx.deterministic = kw, deterministic
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _):
        _first_order_only()
        q, k, v, o, lse, alibi_slopes, seqused_k, sinks, attn_mask = ctx.saved_tensors
        kw = {n: ctx.kw[n] for n in ("causal", "scale", "causal_align", "layout", "window", "softcap")}
        kw["dropout"] = ctx.kw.get("dropout")  # (seed, dropout_p), or None
        dq, dk, dv, dsinks, dmask = backward.dense(do, q, k, v, o, lse, alibi_slopes=alibi_slopes,
                                                   seqused_k=seqused_k, sinks=sinks, deterministic=ctx.deterministic,
                                                   attn_mask=_full(attn_mask, q, k, kw["layout"]),
                                                   mask_grad=attn_mask is not None and ctx.needs_input_grad[8], **kw)
        if dmask is not None:  # summed over what the mask broadcast in float32, then in the mask's dtype
            dmask = dmask.sum_to_size(attn_mask.shape).to(attn_mask.dtype)
        return dq, dk, dv, None, None, dsinks, None, None, dmask


class AttentionVarlen(torch.autograd.Function):
    """:func:`packed` with its backward."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, max_seqlen_q, max_seqlen_k,
                kw, deterministic):
        o, lse = packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                        sinks, kw)
        ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks)
        ctx.kw, ctx.longest, ctx.deterministic = kw, (max_seqlen_q, max_seqlen_k), deterministic
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _):
        _first_order_only()
        q, k, v, o, lse, cu_q, cu_k, alibi_slopes, sinks = ctx.saved_tensors
        kw = {n: ctx.kw[n] for n in ("causal", "scale", "causal_align", "window", "softcap")}
        kw["dropout"] = ctx.kw.get("dropout")
        dq, dk, dv, dsinks = backward.packed(do, q, k, v, o, lse, cu_q, cu_k, *ctx.longest, alibi_slopes=alibi_slopes,
                                             sinks=sinks, deterministic=ctx.deterministic, **kw)
        return dq, dk, dv, None, None, None, dsinks, None, None, None, None


class _Refused(torch.autograd.Function):
    """``run()``'s outputs as differentiable results of ``inputs``, with a backward that raises."""

    @staticmethod
    def forward(ctx, run, *inputs):
        outputs = run()
        ctx.mark_non_differentiable(*outputs[1:])
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(PAGED_MESSAGE)


def inference_only(entry):
    """Wrap an entry point without a backward: a call that autograd records still computes its
    forward, but its output's backward raises :data:`PAGED_MESSAGE`."""
    @functools.wraps(entry)
    def call(*args, **kwargs):
        if not torch.is_grad_enabled():  # the common case, checked first
            return entry(*args, **kwargs)
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not needs_grad(*tensors):
            return entry(*args, **kwargs)
        single = []

        def run():
            result = entry(*args, **kwargs)
            single.append(isinstance(result, torch.Tensor))
            return (result,) if single[0] else tuple(result)

        outputs = _Refused.apply(run, *tensors)
        return outputs[0] if single[0] else outputs
    return call
