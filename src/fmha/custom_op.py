"""``fmha.attention`` as a ``torch.library`` custom op, so ``torch.compile`` can trace around it.

The op ``fmha::attention`` takes the same arguments as :func:`fmha.attention`
and returns ``(o, lse)`` (``lse`` empty unless asked for); its fake
implementation gives shapes and dtypes without running a kernel.
:func:`fmha.attention` routes through it while ``torch.compile`` is tracing; it runs the same
checks and :func:`fmha.forward.dense` as the eager call.  fmha computes no gradients: the op's
registered backward (``fmha::refused_backward``) raises when run.
"""
from __future__ import annotations

import torch

from . import forward
from .checks import check_inputs
from .gradients import MESSAGE


@torch.library.custom_op("fmha::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
                 variant: str, causal_align: str, layout: str, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    check_inputs(q, k, v, causal_align, layout, variant, scale)
    o, lse = forward.dense(q, k, v, causal=causal, scale=scale, variant=variant, causal_align=causal_align,
                           layout=layout, return_lse=return_lse)
    if lse is None:
        lse = q.new_empty((0,), dtype=torch.float32)
    return o, lse


@attention_op.register_fake
def _(q, k, v, causal, scale, variant, causal_align, layout, return_lse):
    batch, heads, seqlen_q = (q.shape[0], q.shape[1], q.shape[2]) if layout == "bhsd" else (
        q.shape[0], q.shape[2], q.shape[1])
    lse_shape = (batch, heads, seqlen_q) if return_lse else (0,)
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("fmha::refused_backward", mutates_args=())
def refused_backward(grad_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of ``fmha::attention``: fmha computes no gradients, so running it raises
    (tracing it under ``torch.compile`` does not: the fake gives the gradients' shapes).  It takes
    ``grad_o`` so that the partitioner keeps it in the backward graph."""
    raise RuntimeError(MESSAGE)


@refused_backward.register_fake
def _(grad_o, q, k, v):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])


def _backward(ctx, grad_o, grad_lse):
    return (*refused_backward(grad_o, *ctx.saved_tensors), None, None, None, None, None, None)


attention_op.register_autograd(_backward, setup_context=_save_inputs)
