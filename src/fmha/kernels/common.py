"""The pieces every Triton variant shares, written once (seed Sections 3, 5, 6, 7).

* :func:`mma` -- the one matrix product, with the interpreter switch;
* :func:`program_start`, :func:`sequence`, :func:`initial_state` -- what a program owns, its
  sequence's place and lengths, and m, l, acc at t = 0; :func:`row_place` -- a flattened query row's place;
* :func:`load_rows` -- a masked ``[rows, head_dim]`` tile load;
* :func:`scores` -- scale, softcap, ALiBi, and the key-boundary, causal and window masks (5.2);
  :func:`masked_scores` -- an ``attn_mask`` joined with them, boolean or an additive bias;
* :func:`window_start` -- the sliding window's whole-tile skip; :func:`window_clear` -- the tiles past its edge;
* :func:`causal_stop` -- the early exit (Section 7);
* :func:`softmax_weights`, :func:`online_softmax_step`, :func:`pv_half` -- one tile of the
  recurrence (5.3-5.6), the product with V whole or a half of the head dimension at a time;
* :func:`write_output` -- the epilogue with the ``l == 0`` guard (Section 6) and LSE.

Scores live in the base-2 domain: ``s = scale_log2 * q.k`` with
``scale_log2 = scale * log2(e)`` folded on the host (8.1), so every exponential is
one ``exp2``.
"""
import os

import triton
import triton.language as tl

from .. import constants
from . import dropout

# Triton 3.6's interpreter returns garbage for a bfloat16 tl.dot; float32 operands
# give exact products.  Decided once, at import, as Triton decides interpretation.
INTERPRET = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")
LN2 = tl.constexpr(constants.LN2)
LOG2E = tl.constexpr(constants.LOG2E)


@triton.jit
def mma(a, b, acc):
    """``acc + a @ b`` with float32 accumulation.  The product's depth must be 16 at least, as the compiled
    ``tl.dot`` asserts (the matrix unit's step): the interpreter, which would multiply any depth, asserts it too, so a
    tiling that a GPU build refuses fails on the CPU as well."""
    tl.static_assert(a.shape[len(a.shape) - 1] >= 16, "a product's depth (a's last dimension) must be 16 at least")
    if INTERPRET:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


