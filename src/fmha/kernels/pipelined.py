"""``pipelined``: the seed's software-pipelined sibling (seed Section 10, the D64 winner).

The same math as ``singlewave`` (one warp, 16 rows, 16-key tiles), with the
independent work reordered: the QK product of tile ``t + 1`` is issued before
the softmax of tile ``t``, so the matrix unit has work while the exponentials
and reductions of tile ``t`` run.  As in ``singlewave``, ``acc`` and each V tile come in two
halves of the head dimension.

On gfx11 a WMMA operand is held twice (both half-waves), so at head_dim 128 Q (64 VGPRs), the
accumulator (64) and the next tile's K operand (64) leave no room for the softmax if the compiler
sinks the next tile's Q K^T below it, as LLVM's scheduler does: it then spills Q to scratch and
reads it back every tile.  ``AMD`` builds make this tile's scores wait for the next tile's Q K^T
(:func:`.common.after`), the order the seed pipelines in, so K's operand dies before the softmax;
beside the causal mask, a window, softcap or ALiBi (their registers besides), the second half's P V
also waits for the first's.  At 65-128 columns ``AMD`` builds also take Q K^T as two products over the head
dimension's halves, each with its own half of K (:func:`_qk`), so half of K's operand is live at a time (with K
whole, a window or all three modifiers at once spill 8 registers: docs/SEED_MAP.md).  Past 128 columns Q and the
accumulator alone fill the register file; AMD runs ``tiled`` there.
"""
import triton
import triton.language as tl

from .common import (after, causal_stop, head_slope, initial_state, load_rows, mma, program_start, pv_half,
                     scores, softmax_weights, split_keys, window_start, write_output)


