"""``fmha.attention``, ``fmha.attention_varlen`` and ``fmha.attention_paged`` as ``torch.library`` custom ops,
so ``torch.compile`` can trace around them.

The op ``fmha::attention`` takes :func:`fmha.attention`'s arguments but ``out``, ``config`` and the float8
descale factors (the window as its two sides) and returns ``(o, lse)`` (``lse`` empty unless asked for:
:func:`fmha.attention` asks whenever autograd records the call); its fake implementation gives shapes
and dtypes without running a kernel.  :func:`fmha.attention` routes through it while ``torch.compile``
is tracing; it runs the same checks and :func:`fmha.forward.dense` as the eager call, holding no buffer past
the call (:func:`fmha.replay.transient`: the compiled code's CUDA graphs warm up in their own memory pool).
Its registered backward is the op ``fmha::attention_backward`` (:func:`fmha.backward.dense`, transient too), so
``torch.compile(fullgraph=True)`` traces forward and backward, modifiers and sinks included.  The op
``fmha::attention_varlen`` does the same for packed sequences (:func:`fmha.forward.packed`, its backward
:func:`fmha.backward.packed`); the max_seqlens are integers of the op (symbolic where Dynamo makes them so).
``fmha::attention_paged`` is forward only, as :func:`fmha.attention_paged` is.
"""
from __future__ import annotations

import torch

from . import backward, forward, replay, sinks as sink_mod
from .checks import (attn_mask_view, check_features, check_forward_only, check_index, check_inputs, check_paged_call,
                     check_splits, check_varlen_call)


@torch.library.custom_op("fmha::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
                 variant: str, causal_align: str, layout: str, return_lse: bool, deterministic: bool = False,
                 window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                 alibi_slopes: torch.Tensor | None = None, seqused_k: torch.Tensor | None = None,
                 num_splits: int = 0, sinks: torch.Tensor | None = None,
                 attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    window = (window_left, window_right)
    check_inputs(q, k, v, causal_align, layout, variant, scale)
    check_features(q, layout, window, softcap, alibi_slopes, sinks)
    if seqused_k is not None:
        check_index(seqused_k, "seqused_k", (q.shape[0],), q.device)
    check_splits(num_splits)
    with replay.transient():
        o, lse = forward.dense(q, k, v, causal=causal, scale=scale, variant=variant, causal_align=causal_align,
                               layout=layout, return_lse=return_lse or sinks is not None, window=window,
                               softcap=softcap, alibi_slopes=alibi_slopes, seqused_k=seqused_k, num_splits=num_splits,
                               attn_mask=None if attn_mask is None else attn_mask_view(attn_mask, q, k, layout))
    if sinks is not None:
        o, lse = sink_mod.attach(o, lse, sinks, layout)
    if not return_lse:
        lse = q.new_empty((0,), dtype=torch.float32)
    return o, lse


def _outputs_like(q, v, layout: str, return_lse: bool):
    """A fake implementation's outputs: o in q's shape with V's head dim, and the LSE ``[batch, heads, seqlen_q]``
    (empty unless asked for)."""
    batch, heads, seqlen_q = (q.shape[0], q.shape[1], q.shape[2]) if layout == "bhsd" else (
        q.shape[0], q.shape[2], q.shape[1])
    lse_shape = (batch, heads, seqlen_q) if return_lse else (0,)
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(lse_shape, dtype=torch.float32)


@attention_op.register_fake
def _(q, k, v, causal, scale, variant, causal_align, layout, return_lse, deterministic=False, window_left=-1,
      window_right=-1, softcap=0.0, alibi_slopes=None, seqused_k=None, num_splits=0, sinks=None, attn_mask=None):
    return _outputs_like(q, v, layout, return_lse)


@torch.library.custom_op("fmha::attention_backward", mutates_args=())
def attention_backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                          lse: torch.Tensor, causal: bool, scale: float | None, causal_align: str,
                          layout: str, deterministic: bool, window_left: int, window_right: int, softcap: float,
                          alibi_slopes: torch.Tensor | None, seqused_k: torch.Tensor | None,
                          sinks: torch.Tensor | None, attn_mask: torch.Tensor | None = None, mask_grad: bool = False,
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of ``fmha::attention``: :func:`fmha.backward.dense` on its saved O and LSE; then the sinks'
    gradient (empty without sinks) and, with ``mask_grad``, the float attn_mask's in float32, in its shape (else
    empty)."""
    mask = None if attn_mask is None else attn_mask_view(attn_mask, q, k, layout)
    with replay.transient():
        dq, dk, dv, dsinks, dmask = backward.dense(do, q, k, v, o, lse, causal=causal, scale=scale,
                                                   causal_align=causal_align, layout=layout,
                                                   deterministic=deterministic, window=(window_left, window_right),
                                                   softcap=softcap, alibi_slopes=alibi_slopes, seqused_k=seqused_k,
                                                   sinks=sinks, attn_mask=mask, mask_grad=mask_grad)
    def empty():  # (each a tensor of its own: an op's outputs may not alias)
        return q.new_empty((0,), dtype=torch.float32)
    return (dq, dk, dv, dsinks if dsinks is not None else empty(),
            dmask.sum_to_size(attn_mask.shape) if dmask is not None else empty())


@attention_backward_op.register_fake
def _(do, q, k, v, o, lse, causal, scale, causal_align, layout, deterministic, window_left, window_right, softcap,
      alibi_slopes, seqused_k, sinks, attn_mask=None, mask_grad=False):
    grads = tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    dmask = q.new_empty(attn_mask.shape if mask_grad else (0,), dtype=torch.float32)
    return (*grads, torch.empty_like(sinks) if sinks is not None else q.new_empty((0,), dtype=torch.float32), dmask)


def _save(ctx, inputs, output):
    (q, k, v, causal, scale, _, causal_align, layout, _, deterministic, window_left, window_right, softcap,
     alibi_slopes, seqused_k, _, sinks, attn_mask) = inputs
    ctx.save_for_backward(q, k, v, *output, alibi_slopes, seqused_k, sinks, attn_mask)
    ctx.args = (causal, scale, causal_align, layout, deterministic, window_left, window_right, softcap)


def _backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse, alibi_slopes, seqused_k, sinks, attn_mask = ctx.saved_tensors
    check_forward_only(q, v, True)
    mask_grad = attn_mask is not None and bool(ctx.needs_input_grad[17])
    dq, dk, dv, dsinks, dmask = attention_backward_op(grad_o, q, k, v, o, lse, *ctx.args, alibi_slopes, seqused_k,
                                                      sinks, attn_mask, mask_grad)
    return (dq, dk, dv, *[None] * 13, dsinks if sinks is not None else None,
            dmask.to(attn_mask.dtype) if mask_grad else None)  # (summed to the mask's shape in float32 by the op)


attention_op.register_autograd(_backward, setup_context=_save)


@torch.library.custom_op("fmha::attention_varlen", mutates_args=())
def attention_varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                        cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                        scale: float | None, variant: str, causal_align: str, return_lse: bool,
                        deterministic: bool = False, window_left: int = -1, window_right: int = -1,
                        softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                        sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    window = (window_left, window_right)
    check_varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, causal_align, variant, scale, window, softcap, alibi_slopes,
                      sinks)
    with replay.transient():
        o, lse = forward.packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                                scale=scale, variant=variant, causal_align=causal_align,
                                return_lse=return_lse or sinks is not None, window=window, softcap=softcap,
                                alibi_slopes=alibi_slopes, config=None)
    if sinks is not None:
        o, lse = sink_mod.attach(o, lse, sinks, "packed")
    if not return_lse:
        lse = q.new_empty((0,), dtype=torch.float32)
    return o, lse


@attention_varlen_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, variant, causal_align,
      return_lse, deterministic=False, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None):
    lse_shape = (q.shape[1], q.shape[0]) if return_lse else (0,)
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("fmha::attention_varlen_backward", mutates_args=())
def attention_varlen_backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 o: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                 cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                                 scale: float | None, causal_align: str, deterministic: bool, window_left: int,
                                 window_right: int, softcap: float, alibi_slopes: torch.Tensor | None,
                                 sinks: torch.Tensor | None
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of ``fmha::attention_varlen``: :func:`fmha.backward.packed` on its saved O and LSE; the
    sinks' gradient last (empty without sinks)."""
    with replay.transient():
        dq, dk, dv, dsinks = backward.packed(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                             max_seqlen_k, causal=causal, scale=scale, causal_align=causal_align,
                                             window=(window_left, window_right), softcap=softcap,
                                             alibi_slopes=alibi_slopes, sinks=sinks, deterministic=deterministic)
    return dq, dk, dv, dsinks if dsinks is not None else q.new_empty((0,), dtype=torch.float32)


