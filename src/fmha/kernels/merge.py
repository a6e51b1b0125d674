"""Merging stacked partial attentions by their log-sum-exp, in one pass (ring attention's merge).

Partial ``s`` of a query row holds ``o_s`` (already normalised over its keys) and
``lse_s``; the whole row is ``o = sum_s exp(lse_s - lse) o_s`` with
``lse = log sum_s exp(lse_s)``: the seed's recurrence (Section 3), one partial at a
time (:func:`~fmha.kernels.common.merge_step`, which split-key decoding runs inside
its own launch).  A row no partial has reached (every ``lse_s = -inf``) gives
``o = 0`` and ``lse = -inf``.
"""
import triton
import triton.language as tl

from .common import LOG2E, initial_state, merge_step, write_output


@triton.jit
def merge_kernel(OP, LP, O, LSE, n_parts, n_rows, heads, seqlen_q, stride_op, lse_part,
                 stride_ob, stride_oh, stride_os, stride_od,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, STORE_LSE: tl.constexpr):
    """``BLOCK_R`` query rows a program: ``OP`` float32 ``[n_parts, n_rows, HEAD_DIM]`` (part stride
    ``stride_op``), ``LP`` float32 ``[n_parts, n_rows]`` (part stride ``lse_part``); row r is
    ``(b, h, i)`` with ``i = r % seqlen_q``, ``h = r // seqlen_q % heads``; ``O`` through its
    strides, ``LSE`` ``[n_rows]``."""
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    live = rows < n_rows
    m, l, acc = initial_state(BLOCK_R, BLOCK_D)
    for s in range(n_parts):
        x = tl.load(LP + s * lse_part + rows, mask=live, other=float("-inf"))
        o = tl.load(OP + s * stride_op + rows[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=live[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
        acc, l, m = merge_step(acc, l, m, x * LOG2E, o)
    bh = rows // seqlen_q
    o_rows = O + (bh // heads) * stride_ob + (bh % heads) * stride_oh + (rows % seqlen_q) * stride_os
    write_output(o_rows, LSE, rows, acc, l, m, rows, n_rows, offs_d, stride_od, HEAD_DIM, BLOCK_D, STORE_LSE)


def launch(o_parts, lse_parts, o, lse, o_strides, heads: int = 1, seqlen_q: int | None = None) -> None:
    """Merge ``o_parts`` ``[n, rows..., D]`` / ``lse_parts`` ``[n, rows...]`` (float32, contiguous)
    into ``o`` and, when not None, ``lse`` (contiguous, ``rows...``).  Row r of the flattened rows
    is ``(b, h, i)`` with ``i = r % seqlen_q``, ``h = r // seqlen_q % heads``; ``o_strides`` are
    ``o``'s strides in (b, h, i, d) order."""
    n, d = o_parts.shape[0], o_parts.shape[-1]
    rows = lse_parts[0].numel()
    if rows == 0 or n == 0:
        return
    block_r = 16
    merge_kernel[(triton.cdiv(rows, block_r),)](
        o_parts, lse_parts, o, lse if lse is not None else lse_parts, n, rows, heads, seqlen_q or rows,
        o_parts.stride(0), lse_parts.stride(0), *o_strides, HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_R=block_r, STORE_LSE=lse is not None, num_warps=4)