@triton.jit
def pipelined_kernel(
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
        KV_TMA: tl.constexpr, AMD: tl.constexpr, BH_BASE: tl.constexpr = 0):
    (row_lo, row_hi, offs_m, q, k_base, v_base, o_rows, lse_rows, seqlen_q, seqlen_k, causal_offset, window_offset,
     align_offset) = program_start(
        Q, K, V, O, stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh,
        stride_vs, stride_ob, stride_oh, stride_os, heads, group, seqlen_q, seqlen_k, causal_offset, window_offset,
        align_offset, CuQ, CuK, SeqK, stride_osplit, lse_split, HEAD_DIM, BLOCK_D, BLOCK_M, VARLEN, SEQUSED,
        ALIGN_BR, SPLIT, PAGED, PACK_GQA, BH_BASE)
    tl.static_assert(not PAGED and not KV_TMA, "paged KV and K/V by TMA run on the tiled variant")
    tl.static_assert(not (PACK_GQA and ALIBI), "ALiBi slopes are per head: not with packed GQA rows")
    if row_lo >= seqlen_q:  # past this sequence's end (packed batches): nothing to do
        return
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    HALF: tl.constexpr = BLOCK_D // 2  # the accumulator and V in two column halves (pv_half)
    offs_h = tl.arange(0, HALF)
    v_ptrs = v_base + offs_n[:, None] * stride_vs + offs_h[None, :] * stride_vd

    m, l, acc = initial_state(BLOCK_M, HALF)
    acc_hi = tl.zeros([BLOCK_M, HALF], tl.float32)
    slope = head_slope(Alibi, tl.program_id(1) + BH_BASE, heads, ALIBI)
    first = window_start(row_lo, window_offset, BLOCK_N, WINDOW)
    stop = causal_stop(row_hi, seqlen_k, causal_offset, CAUSAL)
    first, stop = split_keys(first, stop, split_len, SPLIT)
    v_ptrs += first * stride_vs
    SPLIT_QK: tl.constexpr = AMD and BLOCK_D == 128  # Q K^T over the head dimension's halves (_qk)
    if SPLIT_QK:
        q_lo, q_hi = tl.split(tl.permute(tl.reshape(q, [BLOCK_M, 2, HALF]), (0, 2, 1)))
        k_ptrs = k_base + (first + offs_n)[:, None] * stride_ks + offs_h[None, :] * stride_kd
    else:
        q_lo, q_hi = q, q
        k_ptrs = k_base + (first + offs_n)[:, None] * stride_ks + offs_d[None, :] * stride_kd
    # prologue: QK of tile 0 (keys past `stop` read as 0 and are masked below)
    qk = _qk(q_lo, q_hi, k_ptrs, first + offs_n, stop, offs_d, offs_h, stride_kd, HEAD_DIM, BLOCK_D, HALF,
             BLOCK_M, BLOCK_N, SPLIT_QK)
    for start_n in range(first, stop, BLOCK_N):
        cols = start_n + offs_n
        # 5.1 for tile t+1, issued before the softmax of tile t
        k_ptrs += BLOCK_N * stride_ks
        qk_next = _qk(q_lo, q_hi, k_ptrs, cols + BLOCK_N, stop, offs_d, offs_h, stride_kd, HEAD_DIM, BLOCK_D, HALF,
                      BLOCK_M, BLOCK_N, SPLIT_QK)
        # 5.2-5.6 for tile t, once 5.1 of tile t+1 is done
        s = scores(after(qk, qk_next, AMD), offs_m, cols, seqlen_k, scale_log2, softcap, slope, causal_offset,
                   window_offset, align_offset, True, CAUSAL, WINDOW, SOFTCAP, ALIBI)
        p, alpha, l, m = softmax_weights(l, m, s)
        acc = pv_half(acc, alpha, p, v_ptrs, cols, seqlen_k, offs_h, HALF, HALF)
        if AMD and (CAUSAL or WINDOW or SOFTCAP or ALIBI) and BLOCK_D > 64:  # the second half's V after the first's P V
            p = after(p, tl.max(acc, 1)[:, None], AMD)
        acc_hi = pv_half(acc_hi, alpha, p, v_ptrs + HALF * stride_vd, cols, seqlen_k, offs_h, HEAD_DIM - HALF, HALF)
        # 5.7 carry, the next scores included
        v_ptrs += BLOCK_N * stride_vs
        qk = qk_next
    write_output(o_rows, LSE, lse_rows, acc, l, m, offs_m, seqlen_q, offs_h, stride_od, HALF, HALF, STORE_LSE)
    write_output(o_rows + HALF * stride_od, LSE, lse_rows, acc_hi, l, m, offs_m, seqlen_q, offs_h, stride_od,
                 HEAD_DIM - HALF, HALF, False)


@triton.jit
def _qk(q_lo, q_hi, k_ptrs, rows, stop, offs_d, offs_h, stride_kd, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
        HALF: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_QK: tl.constexpr):
    """Step 5.1, ``Q K^T`` for the key ``rows`` at ``k_ptrs``.  ``SPLIT_QK``: as two products over the head
    dimension's halves (``q_lo``, ``q_hi``: Q's column halves; ``k_ptrs`` over K's first half), each with its own
    half of K, so only half of K's operand (32 VGPRs on gfx11 at head_dim 128, the operand held twice) is live at a
    time; else one product over ``q_lo``, Q whole."""
    zero = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if SPLIT_QK:
        k_lo = load_rows(k_ptrs, rows, stop, offs_h, HALF, HALF, True)
        qk = mma(q_lo, tl.trans(k_lo), zero)
        k_hi = load_rows(k_ptrs + HALF * stride_kd, rows, stop, offs_h, HEAD_DIM - HALF, HALF, True)
        qk = mma(q_hi, tl.trans(k_hi), qk)
    else:
        k = load_rows(k_ptrs, rows, stop, offs_d, HEAD_DIM, BLOCK_D, True)
        qk = mma(q_lo, tl.trans(k), zero)
    return qk


KERNEL = pipelined_kernel
