"""V^T for the float8 forward: the float8 wgmma reads its B operand K-major only, so P V needs V with the
keys along the rows' contiguous dimension.  One pass writes ``[batch * kv_heads, head_dim, keys]`` (keys:
seqlen_k rounded up to 32, the columns past it zero), which the kernel then reads in ``[head_dim, BLOCK_N]``
boxes.  Within each group of 32 keys the columns are reordered as the consumer reorders P's (its
``_p_operand``: key ``16a + 8b + 2t + e`` goes to column ``16a + 4t + 2b + e``), so that P's accumulator
registers are the A operand as they lie and P V sums the same products."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import replay


@triton.jit
def _transpose(V, VT, stride_b, stride_h, stride_s, kv_heads, seqlen, row, HEAD_DIM: tl.constexpr,
               BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BH_BASE: tl.constexpr = 0):
    """Program (column block, batch * kv_heads + head): VT's ``[head_dim, BLOCK_S]`` block, each column from the
    key that the reorder sends there (rows of V gathered, so the stores stay contiguous); keys past seqlen
    (up to ``row``) as zeros; ``BH_BASE``: the first (batch, head) program of this launch
    (:func:`fmha.replay.launch`)."""
    bh = tl.program_id(1) + BH_BASE
    col = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    key = (col & ~31) | (col & 16) | ((col & 12) >> 1) | ((col & 2) << 2) | (col & 1)  # column 16a+4t+2b+e's key
    offs_d = tl.arange(0, BLOCK_D)
    src = V + (bh // kv_heads).to(tl.int64) * stride_b + (bh % kv_heads) * stride_h
    x = tl.load(src + key.to(tl.int64)[:, None] * stride_s + offs_d[None, :],
                mask=(key[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    dst = VT + bh.to(tl.int64) * HEAD_DIM * row + offs_d[:, None] * row + col[None, :]
    tl.store(dst, tl.trans(x), mask=(offs_d[:, None] < HEAD_DIM) & (col[None, :] < row))


def transposed(v: torch.Tensor, layout: str) -> torch.Tensor:
    """V (``[batch, kv_heads, seqlen_k, head_dim]`` in ``layout``, unit-stride head_dim) as a new
    ``[batch * kv_heads, head_dim, row]`` tensor holding V^T, its keys reordered in groups of 32 (``row``:
    seqlen_k rounded up to 32, the keys past it zero); a buffer of the call (:func:`fmha.replay.buffer`)."""
    from .. import strides_bhsd
    sb, sh, ss, _ = strides_bhsd(v, layout)
    b, h, s, d = (v.shape[0], v.shape[1], v.shape[2], v.shape[3]) if layout == "bhsd" else \
        (v.shape[0], v.shape[2], v.shape[1], v.shape[3])
    row = -(-max(s, 1) // 32) * 32
    vt = replay.buffer(torch.empty(b * h, d, row, dtype=v.dtype, device=v.device))
    block_s = 64
    replay.launch(_transpose, (triton.cdiv(row, block_s), b * h), v, vt, sb, sh, ss, h, s, row, HEAD_DIM=d,
                  BLOCK_S=block_s, BLOCK_D=triton.next_power_of_2(d), num_warps=4)
    return vt
