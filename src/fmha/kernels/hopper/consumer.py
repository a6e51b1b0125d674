"""A consumer warpgroup: for each of its items, Q K^T and P V by wgmma over the key tiles with the online
softmax between them (ping-pong turns between warpgroups when asked), then the epilogue."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from .cluster import MMA_128_CLUSTER, _cluster_sync, _cta_rank, _release, _store, _wait_ring
from .epilogue import _store_piece
from .mask import _key_tiles, _mask_from, _scores, _sequence, _window_until
from . import narrow_pass
from .narrow_pass import narrowed
from .schedule import _n_items, _piece, _tile, _work
from .softmax import _any_row_over, _fence, _first_seen, _lse, _narrow, _pivot, _rescale_lazy, _softmax


narrow_pass.install()


@gluon.jit
def _take_turn(turns, n_turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong (FlashAttention-3): wait until the previous consumer warpgroup has issued its
    matrix products of this step, so the warpgroups' products alternate on the tensor cores
    and one warpgroup's softmax runs under the other's products."""
    if PINGPONG:
        mbarrier.wait(turns.index(WG), n_turn & 1)


@gluon.jit
def _pass_turn(turns, WG: gl.constexpr, NUM_WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: this warpgroup has issued its products; the next one may issue."""
    if PINGPONG:
        mbarrier.arrive(turns.index((WG + 1) % NUM_WG), count=1)


@gluon.jit
def _qk(q_op, q_lo, k_bufs, k_lo_bufs, s, s_layout: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
        QK_HI: gl.constexpr, QK_LO: gl.constexpr, SPLIT_QK: gl.constexpr):
    """Q K^T of one key tile, issued (step 5.1).  A head dim padded to its tile's power of two (192 in 256,
    96 in 128) with Q in shared memory: the columns past it hold TMA's zeros, so the product runs over
    the head dim's own columns only, as two slices of powers of two (``QK_HI`` columns, then ``QK_LO``).
    The key tile is slot ``s`` of ``k_bufs``.  SPLIT_QK: the two slices are tiles of their own (``q_op`` and
    ``k_bufs``' the first 128 columns, ``q_lo`` and ``k_lo_bufs``' the last 64)."""
    zeros = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    k_slot = k_bufs.index(s)
    if QK_HI == 0:  # the whole tile
        return warpgroup_mma(q_op, k_slot.permute((1, 0)), zeros, use_acc=False, is_async=True)
    elif SPLIT_QK:
        qk = warpgroup_mma(q_op, k_slot.permute((1, 0)), zeros, use_acc=False, is_async=True)
        return warpgroup_mma(q_lo, k_lo_bufs.index(s).permute((1, 0)), qk, is_async=True)
    else:
        qk = warpgroup_mma(q_op.slice(0, QK_HI, dim=1), k_slot.slice(0, QK_HI, dim=1).permute((1, 0)), zeros,
                           use_acc=False, is_async=True)
        if QK_LO > 0:
            qk = warpgroup_mma(q_op.slice(QK_HI, QK_LO, dim=1), k_slot.slice(QK_HI, QK_LO, dim=1).permute((1, 0)),
                               qk, is_async=True)
        return qk


@gluon.jit
def _pv(p_op, v_op, acc, NARROW: gl.constexpr):
    """P V of one tile into O's accumulator, issued (step 5.6).  NARROW > 0: a V padded to its tile's power
    of two (96 in 128) runs over its first NARROW columns only, one wgmma of that width (:mod:`.narrow_pass`)."""
    return narrowed(p_op, v_op, acc, NARROW)


@gluon.jit
def _wait_pv(acc, p16, FP8: gl.constexpr):
    """Wait for P V, P's registers kept alive until it lands (float8 P is not a dependency the wait
    lowers: ptxas, which sees the wgmma read them, keeps them)."""
    if FP8:
        acc = warpgroup_mma_wait(0, deps=[acc])
    else:
        acc, _ = warpgroup_mma_wait(0, deps=[acc, p16])
    return acc


@gluon.jit
def _p_operand(p, p_dtype: gl.constexpr, p_layout: gl.constexpr, FP8: gl.constexpr):
    """P narrowed to ``p_dtype`` as P V's A operand.  FP8: each 32-key group's columns reordered (bits
    h j1 t1 t0 j0 to h t1 t0 j1 j0) so that every thread's accumulator values are the operand's own, with no
    exchange between threads; V^T's keys are reordered alike (:mod:`.transpose`)."""
    if FP8:
        n: gl.constexpr = p.shape[1]
        x = p.reshape([p.shape[0], n // 32, 2, 2, 4, 2]).permute((0, 1, 2, 4, 3, 5)).reshape([p.shape[0], n])
        return _narrow(gl.convert_layout(x, p_layout), p_dtype)
    return gl.convert_layout(_narrow(p, p_dtype), p_layout)


@gluon.jit
def _carried_p(p, p_dtype: gl.constexpr, p_layout: gl.constexpr, p_buf, FP8: gl.constexpr, P_SMEM: gl.constexpr):
    """P as the loop carries it to the next step's P V: P V's A operand, except float8's, carried as float32
    and narrowed where P V is issued (:func:`_pv_operand`): a float8 operand crosses the loop one byte a
    value, and packing the bytes again took four byte permutes a register.  P_SMEM: P narrowed into the
    warpgroup's shared tile ``p_buf`` (its last P V has retired: :func:`_wait_pv` comes first), which is the
    operand; the wgmma reads each warp's own 16 rows, as each warp wrote them."""
    if P_SMEM:  # (float8: its columns reordered as V^T's keys are, as in registers)
        p_buf.store(_p_operand(p, p_dtype, p_layout, FP8) if FP8 else _narrow(p, p_dtype))
        fence_async_shared()
        carried = p_buf
    elif FP8:
        carried = p
    else:
        carried = _p_operand(p, p_dtype, p_layout, FP8)
    return carried


@gluon.jit
def _pv_operand(p16, p_dtype: gl.constexpr, p_layout: gl.constexpr, FP8: gl.constexpr, P_SMEM: gl.constexpr):
    """P V's A operand from what :func:`_carried_p` carried."""
    if FP8 and not P_SMEM:
        operand = _p_operand(p16, p_dtype, p_layout, FP8)
    else:
        operand = p16
    return operand


@gluon.jit
def _v_operand(v_slot, FP8: gl.constexpr):
    """P V's B operand: the V tile ``[BLOCK_N, HEAD_V]``; FP8: the slot holds V^T, read K-major."""
    if FP8:
        return v_slot.permute((1, 0))
    else:
        return v_slot


@gluon.jit
def _consumer(o_desc, O, LSE, Alibi, q_smem, q_lo_smem, o_smem, o_box, k_bufs, k_lo_bufs, v_bufs, p_bufs, q_bar,
              q_empty, k_ready, k_empty, v_ready, v_empty, turns, CuQ, CuK, SeqK, Items, heads, seqlen_q, seqlen_k,
              causal_offset, window_offset, align_offset, cap_in, cap_out, alibi_scale, scale_log2, n_tiles, n_m,
              head_group, o_rows_b, o_rows_h, o_col_h, o_stride, PieceO, PieceLSE, Rows, pieces, group, Descale,
              STAGES: gl.constexpr, WG: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              HEAD_V: gl.constexpr, DV: gl.constexpr, QK_HI: gl.constexpr, QK_LO: gl.constexpr, CAUSAL: gl.constexpr,
              WINDOW: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, RAGGED: gl.constexpr,
              PAIRED: gl.constexpr, PINGPONG: gl.constexpr, STORE_LSE: gl.constexpr, VARLEN: gl.constexpr,
              SEQUSED: gl.constexpr, ALIGN_BR: gl.constexpr, O_SMEM: gl.constexpr, Q_REGS: gl.constexpr,
              FENCE: gl.constexpr, LAZY: gl.constexpr, STALE: gl.constexpr, SPLIT: gl.constexpr, BALANCE: gl.constexpr,
              CLUSTER: gl.constexpr, FP8: gl.constexpr, SPLIT_QK: gl.constexpr, NARROW: gl.constexpr,
              P_SMEM: gl.constexpr):
    _cluster_sync(CLUSTER)
    rank = _cta_rank(CLUSTER)
    ROWS: gl.constexpr = 64
    NUM_WG: gl.constexpr = BLOCK_M // ROWS
    MASKED: gl.constexpr = CAUSAL or WINDOW or RAGGED  # a row may have seen no visible key yet
    dtype: gl.constexpr = o_desc.dtype
    p_dtype: gl.constexpr = v_bufs.dtype  # P narrowed to V's type for P V (float8 with FP8)
    K_STEP: gl.constexpr = 32 if FP8 else 16  # a wgmma's K: 32 bytes of operand
    # FP8: the pivot 8 below the row max, so P runs up to 256 and no probability above 2**-14 lands in float8's
    # subnormals (whose few bits would lose it); P/l and the LSE are the same with any pivot
    P_SHIFT: gl.constexpr = 8.0 if FP8 else 0.0
    if CLUSTER:  # each CTA of the cluster holds the whole tensor (128-key tiles, head_dim 128)
        s_layout: gl.constexpr = MMA_128_CLUSTER
        o_layout: gl.constexpr = MMA_128_CLUSTER
    else:
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, K_STEP])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_V, K_STEP])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=K_STEP // 8)
    q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    q_half = q_smem.index(WG)
    q_ready = q_bar.index(WG if O_SMEM == 2 else 0)  # (O_SMEM 2: this warpgroup's Q apart, kernel.py)
    q_free = q_empty.index(WG if O_SMEM == 2 else 0)
    if SPLIT_QK:
        q_lo = q_lo_smem.index(WG)
    else:
        q_lo = q_half  # not read
    p_buf = p_bufs.index(WG) if P_SMEM else p_bufs  # (P_SMEM 0: not read)
    ring_pos = 0  # position in the K/V rings, continued across work items
    items_done = 0
    n_turn = 0  # ping-pong: the steps this warpgroup has taken its turn for
    if PINGPONG and WG == NUM_WG - 1:
        mbarrier.arrive(turns.index(0), count=1)  # warpgroup 0 goes first
    for t_idx in range(_n_items(n_tiles, pieces, Items, PAIRED, VARLEN, SPLIT, BALANCE)):
        g, part = _work(t_idx, n_tiles, pieces, Items, PAIRED, VARLEN, SPLIT, BALANCE)
        pid_m, bh = _tile(g, n_m, n_tiles // n_m, head_group, Items, heads, rank, CAUSAL, PAIRED, VARLEN, CLUSTER)
        b = bh // heads
        h = bh % heads
        start_m = pid_m * BLOCK_M
        q0, sq, k0, sk, shift = _sequence(b, seqlen_q, seqlen_k, CuQ, CuK, SeqK, VARLEN, SEQUSED, ALIGN_BR)
        row0 = start_m + WG * ROWS
        seq_causal = causal_offset + shift  # the band's offsets on this sequence's diagonal
        seq_window = window_offset + shift
        seq_align = align_offset + shift
        first, n_iters = _key_tiles(start_m, sk, seq_causal, seq_window, BLOCK_M, BLOCK_N, CAUSAL, WINDOW)
        first, n_iters = _piece(first, n_iters, part, pieces, SPLIT)
        slope = 0.0
        if ALIBI:
            slope = gl.load(Alibi + h) * alibi_scale
        item_scale = scale_log2  # FP8: with q's and k's factors; O takes v's at the end
        v_scale = 1.0
        if FP8:
            factors = Descale + (b * (heads // group) + h // group) * 3
            item_scale = scale_log2 * gl.load(factors) * gl.load(factors + 1)
            v_scale = gl.load(factors + 2)
        # tiles before mask_from are visible to every row of this warpgroup: no mask
        mask_from = _mask_from(row0, sk, seq_causal, BLOCK_N, CAUSAL, RAGGED)
        window_until = _window_until(row0, seq_window, ROWS, BLOCK_N, WINDOW)
        offs_m = row0 + gl.arange(0, ROWS, layout=row_layout)
        acc = gl.zeros([ROWS, HEAD_V], gl.float32, o_layout)

        # tile 0: 5.1-5.4 (no rescale yet)
        s = ring_pos % STAGES
        mbarrier.wait(q_ready, items_done & 1)
        if Q_REGS:  # Q into registers once: its shared slot goes back to the producer at once
            q_op = q_half.load(q_layout)
            if SPLIT_QK:
                q_lo_op = q_lo.load(q_layout)
            else:
                q_lo_op = q_lo
            # the loads are the generic proxy's reads, the next item's Q lands by TMA (the async proxy): without
            # the proxy fence the slot is released while they are in flight (the build waits on their registers
            # only at the first Q K^T), and the next Q can land under them
            fence_async_shared()
            mbarrier.arrive(q_free, count=1)
        else:
            q_op = q_half
            q_lo_op = q_lo
        mbarrier.wait(k_ready.index(s), (ring_pos // STAGES) & 1)
        _take_turn(turns, n_turn, WG, PINGPONG)
        qk = _qk(q_op, q_lo_op, k_bufs, k_lo_bufs, s, s_layout, ROWS, BLOCK_N, QK_HI, QK_LO, SPLIT_QK)
        _pass_turn(turns, WG, NUM_WG, PINGPONG)
        n_turn += 1
        qk, _k0 = warpgroup_mma_wait(0, deps=[qk, k_bufs.index(s)])
        _release(k_empty.index(s), CLUSTER)
        qk = _scores(qk, first, mask_from, window_until, offs_m, offs_n, sk, seq_causal, seq_window, seq_align,
                     cap_in, cap_out, slope, BLOCK_N, CAUSAL, WINDOW, SOFTCAP, ALIBI, RAGGED)
        m = gl.max(qk, axis=1) * item_scale - P_SHIFT
        p = gl.exp2(qk * item_scale - _pivot(m, MASKED)[:, None])
        l = gl.sum(p, axis=1)
        p16 = _carried_p(p, p_dtype, p_layout, p_buf, FP8, P_SMEM)
        # the tiles after the first, STALE in three runs, each loop's code holding only what its tiles need: those
        # the window's lower edge crosses, those every row of this warpgroup sees whole (no mask: the standing pivot),
        # those the diagonal or the last key crosses (each tile's exact max: any pivot gives the same P / l; the
        # standing pivot's second Q K^T beside a mask's code spilled 57 registers at head_dim 128 causal, 181 at 64).
        # Otherwise in one run, each tile masked where it crosses an edge.
        lo = 1
        hi = n_iters
        if STALE:
            lo = gl.minimum(gl.maximum(window_until - first, 1), n_iters)
            hi = gl.minimum(gl.maximum(mask_from - first, lo), n_iters)
        for run in gl.static_range(3):
            if run == 0:
                start = 1
                stop = lo
            elif run == 1:
                start = lo
                stop = hi
            else:
                start = hi
                stop = n_iters
            if run == 1 or (STALE and ((run == 0 and WINDOW) or (run == 2 and (CAUSAL or RAGGED)))):
                for i in range(start, stop):
                    s = (ring_pos + i) % STAGES
                    ph = ((ring_pos + i) // STAGES) & 1
                    prev_slot = (ring_pos + i - 1) % STAGES
                    prev_phase = ((ring_pos + i - 1) // STAGES) & 1
                    # 5.1 of tile i issued, then 5.6 of tile i-1; wait for the scores only
                    _wait_ring(k_ready.index(s), ph, CLUSTER)
                    if PINGPONG:  # both operands in place before the turn is taken
                        mbarrier.wait(v_ready.index(prev_slot), prev_phase)
                        _take_turn(turns, n_turn, WG, PINGPONG)
                    qk = _qk(q_op, q_lo_op, k_bufs, k_lo_bufs, s, s_layout, ROWS, BLOCK_N, QK_HI, QK_LO, SPLIT_QK)
                    if not PINGPONG:
                        mbarrier.wait(v_ready.index(prev_slot), prev_phase)
                    acc = _pv(_pv_operand(p16, p_dtype, p_layout, FP8, P_SMEM),
                              _v_operand(v_bufs.index(prev_slot), FP8), acc, NARROW)
                    _pass_turn(turns, WG, NUM_WG, PINGPONG)
                    n_turn += 1
                    qk = warpgroup_mma_wait(1, deps=[qk])
                    if not (STALE and run == 1):
                        _release(k_empty.index(s), CLUSTER)
                    # 5.2-5.4 of tile i while P V of tile i-1 runs
                    qk = _scores(qk, first + i, mask_from, window_until, offs_m, offs_n, sk, seq_causal, seq_window,
                                 seq_align, cap_in, cap_out, slope, BLOCK_N,
                                 CAUSAL and not (STALE and run == 1), WINDOW and not (STALE and run == 1), SOFTCAP,
                                 ALIBI, RAGGED and not (STALE and run == 1))
                    if STALE and run == 1:  # the standing pivot, no row max; a row sum past STALE_SUM: the tile again,
                        # with its max
                        p = gl.exp2(qk * item_scale - _pivot(m, MASKED)[:, None])
                        l_tile = gl.sum(p, axis=1)
                        alpha = gl.full_like(l_tile, 1.0)
                        if _any_row_over(_first_seen(l_tile, m, MASKED), WG) != 0:
                            qk2 = _qk(q_op, q_lo_op, k_bufs, k_lo_bufs, s, s_layout, ROWS, BLOCK_N, QK_HI, QK_LO,
                                      SPLIT_QK)
                            qk2 = warpgroup_mma_wait(0, deps=[qk2])
                            qk2 = _scores(qk2, first + i, mask_from, window_until, offs_m, offs_n, sk, seq_causal,
                                          seq_window, seq_align, cap_in, cap_out, slope, BLOCK_N, False, False, SOFTCAP,
                                          ALIBI, False)
                            p, alpha, m = _softmax(qk2, m, item_scale, MASKED, False)
                            l_tile = gl.sum(p, axis=1)
                        _release(k_empty.index(s), CLUSTER)
                    else:
                        p, alpha, m = _softmax(qk, m, item_scale, MASKED, LAZY, P_SHIFT)
                        l_tile = gl.sum(p, axis=1)
                    l = l * alpha + l_tile
                    if FENCE:
                        l = _fence(l)
                    acc = _wait_pv(acc, p16, FP8)
                    _release(v_empty.index(prev_slot), CLUSTER)
                    # 5.5: rescale the accumulator once P V of tile i-1 has landed (under the next Q K^T instead,
                    # FlashAttention-3's place, measured 1-2% slower)
                    alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                    if LAZY or STALE:
                        acc = _rescale_lazy(acc, alpha_o, HEAD_V)
                    else:
                        acc = acc * alpha_o
                    p16 = _carried_p(p, p_dtype, p_layout, p_buf, FP8, P_SMEM)
        if not Q_REGS and O_SMEM != 2:  # every Q K^T of this item has retired: the producer may load the next
            mbarrier.arrive(q_free, count=1)  # item's Q (O_SMEM 2: once O has gone out through it, below)
        last = (ring_pos + n_iters - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((ring_pos + n_iters - 1) // STAGES) & 1)
        _take_turn(turns, n_turn, WG, PINGPONG)
        acc = _pv(_pv_operand(p16, p_dtype, p_layout, FP8, P_SMEM), _v_operand(v_bufs.index(last), FP8), acc, NARROW)
        _pass_turn(turns, WG, NUM_WG, PINGPONG)
        n_turn += 1
        acc = _wait_pv(acc, p16, FP8)
        _release(v_empty.index(last), CLUSTER)

        # Section 6: o = acc / l with 1/l := 0 on an empty row
        inv_l = gl.where(l == 0.0, 0.0, v_scale / l)
        acc = acc * gl.convert_layout(inv_l, gl.SliceLayout(1, o_layout))[:, None]
        o_row = b * o_rows_b + h * o_rows_h + q0 + row0
        o_col = h * o_col_h
        if SPLIT and part >= 0:  # a piece's float32 result and LSE, merged after the kernel
            _store_piece(acc, l, m, PieceO, PieceLSE, Rows, g, part, n_tiles, bh * seqlen_q + row0, row0, sq, rank,
                         o_layout, row_layout, BLOCK_M, HEAD_V, WG, CLUSTER)
        elif O_SMEM and row0 + ROWS <= sq:  # (2: this warpgroup's Q tile, whose Q K^T have all retired)
            o_half = o_smem.index(WG)
            o_half.store(acc.to(dtype))
            fence_async_shared()
            o_at = 0  # O's box [1, 64, HEAD_V]: its leading index is the head where heads lie side by side
            if o_col_h != 0:
                o_at = h
            tma.async_copy_shared_to_global(o_desc, [o_at, o_row, 0], o_box.index(WG))
            # o_half is read out before the next item writes it.  Waiting only before that next
            # write (the store running under the next key loop) measured 1-4% slower on the short cells
            tma.store_wait(0)
        else:  # from registers (O not staged, or the warpgroup straddles the end: the rows and columns that exist)
            rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
            cols = gl.arange(0, HEAD_V, layout=gl.SliceLayout(0, o_layout))
            ptrs = O + (o_row + rows).to(gl.int64)[:, None] * o_stride + (o_col + cols)[None, :]
            keep = (row0 + rows < sq)[:, None]
            if DV < HEAD_V:
                keep = keep & (cols < DV)[None, :]
            _store(ptrs, acc.to(dtype), keep, CLUSTER)
        if STORE_LSE and part < 0:
            lse = _lse(m, l)
            if VARLEN:  # [heads, total_q]
                lse_row0 = h.to(gl.int64) * seqlen_q + q0
            else:  # [batch, heads, seqlen_q]
                lse_row0 = bh.to(gl.int64) * seqlen_q
            _store(LSE + lse_row0 + offs_m, lse, offs_m < sq, CLUSTER)
        if O_SMEM == 2:  # O's store has read the Q tile (store_wait above): the next item's Q may land there
            mbarrier.arrive(q_free, count=1)
        ring_pos += n_iters
        items_done += 1
    _cluster_sync(CLUSTER)
