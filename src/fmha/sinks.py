"""Learnable attention sinks (gpt-oss; FlashAttention-4's ``learnable_sink``, vLLM's ``s_aux``).

Head h has one logit ``sink_h`` (not scaled) that joins every row's softmax denominator and brings no
value:

    o_i = sum_j exp(z_ij - m) v_j / (exp(sink_h - m) + sum_j exp(z_ij - m))

With the kernel's own result ``o'_i`` (the softmax over the keys alone) and its log-sum-exp ``L'_i``,
that is a two-part merge of partial attentions (the split decoder's): the keys' part and the sink's,
whose LSE is ``sink_h`` and whose output is 0:

    L_i = log(exp(L'_i) + exp(sink_h)),    o_i = o'_i exp(L'_i - L_i) = o'_i sigmoid(L'_i - sink_h)

so every variant, split decoding and packed sequences take sinks the same way, the sink counted once.
A row that sees no key has ``L' = -inf``: ``o = 0`` and ``L = sink_h``.  Backward: with ``L`` (the sink
included) the kernels' ``P`` and ``delta`` are those of the whole softmax, so dQ, dK, dV need nothing
more, and ``d sink_h = -sum_i exp(sink_h - L_i) delta_i`` over the rows of head h.
"""
from __future__ import annotations

import torch


def _per_head(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``x`` laid out as the LSE (``[batch, heads, rows]``, or ``[heads, total]`` packed) broadcast to the
    output in ``layout`` (bhsd, bshd, or ``packed``: ``[total, heads, D]``)."""
    if layout == "bhsd":
        return x[..., None]
    if layout == "bshd":
        return x.transpose(1, 2)[..., None]
    return x.transpose(0, 1)[..., None]


def _sink_rows(sinks: torch.Tensor, packed: bool) -> torch.Tensor:
    """``sinks`` broadcast over the LSE's rows (``[batch, heads, rows]``, or ``[heads, total]`` packed)."""
    return sinks[:, None] if packed else sinks[None, :, None]


def attach(o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, layout: str):
    """The result with the sinks in the denominator: ``o`` rescaled in place, and the new LSE."""
    s = _sink_rows(sinks.float(), layout == "packed")
    total = torch.logaddexp(lse, s)
    o.mul_(_per_head(torch.exp(lse - total), layout))  # in float32, rounded once to o's dtype
    return o, total


def grad(sinks: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """``d sink_h = -sum_i exp(sink_h - L_i) delta_i`` (``lse`` and ``delta`` laid out alike)."""
    packed = lse.dim() == 2
    w = torch.exp(_sink_rows(sinks.float(), packed) - lse) * delta
    return -(w.sum(dim=1) if packed else w.sum(dim=(0, 2))).to(sinks.dtype)
