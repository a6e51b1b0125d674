"""fmha computes no gradients yet: an output that autograd would differentiate refuses its backward.

A model run in training mode without ``torch.no_grad()`` still gets its forward (people run models
that way), but the output carries a ``grad_fn`` whose backward raises, so ``loss.backward()`` stops
with a clear error instead of training every layer but attention's projections in silence.
"""
from __future__ import annotations

import functools

import torch

MESSAGE = ("fmha computes the attention forward only, without gradients: this output feeds a backward pass "
           "(its q, k or v require grad). Train with torch.nn.functional.scaled_dot_product_attention (or "
           "attn_implementation='sdpa'), or run fmha under torch.no_grad() / torch.inference_mode().")


def needs_refusal(*tensors) -> bool:
    """True when autograd records this call: grad mode on and a tensor that requires grad."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


class _Refused(torch.autograd.Function):
    """``run()``'s outputs as differentiable results of ``inputs``, with a backward that raises."""

    @staticmethod
    def forward(ctx, run, *inputs):
        outputs = run()
        ctx.mark_non_differentiable(*outputs[1:])
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(MESSAGE)


def refuse_backward(run, *inputs):
    """Call ``run()`` (returning a tuple of tensors: the output first, then non-differentiable extras
    such as the LSE) so that the first result's backward raises :data:`MESSAGE`."""
    return _Refused.apply(run, *inputs)


def forward_only(entry):
    """Wrap a public entry point: calls that autograd records go through :func:`refuse_backward`
    (under ``torch.compile`` the custom op's registered backward refuses instead)."""
    @functools.wraps(entry)
    def call(*args, **kwargs):
        if not torch.is_grad_enabled() or torch.compiler.is_compiling():  # the common case, checked first
            return entry(*args, **kwargs)
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not needs_refusal(*tensors):
            return entry(*args, **kwargs)
        single = []

        def run():
            result = entry(*args, **kwargs)
            single.append(isinstance(result, torch.Tensor))
            return (result,) if single[0] else tuple(result)

        outputs = refuse_backward(run, *tensors)
        return outputs[0] if single[0] else outputs
    return call
