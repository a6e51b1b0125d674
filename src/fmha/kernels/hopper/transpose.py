"""V^T for the float8 forward: the float8 wgmma reads its B operand K-major only, so P V needs V with the
keys along the rows' contiguous dimension.  One pass writes ``[batch * kv_heads, head_dim, seqlen_k]``
(rows padded to 16 bytes for TMA), which the kernel then reads in ``[head_dim, BLOCK_N]`` boxes."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import replay


@triton.jit
def _transpose(V, VT, stride_b, stride_h, stride_s, kv_heads, seqlen, row, HEAD_DIM: tl.constexpr,
               BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (key block, batch * kv_heads + head): V's ``[BLOCK_S, head_dim]`` block as VT's columns."""
    bh = tl.program_id(1)
    offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    src = V + (bh // kv_heads).to(tl.int64) * stride_b + (bh % kv_heads) * stride_h
    x = tl.load(src + offs_s.to(tl.int64)[:, None] * stride_s + offs_d[None, :],
                mask=(offs_s[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM))
    dst = VT + bh.to(tl.int64) * HEAD_DIM * row + offs_d[:, None] * row + offs_s[None, :]
    tl.store(dst, tl.trans(x), mask=(offs_d[:, None] < HEAD_DIM) & (offs_s[None, :] < seqlen))


def transposed(v: torch.Tensor, layout: str) -> torch.Tensor:
    """V (``[batch, kv_heads, seqlen_k, head_dim]`` in ``layout``, unit-stride head_dim) as a new
    ``[batch * kv_heads, head_dim, row]`` tensor whose first ``seqlen_k`` columns hold V^T (``row``: seqlen_k
    rounded up to 16 bytes); a buffer of the call (:func:`fmha.replay.buffer`)."""
    from .. import strides_bhsd
    sb, sh, ss, _ = strides_bhsd(v, layout)
    b, h, s, d = (v.shape[0], v.shape[1], v.shape[2], v.shape[3]) if layout == "bhsd" else \
        (v.shape[0], v.shape[2], v.shape[1], v.shape[3])
    row = -(-max(s, 1) * v.element_size() // 16) * 16 // v.element_size()
    vt = replay.buffer(torch.empty(b * h, d, row, dtype=v.dtype, device=v.device))
    block_s = 64
    replay.launch(_transpose, (triton.cdiv(s, block_s), b * h), v, vt, sb, sh, ss, h, s, row, HEAD_DIM=d,
                  BLOCK_S=block_s, BLOCK_D=triton.next_power_of_2(d), num_warps=4)
    return vt
