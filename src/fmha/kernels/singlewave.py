"""``singlewave``: the seed's kernel (seed Sections 4-7, ``fmha_singlewave.py``).

One warp per program (``num_warps=1``), 16 query rows, 16-key tiles: the 16x16x16 matrix-instruction shape of
gfx1151's ``v_wmma_f32_16x16x16_f16``. The running ``m``, ``l``, ``acc`` ride the key loop in registers (``acc`` and
each V tile in two halves of the head dimension, as the seed's ``n_dk`` loop splits them, so D=128 fits gfx1151's
256 VGPRs; at D=96, causal, and beside a window, softcap or ALiBi, the second half's P V waits for the first's on
AMD, :func:`.common.after`, so the masks' and modifiers' registers fit too); the loop stops at the last tile any row
of the block can see (causal early exit), and every tile is masked elementwise (a no-op except on the causal
diagonal and the last, ragged tile).
"""
import triton
import triton.language as tl

from .common import (after, causal_stop, head_slope, initial_state, load_rows, mma, program_start, pv_half, scores,
                     softmax_weights, split_keys, window_start, write_output)


@triton.jit
def singlewave_kernel(
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
    k_ptrs = k_base + offs_n[:, None] * stride_ks + offs_d[None, :] * stride_kd
    v_ptrs = v_base + offs_n[:, None] * stride_vs + offs_h[None, :] * stride_vd

    m, l, acc = initial_state(BLOCK_M, HALF)
    acc_hi = tl.zeros([BLOCK_M, HALF], tl.float32)
    slope = head_slope(Alibi, tl.program_id(1) + BH_BASE, heads, ALIBI)
    first = window_start(row_lo, window_offset, BLOCK_N, WINDOW)
    stop = causal_stop(row_hi, seqlen_k, causal_offset, CAUSAL)
    first, stop = split_keys(first, stop, split_len, SPLIT)
    k_ptrs += first * stride_ks
    v_ptrs += first * stride_vs
    for start_n in range(first, stop, BLOCK_N):
        cols = start_n + offs_n
        # 5.1 S = Q K^T, contracted over the head dimension
        k = load_rows(k_ptrs, cols, seqlen_k, offs_d, HEAD_DIM, BLOCK_D, True)
        qk = mma(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], tl.float32))
        # 5.2 scale into base 2, mask
        s = scores(qk, offs_m, cols, seqlen_k, scale_log2, softcap, slope, causal_offset, window_offset,
                   align_offset, True, CAUSAL, WINDOW, SOFTCAP, ALIBI)
        # 5.3-5.5 running max, alpha, p, l; 5.6 acc += P V, a half of the head dimension at a time
        p, alpha, l, m = softmax_weights(l, m, s)
        acc = pv_half(acc, alpha, p, v_ptrs, cols, seqlen_k, offs_h, HALF, HALF)
        # the masks' and modifiers' registers: the second half's V waits for the first's P V (16 spilled without)
        if AMD and (CAUSAL and HEAD_DIM != BLOCK_D or WINDOW or SOFTCAP or ALIBI):
            p = after(p, tl.max(acc, 1)[:, None], AMD)
        acc_hi = pv_half(acc_hi, alpha, p, v_ptrs + HALF * stride_vd, cols, seqlen_k, offs_h, HEAD_DIM - HALF, HALF)
        # 5.7 next tile
        k_ptrs += BLOCK_N * stride_ks
        v_ptrs += BLOCK_N * stride_vs
    write_output(o_rows, LSE, lse_rows, acc, l, m, offs_m, seqlen_q, offs_h, stride_od, HALF, HALF, STORE_LSE)
    write_output(o_rows + HALF * stride_od, LSE, lse_rows, acc_hi, l, m, offs_m, seqlen_q, offs_h, stride_od,
                 HEAD_DIM - HALF, HALF, False)


KERNEL = singlewave_kernel
