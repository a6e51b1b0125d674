"""Merging partial attentions by their log-sum-exp: in one pass (flash-decoding's second kernel), or inside
the split launch, by the split that finishes its row block last (:func:`merge_if_last`, eager calls).

Partial ``s`` of a query row holds ``o_s`` (already normalised over its keys) and
``lse_s``; the whole row is ``o = sum_s exp(lse_s - lse) o_s`` with
``lse = log sum_s exp(lse_s)``.  The sum runs over the partials in chunks with the
seed's recurrence (Section 3): a running maximum, its rescale ``alpha`` and the
running sum, here in base 2.  A row no partial has reached (every ``lse_s = -inf``)
gives ``o = 0`` and ``lse = -inf``.
"""
import triton
import triton.language as tl

from .. import replay
from .common import LN2, LOG2E, initial_state, row_place, write_output


@triton.jit
def merge_kernel(OP, LP, O, LSE, Rows, n_parts, heads, seqlen_q, stride_op, lse_part,
                 stride_ob, stride_oh, stride_os, stride_od,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, STORE_LSE: tl.constexpr,
                 ROW_MAP: tl.constexpr):
    """One program per partial row: ``OP`` float32 ``[n_parts, rows, HEAD_DIM]`` (part stride
    ``stride_op``), ``LP`` float32 ``[n_parts, rows]`` (part stride ``lse_part``).  Partial row r is
    query row ``(b, h, i)`` flattened (``(b * heads + h) * seqlen_q + i``): r itself, or, ROW_MAP,
    ``Rows[r]`` (-1: no row, nothing stored).  ``O`` through its strides, ``LSE``
    ``[batch*heads*seqlen_q]``."""
    src = tl.program_id(0).to(tl.int64)
    row = src
    if ROW_MAP:
        row = tl.load(Rows + src).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    m = tl.full([1], float("-inf"), tl.float32)
    l = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s0 in range(0, n_parts, BLOCK_S):
        parts = (s0 + offs_s).to(tl.int64)
        lse = tl.load(LP + parts * lse_part + src, mask=parts < n_parts, other=float("-inf")) * LOG2E
        m_new = tl.maximum(m, tl.max(lse, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m - m_safe)
        w = tl.math.exp2(lse[None, :] - m_safe[:, None])  # [1, BLOCK_S]
        o = tl.load(OP + parts[:, None] * stride_op + src * HEAD_DIM + offs_d[None, :],
                    mask=(parts[:, None] < n_parts) & (offs_d[None, :] < HEAD_DIM), other=0.0)
        acc = acc * alpha + tl.sum(tl.trans(w) * o, 0)
        l = l * alpha + tl.sum(w, 1)
        m = m_new
    inv_l = tl.where(l == 0.0, 0.0, 1.0 / l)
    o_ptrs = row_place(O, row, heads, seqlen_q, stride_ob, stride_oh, stride_os) + offs_d * stride_od
    tl.store(o_ptrs, (acc * inv_l).to(O.dtype.element_ty), mask=(offs_d < HEAD_DIM) & (row >= 0))
    if STORE_LSE:
        total = tl.where(l == 0.0, float("-inf"), (m + tl.math.log2(l)) * LN2)
        tl.store(LSE + row + tl.arange(0, 1), total, mask=row >= 0)


@triton.jit
def merge_step(acc, l, m, lse, o):
    """One partial result into a running merge (Section 3's recurrence, a partial standing for a key):
    ``o`` (already over its own sum) weighs ``2**lse`` (``lse`` in base 2); ``m`` is the largest ``lse``
    so far, ``l`` the weights' sum and ``acc`` the weighted sum, both relative to ``2**m``.  A partial that
    saw no key (``lse = -inf``) weighs 0."""
    m_new = tl.maximum(m, lse)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m - m_safe)
    w = tl.math.exp2(lse - m_safe)
    return acc * alpha[:, None] + w[:, None] * o, l * alpha + w, m_new


@triton.jit
def merge_if_last(o_rows, LSE, lse_rows, Out, LseOut, Tickets, offs_m, heads, seqlen_q, offs_d, stride_od,
                  stride_osplit, lse_split, stride_fb, stride_fh, stride_fs, stride_fd, HEAD_DIM: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, MERGE_LSE: tl.constexpr):
    """Flash-decoding's second pass inside the split launch.  Once this split's partial is stored
    (``o_rows`` into ``O``, ``lse_rows`` into ``LSE``, rows ``(b * heads + h) * seqlen_q + i``), the split
    takes a ticket for its row block; the split that takes the last one merges every split's partial
    (:func:`merge_step`) into ``Out`` (strides ``stride_f*``) and, MERGE_LSE, the whole LSE into ``LseOut``
    (``[batch, heads, seqlen_q]``), and sets the ticket back to 0 for the next launch on the stream.  The
    partials are read through L2 (``.cg``): other SMs wrote them."""
    n = tl.num_programs(2)
    ticket = Tickets + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    tl.debug_barrier()  # every thread's part of the partial is stored before the ticket is taken
    if tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu") == n - 1:
        tl.atomic_xchg(ticket, 0, sem="relaxed", scope="gpu")
        rows = offs_m < seqlen_q
        here = tl.program_id(2).to(tl.int64)
        o_rows -= here * stride_osplit  # split 0's
        lse_rows -= here * lse_split
        m, l, acc = initial_state(BLOCK_M, BLOCK_D)
        for s in range(n):
            lse = tl.load(LSE + lse_rows + s * lse_split, mask=rows, other=float("-inf"), cache_modifier=".cg")
            o = tl.load(o_rows[:, None] + s * stride_osplit + offs_d[None, :] * stride_od,
                        mask=rows[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0, cache_modifier=".cg")
            acc, l, m = merge_step(acc, l, m, lse * LOG2E, o)
        f_rows = row_place(Out, lse_rows, heads, seqlen_q, stride_fb, stride_fh, stride_fs)
        write_output(f_rows, LseOut, lse_rows, acc, l, m, offs_m, seqlen_q, offs_d, stride_fd, HEAD_DIM, BLOCK_D,
                     MERGE_LSE)



def launch(o_parts, lse_parts, o, lse, o_strides, heads: int = 1, seqlen_q: int | None = None,
           rows=None) -> None:
    """Merge ``o_parts`` ``[n, rows..., D]`` / ``lse_parts`` ``[n, rows...]`` (float32, contiguous)
    into ``o`` and, when not None, ``lse`` (contiguous, ``rows...``).  Row r of the flattened rows
    is ``(b, h, i)`` with ``i = r % seqlen_q``, ``h = r // seqlen_q % heads``, or, given ``rows``
    (int32, one per partial row), row ``rows[r]`` of the output (-1: none); ``o_strides`` are
    ``o``'s strides in (b, h, i, d) order.  One row a program: blocks of several rows left
    decoding's merges 0.3 us slower at 1k and 8k keys and the split tail's no faster."""
    n, d = o_parts.shape[0], o_parts.shape[-1]
    n_rows = lse_parts[0].numel()
    if n_rows == 0 or n == 0:
        return
    replay.launch(merge_kernel, (n_rows,), o_parts, lse_parts, o, lse if lse is not None else lse_parts,
                            rows if rows is not None else lse_parts, n, heads, seqlen_q or n_rows,
                            o_parts.stride(0), lse_parts.stride(0), *o_strides,
                            HEAD_DIM=d, BLOCK_D=max(16, 1 << (d - 1).bit_length()),
                            BLOCK_S=min(16, 1 << (n - 1).bit_length()), STORE_LSE=lse is not None,
                            ROW_MAP=rows is not None, num_warps=4)
