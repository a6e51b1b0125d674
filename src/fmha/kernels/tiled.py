"""``tiled``: the general kernel for any GPU: large tiles, several warps, pipelined loads.

The key range of a query block is split in two loops (Triton tutorial 06's
shape): first the whole tiles every row of the block sees, with no mask at all,
then the remaining tiles up to the causal early exit (the diagonal and the
ragged end), masked elementwise.  Tile sizes, warps and stages come from
:mod:`fmha.configs`.
"""
import triton
import triton.language as tl

from . import dropout, guards
from .combine import merge_if_last
from .common import (causal_stop, dot_t, full_stop, head_slope, initial_state, load_rows, masked_scores, mma,
                     online_softmax_step, paged_rows, program_start, row_place, scores, split_keys, window_clear,
                     window_start, write_output)


@triton.jit
def _v_columns(offs_dv, HEAD_V: tl.constexpr, BLOCK_DV: tl.constexpr, AMD: tl.constexpr):
    """The columns V's tile reads: AMD, where V is padded to its tile (96 in 128, 192 in 256), the columns past
    HEAD_V read again the ones just before them (always memory of the row; O's columns there are never stored), so
    V's loads need no column mask, whose registers gfx1151 cannot spare at 192 (78 spilled with it, none without)."""
    if AMD and HEAD_V != BLOCK_DV:
        offs_dv = tl.where(offs_dv < HEAD_V, offs_dv, offs_dv - (BLOCK_DV - HEAD_V))
    return offs_dv


@triton.jit
def _v_rows_clamped(v_base, cols, seqlen_k, offs_dv, stride_vs, stride_vd, HEAD_V: tl.constexpr,
                    BLOCK_DV: tl.constexpr):
    """A V tile whose keys may run past ``seqlen_k``: each row read from ``min(key, seqlen_k - 1)`` (always memory of
    the sequence), those past the end then set to 0 (P is 0 there, and 0 * NaN would not be).  The same tile as
    :func:`load_rows` with its row mask; on gfx1151 a row-masked load of a 16 x 256 tile holds some 30 VGPRs more
    than this (``tiled`` at head_dim 256 spilled 67 registers, none this way)."""
    rows = tl.minimum(cols, seqlen_k - 1).to(tl.int64)
    v = load_rows(v_base + rows[:, None] * stride_vs + offs_dv[None, :] * stride_vd, cols, seqlen_k, offs_dv, HEAD_V,
                  BLOCK_DV, False)
    return tl.where((cols < seqlen_k)[:, None], v, 0.0)


