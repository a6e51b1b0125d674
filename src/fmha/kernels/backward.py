"""The backward pass, FlashAttention-2's (docs/BACKWARD.md derives it), in three Triton kernels that
run on every target and in the interpreter.

With ``z`` the natural-unit scores (after softcap and ALiBi, masked), ``P = softmax(z)`` recomputed
from the forward's LSE, ``O = P V`` and the incoming ``dO``:

* :func:`delta_kernel`: ``delta_i = sum_d dO_id O_id`` (the row sum of ``P * dP``);
* :func:`dkdv_kernel`, a program per key block of one (batch, KV head), over the query blocks of
  every query head of its group: ``dV = P^T dO``, ``dP = dO V^T``, ``dZ = P (dP - delta)``,
  ``dK = scale dZ'^T Q`` (GQA's group summed in the program: no atomics);
* :func:`dq_kernel`, a program per query block: ``dQ = scale dZ' K``; or, with ``ATOMIC_DQ``, no
  such kernel: :func:`dkdv_kernel` adds each tile's ``scale dZ' K`` into a float32 dQ with atomics
  (two matmuls and one ``exp2`` a score fewer, in an order that varies from run to run), zeroed before
  by :func:`zero_kernel` and cast after by :func:`cast_kernel` (launches, not torch's ops: a replayed call,
  :mod:`fmha.replay`, makes only launches).

With attention dropout (``DROPOUT``, :mod:`.dropout`: ``O = (P * Z) V``) ``dV = (P * Z)^T dO`` and
``dP = Z * (dO V^T)``, the pairs drawn again from the forward's seed.  ``dZ' = dZ`` times the softcap's derivative
``1 - tanh^2(scale q.k / softcap)`` when capped.  Masks and modifiers
are the forward's (:func:`.common.scores`), and with ``ATTN_MASK`` its attn_mask (:func:`.common.masked_scores`:
``P = 0`` where a boolean one hides the key, a bias added to ``z``), whose gradient, when asked (``MASK_GRAD``: a
bias's), is ``dZ`` itself, stored by :func:`dq_kernel` for every score it visits; a row that sees no key (LSE
``-inf``) has ``P = 0`` and so zero gradients.  Without ``ATOMIC_DQ`` the work is deterministic: each output
element is written by one program, in a fixed order.
"""
import triton
import triton.language as tl

from . import dropout
from .common import LOG2E, dot_t, head_slope, load_rows, masked_scores, mma, scores, sequence


@triton.jit
def delta_kernel(O, DO, Delta, stride_ob, stride_oh, stride_os, stride_gb, stride_gh, stride_gs, heads,
                 seqlen_q, delta_rows, CuQ, Lse, LseOut, lse_rows, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_M: tl.constexpr, VARLEN: tl.constexpr, ALIGNED: tl.constexpr, BH_BASE: tl.constexpr = 0):
    """``Delta[row] = sum_d dO * O`` (float32), rows laid out as the forward's LSE, a head's ``delta_rows`` apart
    (seqlen_q, or the packed rows, or more).  ALIGNED (packed): sequence b's rows from :func:`stats_row` instead
    of its first row, and the forward's LSE (``[heads, total_q]``, a head's ``lse_rows`` apart) copied beside
    them into ``LseOut``, laid out as Delta: rows that start 16 bytes apart, as TMA reads them.  ``BH_BASE``, here
    and in the kernels below: the first (batch, head) program of this launch (:func:`fmha.replay.launch`)."""
    bh = tl.program_id(1) + BH_BASE
    b = bh // heads
    h = bh % heads
    q0, sq = 0, seqlen_q
    if VARLEN:
        q0 = tl.load(CuQ + b)
        sq = tl.load(CuQ + b + 1) - q0
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    if tl.program_id(0) * BLOCK_M >= sq:
        return
    offs_d = tl.arange(0, BLOCK_D)
    seq = (q0 + offs_m).to(tl.int64)
    base_o = O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + seq[:, None] * stride_os
    base_g = DO + b.to(tl.int64) * stride_gb + h.to(tl.int64) * stride_gh + seq[:, None] * stride_gs
    o = load_rows(base_o + offs_d[None, :], offs_m, sq, offs_d, HEAD_DIM, BLOCK_D, True).to(tl.float32)
    g = load_rows(base_g + offs_d[None, :], offs_m, sq, offs_d, HEAD_DIM, BLOCK_D, True).to(tl.float32)
    if ALIGNED:
        rows = h.to(tl.int64) * delta_rows + stats_row(q0, b) + offs_m
        lse = tl.load(Lse + h.to(tl.int64) * lse_rows + q0 + offs_m, mask=offs_m < sq)
        tl.store(LseOut + rows, lse, mask=offs_m < sq)
    elif VARLEN:
        rows = h.to(tl.int64) * delta_rows + q0 + offs_m
    else:
        rows = bh.to(tl.int64) * delta_rows + offs_m
    tl.store(Delta + rows, tl.sum(o * g, 1), mask=offs_m < sq)


