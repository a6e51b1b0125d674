"""``fmha.attention`` as a ``torch.library`` custom op, so ``torch.compile`` can trace around it.

The op ``fmha::attention`` takes the same arguments as :func:`fmha.attention`
and returns ``(o, lse)`` (``lse`` empty unless asked for: :func:`fmha.attention` asks whenever
autograd records the call); its fake implementation gives shapes and dtypes without running a kernel.
:func:`fmha.attention` routes through it while ``torch.compile`` is tracing; it runs the same
checks and :func:`fmha.forward.dense` as the eager call.  Its registered backward is the op
``fmha::attention_backward`` (:func:`fmha.backward.dense`), so ``torch.compile(fullgraph=True)``
traces forward and backward.
"""
from __future__ import annotations

import torch

from . import backward, forward
from .checks import check_inputs


@torch.library.custom_op("fmha::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
                 variant: str, causal_align: str, layout: str, return_lse: bool,
                 deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    check_inputs(q, k, v, causal_align, layout, variant, scale)
    o, lse = forward.dense(q, k, v, causal=causal, scale=scale, variant=variant, causal_align=causal_align,
                           layout=layout, return_lse=return_lse)
    if lse is None:
        lse = q.new_empty((0,), dtype=torch.float32)
    return o, lse


@attention_op.register_fake
def _(q, k, v, causal, scale, variant, causal_align, layout, return_lse, deterministic=False):
    batch, heads, seqlen_q = (q.shape[0], q.shape[1], q.shape[2]) if layout == "bhsd" else (
        q.shape[0], q.shape[2], q.shape[1])
    lse_shape = (batch, heads, seqlen_q) if return_lse else (0,)
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("fmha::attention_backward", mutates_args=())
def attention_backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                          lse: torch.Tensor, causal: bool, scale: float | None, causal_align: str,
                          layout: str, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of ``fmha::attention``: :func:`fmha.backward.dense` on its saved O and LSE."""
    return backward.dense(do, q, k, v, o, lse, causal=causal, scale=scale, causal_align=causal_align,
                          layout=layout, deterministic=deterministic)[:3]


@attention_backward_op.register_fake
def _(do, q, k, v, o, lse, causal, scale, causal_align, layout, deterministic):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _save(ctx, inputs, output):
    q, k, v, causal, scale, _, causal_align, layout, _, deterministic = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.args = (causal, scale, causal_align, layout, deterministic)


def _backward(ctx, grad_o, grad_lse):
    return (*attention_backward_op(grad_o, *ctx.saved_tensors, *ctx.args), None, None, None, None, None, None, None)


attention_op.register_autograd(_backward, setup_context=_save)