@triton.jit
def dot_t(a, b, M: tl.constexpr, N: tl.constexpr, CHUNKS: tl.constexpr):
    """``a @ b^T`` in float32 (``a`` ``[M, D]``, ``b`` ``[N, D]``); CHUNKS: as one batched product over that many
    column chunks of D, summed, so that each warp holds a chunk of both operands' columns, not all of them (RDNA's
    matrix unit holds an operand twice, once a half-wave: at head_dim 256 whole rows of both fill the register file,
    and at MLA's 576 whole rows of Q alone); fewer where D holds fewer chunks of 16 columns, the product's least depth
    (V's 128 columns beside q/k's 192 in 8, where the q/k product takes 16)."""
    if CHUNKS:
        D: tl.constexpr = a.shape[1]
        C: tl.constexpr = CHUNKS if D // CHUNKS >= 16 else D // 16
        a3 = tl.permute(tl.reshape(a, [M, C, D // C]), (1, 0, 2))
        b3 = tl.permute(tl.reshape(b, [N, C, D // C]), (1, 2, 0))
        out = tl.sum(mma(a3, b3, tl.zeros([C, M, N], tl.float32)), axis=0)
    else:
        out = mma(a, tl.trans(b), tl.zeros([M, N], tl.float32))
    return out


@triton.jit
def program_start(Q, K, V, O, stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks,
                  stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os, heads, group, seqlen_q, seqlen_k,
                  causal_offset, window_offset, align_offset, CuQ, CuK, SeqK, stride_osplit, lse_split,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_M: tl.constexpr, VARLEN: tl.constexpr, SEQUSED: tl.constexpr, ALIGN_BR: tl.constexpr,
                  SPLIT: tl.constexpr, PAGED: tl.constexpr, PACK_GQA: tl.constexpr, BH_BASE: tl.constexpr):
    """Program (row block, batch*head: ``program_id(1) + BH_BASE``, :func:`fmha.replay.launch`) -> its query rows, its Q
    tile, the bases of its K/V head, a pointer to each row's output and the offset of each row's LSE, its
    sequence's lengths, and the band's offsets moved onto its sequence's diagonal (the host passes them relative
    to it).  Returns ``(row_lo, row_hi, offs_m, q, k_base, v_base, o_rows, lse_rows, seqlen_q, seqlen_k,
    causal_offset, window_offset, align_offset)``: ``offs_m`` holds each row's query position, all of them within
    ``[row_lo, row_hi)``.

    PACK_GQA: grid axis 1 is batch*kv_heads and the block's rows are the ``group`` query
    heads of one KV head interleaved (row r: query ``r // group`` of head ``r % group``), so
    each K/V tile is read once for the whole group (decoding).  VARLEN: sequence b occupies
    rows ``cu_q[b]..cu_q[b+1]`` of packed q/o and ``cu_k[b]..cu_k[b+1]`` of packed k/v (LSE
    is ``[heads, total_q]``).  SEQUSED: batch b uses only its first ``seqused_k[b]`` keys.
    ALIGN_BR: the diagonal is ``i + seqlen_k - seqlen_q`` of this sequence (bottom-right),
    else ``i``.  SPLIT: grid axis 2 splits the keys (flash-decoding); split s writes its
    partial O and LSE ``s * stride_osplit`` and ``s * lse_split`` further on.  PAGED: K/V are
    page pools (the batch stride is the page stride); the K/V bases hold only the head
    offset.  64-bit offsets: tensors past 2**31 elements stay addressable.
    """
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1) + BH_BASE
    rows = start_m + tl.arange(0, BLOCK_M)
    if PACK_GQA:
        kv_heads = heads // group
        b = bh // kv_heads
        kvh = (bh % kv_heads).to(tl.int64)
        h = kvh * group + rows % group
        offs_m = rows // group
        row_lo = start_m // group
        row_hi = (start_m + BLOCK_M - 1) // group + 1
    else:
        b = bh // heads
        h = bh % heads
        kvh = (h // group).to(tl.int64)
        offs_m = rows
        row_lo = start_m
        row_hi = start_m + BLOCK_M
    q0, krow0, sq, sk, align = sequence(b, seqlen_q, seqlen_k, CuQ, CuK, SeqK, VARLEN, SEQUSED, ALIGN_BR)
    if VARLEN:
        lse_rows = h.to(tl.int64) * seqlen_q + q0 + offs_m  # seqlen_q is the packed total here
    else:
        lse_rows = (b * heads + h).to(tl.int64) * seqlen_q + offs_m
    b = b.to(tl.int64)
    h = h.to(tl.int64)
    seq = (q0 + offs_m).to(tl.int64)
    q_rows = Q + b * stride_qb + h * stride_qh + seq * stride_qs
    o_rows = O + b * stride_ob + h * stride_oh + seq * stride_os
    if SPLIT:
        o_rows += tl.program_id(2).to(tl.int64) * stride_osplit
        lse_rows += tl.program_id(2).to(tl.int64) * lse_split
    if PAGED:
        k_base = K + kvh * stride_kh
        v_base = V + kvh * stride_vh
    else:
        k_base = K + b * stride_kb + kvh * stride_kh + krow0 * stride_ks
        v_base = V + b * stride_vb + kvh * stride_vh + krow0 * stride_vs
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(q_rows[:, None] + offs_d[None, :] * stride_qd, offs_m, sq, offs_d, HEAD_DIM, BLOCK_D, True)
    return (row_lo, row_hi, offs_m, q, k_base, v_base, o_rows, lse_rows, sq, sk, causal_offset + align,
            window_offset + align, align_offset + align)


@triton.jit
def row_place(Base, row, heads, seqlen_q, stride_b, stride_h, stride_s):
    """Query row ``(b, h, i)`` flattened as ``row = (b * heads + h) * seqlen_q + i`` (an LSE's or a split's
    partials' order), placed in a tensor through its (batch, head, seq) strides: ``Base`` plus its offset."""
    bh = row // seqlen_q
    return Base + (bh // heads) * stride_b + (bh % heads) * stride_h + (row % seqlen_q) * stride_s


@triton.jit
def sequence(b, seqlen_q, seqlen_k, CuQ, CuK, SeqK, VARLEN: tl.constexpr, SEQUSED: tl.constexpr,
             ALIGN_BR: tl.constexpr):
    """Batch ``b``'s sequence: ``(q0, k0, sq, sk, align)``, its first query and key rows in the
    packed tensors (0 unless VARLEN), its lengths (SEQUSED: the first ``seqused_k[b]`` keys), and the
    shift of its diagonal (``sk - sq`` bottom-right, else 0)."""
    if VARLEN:
        q0 = tl.load(CuQ + b)
        first_key = tl.load(CuK + b)
        sq = tl.load(CuQ + b + 1) - q0
        sk = tl.load(CuK + b + 1) - first_key
        k0 = first_key.to(tl.int64)
    else:
        q0 = 0
        k0 = 0
        sq = seqlen_q
        sk = seqlen_k
        if SEQUSED:
            sk = tl.minimum(tl.load(SeqK + b), seqlen_k)
    align = 0
    if ALIGN_BR:
        align = sk - sq
    return q0, k0, sq, sk, align


@triton.jit
def initial_state(BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Seed Section 3 at t = 0: ``m = -inf``, ``l = 0``, ``acc = 0``."""
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    return m, l, acc


@triton.jit
def load_rows(ptrs, rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              MASK_ROWS: tl.constexpr):
    """Load a ``[len(rows), BLOCK_D]`` tile; rows >= n_rows and columns >= HEAD_DIM read 0."""
    if MASK_ROWS:
        if BLOCK_D == HEAD_DIM:
            x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
        else:
            x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    else:
        if BLOCK_D == HEAD_DIM:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return x


@triton.jit
def scores(qk, offs_m, offs_n, seqlen_k, scale_log2, softcap, slope, causal_offset, window_offset, align_offset,
           MASK_KEYS: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
           ALIBI: tl.constexpr):
    """Step 5.2: raw ``Q K^T`` -> base-2 scores, with the optional modifiers, then masked to -inf.

    softcap: ``softcap * tanh(scale qk / softcap)``; ALiBi: ``- slope |i + align_offset - j|``
    (both in natural units, then times log2(e)).  Query i sees key j iff ``j < seqlen_k``,
    ``j <= i + causal_offset`` (CAUSAL: the band's upper edge) and ``j >= i + window_offset``
    (WINDOW: its lower edge).
    """
    if SOFTCAP:
        x = qk * (scale_log2 / (LOG2E * softcap))
        s = (softcap * LOG2E) * (1.0 - 2.0 / (tl.math.exp2((2.0 * LOG2E) * x) + 1.0))  # tanh via exp2
    else:
        s = qk * scale_log2
    if ALIBI:
        s = s - (slope * LOG2E) * tl.abs((offs_m[:, None] + align_offset - offs_n[None, :]).to(tl.float32))
    if MASK_KEYS:
        s = tl.where(offs_n[None, :] < seqlen_k, s, float("-inf"))
    if CAUSAL:
        s = tl.where(offs_n[None, :] <= offs_m[:, None] + causal_offset, s, float("-inf"))
    if WINDOW:
        s = tl.where(offs_n[None, :] >= offs_m[:, None] + window_offset, s, float("-inf"))
    return s


# an attn_mask's kinds, as the kernels' ATTN_MASK constexpr takes them
MASK_NONE = tl.constexpr(0)
MASK_BOOL = tl.constexpr(1)  # SDPA's boolean mask, read as bytes: a key it hides scores -inf
MASK_BIAS = tl.constexpr(2)  # SDPA's float mask: added to each score (natural units)


@triton.jit
def masked_scores(s, mask_rows, rows_in, cols, seqlen_k, stride_mk, ATTN_MASK: tl.constexpr):
    """Base-2 scores ``s`` joined with an attn_mask (``mask_rows``: each row's pointer into it, ``rows_in`` the
    rows whose pointer may be read, ``cols`` the keys, ``stride_mk`` apart).  MASK_BOOL: -inf where it hides the
    key (``where``: a NaN score it hides stays out); MASK_BIAS: plus the bias times log2(e) (-inf hides the key,
    NaN reaches the row as SDPA's sum takes it).  Keys past ``seqlen_k`` read as hidden."""
    if ATTN_MASK != MASK_NONE:
        at = mask_rows[:, None] + cols[None, :].to(tl.int64) * stride_mk
        inside = rows_in[:, None] & (cols < seqlen_k)[None, :]
        if ATTN_MASK == MASK_BOOL:
            keep = tl.load(at, mask=inside, other=0)
            s = tl.where(keep != 0, s, float("-inf"))
        else:
            s = s + tl.load(at, mask=inside, other=float("-inf")).to(tl.float32) * LOG2E
    return s


@triton.jit
def window_start(row_lo, window_offset, BLOCK_N: tl.constexpr, WINDOW: tl.constexpr):
    """The first key tile any row of the block (first query ``row_lo``) sees: keys before the
    band's lower edge are skipped whole, as the causal early exit skips those after its upper edge."""
    first = 0
    if WINDOW:
        first = (tl.maximum(row_lo + window_offset, 0) // BLOCK_N) * BLOCK_N
    return first


@triton.jit
def window_clear(row_hi, window_offset, BLOCK_N: tl.constexpr, WINDOW: tl.constexpr):
    """Keys from the returned position on lie inside the window's lower edge for every row of the
    block (queries before ``row_hi``), in whole ``BLOCK_N`` tiles: only the tiles before it need the
    window's mask (0 without a window)."""
    clear = 0
    if WINDOW:
        clear = tl.cdiv(tl.maximum(row_hi - 1 + window_offset, 0), BLOCK_N) * BLOCK_N
    return clear


@triton.jit
def split_keys(lo, hi, split_len, SPLIT: tl.constexpr):
    """The part of the key range ``[lo, hi)`` that this program's split owns."""
    if SPLIT:
        s0 = tl.program_id(2) * split_len
        lo = tl.maximum(lo, s0)
        hi = tl.minimum(hi, s0 + split_len)
    return lo, hi


@triton.jit
def paged_rows(base, BlockTable, b, start_n, offs_n, offs_d, stride_bt, max_pages, stride_page, stride_row,
               stride_d, PAGE: tl.constexpr):
    """Pointers to key tile ``start_n`` of batch b in a paged cache: its page from the block
    table (``PAGE`` a multiple of the tile, so a tile never straddles pages)."""
    idx = start_n // PAGE
    page = tl.load(BlockTable + b.to(tl.int64) * stride_bt + idx, mask=idx < max_pages, other=0)
    rows = (start_n % PAGE) + offs_n
    return base + page.to(tl.int64) * stride_page + rows[:, None] * stride_row + offs_d[None, :] * stride_d


@triton.jit
def head_slope(Alibi, bh, heads, ALIBI: tl.constexpr):
    """The ALiBi slope of (batch, head) ``bh`` (``batch * heads + head``): ALIBI 1 one a head (``Alibi`` ``[heads]``),
    2 one a (batch, head) (``[batch, heads]``, contiguous: FlashAttention's other form), 0 none."""
    slope = 0.0
    if ALIBI == 2:
        slope = tl.load(Alibi + bh)
    elif ALIBI:
        slope = tl.load(Alibi + bh % heads)
    return slope


@triton.jit
def causal_stop(row_hi, seqlen_k, causal_offset, CAUSAL: tl.constexpr):
    """Section 7: keys at or past the returned position are invisible to every row
    of the block (queries before ``row_hi``), so the key loop stops there."""
    stop = seqlen_k
    if CAUSAL:
        stop = tl.minimum(seqlen_k, tl.maximum(row_hi + causal_offset, 0))
    return stop


@triton.jit
def full_stop(row_lo, seqlen_k, causal_offset, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Keys ``[0, full_stop)`` exist and are visible to every row of the block (queries from
    ``row_lo`` on), in whole ``BLOCK_N`` tiles: the loop over them needs no mask."""
    stop = seqlen_k
    if CAUSAL:
        stop = tl.minimum(seqlen_k, tl.maximum(row_lo + causal_offset + 1, 0))
    return (stop // BLOCK_N) * BLOCK_N


@triton.jit
def softmax_weights(l, m, s):
    """Steps 5.3-5.5 of one key tile, ``s`` already scaled and masked: ``m_new = max(m, rowmax s)``,
    ``alpha = exp2(m - m_new)``, ``p = exp2(s - m_new)``, ``l = alpha l + rowsum p``.  Returns
    ``(p, alpha, l, m_new)``.  A row that has seen only masked keys keeps ``m = -inf``; its pivot
    is taken as 0 so that no ``-inf - -inf`` appears, and its ``p`` and ``l`` stay 0."""
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m - m_safe)
    p = tl.math.exp2(s - m_safe[:, None])
    l = l * alpha + tl.sum(p, 1)
    return p, alpha, l, m_new


@triton.jit
def online_softmax_step(acc, l, m, s, v, keep=None, keep_scale=1.0):
    """One key tile of the recurrence (seed 5.3-5.6): :func:`softmax_weights`, then
    ``acc = alpha acc + p @ v``; ``keep, keep_scale``: attention dropout's pairs of the tile
    (:func:`.dropout.kept`), which weigh ``p`` in the product and not in ``l``."""
    p, alpha, l, m = softmax_weights(l, m, s)
    acc = acc * alpha[:, None]
    if keep is not None:
        p = dropout.dropped(p, keep, keep_scale)
    acc = mma(p.to(v.dtype), v, acc)
    return acc, l, m


@triton.jit
def pv_half(acc, alpha, p, v_ptrs, cols, seqlen_k, offs_h, HEAD_COLS: tl.constexpr, HALF: tl.constexpr):
    """Step 5.6 for one half of the head dimension (the seed's ``n_dk`` split of the accumulator):
    ``acc = alpha acc + p @ v`` over ``HALF`` columns of V and O, ``HEAD_COLS`` of them real.  Only
    this half's V tile is live, in the matrix unit's operand layout, beside the two accumulators:
    at head_dim 128 the whole tile and the whole accumulator do not fit gfx1151's 256 VGPRs."""
    v = load_rows(v_ptrs, cols, seqlen_k, offs_h, HEAD_COLS, HALF, True)
    return mma(p.to(v.dtype), v, acc * alpha[:, None])


@triton.jit
def write_output(o_rows, LSE, lse_rows, acc, l, m, offs_m, seqlen_q, offs_d, stride_od,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, STORE_LSE: tl.constexpr):
    """Section 6: ``o = acc / l`` with ``1/l := 0`` on an empty row (never NaN), stored through
    each row's pointer; LSE (natural log, float32, ``-inf`` on an empty row) when asked."""
    inv_l = tl.where(l == 0.0, 0.0, 1.0 / l)
    o = acc * inv_l[:, None]
    o_ptrs = o_rows[:, None] + offs_d[None, :] * stride_od
    if BLOCK_D == HEAD_DIM:
        o_mask = offs_m[:, None] < seqlen_q
    else:
        o_mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    tl.store(o_ptrs, o.to(o_rows.dtype.element_ty), mask=o_mask)
    if STORE_LSE:
        lse = tl.where(l == 0.0, float("-inf"), (m + tl.math.log2(l)) * LN2)
        tl.store(LSE + lse_rows, lse, mask=offs_m < seqlen_q)


@triton.jit
def after(x, dep, AMD: tl.constexpr):
    """``x``, computed no earlier than ``dep`` on an AMD GPU (an opaque copy that reads ``dep``: the
    compiler cannot move ``dep``'s instructions below ``x``'s uses); elsewhere ``x``."""
    if AMD and not INTERPRET:
        return tl.inline_asm_elementwise("v_mov_b32 $0, $1", "=v,v,v", [x, dep], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return x
