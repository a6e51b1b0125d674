"""The backward's consumer warpgroups: per query tile S, dP, P and dS, then dV and dK (accumulated in
registers through the walk) and dQ (added by TMA reduce-adds), over the columns that exist."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)

from ....constants import LOG2E as LOG2E_VALUE
from .. import narrow_pass, reduce_pass
from ..mask import _modified
from ..narrow_pass import narrowed
from .walks import _active, _extent, _pass_turn, _program, _query_tile, _receive, _take_turn, _turn, _walk

LOG2E = gl.constexpr(LOG2E_VALUE)
WARPS = gl.constexpr(4)  # a consumer warpgroup's
TILE_F32 = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
REDUCE_MARK = gl.constexpr(f"{reduce_pass.KERNEL_MARK}\n\tmov.u32 $0, 0;")
ROW_LAYOUT = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
ID_4 = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))  # ... in a consumer warpgroup


@gluon.jit
def _crossed(m, key0, seqlen_q, seqlen_k, causal_offset, window_offset, BLOCK_M: gl.constexpr, KEYS: gl.constexpr,
             CAUSAL: gl.constexpr, WINDOW: gl.constexpr, RAGGED: gl.constexpr, VARLEN: gl.constexpr):
    """Whether query tile ``m`` against keys ``key0 .. key0 + KEYS - 1`` holds a pair that is not seen: RAGGED
    (seqlen_k not a multiple of the key block), a key past seqlen_k (TMA's zeros, or the next packed sequence's
    keys zeroed, whose score 0 can lie far above a row's LSE, where P = exp(0 - LSE) would overflow); VARLEN, a
    query row past the sequence's end (the next sequence's, its statistics not this one's); or the band's edges
    crossing the tile."""
    crossed = False
    if RAGGED:
        crossed = key0 + KEYS > seqlen_k
    if VARLEN:
        crossed = crossed | (m * BLOCK_M + BLOCK_M > seqlen_q)
    if CAUSAL:
        crossed = crossed | (m * BLOCK_M + causal_offset < key0 + KEYS - 1)
    if WINDOW:
        crossed = crossed | (m * BLOCK_M + BLOCK_M - 1 + window_offset > key0)
    return crossed


@gluon.jit
def _hidden(m, key0, causal_offset, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr):
    """Whether the band's upper edge hides keys ``key0`` on from every row of query tile ``m`` (the tile's last row
    sees none of them): there the warpgroup that owns them has P = dS = 0, nothing to multiply."""
    hidden = False
    if CAUSAL:
        hidden = m * BLOCK_M + BLOCK_M - 1 + causal_offset < key0
    return hidden


@gluon.jit
def _seen(keys, rows, seqlen_q, seqlen_k, causal_offset, window_offset, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
          VARLEN: gl.constexpr):
    """The pairs of ``keys`` and query ``rows`` (broadcast against each other) that are seen."""
    seen = keys < seqlen_k
    if VARLEN:
        seen = seen & (rows < seqlen_q)
    if CAUSAL:
        seen = seen & (keys <= rows + causal_offset)
    if WINDOW:
        seen = seen & (keys >= rows + window_offset)
    return seen


@gluon.jit
def _pds_views(p_smem, ds_smem, d, WG: gl.constexpr, KEYS: gl.constexpr, RS: gl.constexpr, DQ_ROWS: gl.constexpr):
    """Buffer ``d`` of P and dS: this warpgroup's part of P ([query rows, its ``KEYS`` keys]) and of dS ([query
    rows, its keys], or RS: dS^T's [its keys, query rows]), and the dS operand of its dQ product: every key by its
    ``DQ_ROWS`` query rows (RS: a row half of the 128-row tile) or by the whole tile's (:func:`tiles`)."""
    ds = ds_smem.index(d)
    if RS:
        ds_w = ds.slice(WG * KEYS, KEYS, dim=0)
        p_w = ds_w  # (P stays in registers)
        ds_q = ds.permute((1, 0))
        if DQ_ROWS < ds.shape[1]:  # (a row half of the tile's)
            ds_q = ds.slice(WG * DQ_ROWS, DQ_ROWS, dim=1).permute((1, 0))
    else:
        p_w = p_smem.index(d).slice(WG * KEYS, KEYS, dim=1)
        ds_w = ds.slice(WG * KEYS, KEYS, dim=1)
        ds_q = ds
    return p_w, ds_w, ds_q


