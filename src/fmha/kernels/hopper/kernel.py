"""The kernel entry: shared memory and mbarriers, then the producer and the consumer warpgroups
under ``gl.warp_specialize``."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .cluster import BARRIER_CLUSTER, SPARE_CLUSTER
from .consumer import _consumer
from .producer import _producer
from .resources import PRODUCER_REGS, tile_layout


# the 2-D tiles the TMA boxes land in and the wgmma read: ``resources.tile_layout`` of their width (CLUSTER:
# whole in each CTA of the cluster)
TILE_CLUSTER = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2,
                                                 cga_layout=[[0, 0]]))


@gluon.jit
def hopper_kernel(q_desc, k_desc, v_desc, o_desc, O, LSE, Alibi, CuQ, CuK, SeqK, Items, heads, group, seqlen_q,
                  seqlen_k, causal_offset, window_offset, align_offset, cap_in, cap_out, alibi_scale, scale_log2,
                  n_tiles, n_m, head_group, q_rows_b, q_rows_h, q_lead, kv_seq_b, kv_seq_h, kv_lead, o_rows_b,
                  o_rows_h, o_col_h, o_stride,
                  Pages, pages_b, page, PieceO, PieceLSE, Rows, pieces, Descale,
                  HEAD: gl.constexpr, HEAD_V: gl.constexpr, DV: gl.constexpr, QK_HI: gl.constexpr,
                  QK_LO: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                  CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr,
                  RAGGED: gl.constexpr, PAIRED: gl.constexpr, PINGPONG: gl.constexpr, STORE_LSE: gl.constexpr,
                  VARLEN: gl.constexpr, SEQUSED: gl.constexpr, ALIGN_BR: gl.constexpr, PAGED: gl.constexpr,
                  O_SMEM: gl.constexpr, Q_REGS: gl.constexpr, FENCE: gl.constexpr, LAZY: gl.constexpr,
                  STALE: gl.constexpr, SPLIT: gl.constexpr, BALANCE: gl.constexpr, CLUSTER: gl.constexpr,
                  FP8: gl.constexpr, SPLIT_QK: gl.constexpr, NARROW: gl.constexpr, P_SMEM: gl.constexpr):
    """Each program runs its work items (query block, batch*head), :func:`_n_items` and
    :func:`_tile`; the K/V rings and the barrier phases carry on from one item to the
    next, so the next item's first loads overlap this one's epilogue.  CLUSTER: a program is a
    cluster of two CTAs that share each K/V tile (:mod:`.multicast`); its producer has a whole
    warpgroup, so that every warp runs a partition (the cluster barrier counts every thread).
    HEAD and HEAD_V: q/k's and v's tile widths (``resources.padded``), DV: v's head dim; QK_HI and QK_LO:
    the slices Q K^T runs over where it leaves a padded head dim's zero columns out (:func:`qk_slices`).
    O_SMEM: how O goes out (``resources.o_stage``): 1 a shared stage of its own, 2 Q's tile, 0 from registers.
    FP8: q, k and v float8 (``Descale``: each (batch, kv head)'s three factors), V read transposed (``v_desc``
    over V^T: the float8 wgmma takes its B operand K-major only), O bfloat16.  SPLIT_QK (q/k head dim 192): Q
    and K held as a 128-column tile and a 64-column one, each filled by 64-column TMA boxes, instead of a
    256-column tile a quarter padding (``q_lo_*``, ``k_lo_*``; placeholders otherwise).  NARROW: the columns
    P V runs over where V is padded (:mod:`.narrow_pass`; 0: the whole tile).  P_SMEM: P reaches P V through a
    ``[64, BLOCK_N]`` shared tile of each consumer warpgroup instead of its registers."""
    NUM_WG: gl.constexpr = BLOCK_M // 64
    if CLUSTER:  # each CTA of the cluster holds all of every buffer
        bar_layout: gl.constexpr = BARRIER_CLUSTER
        spare_layout: gl.constexpr = SPARE_CLUSTER
        tile: gl.constexpr = TILE_CLUSTER  # q/k's tiles
        tile_v: gl.constexpr = TILE_CLUSTER  # v's and O's
    else:
        bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
        spare_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
        tile: gl.constexpr = tile_layout(HEAD)
        tile_v: gl.constexpr = tile_layout(HEAD_V)
    if FP8:  # one-byte Q and K tiles of HEAD columns; V^T's of BLOCK_N
        in_tile: gl.constexpr = tile_layout(HEAD, 2, 8)
        vt_tile: gl.constexpr = tile_layout(BLOCK_N, 2, 8)
    else:
        in_tile: gl.constexpr = tile
    # Q and O: a [1, 64, HEAD] TMA box per warpgroup, read and written as its [64, HEAD] tile
    if SPLIT_QK:  # Q's first 128 columns in two boxes (2g, 2g + 1: warpgroup g's), its last 64 in one
        q_box = gl.allocate_shared_memory(q_desc.dtype, [2 * NUM_WG, 1, 64, 64], q_desc.layout)
        q_smem = q_box._reinterpret(q_desc.dtype, [NUM_WG, 64, 128], tile_layout(128))
        q_lo_box = gl.allocate_shared_memory(q_desc.dtype, [NUM_WG, 1, 64, 64], q_desc.layout)
        q_lo_smem = q_lo_box._reinterpret(q_desc.dtype, [NUM_WG, 64, 64], tile_layout(64))
    else:
        q_box = gl.allocate_shared_memory(q_desc.dtype, [NUM_WG, 1, 64, HEAD], q_desc.layout)
        q_smem = q_box._reinterpret(q_desc.dtype, [NUM_WG, 64, HEAD], in_tile)
        q_lo_box = gl.allocate_shared_memory(q_desc.dtype, [1, 8, 8], spare_layout)  # placeholders
        q_lo_smem = q_lo_box
    if P_SMEM:  # P's tiles, one a consumer warpgroup
        p_bufs = gl.allocate_shared_memory(v_desc.dtype, [NUM_WG, 64, BLOCK_N],
                                           tile_layout(BLOCK_N, 2, 8 if FP8 else 16))
    else:
        p_bufs = q_smem  # not read
    if O_SMEM == 1:
        o_box = gl.allocate_shared_memory(o_desc.dtype, [NUM_WG, 1, 64, HEAD_V], o_desc.layout)
        o_smem = o_box._reinterpret(o_desc.dtype, [NUM_WG, 64, HEAD_V], tile_v)
    elif O_SMEM == 2:  # O out through each warpgroup's Q tile (SPLIT_QK: its 128 columns; ``resources.o_stage``)
        o_box = q_box._reinterpret(o_desc.dtype, [NUM_WG, 1, 64, HEAD_V], o_desc.layout)
        o_smem = q_box._reinterpret(o_desc.dtype, [NUM_WG, 64, HEAD_V], tile_v)
    else:  # never used: placeholders for the partitions' argument lists
        o_box = gl.allocate_shared_memory(o_desc.dtype, [1, 8, 8], spare_layout)
        o_smem = o_box
    if CLUSTER:  # the rings in column halves, a TMA box each (a CTA loads one, both get it), whole for the wgmma
        k_load = gl.allocate_shared_memory(k_desc.dtype, [2 * STAGES, 1, 1, BLOCK_N, HEAD // 2], k_desc.layout)
        v_load = gl.allocate_shared_memory(v_desc.dtype, [2 * STAGES, 1, 1, BLOCK_N, HEAD_V // 2], v_desc.layout)
        k_bufs = k_load._reinterpret(k_desc.dtype, [STAGES, BLOCK_N, HEAD], tile)
        v_bufs = v_load._reinterpret(v_desc.dtype, [STAGES, BLOCK_N, HEAD_V], tile_v)
    elif FP8:  # V^T's slots: [HEAD_V, BLOCK_N]
        k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD], in_tile)
        v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, HEAD_V, BLOCK_N], vt_tile)
        k_load = k_bufs
        v_load = v_bufs
    elif SPLIT_QK:  # K's slot s: its first 128 columns in boxes 2s and 2s + 1, its last 64 in box s of k_lo
        k_load = gl.allocate_shared_memory(k_desc.dtype, [2 * STAGES, 1, 1, BLOCK_N, 64], k_desc.layout)
        k_bufs = k_load._reinterpret(k_desc.dtype, [STAGES, BLOCK_N, 128], tile_layout(128))
        k_lo_load = gl.allocate_shared_memory(k_desc.dtype, [STAGES, 1, 1, BLOCK_N, 64], k_desc.layout)
        k_lo_bufs = k_lo_load._reinterpret(k_desc.dtype, [STAGES, BLOCK_N, 64], tile_layout(64))
        v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_V], tile_v)
        v_load = v_bufs
    else:
        k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD], tile)  # 2-D slots
        v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_V], tile_v)
        k_load = k_bufs
        v_load = v_bufs
    if not SPLIT_QK:
        k_lo_load = gl.allocate_shared_memory(k_desc.dtype, [1, 8, 8], spare_layout)  # placeholders
        k_lo_bufs = k_lo_load
    # Q's barriers: the first of each for the whole tile; O_SMEM 2, one for each warpgroup's part (its own Q loads
    # once its own O has gone out through it)
    q_bar = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], bar_layout)
    q_empty = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], bar_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    turns = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], bar_layout)  # ping-pong
    v_tail = gl.allocate_shared_memory(gl.int64, [1], bar_layout)  # a V tile to zero past the end
    for i in gl.static_range(NUM_WG):
        mbarrier.init(q_bar.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1 if O_SMEM == 2 else NUM_WG)  # (one arrival per consumer warpgroup)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=NUM_WG * (2 if CLUSTER else 1))  # CLUSTER: both CTAs' consumers
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=NUM_WG * (2 if CLUSTER else 1))
    for i in gl.static_range(NUM_WG):
        mbarrier.init(turns.index(i), count=1)
    mbarrier.init(v_tail, count=1)
    # (the partition arguments are spelled out: a tuple would lose their constexpr-ness)
    if NUM_WG == 3:
        gl.warp_specialize([
            (_consumer, (o_desc, O, LSE, Alibi, q_smem, q_lo_smem, o_smem, o_box, k_bufs, k_lo_bufs, v_bufs, p_bufs,
                         q_bar, q_empty, k_ready, k_empty, v_ready, v_empty, turns, CuQ, CuK, SeqK, Items, heads,
                         seqlen_q, seqlen_k, causal_offset, window_offset, align_offset, cap_in, cap_out, alibi_scale,
                         scale_log2, n_tiles, n_m, head_group, o_rows_b, o_rows_h, o_col_h, o_stride, PieceO, PieceLSE,
                         Rows, pieces, group, Descale, STAGES, 0, BLOCK_M, BLOCK_N, HEAD_V, DV, QK_HI, QK_LO, CAUSAL,
                         WINDOW, SOFTCAP, ALIBI, RAGGED, PAIRED, PINGPONG, STORE_LSE, VARLEN, SEQUSED, ALIGN_BR,
                         O_SMEM, Q_REGS, FENCE, LAZY, STALE, SPLIT, BALANCE, CLUSTER, FP8, SPLIT_QK, NARROW, P_SMEM)),
            (_consumer, (o_desc, O, LSE, Alibi, q_smem, q_lo_smem, o_smem, o_box, k_bufs, k_lo_bufs, v_bufs, p_bufs,
                         q_bar, q_empty, k_ready, k_empty, v_ready, v_empty, turns, CuQ, CuK, SeqK, Items, heads,
                         seqlen_q, seqlen_k, causal_offset, window_offset, align_offset, cap_in, cap_out, alibi_scale,
                         scale_log2, n_tiles, n_m, head_group, o_rows_b, o_rows_h, o_col_h, o_stride, PieceO, PieceLSE,
                         Rows, pieces, group, Descale, STAGES, 1, BLOCK_M, BLOCK_N, HEAD_V, DV, QK_HI, QK_LO, CAUSAL,
                         WINDOW, SOFTCAP, ALIBI, RAGGED, PAIRED, PINGPONG, STORE_LSE, VARLEN, SEQUSED, ALIGN_BR,
                         O_SMEM, Q_REGS, FENCE, LAZY, STALE, SPLIT, BALANCE, CLUSTER, FP8, SPLIT_QK, NARROW, P_SMEM)),
            (_consumer, (o_desc, O, LSE, Alibi, q_smem, q_lo_smem, o_smem, o_box, k_bufs, k_lo_bufs, v_bufs, p_bufs,
                         q_bar, q_empty, k_ready, k_empty, v_ready, v_empty, turns, CuQ, CuK, SeqK, Items, heads,
                         seqlen_q, seqlen_k, causal_offset, window_offset, align_offset, cap_in, cap_out, alibi_scale,
                         scale_log2, n_tiles, n_m, head_group, o_rows_b, o_rows_h, o_col_h, o_stride, PieceO, PieceLSE,
                         Rows, pieces, group, Descale, STAGES, 2, BLOCK_M, BLOCK_N, HEAD_V, DV, QK_HI, QK_LO, CAUSAL,
                         WINDOW, SOFTCAP, ALIBI, RAGGED, PAIRED, PINGPONG, STORE_LSE, VARLEN, SEQUSED, ALIGN_BR,
                         O_SMEM, Q_REGS, FENCE, LAZY, STALE, SPLIT, BALANCE, CLUSTER, FP8, SPLIT_QK, NARROW, P_SMEM)),
            (_producer, (q_desc, k_desc, v_desc, q_box, q_lo_box, k_load, k_lo_load, v_load, q_bar, q_empty, k_ready,
                         k_empty, v_ready, v_empty, v_tail, CuQ, CuK, SeqK, Items, heads, group, seqlen_q, seqlen_k,
                         causal_offset, window_offset, n_tiles, n_m, head_group, q_rows_b, q_rows_h, q_lead, kv_seq_b,
                         kv_seq_h, kv_lead, Pages, pages_b, page, pieces, NUM_WG, STAGES, BLOCK_M, BLOCK_N, CAUSAL,
                         WINDOW, PAIRED, VARLEN, SEQUSED, ALIGN_BR, PAGED, SPLIT, BALANCE, CLUSTER, FP8, SPLIT_QK,
                         O_SMEM)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
    elif NUM_WG == 2:
        gl.warp_specialize([
            (_consumer, (o_desc, O, LSE, Alibi, q_smem, q_lo_smem, o_smem, o_box, k_bufs, k_lo_bufs, v_bufs, p_bufs,
                         q_bar, q_empty, k_ready, k_empty, v_ready, v_empty, turns, CuQ, CuK, SeqK, Items, heads,
                         seqlen_q, seqlen_k, causal_offset, window_offset, align_offset, cap_in, cap_out, alibi_scale,
                         scale_log2, n_tiles, n_m, head_group, o_rows_b, o_rows_h, o_col_h, o_stride, PieceO, PieceLSE,
                         Rows, pieces, group, Descale, STAGES, 0, BLOCK_M, BLOCK_N, HEAD_V, DV, QK_HI, QK_LO, CAUSAL,
                         WINDOW, SOFTCAP, ALIBI, RAGGED, PAIRED, PINGPONG, STORE_LSE, VARLEN, SEQUSED, ALIGN_BR,
                         O_SMEM, Q_REGS, FENCE, LAZY, STALE, SPLIT, BALANCE, CLUSTER, FP8, SPLIT_QK, NARROW, P_SMEM)),
            (_consumer, (o_desc, O, LSE, Alibi, q_smem, q_lo_smem, o_smem, o_box, k_bufs, k_lo_bufs, v_bufs, p_bufs,
                         q_bar, q_empty, k_ready, k_empty, v_ready, v_empty, turns, CuQ, CuK, SeqK, Items, heads,
                         seqlen_q, seqlen_k, causal_offset, window_offset, align_offset, cap_in, cap_out, alibi_scale,
                         scale_log2, n_tiles, n_m, head_group, o_rows_b, o_rows_h, o_col_h, o_stride, PieceO, PieceLSE,
                         Rows, pieces, group, Descale, STAGES, 1, BLOCK_M, BLOCK_N, HEAD_V, DV, QK_HI, QK_LO, CAUSAL,
                         WINDOW, SOFTCAP, ALIBI, RAGGED, PAIRED, PINGPONG, STORE_LSE, VARLEN, SEQUSED, ALIGN_BR,
                         O_SMEM, Q_REGS, FENCE, LAZY, STALE, SPLIT, BALANCE, CLUSTER, FP8, SPLIT_QK, NARROW, P_SMEM)),
            (_producer, (q_desc, k_desc, v_desc, q_box, q_lo_box, k_load, k_lo_load, v_load, q_bar, q_empty, k_ready,
                         k_empty, v_ready, v_empty, v_tail, CuQ, CuK, SeqK, Items, heads, group, seqlen_q, seqlen_k,
                         causal_offset, window_offset, n_tiles, n_m, head_group, q_rows_b, q_rows_h, q_lead, kv_seq_b,
                         kv_seq_h, kv_lead, Pages, pages_b, page, pieces, NUM_WG, STAGES, BLOCK_M, BLOCK_N, CAUSAL,
                         WINDOW, PAIRED, VARLEN, SEQUSED, ALIGN_BR, PAGED, SPLIT, BALANCE, CLUSTER, FP8, SPLIT_QK,
                         O_SMEM)),
        ], [4, 4 if CLUSTER else 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:  # one consumer warpgroup: it is the default partition, with the registers the producer gives up
        gl.warp_specialize([
            (_consumer, (o_desc, O, LSE, Alibi, q_smem, q_lo_smem, o_smem, o_box, k_bufs, k_lo_bufs, v_bufs, p_bufs,
                         q_bar, q_empty, k_ready, k_empty, v_ready, v_empty, turns, CuQ, CuK, SeqK, Items, heads,
                         seqlen_q, seqlen_k, causal_offset, window_offset, align_offset, cap_in, cap_out, alibi_scale,
                         scale_log2, n_tiles, n_m, head_group, o_rows_b, o_rows_h, o_col_h, o_stride, PieceO, PieceLSE,
                         Rows, pieces, group, Descale, STAGES, 0, BLOCK_M, BLOCK_N, HEAD_V, DV, QK_HI, QK_LO, CAUSAL,
                         WINDOW, SOFTCAP, ALIBI, RAGGED, PAIRED, PINGPONG, STORE_LSE, VARLEN, SEQUSED, ALIGN_BR,
                         O_SMEM, Q_REGS, FENCE, LAZY, STALE, SPLIT, BALANCE, CLUSTER, FP8, SPLIT_QK, NARROW, P_SMEM)),
            (_producer, (q_desc, k_desc, v_desc, q_box, q_lo_box, k_load, k_lo_load, v_load, q_bar, q_empty, k_ready,
                         k_empty, v_ready, v_empty, v_tail, CuQ, CuK, SeqK, Items, heads, group, seqlen_q, seqlen_k,
                         causal_offset, window_offset, n_tiles, n_m, head_group, q_rows_b, q_rows_h, q_lead, kv_seq_b,
                         kv_seq_h, kv_lead, Pages, pages_b, page, pieces, NUM_WG, STAGES, BLOCK_M, BLOCK_N, CAUSAL,
                         WINDOW, PAIRED, VARLEN, SEQUSED, ALIGN_BR, PAGED, SPLIT, BALANCE, CLUSTER, FP8, SPLIT_QK,
                         O_SMEM)),
        ], [1], [PRODUCER_REGS])


KERNEL = hopper_kernel