@triton.jit
def _key_range(acc, l, m, q, q_lo, k_base, v_base, lo, hi, offs_m, offs_n, offs_d, offs_dv,
               stride_ks, stride_kd, stride_vs, stride_vd, seqlen_k, causal_offset, scale_log2,
               window_offset, align_offset, softcap, slope, BlockTable, b, stride_bt, max_pages, stride_kb, stride_vb,
               K_desc, V_desc, kv_seq, kv_col, mask_rows, stride_mk, seed, drop_rows, drop_keys, dropout_p,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
               SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, PAGED: tl.constexpr, PAGE: tl.constexpr,
               KV_TMA: tl.constexpr, HEAD_V: tl.constexpr, BLOCK_DV: tl.constexpr, FP8: tl.constexpr,
               QK_LO: tl.constexpr, V_FROM_K: tl.constexpr, ATTN_MASK: tl.constexpr, AMD: tl.constexpr,
               QK_CHUNKS: tl.constexpr, DROPOUT: tl.constexpr):
    """The key tiles ``[lo, hi)``.  QK_LO: Q K^T also over the ``QK_LO`` columns after q/k's first ``BLOCK_D``
    (``q_lo``: Q's); V_FROM_K: V is K's first ``BLOCK_DV`` columns (MLA's absorbed form), so K's tile serves.
    ATTN_MASK: each row's attn_mask (``mask_rows``, key stride ``stride_mk``; :func:`.common.masked_scores`) joins
    the band, in every tile.
    AMD: a masked tile's V read as :func:`_v_rows_clamped` reads it.  ``offs_dv`` and HEAD_V: the columns V's tile
    reads and how many of them are real (columns past them read 0); an AMD build passes :func:`_v_columns`' and
    BLOCK_DV.  QK_CHUNKS: Q K^T over column chunks (:func:`.common.dot_t`).  DROPOUT: P V over the kept pairs'
    probabilities (:func:`.dropout.kept` of ``seed`` at the rows ``drop_rows`` of ``drop_keys`` keys), the
    denominator over all of them."""
    first = (lo + offs_n).to(tl.int64)
    k_ptrs = k_base + first[:, None] * stride_ks + offs_d[None, :] * stride_kd
    v_ptrs = v_base + first[:, None] * stride_vs + offs_dv[None, :] * stride_vd
    if QK_LO:
        offs_lo = tl.arange(0, QK_LO)
        klo_base = k_base + BLOCK_D * stride_kd
        klo_ptrs = klo_base + first[:, None] * stride_ks + offs_lo[None, :] * stride_kd
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if PAGED:  # each tile through the block table
            k_ptrs = paged_rows(k_base, BlockTable, b, start_n, offs_n, offs_d, stride_bt, max_pages, stride_kb,
                                stride_ks, stride_kd, PAGE)
            v_ptrs = paged_rows(v_base, BlockTable, b, start_n, offs_n, offs_dv, stride_bt, max_pages, stride_vb,
                                stride_vs, stride_vd, PAGE)
            if QK_LO:
                klo_ptrs = paged_rows(klo_base, BlockTable, b, start_n, offs_n, offs_lo, stride_bt, max_pages,
                                      stride_kb, stride_ks, stride_kd, PAGE)
        if KV_TMA:  # a box of the 3-D descriptor; keys past the tensor's end come back 0
            k = K_desc.load([kv_seq, start_n, kv_col]).reshape([BLOCK_N, BLOCK_D])
        else:
            k = load_rows(k_ptrs, cols, seqlen_k, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        if FP8:  # float8 values are exact in 16 bits (q's type); their descale factors act on the scores and O
            k = k.to(q.dtype)
        qk = dot_t(q, k, BLOCK_M, BLOCK_N, QK_CHUNKS)
        if QK_LO:
            k_lo = load_rows(klo_ptrs, cols, seqlen_k, offs_lo, QK_LO, QK_LO, MASKED)
            if FP8:
                k_lo = k_lo.to(q.dtype)
            qk = mma(q_lo, tl.trans(k_lo), qk)
        s = scores(qk, offs_m, cols, seqlen_k, scale_log2, softcap, slope, causal_offset, window_offset, align_offset,
                   MASKED, CAUSAL and MASKED, WINDOW and MASKED, SOFTCAP, ALIBI)
        s = masked_scores(s, mask_rows, offs_m >= 0, cols, seqlen_k, stride_mk, ATTN_MASK)
        if V_FROM_K:  # (already 16-bit, and zero past seqlen_k where MASKED)
            v = k
        elif KV_TMA:
            v = V_desc.load([kv_seq, start_n, kv_col]).reshape([BLOCK_N, BLOCK_DV])
            if MASKED:  # rows past seqlen_k (seqused_k) hold real memory: 0 * NaN would be NaN
                v = tl.where((cols < seqlen_k)[:, None], v, 0.0)
        elif AMD and MASKED and not PAGED:
            v = _v_rows_clamped(v_base, cols, seqlen_k, offs_dv, stride_vs, stride_vd, HEAD_V, BLOCK_DV)
        else:
            v = load_rows(v_ptrs, cols, seqlen_k, offs_dv, HEAD_V, BLOCK_DV, MASKED)
        if FP8 and not V_FROM_K:
            v = v.to(q.dtype)
        if DROPOUT:
            keep, keep_scale = dropout.kept(seed, drop_rows, start_n, drop_keys, dropout_p, BLOCK_N)
            acc, l, m = online_softmax_step(acc, l, m, s, v, keep, keep_scale)
        else:
            acc, l, m = online_softmax_step(acc, l, m, s, v)
        k_ptrs += BLOCK_N * stride_ks
        v_ptrs += BLOCK_N * stride_vs
        if QK_LO:
            klo_ptrs += BLOCK_N * stride_ks
    return acc, l, m


@triton.jit
def _mask_rows(AttnMask, lse_rows, offs_m, heads, seqlen_q, lse_split, stride_mb, stride_mh, stride_mq,
               SPLIT: tl.constexpr, VARLEN: tl.constexpr, ATTN_MASK: tl.constexpr):
    """ATTN_MASK: a pointer to each row's mask row, read off the row's place ``(b * heads + h) * seqlen_q + i``
    (``lse_rows``, split 0's); rows past the sequence's end (never stored) read the first row's."""
    rows = lse_rows
    if ATTN_MASK:
        tl.static_assert(not VARLEN, "an attn_mask is [batch, heads, seqlen_q, seqlen_k]: not packed sequences")
        if SPLIT:
            rows = lse_rows - tl.program_id(2).to(tl.int64) * lse_split
        rows = row_place(AttnMask, tl.where(offs_m < seqlen_q, rows, 0), heads, seqlen_q, stride_mb, stride_mh,
                         stride_mq)
    return rows


# the mask's key stride unspecialised: MASK_UNIT says where its keys lie next to each other (the docstring)
@triton.jit(do_not_specialize=["stride_mk"])
def tiled_kernel(
        Q, K, V, O, LSE,
        stride_qb, stride_qh, stride_qs, stride_qd,
        stride_kb, stride_kh, stride_ks, stride_kd,
        stride_vb, stride_vh, stride_vs, stride_vd,
        stride_ob, stride_oh, stride_os, stride_od,
        heads, group, seqlen_q, seqlen_k, causal_offset, scale_log2,
        window_offset, align_offset, softcap, Alibi, CuQ, CuK, SeqK, split_len, stride_osplit, lse_split,
        BlockTable, stride_bt, max_pages, K_desc, V_desc, kv_seq_b, kv_seq_h, kv_col_h,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
        ALIBI: tl.constexpr, VARLEN: tl.constexpr, SEQUSED: tl.constexpr, ALIGN_BR: tl.constexpr,
        SPLIT: tl.constexpr, PAGED: tl.constexpr, PAGE: tl.constexpr, PACK_GQA: tl.constexpr,
        KV_TMA: tl.constexpr, HEAD_V: tl.constexpr, BLOCK_DV: tl.constexpr, Descale, FP8: tl.constexpr,
        QK_LO: tl.constexpr, V_FROM_K: tl.constexpr,
        Out, stride_fb, stride_fh, stride_fs, stride_fd, LseOut, Tickets, MERGE: tl.constexpr,
        MERGE_LSE: tl.constexpr, AttnMask, stride_mb, stride_mh, stride_mq, stride_mk, ATTN_MASK: tl.constexpr,
        AMD: tl.constexpr, QK_CHUNKS: tl.constexpr, num_pages, max_seqlen_q, max_seqlen_k, CHECKED: tl.constexpr,
        MASK_UNIT: tl.constexpr = False, BH_BASE: tl.constexpr = 0, Seed=None, dropout_p=0.0,
        DROPOUT: tl.constexpr = False):
    """HEAD_V, BLOCK_DV: V's and O's head dimension (DeepSeek's MLA: 128 against q/k's 192), else HEAD_DIM's.
    QK_LO: q/k have ``QK_LO`` more columns after their first ``BLOCK_D`` (MLA's absorbed form: 576 = 512 + 64,
    HEAD_DIM then 512), a second slice of Q K^T; V_FROM_K: V is K's first columns, read once as K's tile.
    FP8: float8 K and V (q float8 or 16-bit), dequantized on load to q's 16 bits (bfloat16 for float8 q);
    ``Descale`` holds each (batch, kv head)'s q, k and v factors: q's and k's scale the scores (with
    ``scale_log2``), v's the output.  MERGE (SPLIT): the split that finishes a row block last merges the
    partials into ``Out`` (strides ``stride_f*``) and, MERGE_LSE, ``LseOut``, counting splits in ``Tickets``
    (int32, one per row block and batch*head program, at zero).  ATTN_MASK: an attn_mask ``[batch, heads,
    seqlen_q, seqlen_k]`` (strides ``stride_m*``, broadcast dimensions 0), boolean or an additive bias
    (:data:`.common.MASK_BOOL`, :data:`.common.MASK_BIAS`), joins the band (not VARLEN); MASK_UNIT: its keys lie
    next to each other (``stride_mk`` 1, :func:`fmha.kernels.mask_unit`), a constant in the build: on the H100 a
    boolean mask's forward ran 3.2-3.9x as fast as with the stride read at run time (not profiled; both builds load
    the mask a byte at a time), although it spills more registers (sm_90 294 at head_dim 128, sm_80 4876, gfx1151
    34; with the stride read at run time 158, 100 and 0).  AMD: an AMD
    build (:func:`fmha.kernels.amd_build`), which reads V without masked loads (:func:`_v_rows_clamped`,
    :func:`_v_columns`).  QK_CHUNKS (``KernelConfig.qk_chunks``): Q K^T as one batched product over that many column
    chunks of q/k's first ``BLOCK_D`` columns, summed: each warp holds a chunk of Q's columns for the loop, not all of
    them (MLA's absorbed form on gfx11: 576 columns of Q in the matrix unit's operand layout fill the register file).
    CHECKED (VARLEN or PAGED; built with :data:`.guards.CHECK_OPTIONS`): the program checks its sequence's cu_seqlens
    (against ``max_seqlen_q`` / ``max_seqlen_k``) or cache_seqlens, and the pages of the keys it reads (``num_pages``
    in the pool) before it reads them, as the separate launches of :mod:`.guards` would (one launch's grid holds
    every sequence: :func:`fmha.forward.self_checked`).  ``BH_BASE``: the first (batch, head) program of this
    launch (:func:`fmha.replay.launch`).  DROPOUT (not split, no packed GQA rows, no pages): attention dropout with
    probability ``dropout_p``, its pairs drawn from the seed in ``Seed`` (:mod:`.dropout`) at the rows' places (the
    LSE's) and the keys' numbers in their sequence."""
    tl.static_assert(not DROPOUT or not (SPLIT or PACK_GQA or PAGED), "dropout: a row's keys in one launch")
    drop_keys = seqlen_k  # the tensor's keys, before a sequence's own length replaces them (a pair's place)
    seed = 0
    if DROPOUT:
        seed = tl.load(Seed)
    per_batch = heads // group if PACK_GQA else heads
    bh = tl.program_id(1) + BH_BASE
    if CHECKED:
        guards.program_checks(CuQ, CuK, SeqK, bh // per_batch, tl.num_programs(1) // per_batch,
                              seqlen_q, seqlen_k, max_seqlen_q, max_seqlen_k, seqlen_k, VARLEN, PAGED)
    (row_lo, row_hi, offs_m, q, k_base, v_base, o_rows, lse_rows, seqlen_q, seqlen_k, causal_offset, window_offset,
     align_offset) = program_start(
        Q, K, V, O, stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh,
        stride_vs, stride_ob, stride_oh, stride_os, heads, group, seqlen_q, seqlen_k, causal_offset, window_offset,
        align_offset, CuQ, CuK, SeqK, stride_osplit, lse_split, HEAD_DIM, BLOCK_D, BLOCK_M, VARLEN, SEQUSED,
        ALIGN_BR, SPLIT, PAGED, PACK_GQA, BH_BASE)
    tl.static_assert(not (PACK_GQA and ALIBI), "ALiBi slopes are per head: not with packed GQA rows")
    tl.static_assert(not KV_TMA or (BLOCK_D == HEAD_DIM and not VARLEN and not PAGED and not QK_LO),
                     "K/V by TMA: whole head_dim boxes of one (batch, head) sequence")
    tl.static_assert(not V_FROM_K or (BLOCK_DV == BLOCK_D and HEAD_V == HEAD_DIM), "V_FROM_K: V is K's first slice")
    if row_lo >= seqlen_q:  # past this sequence's end (packed batches): nothing to do
        return
    mask_rows = _mask_rows(AttnMask, lse_rows, offs_m, heads, seqlen_q, lse_split, stride_mb, stride_mh, stride_mq,
                           SPLIT, VARLEN, ATTN_MASK)
    q_lo = q
    if QK_LO:  # Q's second slice: the same rows from column BLOCK_D on
        q_lo = program_start(
            Q + BLOCK_D * stride_qd, K, V, O, stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh,
            stride_ks, stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os, heads, group, seqlen_q,
            seqlen_k, causal_offset, window_offset, align_offset, CuQ, CuK, SeqK, stride_osplit, lse_split, QK_LO,
            QK_LO, BLOCK_M, VARLEN, SEQUSED, ALIGN_BR, SPLIT, PAGED, PACK_GQA, BH_BASE)[3]
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    m, l, acc = initial_state(BLOCK_M, BLOCK_DV)
    slope = head_slope(Alibi, bh, heads, ALIBI)
    b = bh // per_batch
    kvh = bh % (heads // group) if PACK_GQA else bh % heads // group
    kv_seq = b * kv_seq_b + kvh * kv_seq_h  # KV_TMA: this program's place in the K/V descriptors
    kv_col = kvh * kv_col_h
    if FP8:
        factors = Descale + (b * (heads // group) + kvh) * 3
        scale_log2 = scale_log2 * tl.load(factors) * tl.load(factors + 1)
        if q.dtype == tl.float8e4nv:
            q = q.to(tl.bfloat16)
            q_lo = q_lo.to(tl.bfloat16)
    # key tiles [first, u0): across the window's lower edge (masked; none without a window); [u0, lo): seen by
    # every row (no mask); [lo, hi): across the diagonal or the ragged end, up to the early exit (masked)
    first = window_start(row_lo, window_offset, BLOCK_N, WINDOW)
    lo = full_stop(row_lo, seqlen_k, causal_offset, BLOCK_N, CAUSAL)
    hi = causal_stop(row_hi, seqlen_k, causal_offset, CAUSAL)
    u0 = tl.maximum(first, tl.minimum(window_clear(row_hi, window_offset, BLOCK_N, WINDOW), lo))
    lo = tl.maximum(lo, u0)
    if CHECKED and PAGED:  # every page of the keys this program reads, before the first read
        read_lo, read_hi = split_keys(first, hi, split_len, SPLIT)
        guards.pages_checked(BlockTable, b, read_lo, read_hi, stride_bt, num_pages, PAGE)
    w0, w1 = split_keys(first, u0, split_len, SPLIT)
    u0, u1 = split_keys(u0, lo, split_len, SPLIT)
    lo, hi = split_keys(lo, hi, split_len, SPLIT)
    offs_vr = _v_columns(offs_dv, HEAD_V, BLOCK_DV, AMD)  # V's columns as read (AMD: no column mask)
    V_READ: tl.constexpr = BLOCK_DV if AMD else HEAD_V
    ranges = ((w0, w1), (u0, u1), (lo, hi))
    if MASK_UNIT:
        stride_mk = 1
    for part in tl.static_range(3):
        if part != 0 or WINDOW:
            acc, l, m = _key_range(acc, l, m, q, q_lo, k_base, v_base, ranges[part][0], ranges[part][1], offs_m,
                                   offs_n, offs_d, offs_vr, stride_ks, stride_kd, stride_vs, stride_vd, seqlen_k,
                                   causal_offset, scale_log2, window_offset, align_offset, softcap, slope, BlockTable,
                                   b, stride_bt, max_pages, stride_kb, stride_vb, K_desc, V_desc, kv_seq, kv_col,
                                   mask_rows, stride_mk, seed, lse_rows, drop_keys, dropout_p, HEAD_DIM, BLOCK_D,
                                   BLOCK_M, BLOCK_N, part != 1, CAUSAL, WINDOW, SOFTCAP, ALIBI, PAGED, PAGE, KV_TMA,
                                   V_READ, BLOCK_DV, FP8, QK_LO, V_FROM_K, ATTN_MASK, AMD, QK_CHUNKS, DROPOUT)
    if FP8:
        acc = acc * tl.load(factors + 2)
    write_output(o_rows, LSE, lse_rows, acc, l, m, offs_m, seqlen_q, offs_dv, stride_od,
                 HEAD_V, BLOCK_DV, STORE_LSE)
    if MERGE:
        tl.static_assert(SPLIT and STORE_LSE and not VARLEN, "the merge reads a dense split's partials")
        merge_if_last(o_rows, LSE, lse_rows, Out, LseOut, Tickets, offs_m, heads, seqlen_q, offs_dv, stride_od,
                      stride_osplit, lse_split, stride_fb, stride_fh, stride_fs, stride_fd, HEAD_V, BLOCK_DV,
                      BLOCK_M, MERGE_LSE)


KERNEL = tiled_kernel