@attention_varlen_backward_op.register_fake
def _(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, causal_align,
      deterministic, window_left, window_right, softcap, alibi_slopes, sinks):
    grads = tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    return (*grads, torch.empty_like(sinks) if sinks is not None else q.new_empty((0,), dtype=torch.float32))


def _save_varlen(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, _, causal_align, _, deterministic, window_left, window_right,
     softcap, alibi_slopes, sinks) = inputs
    ctx.save_for_backward(q, k, v, *output, cu_q, cu_k, alibi_slopes, sinks)
    ctx.args = (max_q, max_k, causal, scale, causal_align, deterministic, window_left, window_right, softcap)


def _backward_varlen(ctx, grad_o, grad_lse):
    q, k, v, o, lse, cu_q, cu_k, alibi_slopes, sinks = ctx.saved_tensors
    check_forward_only(q, v, True)
    dq, dk, dv, dsinks = attention_varlen_backward_op(grad_o, q, k, v, o, lse, cu_q, cu_k, *ctx.args, alibi_slopes,
                                                      sinks)
    return (dq, dk, dv, *[None] * 14, dsinks if sinks is not None else None)


attention_varlen_op.register_autograd(_backward_varlen, setup_context=_save_varlen)


@torch.library.custom_op("fmha::attention_paged", mutates_args=())
def attention_paged_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                       cache_seqlens: torch.Tensor, causal: bool, scale: float | None, causal_align: str, layout: str,
                       return_lse: bool, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                       alibi_slopes: torch.Tensor | None = None, num_splits: int = 0, variant: str = "auto",
                       sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    window = (window_left, window_right)
    check_paged_call(q, k_cache, v_cache, block_table, cache_seqlens, causal_align, layout, variant, scale, window,
                     softcap, alibi_slopes, sinks, num_splits)
    with replay.transient():
        o, lse = forward.paged(q, k_cache, v_cache, block_table, cache_seqlens, causal=causal, scale=scale,
                               causal_align=causal_align, layout=layout, return_lse=return_lse or sinks is not None,
                               window=window, softcap=softcap, alibi_slopes=alibi_slopes, num_splits=num_splits,
                               variant=variant, config=None)
    if sinks is not None:
        o, lse = sink_mod.attach(o, lse, sinks, layout)
    if not return_lse:
        lse = q.new_empty((0,), dtype=torch.float32)
    return o, lse


@attention_paged_op.register_fake
def _(q, k_cache, v_cache, block_table, cache_seqlens, causal, scale, causal_align, layout, return_lse,
      window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, num_splits=0, variant="auto", sinks=None):
    return _outputs_like(q, v_cache, layout, return_lse)
