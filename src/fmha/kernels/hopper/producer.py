"""The producer warp: Q and the K/V tiles by TMA into shared-memory rings (a paged cache's tiles through
the block table), and V's rows past a sequence's end zeroed before the consumers see them."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from .cluster import _cluster_sync, _cta_rank
from .mask import _key_tiles, _sequence
from .schedule import _n_items, _piece, _tile, _work


@gluon.jit
def _load_q(q_desc, at, row, bar, q_box, q_lo_box, g, SPLIT_QK: gl.constexpr):
    """Warpgroup ``g``'s 64 rows of Q, from ``row`` of the view's ``at``: one box [1, 64, HEAD]; SPLIT_QK three
    64-column boxes, the first two its 128-column tile (``q_box`` 2g and 2g + 1), the last its 64-column one."""
    if SPLIT_QK:
        tma.async_copy_global_to_shared(q_desc, [at, row, 0], bar, q_box.index(2 * g))
        tma.async_copy_global_to_shared(q_desc, [at, row, 64], bar, q_box.index(2 * g + 1))
        tma.async_copy_global_to_shared(q_desc, [at, row, 128], bar, q_lo_box.index(g))
    else:
        tma.async_copy_global_to_shared(q_desc, [at, row, 0], bar, q_box.index(g))


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_box, q_lo_box, k_bufs, k_lo_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty,
              v_ready, v_empty, v_tail, CuQ, CuK, SeqK, Items, heads, group, seqlen_q, seqlen_k, causal_offset,
              window_offset, n_tiles, n_m, head_group, q_rows_b, q_rows_h, q_lead, kv_seq_b, kv_seq_h, kv_lead, Pages,
              pages_b, page, pieces, NUM_WG: gl.constexpr, STAGES: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, PAIRED: gl.constexpr,
              VARLEN: gl.constexpr, SEQUSED: gl.constexpr, ALIGN_BR: gl.constexpr, PAGED: gl.constexpr,
              SPLIT: gl.constexpr, BALANCE: gl.constexpr, CLUSTER: gl.constexpr, FP8: gl.constexpr,
              SPLIT_QK: gl.constexpr, O_SMEM: gl.constexpr):
    _cluster_sync(CLUSTER)
    rank = _cta_rank(CLUSTER)
    it = 0  # position in the K/V rings, continued across work items
    tc = 0
    n_tail = 0  # V tiles zeroed past the sequence's end so far (the phase of v_tail)
    tail = 0  # 1: V tile ``tail_slot`` holds rows past its sequence's end (from ``tail_valid``), not yet zeroed
    tail_slot = 0
    tail_valid = 0
    for t_idx in range(_n_items(n_tiles, pieces, Items, PAIRED, VARLEN, SPLIT, BALANCE)):
        g, part = _work(t_idx, n_tiles, pieces, Items, PAIRED, VARLEN, SPLIT, BALANCE)
        pid_m, bh = _tile(g, n_m, n_tiles // n_m, head_group, Items, heads, rank, CAUSAL, PAIRED, VARLEN, CLUSTER)
        b = bh // heads
        h = bh % heads
        kvh = h // group
        start_m = pid_m * BLOCK_M
        q0, sq, k0, sk, shift = _sequence(b, seqlen_q, seqlen_k, CuQ, CuK, SeqK, VARLEN, SEQUSED, ALIGN_BR)
        first, n_iters = _key_tiles(start_m, sk, causal_offset + shift, window_offset + shift, BLOCK_M, BLOCK_N,
                                    CAUSAL, WINDOW)
        first, n_iters = _piece(first, n_iters, part, pieces, SPLIT)
        # K/V boxes [1, 1, BLOCK_N, HEAD] of the 4-D view [kv_heads side by side in a row or 1, batch*kv_heads
        # or batch, seqlen_k, head_dim]: keys past seqlen_k and columns past head_dim are outside the view, and
        # TMA fills them with zeros (PAGED: [*, pages, page, head_dim], :func:`_kv_place`)
        kv_seq = b * kv_seq_b + kvh * kv_seq_h
        kv_at = kvh * kv_lead
        # the first K tile goes out before Q: it may overlap the consumers' previous epilogue
        s = it % STAGES
        kv_s, row = _kv_place(b, kv_seq, k0, first, Pages, pages_b, page, BLOCK_N, PAGED)
        mbarrier.wait(k_empty.index(s), ((it // STAGES) & 1) ^ 1)
        _load_k(k_desc, [kv_at, kv_s, row], k_ready.index(s), k_bufs, k_lo_bufs, s, rank, CLUSTER, SPLIT_QK)
        # Q in 64-row boxes [1, 64, HEAD] (TMA boxes are powers of two; 192 rows is three), once every
        # consumer has issued its last Q K^T of the previous item; SPLIT_QK: three 64-column boxes a warpgroup.
        # O_SMEM 2 (O out through Q's tile): each warpgroup's boxes once that warpgroup's O has gone out
        q_first = b * q_rows_b + h * q_rows_h + q0 + start_m
        q_bytes: gl.constexpr = (3 if SPLIT_QK else 1) * q_desc.block_type.nbytes  # a warpgroup's
        if O_SMEM == 2:
            for g in gl.static_range(NUM_WG):
                mbarrier.wait(q_empty.index(g), (tc & 1) ^ 1)
                mbarrier.expect(q_bar.index(g), q_bytes)
                _load_q(q_desc, h * q_lead, q_first + 64 * g, q_bar.index(g), q_box, q_lo_box, g, SPLIT_QK)
        else:
            mbarrier.wait(q_empty.index(0), (tc & 1) ^ 1)
            mbarrier.expect(q_bar.index(0), NUM_WG * q_bytes)
            for g in gl.static_range(NUM_WG):
                _load_q(q_desc, h * q_lead, q_first + 64 * g, q_bar.index(0), q_box, q_lo_box, g, SPLIT_QK)
        if VARLEN or SEQUSED:
            # the previous item's last V tile, zeroed past its end only now, once this item's first
            # K and Q are on their way (waiting for it at once measured the same)
            if tail:
                _zero_past(v_bufs.index(tail_slot), tail_valid, v_tail, n_tail, v_ready.index(tail_slot))
                n_tail += 1
                tail = 0
        for i in range(n_iters):
            s = it % STAGES
            ph = (it // STAGES) & 1
            if i > 0:  # (tile 0's place is the first K load's)
                kv_s, row = _kv_place(b, kv_seq, k0, first + i, Pages, pages_b, page, BLOCK_N, PAGED)  # before the wait
                mbarrier.wait(k_empty.index(s), ph ^ 1)
                _load_k(k_desc, [kv_at, kv_s, row], k_ready.index(s), k_bufs, k_lo_bufs, s, rank, CLUSTER, SPLIT_QK)
            mbarrier.wait(v_empty.index(s), ph ^ 1)
            if VARLEN or SEQUSED:
                # keys past this sequence's end are another sequence's or unused cache (NaN, maybe):
                # a masked score times a NaN value is NaN, so those rows of V get zeroed (the
                # last tile only; it lands on v_tail, and v_ready waits for the zeros)
                valid = sk - (first + i) * BLOCK_N
                if valid < BLOCK_N:
                    _load(v_desc, [kv_at, kv_s, row, 0], v_tail, v_bufs.index(s))
                    tail = 1
                    tail_slot = s
                    tail_valid = valid
                else:
                    _load(v_desc, [kv_at, kv_s, row, 0], v_ready.index(s), v_bufs.index(s))
            elif FP8:  # V^T [1, batch * kv_heads, head_dim, seqlen_k]: the tile's keys are its columns
                _load(v_desc, [0, b * (heads // group) + kvh, 0, row], v_ready.index(s), v_bufs.index(s))
            else:
                _load_kv(v_desc, [kv_at, kv_s, row, 0], v_ready.index(s), v_bufs, s, rank, CLUSTER)
            it += 1
        tc += 1
    if VARLEN or SEQUSED:
        if tail:
            _zero_past(v_bufs.index(tail_slot), tail_valid, v_tail, n_tail, v_ready.index(tail_slot))
    _cluster_sync(CLUSTER)


@gluon.jit
def _kv_place(b, kv_seq, k0, tile, Pages, pages_b, page, BLOCK_N: gl.constexpr, PAGED: gl.constexpr):
    """Where key tile ``tile`` of batch ``b`` lies in the K/V descriptors: (first coordinate, row).
    PAGED: a page pool [pages, page, kv_heads, head_dim], the page from row ``b`` of the block table
    ``Pages`` (``page`` a multiple of BLOCK_N, so a tile never straddles two pages)."""
    if PAGED:
        key = tile * BLOCK_N
        place = gl.load(Pages + b * pages_b + key // page)
        row = key % page
    else:
        place = kv_seq
        row = k0 + tile * BLOCK_N
    return place, row


@gluon.jit
def _load(desc, coord, ready, buf):
    """One TMA box (``buf``, a 2-D ring slot, as the box of the 4-D descriptor) onto ``ready``."""
    mbarrier.expect(ready, desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, coord, ready, _box(buf))


@gluon.jit
def _load_kv(desc, coord, ready, ring, s, rank, CLUSTER: gl.constexpr):
    """A K or V tile into slot ``s`` of ``ring`` onto ``ready``.  CLUSTER: the ring is in column
    halves (slot ``s`` is halves ``2s`` and ``2s + 1``, the same bytes as the whole slot the
    consumers read); this CTA loads its half (the descriptor's box), which the PTX pass multicasts
    to both CTAs, and the barrier waits for both halves."""
    if CLUSTER:
        mbarrier.expect(ready, 2 * desc.block_type.nbytes)
        half = ring.shape[4]
        tma.async_copy_global_to_shared(desc, [coord[0], coord[1], coord[2], coord[3] + rank * half], ready,
                                        ring.index(2 * s + rank))
    else:
        _load(desc, coord, ready, ring.index(s))


@gluon.constexpr_function
def _chunk_cols(width):
    """The columns of one chunk :func:`_zero_past` loads and stores: 64, or the tile's width if narrower."""
    return min(64, width)


@gluon.jit
def _load_k(desc, at, ready, ring, lo_ring, s, rank, CLUSTER: gl.constexpr, SPLIT_QK: gl.constexpr):
    """K's tile at ``at`` (the descriptor's first three coordinates) into slot ``s`` onto ``ready``: as
    :func:`_load_kv`, or with SPLIT_QK in three 64-column boxes, boxes ``2s`` and ``2s + 1`` of ``ring`` (its
    first 128 columns) and box ``s`` of ``lo_ring`` (the last 64)."""
    if SPLIT_QK:
        mbarrier.expect(ready, 3 * desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, [at[0], at[1], at[2], 0], ready, ring.index(2 * s))
        tma.async_copy_global_to_shared(desc, [at[0], at[1], at[2], 64], ready, ring.index(2 * s + 1))
        tma.async_copy_global_to_shared(desc, [at[0], at[1], at[2], 128], ready, lo_ring.index(s))
    else:
        _load_kv(desc, [at[0], at[1], at[2], 0], ready, ring, s, rank, CLUSTER)


@gluon.jit
def _zero_past(buf, valid, landed, n_landed, ready):
    """Once the tile loaded into ``buf`` has landed (the ``n_landed``-th phase of ``landed``), set
    its rows from ``valid`` on to zero, make the zeros visible to the consumers' wgmma (the
    async proxy), then signal ``ready``."""
    mbarrier.wait(landed, n_landed & 1)
    _zero_rows(buf, valid)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(ready, count=1)


@gluon.jit
def _zero_rows(buf, valid):
    """Rows ``valid..`` of a landed [rows, columns] tile (128-byte swizzled) set to zero, by one warp; the
    caller makes the zeros visible to wgmma (``fence_async_shared``) and signals."""
    ROWS: gl.constexpr = 8  # the 128-byte swizzle repeats every 8 rows: slices start on its pattern
    COLS: gl.constexpr = _chunk_cols(buf.shape[1])  # and every 64 16-bit columns (TMA writes a 128-column
    # tile as two); a 32-wide tile is one chunk a row
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])  # one warp, 16 values a thread
    for c in gl.static_range(buf.shape[0] // ROWS):
        if (c + 1) * ROWS > valid:
            rows = c * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
            for d in gl.static_range(buf.shape[1] // COLS):
                chunk = buf.slice(c * ROWS, ROWS, dim=0).slice(d * COLS, COLS, dim=1)
                x = chunk.load(layout)
                chunk.store(gl.where(rows[:, None] < valid, x, gl.zeros_like(x)))


@gluon.jit
def _box(buf):
    """A [BLOCK_N, HEAD] ring slot as the [1, 1, BLOCK_N, HEAD] box of the 4-D K/V descriptors."""
    return buf.reshape([1, 1, buf.shape[0], buf.shape[1]])