@triton.jit
def stats_row(q0, b):
    """Where packed sequence ``b`` (its first row ``q0``) starts in the rows of statistics the Gluon backward reads
    by TMA, whose boxes start 16 bytes apart: ``q0 + 3 b`` rounded up to 4, so each sequence's rows begin on a
    multiple of 4 floats and end before the next one's (``total_q + 3 batch`` rows hold them all)."""
    return (q0 + 3 * b + 3) // 4 * 4


@triton.jit
def zero_kernel(X, n, BLOCK: tl.constexpr):
    """``X[0:n] = 0``."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(X + offs, tl.zeros([BLOCK], dtype=X.dtype.element_ty), mask=offs < n)


@triton.jit
def cast_kernel(Src, Dst, stride_sb, stride_sh, stride_ss, stride_db, stride_dh, stride_ds, heads, seqlen, CuQ, gap,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, VARLEN: tl.constexpr,
                BH_BASE: tl.constexpr = 0):
    """``Dst = Src`` in Dst's dtype, (batch, head, row) each in its own strides, the first HEAD_DIM columns.
    VARLEN: packed sequence b's rows from ``CuQ[b]`` in Dst and from ``CuQ[b] + b * gap`` in Src (the batch
    strides unused)."""
    bh = tl.program_id(1) + BH_BASE
    b = bh // heads
    h = bh % heads
    q0, sq = 0, seqlen
    if VARLEN:
        q0 = tl.load(CuQ + b)
        sq = tl.load(CuQ + b + 1) - q0
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m < sq)[:, None] & (offs_d < HEAD_DIM)[None, :]
    rows = (q0 + offs_m).to(tl.int64)[:, None]
    src = (Src + b.to(tl.int64) * stride_sb + h.to(tl.int64) * stride_sh + (rows + b * gap) * stride_ss
           + offs_d[None, :])
    dst = Dst + b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dh + rows * stride_ds + offs_d[None, :]
    tl.store(dst, tl.load(src, mask=mask).to(Dst.dtype.element_ty), mask=mask)


@triton.jit
def _probs(qk, lse2, offs_m, offs_n, seqlen_q, seqlen_k, scale_log2, softcap, slope, causal_offset, window_offset,
           align_offset, mask_rows, stride_mk, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
           ALIBI: tl.constexpr, ATTN_MASK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``P`` of a (query block, key block) tile from its ``qk = Q K^T`` and the saved base-2 LSE, and the factor
    that turns ``dZ`` into the gradient of ``scale q.k`` (the softcap's ``1 - tanh^2``, else 1).  With ATTN_MASK the
    forward's attn_mask joins the scores (``mask_rows``: :func:`_mask_rows`), as it joined them in the LSE."""
    s = scores(qk, offs_m, offs_n, seqlen_k, scale_log2, softcap, slope, causal_offset, window_offset,
               align_offset, True, CAUSAL, WINDOW, SOFTCAP, ALIBI)
    s = masked_scores(s, mask_rows, offs_m < seqlen_q, offs_n, seqlen_k, stride_mk, ATTN_MASK)
    p = tl.math.exp2(s - lse2[:, None])
    dcap = tl.full([BLOCK_M, BLOCK_N], 1.0, tl.float32)
    if SOFTCAP:
        x = qk * (scale_log2 / (LOG2E * softcap))
        th = 1.0 - 2.0 / (tl.math.exp2((2.0 * LOG2E) * x) + 1.0)
        dcap = 1.0 - th * th
    return p, dcap


