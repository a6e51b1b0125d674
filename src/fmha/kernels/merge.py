"""Merging partial attentions by their log-sum-exp, in one pass (flash-decoding's second kernel).

Partial ``s`` of a query row holds ``o_s`` (already normalised over its keys) and
``lse_s``; the whole row is ``o = sum_s exp(lse_s - lse) o_s`` with
``lse = log sum_s exp(lse_s)``.  The sum runs over the partials in chunks with the
seed's recurrence (Section 3): a running maximum, its rescale ``alpha`` and the
running sum, here in base 2.  A row no partial has reached (every ``lse_s = -inf``)
gives ``o = 0`` and ``lse = -inf``.
"""
import triton
import triton.language as tl

from .common import LN2, LOG2E


@triton.jit
def merge_kernel(OP, LP, O, LSE, Rows, n_parts, n_rows, heads, seqlen_q, stride_op, lse_part,
                 stride_ob, stride_oh, stride_os, stride_od,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr,
                 STORE_LSE: tl.constexpr, ROW_MAP: tl.constexpr):
    """One program per ``BLOCK_R`` partial rows: ``OP`` float32 ``[n_parts, n_rows, HEAD_DIM]`` (part
    stride ``stride_op``), ``LP`` float32 ``[n_parts, n_rows]`` (part stride ``lse_part``).  Partial
    row r is query row ``(b, h, i)`` flattened (``(b * heads + h) * seqlen_q + i``): r itself, or,
    ROW_MAP, ``Rows[r]`` (-1: no row, nothing stored).  ``O`` through its strides, ``LSE``
    ``[batch*heads*seqlen_q]``.  A partial with LSE -inf (no key, or an empty slot) weighs 0 and its
    ``o`` is never read."""
    src = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = src < n_rows
    row = src
    if ROW_MAP:
        row = tl.load(Rows + src, mask=live, other=-1).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for s0 in range(0, n_parts, BLOCK_S):
        parts = (s0 + offs_s).to(tl.int64)
        lse = tl.load(LP + parts[:, None] * lse_part + src[None, :], mask=(parts[:, None] < n_parts) & live[None, :],
                      other=float("-inf")) * LOG2E  # [BLOCK_S, BLOCK_R]
        m_new = tl.maximum(m, tl.max(lse, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m - m_safe)
        w = tl.math.exp2(lse - m_safe[None, :])
        o = tl.load(OP + parts[:, None, None] * stride_op + src[None, :, None] * HEAD_DIM + offs_d[None, None, :],
                    mask=(lse[:, :, None] > float("-inf")) & (offs_d[None, None, :] < HEAD_DIM), other=0.0)
        acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * o, 0)
        l = l * alpha + tl.sum(w, 0)
        m = m_new
    inv_l = tl.where(l == 0.0, 0.0, 1.0 / l)
    i = row % seqlen_q
    bh = row // seqlen_q
    o_ptrs = O + ((bh // heads) * stride_ob + (bh % heads) * stride_oh + i * stride_os)[:, None] \
        + offs_d[None, :] * stride_od
    tl.store(o_ptrs, (acc * inv_l[:, None]).to(O.dtype.element_ty),
             mask=(row >= 0)[:, None] & (offs_d[None, :] < HEAD_DIM))
    if STORE_LSE:
        total = tl.where(l == 0.0, float("-inf"), (m + tl.math.log2(l)) * LN2)
        tl.store(LSE + row, total, mask=row >= 0)


def launch(o_parts, lse_parts, o, lse, o_strides, heads: int = 1, seqlen_q: int | None = None,
           rows=None) -> None:
    """Merge ``o_parts`` ``[n, rows..., D]`` / ``lse_parts`` ``[n, rows...]`` (float32, contiguous)
    into ``o`` and, when not None, ``lse`` (contiguous, ``rows...``).  Row r of the flattened rows
    is ``(b, h, i)`` with ``i = r % seqlen_q``, ``h = r // seqlen_q % heads``, or, given ``rows``
    (int32, one per partial row), row ``rows[r]`` of the output (-1: none); ``o_strides`` are
    ``o``'s strides in (b, h, i, d) order.  A program merges up to 16 parts of a row at a time, and
    several rows where there are thousands (:data:`ROWS_APART`)."""
    n, d = o_parts.shape[0], o_parts.shape[-1]
    n_rows = lse_parts[0].numel()
    if n_rows == 0 or n == 0:
        return
    block_d = max(16, triton.next_power_of_2(d))
    block_s = min(16, triton.next_power_of_2(n))
    block_r = 1 if n_rows < ROWS_APART else max(1, min(16, 4096 // (block_s * block_d)))
    merge_kernel[(triton.cdiv(n_rows, block_r),)](
        o_parts, lse_parts, o, lse if lse is not None else lse_parts, rows if rows is not None else lse_parts, n,
        n_rows, heads, seqlen_q or n_rows, o_parts.stride(0), lse_parts.stride(0), *o_strides,
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK_S=block_s, BLOCK_R=block_r, STORE_LSE=lse is not None,
        ROW_MAP=rows is not None, num_warps=4)


ROWS_APART = 4096  # from this many rows a merge program takes several (the split tail's 8704 rows at 16k keys
# ran 8704 one-row programs for 29.7 us under ncu, call 1 of session 12); decoding's few rows keep one each