@gluon.constexpr_function
def _frees_apart(ds_bufs, stages, early):
    """Whether a tile's P/dS buffer is freed by a barrier of its own, not with its Q/dO stage (one barrier for both
    where the two rings are as deep and the stage is held until dQ's products are done)."""
    return ds_bufs != stages or early


@gluon.constexpr_function
def _span(d, head):
    """COLS: the columns of a ``head``-wide tile that dK's, dV's and dQ's shares cover for ``d`` real ones: whole
    64-column steps (:func:`_col0`)."""
    return min(head, (d + 63) // 64 * 64)


@gluon.constexpr_function
def _depth(d, head):
    """The columns a product reduces over for ``d`` real ones in a ``head``-wide tile: whole 16-column steps of
    wgmma's k (TMA's zeros past them not multiplied)."""
    return min(head, (d + 15) // 16 * 16)


@gluon.constexpr_function
def _pieces(depth, head):
    """The products :func:`_over` issues over ``depth`` of a ``head``-wide tile's columns: one for the whole tile,
    else one a power of two of ``depth``, widest first (96: 64 and 32; 192: 128 and 64)."""
    return 1 if depth == head else bin(depth).count("1")


@gluon.constexpr_function
def _piece(depth, i):
    """Where :func:`_over`'s ``i``-th piece of ``depth`` columns starts (past the last piece: ``depth``)."""
    return sum([w for w in (256, 128, 64, 32, 16) if depth & w][:i])


@gluon.constexpr_function
def _col0(span, wg):
    """COLS: the first of warpgroup ``wg``'s share of ``span`` columns (a multiple of 64, taken at least 128 wide so
    that each share is whole 64-column steps): halves where they are a power of two, else the first 128 and the rest
    (192: 128 and 64)."""
    span = max(span, 128)
    half = span // 2
    return 0 if wg == 0 else (half if half & (half - 1) == 0 else 128)


@gluon.constexpr_function
def _cols(span, wg):
    """COLS: how many columns warpgroup ``wg``'s share of ``span`` holds (:func:`_col0`)."""
    return _col0(span, 1) if wg == 0 else max(span, 128) - _col0(span, 1)


@gluon.jit
def _cut(t, DEPTH: gl.constexpr, i: gl.constexpr):
    """The columns of :func:`_over`'s ``i``-th piece of ``t``."""
    return t.slice(_piece(DEPTH, i), _piece(DEPTH, i + 1) - _piece(DEPTH, i), dim=1)


@gluon.jit
def _over(a_smem, b_smem, acc, DEPTH: gl.constexpr, FRESH: gl.constexpr):
    """``a[:, :DEPTH] b[:, :DEPTH]^T`` from shared memory into ``acc`` (FRESH: over it), issued (:func:`_pieces`
    products, each its own group): the columns past DEPTH, TMA's zeros, not multiplied."""
    if DEPTH == a_smem.shape[1]:  # (the whole tile)
        acc = warpgroup_mma(a_smem, b_smem.permute((1, 0)), acc, use_acc=not FRESH, is_async=True)
    else:
        for i in gl.static_range(_pieces(DEPTH, a_smem.shape[1])):
            acc = warpgroup_mma(_cut(a_smem, DEPTH, i), _cut(b_smem, DEPTH, i).permute((1, 0)), acc,
                                use_acc=not FRESH or i > 0, is_async=True)
    return acc


@gluon.jit
def _unhoisted(i):
    """Index ``i`` of a buffer (K's and V's, or a ring of one) as a register the compiler cannot fold, taken at every
    tile: each product's shared-memory descriptors (one 64-bit value a 16-deep step of each operand) are then made in
    the walk from it, not hoisted out of the walk as constants and held there, which spilled them.  At head_dim 256
    (COLS, one stage: 96 descriptors a tile) the sm_90 builds spilled 105-300 registers, 0-14 so, and ran 1.19-1.22x
    as fast; at 64 and 128 (spills from 14-87 registers to 0-8) 0.98-1.09x, so those keep K's and V's hoisted."""
    return gl.inline_asm_elementwise("mov.u32 $0, $1;", "=r,r", [i], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _row_stats(lse_s, delta_s, factor, layout: gl.constexpr):
    """A tile's LSEs times ``factor`` and deltas, from their [1, rows] boxes in shared memory, in ``layout``."""
    ROWS: gl.constexpr = lse_s.shape[1]
    lse = lse_s._reinterpret(gl.float32, [ROWS], ROW_LAYOUT).load(layout)
    return lse * factor, delta_s._reinterpret(gl.float32, [ROWS], ROW_LAYOUT).load(layout)


@gluon.jit
def _consumer(k_bufs, v_bufs, q_bufs, do_bufs, lse_bufs, delta_bufs, p_smem, ds_smem, dq_box, kv_ready, kv_empty,
              q_ready, q_empty, ds_ready, ds_free, dq_desc, DK, DV, Locks, CuQ, CuK, heads, kv_heads, group, seqlen_q,
              seqlen_k, n_m, causal_offset, window_offset, chunk, order, scale_log2, scale, dk_strides, dv_strides,
              ids, id_ready, id_free, mods, WG: gl.constexpr, HEAD: gl.constexpr, D: gl.constexpr,
              D_V: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, RAGGED: gl.constexpr, RS: gl.constexpr,
              DETERMINISTIC: gl.constexpr, VARLEN: gl.constexpr, ALIGN_BR: gl.constexpr, DYNAMIC: gl.constexpr,
              COLS: gl.constexpr, EARLY: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr):
    BLOCK_N: gl.constexpr = k_bufs.shape[1]  # a program's keys
    KEYS: gl.constexpr = BLOCK_N // 2  # this warpgroup's keys of S and dP
    STAGES: gl.constexpr = q_bufs.shape[0]
    # COLS: the columns dK's, dV's and dQ's shares cover, q/k's and V's in whole 64-column steps of the tile
    SPAN: gl.constexpr = _span(D, HEAD)
    SPAN_V: gl.constexpr = _span(D_V, v_bufs.shape[2])
    # S's and dP's reductions: over q/k's and V's real columns in 16-column steps (TMA's zeros past them)
    DEPTH: gl.constexpr = _depth(D, HEAD)
    DEPTH_V: gl.constexpr = _depth(D_V, v_bufs.shape[2])
    # this warpgroup's dK and dV: its keys' rows over every column, or COLS every key's rows over its share of the
    # columns (:func:`_col0`)
    KV_ROWS: gl.constexpr = BLOCK_N if COLS else KEYS
    K_COL0: gl.constexpr = _col0(SPAN, WG) if COLS else 0
    K_COLS: gl.constexpr = _cols(SPAN, WG) if COLS else HEAD
    V_COL0: gl.constexpr = _col0(SPAN_V, WG) if COLS else 0
    V_COLS: gl.constexpr = _cols(SPAN_V, WG) if COLS else v_bufs.shape[2]
    BLOCK_M: gl.constexpr = q_bufs.shape[1]  # query rows a tile
    DS_BUFS: gl.constexpr = ds_smem.shape[0]
    DQ_ROWS: gl.constexpr = dq_desc.block_type.shape[1]  # dQ: a row or a column half each (:func:`tiles`)
    DQ_COLS: gl.constexpr = dq_desc.block_type.shape[2]
    # a warpgroup's dQ adds a tile and the first one's index: one, or COLS the 64-column pieces of its share of the
    # span, the share whose dK columns are fewer taking more (at 192: 128 + 64 and 64 + 128 a warpgroup)
    DQ_PIECE0: gl.constexpr = WG * (SPAN // DQ_COLS // 2) if COLS else WG
    DQ_PIECES: gl.constexpr = (SPAN // DQ_COLS - DQ_PIECE0 if WG else SPAN // DQ_COLS // 2) if COLS else 1
    # the narrower products' widths (0: the whole tile; COLS: the shares' whole 64-column steps): dK over Q's columns,
    # dV over dO's, dQ over this warpgroup's columns of K
    N_K: gl.constexpr = 0 if COLS else narrow_pass.width(D, HEAD)
    N_V: gl.constexpr = 0 if COLS else narrow_pass.width(D_V, v_bufs.shape[2])
    N_Q: gl.constexpr = 0 if COLS else narrow_pass.width(D - (WG * DQ_COLS if DQ_COLS < HEAD else 0), DQ_COLS)
    FREE_APART: gl.constexpr = _frees_apart(DS_BUFS, STAGES, EARLY)
    # dK's product issued after dQ's (64-wide tiles, fast mode: 7-12% faster causal); 1-3% slower at 128, and 2-4%
    # slower deterministic, which issue it before
    DK_LAST: gl.constexpr = RS and not DETERMINISTIC
    # the scores modified as the forward's (:func:`.mask._modified`): ALiBi's bias, linear, starts the products'
    # accumulator where no cap comes first; the cap, not linear, takes the product's raw scores
    BIASED: gl.constexpr = ALIBI and not SOFTCAP
    Alibi, align_offset, cap_in, cap_out, alibi_scale = mods
    dtype: gl.constexpr = k_bufs.dtype
    gl.inline_asm_elementwise(REDUCE_MARK, "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, KEYS, 16])
    g_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, K_COLS, 16])
    gv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, V_COLS, 16])
    q_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, DQ_COLS, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    t_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=g_layout, k_width=2)
    tiles_m = n_m  # the query tiles of the call's longest sequence (the counters' rows)
    lock = Locks  # deterministic: the counter of the dQ tile's half added last
    n_kv = 0  # key blocks walked so far (the phase of ``kv_ready``)
    it = 0
    total = order[1] * order[2]
    if DYNAMIC:
        item = _receive(0, ids, id_ready, id_free, ID_4)
    else:
        item = gl.program_id(0)
    n_seen = 1  # DYNAMIC: key blocks received from the producer
    while item < total:
        pid_n, pair = _program(item, order, CAUSAL, DETERMINISTIC)
        b, kvh, q0, sq, k0, sk, n_m_b, blocks_b, chunk_b, causal_b, window_b = _extent(
            pair, kv_heads, seqlen_q, seqlen_k, n_m, order[1], chunk, causal_offset, window_offset, CuQ, CuK, BLOCK_M,
            BLOCK_N, VARLEN, ALIGN_BR)
        key0 = pid_n * BLOCK_N + WG * KEYS
        # dQ[rows, cols] = dS[rows, all keys] K[all keys, cols]: this warpgroup's row half, or its column half (COLS:
        # in pieces of DQ_COLS, one product and one add each)
        dq_row = 0
        dq_col: gl.constexpr = DQ_PIECE0 * DQ_COLS if DQ_COLS < HEAD else 0
        if DQ_ROWS < BLOCK_M:
            dq_row = WG * DQ_ROWS
        # a tile's query rows and this warpgroup's keys along the scores' dimensions (RS: S^T's, keys the rows)
        offs_q = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, t_layout) if RS else row_layout)
        offs_k = key0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, t_layout) if RS else gl.SliceLayout(0, s_layout))
        dk = gl.zeros([KV_ROWS, K_COLS], gl.float32, g_layout)
        dv = gl.zeros([KV_ROWS, V_COLS], gl.float32, gv_layout)
        align_b = align_offset + causal_b - causal_offset  # ALiBi's diagonal, moved as the band's
        first, end = _walk(pid_n, n_m_b, causal_b, window_b, BLOCK_M, BLOCK_N, CAUSAL, WINDOW)
        if _active(pid_n, sk, BLOCK_N, VARLEN):
            mbarrier.wait(kv_ready, n_kv & 1)
        else:
            end = first
        for gi in range(group):
            bh = b * heads + kvh * group + gi
            slope = 0.0
            if ALIBI:
                slope = gl.load(Alibi + kvh * group + gi) * alibi_scale
            dq_at = (bh, 0)  # dQ's float32 rows (packed: [heads, rows], a tile's room after each sequence)
            if VARLEN:
                dq_at = (kvh * group + gi, q0 + b * BLOCK_M)
            for j in range(end - first):
                m = _query_tile(j, first, n_m_b, pid_n, blocks_b, chunk_b, CAUSAL, DETERMINISTIC)
                s = it % STAGES
                if STAGES == 1:  # (a register, not the constant: see :func:`_unhoisted`)
                    s = _unhoisted(s)
                rows = m * BLOCK_M + offs_q
                q_s = q_bufs.index(s)
                do_s = do_bufs.index(s)
                d = it % DS_BUFS
                if DS_BUFS == 1:  # (likewise)
                    d = _unhoisted(d)
                d_phase = (it // DS_BUFS) & 1
                p_w, ds_w, ds_q = _pds_views(p_smem, ds_smem, d, WG, KEYS, RS, DQ_ROWS)
                kv = 0  # the block's K and V, one buffer each (COLS: see :func:`_unhoisted`)
                if COLS:
                    kv = _unhoisted(kv)
                k_smem = k_bufs.index(kv)
                v_smem = v_bufs.index(kv)
                k_w = k_smem.slice(WG * KEYS, KEYS, dim=0)
                v_w = v_smem.slice(WG * KEYS, KEYS, dim=0)
                mbarrier.wait(q_ready.index(s), (it // STAGES) & 1)
                if RS:  # S^T and dP^T (keys the rows): P^T and dS^T are dV's and dK's A operands in registers
                    lse_t, delta_t = _row_stats(lse_bufs.index(s), delta_bufs.index(s), 1.0 / scale,
                                                gl.SliceLayout(0, t_layout))
                    zeros_t = gl.zeros([KEYS, BLOCK_M], gl.float32, t_layout)
                    crossed = _crossed(m, key0, sq, sk, causal_b, window_b, BLOCK_M, KEYS, CAUSAL, WINDOW, RAGGED,
                                       VARLEN)
                    # (keys the rows: ALiBi's |row + align - key| as |key - align - row|)
                    st0 = zeros_t
                    if not SOFTCAP:  # the statistics, ALiBi's bias and the masks start the accumulator
                        st0 = zeros_t - lse_t[None, :]
                        if BIASED:
                            st0, _ = _modified(st0, offs_k[:, None], rows[None, :], -align_b, cap_in, cap_out, slope,
                                               False, True)
                        if crossed:
                            seen = _seen(offs_k[:, None], rows[None, :], sq, sk, causal_b, window_b, CAUSAL,
                                         WINDOW, VARLEN)
                            st0 = gl.where(seen, st0, float("-inf"))

                    st = _over(k_w, q_s, st0, DEPTH, False)
                    dpt = _over(v_w, do_s, zeros_t - delta_t[None, :], DEPTH_V, False)
                    st, dpt = warpgroup_mma_wait(0, deps=[st, dpt])
                    if SOFTCAP:
                        st, dcap = _modified(st, offs_k[:, None], rows[None, :], -align_b, cap_in, cap_out, slope,
                                             SOFTCAP, ALIBI)
                        dpt = dpt * dcap
                        st = st - lse_t[None, :]
                        if crossed:
                            st = gl.where(_seen(offs_k[:, None], rows[None, :], sq, sk, causal_b, window_b, CAUSAL,
                                                WINDOW, VARLEN), st, float("-inf"))
                    pt = gl.exp2(st * scale_log2)
                    dst = (pt * dpt * scale).to(dtype)
                    dv = narrowed(gl.convert_layout(pt.to(dtype), a_layout), do_s, dv, N_V)
                    mbarrier.wait(ds_free.index(d), d_phase ^ 1)
                    ds_w.store(dst)
                    fence_async_shared()
                    mbarrier.arrive(ds_ready.index(d), count=1)
                    ds_t = gl.convert_layout(dst, a_layout)  # dK's A operand
                    if not DK_LAST:
                        dk = narrowed(ds_t, q_s, dk, N_K)
                else:
                    # typed as the products' accumulators before the branch that may issue none
                    dv = warpgroup_mma_init(dv)
                    dk = warpgroup_mma_init(dk)
                    if _hidden(m, key0, causal_b, BLOCK_M, CAUSAL):  # (a block's first tile, its last keys) dS = 0
                        mbarrier.wait(ds_free.index(d), d_phase ^ 1)
                        if COLS:  # (the other warpgroup's dV reads this P)
                            p_w.store(gl.zeros([BLOCK_M, KEYS], dtype, s_layout))
                        ds_w.store(gl.zeros([BLOCK_M, KEYS], dtype, s_layout))
                        fence_async_shared()
                        mbarrier.arrive(ds_ready.index(d), count=1)
                    else:
                        lse2, delta = _row_stats(lse_bufs.index(s), delta_bufs.index(s), LOG2E, row_layout)
                        zeros = gl.zeros([BLOCK_M, KEYS], gl.float32, s_layout)
                        s0 = zeros
                        if BIASED:
                            s0, _ = _modified(zeros, rows[:, None], offs_k[None, :], align_b, cap_in, cap_out, slope,
                                              False, True)
                        qk = _over(q_s, k_w, s0, DEPTH, not BIASED)
                        dp = _over(do_s, v_w, zeros, DEPTH_V, True)
                        if SOFTCAP:  # dP too, each score's cap derivative into its dP at once: dS = P (dP - delta) dcap
                            qk, dp = warpgroup_mma_wait(0, deps=[qk, dp])
                            qk, dcap = _modified(qk, rows[:, None], offs_k[None, :], align_b, cap_in, cap_out, slope,
                                                 SOFTCAP, ALIBI)
                            dp = (dp - delta[:, None]) * dcap + delta[:, None]
                        else:
                            qk = warpgroup_mma_wait(_pieces(DEPTH_V, v_bufs.shape[2]), deps=[qk])
                        p = gl.exp2(qk * scale_log2 - lse2[:, None])
                        if _crossed(m, key0, sq, sk, causal_b, window_b, BLOCK_M, KEYS, CAUSAL, WINDOW, RAGGED,
                                    VARLEN):
                            p = gl.where(_seen(offs_k[None, :], rows[:, None], sq, sk, causal_b, window_b,
                                               CAUSAL, WINDOW, VARLEN), p, 0.0)

                        # P and dS into shared memory (the A operands of dV and dK transposed, of dQ as they are),
                        # once both warpgroups are done with the previous tile's
                        mbarrier.wait(ds_free.index(d), d_phase ^ 1)
                        p_w.store(p.to(dtype))
                        dp = warpgroup_mma_wait(0, deps=[dp])
                        ds_w.store((p * (dp - delta[:, None]) * scale).to(dtype))
                        fence_async_shared()
                        mbarrier.arrive(ds_ready.index(d), count=1)
                        if not COLS:
                            dv = narrowed(p_w.permute((1, 0)), do_s, dv, N_V)
                            dk = narrowed(ds_w.permute((1, 0)), q_s, dk, N_K)
                    if COLS:  # every key's P and dS, both warpgroups' halves, by this warpgroup's columns
                        mbarrier.wait(ds_ready.index(d), d_phase)
                        dv = warpgroup_mma(p_smem.index(d).permute((1, 0)), do_s.slice(V_COL0, V_COLS, dim=1), dv,
                                           is_async=True)
                        dk = warpgroup_mma(ds_smem.index(d).permute((1, 0)), q_s.slice(K_COL0, K_COLS, dim=1), dk,
                                           is_async=True)
                if DETERMINISTIC:  # the previous tile's add, complete by now: the next block's turn at that tile
                    if it > 0:
                        _pass_turn(lock)
                mbarrier.wait(ds_ready.index(d), d_phase)  # both warpgroups' dS in place
                for piece in gl.static_range(DQ_PIECES):
                    k_b = k_smem
                    if DQ_COLS < HEAD:
                        k_b = k_smem.slice(dq_col + piece * DQ_COLS, DQ_COLS, dim=1)
                    dq = narrowed(ds_q, k_b, gl.zeros([DQ_ROWS, DQ_COLS], gl.float32, q_layout), N_Q, False)
                    if DK_LAST:  # dK's product in flight while dQ's tile goes to shared memory and on to its add
                        dk = narrowed(ds_t, q_s, dk, N_K)
                        dq = warpgroup_mma_wait(1, deps=[dq])
                    else:
                        if EARLY and piece == 0:  # dV's and dK's products done: Q, dO and their statistics read
                            dv, dk = warpgroup_mma_wait(1, deps=[dv, dk])
                            mbarrier.arrive(q_empty.index(s), count=1)
                        dq, dv, dk = warpgroup_mma_wait(0, deps=[dq, dv, dk])
                        if piece == DQ_PIECES - 1:  # the last piece's product has read dS
                            # (and the P/dS buffer where the rings match: one barrier)
                            if not EARLY:
                                mbarrier.arrive(q_empty.index(s), count=1)
                            if FREE_APART:
                                mbarrier.arrive(ds_free.index(d), count=1)
                    if piece == 0:
                        tma.store_wait(0)  # the previous tile's reduce-adds have read their buffers
                    dq_tile = dq_box.index(DQ_PIECE0 + piece)
                    dq_tile._reinterpret(gl.float32, [DQ_ROWS, DQ_COLS], TILE_F32).store(dq)
                    fence_async_shared()
                    if DETERMINISTIC and piece == 0:
                        lock = Locks + (bh * tiles_m + m) * 2 + WG  # (halves: :func:`tiles`)
                        _take_turn(lock, WARPS * _turn(m, pid_n, blocks_b, causal_b, chunk_b, BLOCK_M, BLOCK_N,
                                                       CAUSAL))
                    tma.async_copy_shared_to_global(
                        dq_desc, [dq_at[0], dq_at[1] + m * BLOCK_M + dq_row, dq_col + piece * DQ_COLS], dq_tile)
                if DK_LAST:
                    dv, dk = warpgroup_mma_wait(0, deps=[dv, dk])
                    # (and the P/dS buffer where the rings match: one barrier)
                    mbarrier.arrive(q_empty.index(s), count=1)
                    if FREE_APART:
                        mbarrier.arrive(ds_free.index(d), count=1)
                it += 1
        if _active(pid_n, sk, BLOCK_N, VARLEN):
            mbarrier.arrive(kv_empty, count=1)  # this block's products are done with K and V: the next block's load
            n_kv += 1
        if DETERMINISTIC:  # (one block a program)
            if it > 0:
                _pass_turn(lock)
        # (packed: the batch strides are 0, the sequence's keys from its first)
        row0 = k0 + pid_n * BLOCK_N if COLS else k0 + key0
        _store_rows(dk, DK, b, kvh, k0 + sk, dk_strides, row0, K_COL0, g_layout, KV_ROWS, K_COLS, D)
        _store_rows(dv, DV, b, kvh, k0 + sk, dv_strides, row0, V_COL0, gv_layout, KV_ROWS, V_COLS, D_V)
        if DYNAMIC:
            item = _receive(n_seen, ids, id_ready, id_free, ID_4)
            n_seen += 1
        else:
            item += gl.num_programs(0)
    tma.store_wait(0)


@gluon.jit
def _store_rows(acc, Ptr, b, h, seqlen, strides, row0, col0, layout: gl.constexpr, ROWS: gl.constexpr,
                COLS: gl.constexpr, D: gl.constexpr):
    """A [ROWS, COLS] accumulator into rows ``row0..`` and columns ``col0..`` of (b, h) of a 16-bit tensor: the rows and
    columns that exist."""
    rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    base = Ptr + b.to(gl.int64) * strides[0] + h.to(gl.int64) * strides[1]
    ptrs = base + rows.to(gl.int64)[:, None] * strides[2] + cols[None, :]
    gl.store(ptrs, acc.to(Ptr.dtype.element_ty), mask=(rows < seqlen)[:, None] & (cols < D)[None, :])