@triton.jit
def _mask_rows(AttnMask, b, h, offs_m, stride_mb, stride_mh, stride_mq):
    """Each query row's pointer into the attn_mask ``[batch, heads, seqlen_q, seqlen_k]`` of (batch, head)
    ``(b, h)`` (:func:`.common.masked_scores` reads them; unread without one)."""
    at = AttnMask + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
    return at + offs_m.to(tl.int64) * stride_mq


@triton.jit
def _row_stats(LSE, Delta, rows, offs_m, sq):
    """Each query row's base-2 LSE (``+inf`` past the rows: P = 0 there; 0 for a row that saw no key,
    whose scores are all ``-inf``) and its delta."""
    lse = tl.load(LSE + rows, mask=offs_m < sq, other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), 0.0, lse * LOG2E)
    delta = tl.load(Delta + rows, mask=offs_m < sq, other=0.0)
    return lse2, delta


@triton.jit
def _sequence_band(b, seqlen_q, seqlen_k, CuQ, CuK, SeqK, causal_offset, window_offset, align_offset,
                   VARLEN: tl.constexpr, SEQUSED: tl.constexpr, ALIGN_BR: tl.constexpr):
    """Batch ``b``'s sequence (:func:`.common.sequence`: its first query row and key, its lengths) and the
    band's offsets with that sequence's own diagonal added back."""
    q0, k0, sq, sk, align = sequence(b, seqlen_q, seqlen_k, CuQ, CuK, SeqK, VARLEN, SEQUSED, ALIGN_BR)
    return q0, k0, sq, sk, causal_offset + align, window_offset + align, align_offset + align


