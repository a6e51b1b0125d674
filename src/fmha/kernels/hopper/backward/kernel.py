"""The backward kernel's entry: shared memory and mbarriers, then the two consumer warpgroups and the producer
under ``gl.warp_specialize``."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .consumer import ROW_LAYOUT, _consumer, _frees_apart, _span
from .producer import _producer

TILE = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))


@gluon.jit
def backward_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_desc, delta_desc, DK, DV, Locks, Deal, CuQ, CuK,
                    Alibi, heads, kv_heads, group, seqlen_q, seqlen_k, n_m, causal_offset, window_offset,
                    align_offset, chunk, section, blocks, pairs, scale_log2, scale, cap_in, cap_out, alibi_scale,
                    q_lead, q_first_b, q_first_h, k_lead, k_first_b, k_first_h,
                    v_lead, v_first_b, v_first_h, do_lead, do_first_b, do_first_h, dk_b, dk_h, dk_s, dv_b, dv_h, dv_s,
                    HEAD: gl.constexpr, D: gl.constexpr, D_V: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
                    RAGGED: gl.constexpr, RS: gl.constexpr, DS_BUFS: gl.constexpr, DETERMINISTIC: gl.constexpr,
                    VARLEN: gl.constexpr, ALIGN_BR: gl.constexpr, DYNAMIC: gl.constexpr, STAGES: gl.constexpr,
                    COLS: gl.constexpr, EARLY: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr):
    """dK and dV of each key block of a (batch, KV head) a program walks (:func:`_program`), and its share of dQ
    added into ``dq_desc``'s float32 buffer.  HEAD: the tile width (head_dim padded), D: head_dim, D_V: V's (no
    wider: V and dO read in tiles of their own width, ``v_desc``'s box, or in q/k's, TMA's zeros past D_V; dV stored
    over V's own columns).
    ``Locks``: deterministic, zeroed int32 counters, one a half of each (batch * head, query tile);
    ``Deal``: DYNAMIC, two int32 counters at zero (left so): the next key block a program takes as it frees, past
    the first turn's (each program's own number), and the programs done;
    ``chunk``: deterministic, the key blocks that walk side by side (:func:`_turn`; VARLEN: at most the SMs);
    ``section``, ``blocks``, ``pairs``: the programs' order (:func:`_program`).  VARLEN: packed sequences,
    ``CuQ``/``CuK`` their cu_seqlens, ``batch`` of them; seqlen_q/k the totals and ``n_m``, ``blocks`` the
    longest sequence's; the band's offsets relative to each sequence's diagonal where ALIGN_BR.  SOFTCAP, ALIBI: the
    scores as the forward's (``cap_in``, ``cap_out``; ``Alibi`` a slope a head, times ``alibi_scale``, about the
    diagonal ``align_offset``)."""
    dtype: gl.constexpr = q_desc.dtype
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    HEAD_V: gl.constexpr = v_desc.block_type.shape[3]  # V's and dO's tile width (:class:`Tiles`)
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD], TILE)
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_V], TILE)
    lse_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], lse_desc.layout)
    delta_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], delta_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD], TILE)  # (one buffer, indexed: :func:`_unhoisted`)
    v_bufs = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_V], TILE)
    k_smem = k_bufs.index(0)
    v_smem = v_bufs.index(0)
    if RS:  # P stays in registers
        ds_smem = gl.allocate_shared_memory(dtype, [DS_BUFS, BLOCK_N, BLOCK_M], TILE)
        p_smem = ds_smem
    else:
        ds_smem = gl.allocate_shared_memory(dtype, [DS_BUFS, BLOCK_M, BLOCK_N], TILE)
        p_smem = gl.allocate_shared_memory(dtype, [DS_BUFS, BLOCK_M, BLOCK_N], TILE)
    # a warpgroup's dQ tile each, or COLS the pieces of the descriptor's box over the columns that exist
    DQ_BOXES: gl.constexpr = _span(D, HEAD) // dq_desc.block_type.shape[2] if COLS else 2
    dq_box = gl.allocate_shared_memory(gl.float32, [DQ_BOXES, 1, dq_desc.block_type.shape[1],
                                                    dq_desc.block_type.shape[2]], dq_desc.layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [DS_BUFS, 1], mbarrier.MBarrierLayout())
    FREE_APART: gl.constexpr = _frees_apart(DS_BUFS, STAGES, EARLY)
    if FREE_APART:
        ds_free = gl.allocate_shared_memory(gl.int64, [DS_BUFS, 1], mbarrier.MBarrierLayout())
    else:  # a tile frees its Q/dO stage and its P/dS buffer at once: one barrier
        ds_free = q_empty
    landed = kv_ready  # VARLEN: the tiles whose rows past a sequence's end the producer zeroes land here first
    if VARLEN:
        landed = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(landed, count=1)
    # DYNAMIC: the producer hands each key block's number to the consumers through two slots
    ids = gl.allocate_shared_memory(gl.int32, [2, 1], ROW_LAYOUT)
    id_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    id_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    mbarrier.init(kv_empty, count=2)
    for i in gl.static_range(2):
        mbarrier.init(id_ready.index(i), count=1)
        mbarrier.init(id_free.index(i), count=2)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)
    for i in gl.static_range(DS_BUFS):
        mbarrier.init(ds_ready.index(i), count=2)
        if FREE_APART:
            mbarrier.init(ds_free.index(i), count=2)
    order = (section, blocks, pairs)
    mods = (Alibi, align_offset, cap_in, cap_out, alibi_scale)
    place = (q_lead, q_first_b, q_first_h, k_lead, k_first_b, k_first_h, v_lead, v_first_b, v_first_h, do_lead,
             do_first_b, do_first_h)
    gl.warp_specialize([
        (_consumer, (k_bufs, v_bufs, q_bufs, do_bufs, lse_bufs, delta_bufs, p_smem, ds_smem, dq_box, kv_ready,
                     kv_empty, q_ready, q_empty, ds_ready, ds_free, dq_desc, DK, DV, Locks, CuQ, CuK, heads, kv_heads,
                     group, seqlen_q, seqlen_k, n_m, causal_offset, window_offset, chunk, order, scale_log2, scale,
                     (dk_b, dk_h, dk_s), (dv_b, dv_h, dv_s), ids, id_ready, id_free, mods, 0, HEAD, D, D_V,
                     CAUSAL, WINDOW, RAGGED, RS, DETERMINISTIC, VARLEN, ALIGN_BR, DYNAMIC, COLS, EARLY, SOFTCAP,
                     ALIBI)),
        (_consumer, (k_bufs, v_bufs, q_bufs, do_bufs, lse_bufs, delta_bufs, p_smem, ds_smem, dq_box, kv_ready,
                     kv_empty, q_ready, q_empty, ds_ready, ds_free, dq_desc, DK, DV, Locks, CuQ, CuK, heads, kv_heads,
                     group, seqlen_q, seqlen_k, n_m, causal_offset, window_offset, chunk, order, scale_log2, scale,
                     (dk_b, dk_h, dk_s), (dv_b, dv_h, dv_s), ids, id_ready, id_free, mods, 1, HEAD, D, D_V,
                     CAUSAL, WINDOW, RAGGED, RS, DETERMINISTIC, VARLEN, ALIGN_BR, DYNAMIC, COLS, EARLY, SOFTCAP,
                     ALIBI)),
        (_producer, (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs,
                     k_smem, v_smem, kv_ready, kv_empty, q_ready, q_empty, landed, CuQ, CuK, heads, kv_heads, group,
                     seqlen_q, seqlen_k, n_m, causal_offset, window_offset, chunk, order, place, Deal, ids, id_ready,
                     id_free, CAUSAL, WINDOW, DETERMINISTIC, VARLEN, ALIGN_BR, DYNAMIC)),
    ], [4, 1], [240, 24])