@triton.jit
def dkdv_kernel(Q, K, V, DO, LSE, Delta, DK, DV, DQ,
                stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
                stride_gb, stride_gh, stride_gs, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh,
                stride_dvs, stride_dqb, stride_dqh, stride_dqs, heads, group, seqlen_q, seqlen_k, causal_offset,
                window_offset, align_offset, scale_log2, softcap, Alibi, CuQ, CuK, SeqK, AttnMask, stride_mb,
                stride_mh, stride_mq, stride_mk,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                VARLEN: tl.constexpr, SEQUSED: tl.constexpr, ALIGN_BR: tl.constexpr, HEAD_V: tl.constexpr,
                BLOCK_DV: tl.constexpr, ATTN_MASK: tl.constexpr, ATOMIC_DQ: tl.constexpr, QK_CHUNKS: tl.constexpr,
                BH_BASE: tl.constexpr = 0, Seed=None, dropout_p=0.0, DROPOUT: tl.constexpr = False,
                HALVES: tl.constexpr = False):
    """dK and dV of key block ``program_id(0)`` of (batch, KV head) ``program_id(1)`` (HEAD_V: V's, O's and
    dO's head dimension); with ``ATOMIC_DQ`` also this block's share of dQ, added into the float32 ``DQ``.
    ``HALVES``: two programs a block (``program_id(0)`` = 2 block + half), each its half of dK's (and dQ's) and of
    dV's columns, with every operand read in column halves (its own, then the other, whose products complete S and
    dP): past head_dim 128 whole rows' accumulators leave a tile too few registers and one stage."""
    kv_heads = heads // group
    bh = tl.program_id(1) + BH_BASE
    b = bh // kv_heads
    kvh = bh % kv_heads
    q0, k0, sq, sk, causal_offset, window_offset, align_offset = _sequence_band(
        b, seqlen_q, seqlen_k, CuQ, CuK, SeqK, causal_offset, window_offset, align_offset, VARLEN, SEQUSED, ALIGN_BR)
    block = tl.program_id(0)
    half = 0
    if HALVES:
        half = block % 2
        block = block // 2
    start_n = block * BLOCK_N
    if VARLEN and start_n >= sk:  # past this sequence's keys: the next sequence's rows
        return
    offs_n = start_n + tl.arange(0, BLOCK_N)
    KW: tl.constexpr = BLOCK_D // 2 if HALVES else BLOCK_D  # the columns of dK a program holds
    VW: tl.constexpr = BLOCK_DV // 2 if HALVES else BLOCK_DV  # ... of dV
    offs_k = half * KW + tl.arange(0, KW)
    offs_v = half * VW + tl.arange(0, VW)
    offs_ko = (1 - half) * KW + tl.arange(0, KW)  # HALVES: the other half
    offs_vo = (1 - half) * VW + tl.arange(0, VW)
    b64 = b.to(tl.int64)
    keys = (k0 + offs_n).to(tl.int64)
    dk_ptrs = DK + b64 * stride_dkb + kvh.to(tl.int64) * stride_dkh + keys[:, None] * stride_dks + offs_k[None, :]
    dv_ptrs = DV + b64 * stride_dvb + kvh.to(tl.int64) * stride_dvh + keys[:, None] * stride_dvs + offs_v[None, :]
    # every key row of the tensor gets written: past a seqused_k length the gradients are 0
    rows_kept = offs_n[:, None] < (sk if VARLEN else seqlen_k)
    k = _part(K + b64 * stride_kb + kvh.to(tl.int64) * stride_kh + keys[:, None] * stride_ks, offs_n, sk, offs_k,
              HEAD_DIM, HALVES)
    v = _part(V + b64 * stride_vb + kvh.to(tl.int64) * stride_vh + keys[:, None] * stride_vs, offs_n, sk, offs_v,
              HEAD_V, HALVES)
    k_o = k
    v_o = v
    if HALVES:  # the other half's columns, for S and dP
        k_o = _part(K + b64 * stride_kb + kvh.to(tl.int64) * stride_kh + keys[:, None] * stride_ks, offs_n, sk,
                    offs_ko, HEAD_DIM, HALVES)
        v_o = _part(V + b64 * stride_vb + kvh.to(tl.int64) * stride_vh + keys[:, None] * stride_vs, offs_n, sk,
                    offs_vo, HEAD_V, HALVES)
    dk = tl.zeros([BLOCK_N, KW], tl.float32)
    dv = tl.zeros([BLOCK_N, VW], tl.float32)
    # the query rows that can see this block: from the diagonal (causal) to the window's end
    lo = 0
    if CAUSAL:
        lo = tl.maximum(start_n - causal_offset, 0) // BLOCK_M * BLOCK_M
    hi = sq
    if WINDOW:
        hi = tl.minimum(tl.maximum(start_n + BLOCK_N - window_offset, 0), sq)
    seed = 0
    if DROPOUT:
        seed = tl.load(Seed)
    for g in range(group):
        h = kvh * group + g
        slope = head_slope(Alibi, b * heads + h, heads, ALIBI)
        q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh
        g_base = DO + b64 * stride_gb + h.to(tl.int64) * stride_gh
        for start_m in range(lo, hi, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            seq = (q0 + offs_m).to(tl.int64)
            q = _part(q_base + seq[:, None] * stride_qs, offs_m, sq, offs_k, HEAD_DIM, HALVES)
            do = _part(g_base + seq[:, None] * stride_gs, offs_m, sq, offs_v, HEAD_V, HALVES)
            if VARLEN:
                rows = h.to(tl.int64) * seqlen_q + q0 + offs_m
            else:
                rows = (b * heads + h).to(tl.int64) * seqlen_q + offs_m
            lse2, delta = _row_stats(LSE, Delta, rows, offs_m, sq)
            mask_rows = _mask_rows(AttnMask, b, h, offs_m, stride_mb, stride_mh, stride_mq)
            qk = dot_t(q, k, BLOCK_M, BLOCK_N, QK_CHUNKS)
            if HALVES:  # the other half's product completes S
                q_o = _part(q_base + seq[:, None] * stride_qs, offs_m, sq, offs_ko, HEAD_DIM, HALVES)
                qk = mma(q_o, tl.trans(k_o), qk)
            p, dcap = _probs(qk, lse2, offs_m, offs_n, sq, sk, scale_log2, softcap, slope, causal_offset,
                             window_offset, align_offset, mask_rows, stride_mk, CAUSAL, WINDOW, SOFTCAP, ALIBI,
                             ATTN_MASK, BLOCK_M, BLOCK_N)
            if DROPOUT:
                keep, keep_scale = dropout.kept(seed, rows, start_n, seqlen_k, dropout_p, BLOCK_N)
                dv = mma(tl.trans(dropout.dropped(p, keep, keep_scale).to(do.dtype)), do, dv)
            else:
                dv = mma(tl.trans(p.to(do.dtype)), do, dv)
            dp = dot_t(do, v, BLOCK_M, BLOCK_N, QK_CHUNKS)
            if HALVES:  # ... and dP
                do_o = _part(g_base + seq[:, None] * stride_gs, offs_m, sq, offs_vo, HEAD_V, HALVES)
                dp = mma(do_o, tl.trans(v_o), dp)
            if DROPOUT:
                dp = dropout.dropped(dp, keep, keep_scale)
            dz = p * (dp - delta[:, None]) * dcap
            dk = mma(tl.trans(dz.to(q.dtype)), q, dk)
            if ATOMIC_DQ:
                dq = mma(dz.to(k.dtype), k, tl.zeros([BLOCK_M, KW], tl.float32)) * (scale_log2 / LOG2E)
                dq_ptrs = DQ + b64 * stride_dqb + h.to(tl.int64) * stride_dqh + seq[:, None] * stride_dqs
                tl.atomic_add(dq_ptrs + offs_k[None, :], dq, mask=(offs_m[:, None] < sq) & (offs_k[None, :] < HEAD_DIM),
                              sem="relaxed")
    dk = dk * (scale_log2 / LOG2E)
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=rows_kept & (offs_k[None, :] < HEAD_DIM))
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=rows_kept & (offs_v[None, :] < HEAD_V))


@triton.jit
def _part(row_ptrs, rows, n_rows, cols, WIDTH: tl.constexpr, HALVES: tl.constexpr):
    """The ``[len(rows), len(cols)]`` tile of a tensor's rows (``row_ptrs``, a column each) at columns ``cols``, rows
    >= n_rows and columns >= WIDTH read 0: whole rows as :func:`.common.load_rows` reads them; a half's columns each
    masked (the second half of a V narrower than its tile may hold none of V's)."""
    if HALVES:
        x = tl.load(row_ptrs + cols[None, :], mask=(rows[:, None] < n_rows) & (cols[None, :] < WIDTH), other=0.0)
    else:
        x = load_rows(row_ptrs + cols[None, :], rows, n_rows, cols, WIDTH, cols.shape[0], True)
    return x


@triton.jit
def dq_kernel(Q, K, V, DO, LSE, Delta, DQ,
              stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
              stride_gb, stride_gh, stride_gs, stride_dqb, stride_dqh, stride_dqs, heads, group, seqlen_q, seqlen_k,
              causal_offset, window_offset, align_offset, scale_log2, softcap, Alibi, CuQ, CuK, SeqK, AttnMask,
              stride_mb, stride_mh, stride_mq, stride_mk, DMask,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
              VARLEN: tl.constexpr, SEQUSED: tl.constexpr, ALIGN_BR: tl.constexpr, HEAD_V: tl.constexpr,
              BLOCK_DV: tl.constexpr, ATTN_MASK: tl.constexpr, QK_CHUNKS: tl.constexpr, MASK_GRAD: tl.constexpr,
              BH_BASE: tl.constexpr = 0, Seed=None, dropout_p=0.0, DROPOUT: tl.constexpr = False):
    """dQ of query block ``program_id(0)`` of (batch, head) ``program_id(1)``; with ``MASK_GRAD`` also the gradient
    of each score it visits, ``dZ``, into the float32 ``DMask`` ``[batch, heads, seqlen_q, seqlen_k]`` (contiguous;
    zero where no program writes: scores outside the band)."""
    bh = tl.program_id(1) + BH_BASE
    b = bh // heads
    h = bh % heads
    kvh = h // group
    q0, k0, sq, sk, causal_offset, window_offset, align_offset = _sequence_band(
        b, seqlen_q, seqlen_k, CuQ, CuK, SeqK, causal_offset, window_offset, align_offset, VARLEN, SEQUSED, ALIGN_BR)
    start_m = tl.program_id(0) * BLOCK_M
    if start_m >= sq:
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    b64 = b.to(tl.int64)
    seq = (q0 + offs_m).to(tl.int64)
    q = load_rows(Q + b64 * stride_qb + h.to(tl.int64) * stride_qh + seq[:, None] * stride_qs + offs_d[None, :],
                  offs_m, sq, offs_d, HEAD_DIM, BLOCK_D, True)
    do = load_rows(DO + b64 * stride_gb + h.to(tl.int64) * stride_gh + seq[:, None] * stride_gs + offs_dv[None, :],
                   offs_m, sq, offs_dv, HEAD_V, BLOCK_DV, True)
    if VARLEN:
        rows = h.to(tl.int64) * seqlen_q + q0 + offs_m
    else:
        rows = bh.to(tl.int64) * seqlen_q + offs_m
    lse2, delta = _row_stats(LSE, Delta, rows, offs_m, sq)
    slope = head_slope(Alibi, b * heads + h, heads, ALIBI)
    mask_rows = _mask_rows(AttnMask, b, h, offs_m, stride_mb, stride_mh, stride_mq)
    k_base = K + b64 * stride_kb + kvh.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + kvh.to(tl.int64) * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # the key blocks this block's rows can see: from the window's start to the diagonal (causal)
    lo = 0
    if WINDOW:
        lo = tl.maximum(start_m + window_offset, 0) // BLOCK_N * BLOCK_N
    hi = sk
    if CAUSAL:
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + causal_offset, 0), sk)
    seed = 0
    if DROPOUT:
        seed = tl.load(Seed)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        keys = (k0 + offs_n).to(tl.int64)
        k = load_rows(k_base + keys[:, None] * stride_ks + offs_d[None, :], offs_n, sk, offs_d, HEAD_DIM, BLOCK_D,
                      True)
        v = load_rows(v_base + keys[:, None] * stride_vs + offs_dv[None, :], offs_n, sk, offs_dv, HEAD_V, BLOCK_DV,
                      True)
        p, dcap = _probs(dot_t(q, k, BLOCK_M, BLOCK_N, QK_CHUNKS), lse2, offs_m, offs_n, sq, sk, scale_log2, softcap,
                         slope, causal_offset, window_offset, align_offset, mask_rows, stride_mk, CAUSAL, WINDOW,
                         SOFTCAP, ALIBI, ATTN_MASK, BLOCK_M, BLOCK_N)
        dp = dot_t(do, v, BLOCK_M, BLOCK_N, QK_CHUNKS)
        if DROPOUT:
            keep, keep_scale = dropout.kept(seed, rows, start_n, seqlen_k, dropout_p, BLOCK_N)
            dp = dropout.dropped(dp, keep, keep_scale)
        dz = p * (dp - delta[:, None])
        if MASK_GRAD:  # (dense only: the buffer's rows are (batch, head, query))
            at = DMask + (bh.to(tl.int64) * seqlen_q + offs_m)[:, None] * seqlen_k + offs_n[None, :]
            tl.store(at, dz, mask=(offs_m < sq)[:, None] & (offs_n < sk)[None, :])
        dq = mma((dz * dcap).to(k.dtype), k, dq)
    dq = dq * (scale_log2 / LOG2E)
    tl.store(DQ + b64 * stride_dqb + h.to(tl.int64) * stride_dqh + seq[:, None] * stride_dqs + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=(offs_m[:, None] < sq) & (offs_d[None, :] < HEAD_DIM))
