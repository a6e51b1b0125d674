"""``hopper``: the sm_90 fast path, in Gluon (explicit wgmma, TMA, mbarriers, warp specialization).

FlashAttention-3's shape, persistent: one program per SM (or per work item with
``KernelConfig.persistent=0``) walks work items of ``BLOCK_M`` query rows of one
(batch, head); a 1-warp producer streams Q and the
K and V tiles by TMA into ``STAGES``-deep shared rings that carry on from one
item to the next (the next item's first K tile and Q load overlap this item's
last P V and epilogue); ``BLOCK_M / 64`` consumer warpgroups (1, 2 or 3) of 64 rows
each run the recurrence and stage O in their own shared buffer.  ``KernelConfig.occupancy``
puts that many programs on each SM (the persistent grid, and the registers each launches
with, :func:`launch_regs`): with one consumer warpgroup a program is a 64-row item, and
programs side by side overlap each other's softmax, loads and epilogues, which short causal
items (a few key tiles each) cannot do within one.  Inside a
consumer, the Q K^T of tile j+1 is issued before P V of tile j and waited on
first, so the softmax of one tile can overlap the matrix unit's work on the other;
ptxas moves the wait for P V above the exponentials unless ``KernelConfig.fence``
puts a block edge between them (:func:`_fence`).  P stays in registers as the A
operand of P V (narrowed two values at a time, :func:`_narrow`), and with
``KernelConfig.q_regs`` so does each warpgroup's Q for Q K^T.  ``KernelConfig.lazy`` moves a row's
pivot only when its max grows past it by more than 2**8, and a thread skips O's rescale while both
its rows keep theirs (:func:`_rescale_lazy`).  ``KernelConfig.stale`` goes further: past an item's first
key tile a row keeps its pivot and takes no max at all; a tile where some row of the warpgroup sums past
2**15 (or to inf/NaN), or sees its first visible key, is multiplied again and takes the ordinary step
(one ``bar.red`` vote a tile, :func:`_any_row_over`).  ``KernelConfig.pingpong=1`` adds
FlashAttention-3's ping-pong: the consumer warpgroups take turns issuing their
products (an mbarrier per warpgroup), so one's softmax runs under another's
products (``configs.HOPPER`` takes it where it measured faster: D=128 non-causal
up to 512 keys, and D=64 non-causal on 192 rows).  ``KernelConfig.cluster`` (D=128 non-causal,
dense) makes a program a cluster of two CTAs on neighbouring query blocks that read each K/V
tile from L2 once for both: each CTA's producer loads a column half, multicast to both, and a
ring slot is refilled once the consumers of both CTAs have released it (the multicast and the
arrivals on the other CTA are PTX that :mod:`.multicast` writes in, Gluon 3.6 having neither).

The math is the seed's (Section 9) in the base-2 domain, with the same guards as
``kernels/common.py``: a row that has seen no visible key keeps ``m = -inf`` and
a pivot of 0, and ``1/l := 0`` at the end (with ``lazy`` the pivot may lag the row's max by up to
8, with ``stale`` by up to 15: l, O and the LSE all use the same pivot, so the result is the same).
Causal: the key loop stops at the block's last visible tile (Section 7) and only tiles that cross the diagonal are
masked; causal work items run longest-first within each head, or, persistent, in
pairs of equal cost (longest with shortest).  A sliding window also starts the
loop at the block's first visible tile and masks the band's lower edge; softcap
and ALiBi act on the raw scores ``q.k`` (:func:`_scores`, the same values as
``common.scores`` before its scale).

Shapes it takes (:func:`supports`): sm_90, head_dim 64 or 128, any seqlen_q and
seqlen_k, q/k/v/out contiguous in bhsd or bshd, packed sequences (``VARLEN``,
one packed bshd tensor; the work items come from a list the host builds from the
lengths, :func:`varlen_items`, so none lies past a sequence's end) and per-batch
key lengths (``SEQUSED``), also against a paged K/V cache (``PAGED``: pages of a
multiple of ``BLOCK_N`` keys, each key tile's page read from the block table by the
producer).  Rows of the last query block past the sequence's end are computed on
whatever TMA reads there and never stored (a warpgroup that straddles the end, or
every warpgroup where O cannot be staged in shared memory, stores from registers).  K and V are read
through 3-D descriptors, one sequence per (batch, head), so a last key tile past
seqlen_k holds zeros (never the next head's keys, which could hold anything, NaN
included: a masked score times a NaN value is NaN) and is masked (``RAGGED``).
Past a packed sequence's end or a seqused_k length the tile holds real memory
(the next sequence's keys, or the cache's unused part): the scores are masked
and the producer zeroes those rows of V in shared memory before the consumers
see it (:func:`_zero_past`).  Anything else goes to ``tiled``.  Gluon
kernels do not run in the interpreter.
"""
from __future__ import annotations

import functools
import heapq
import struct

import numpy as np
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                               warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ..reference import LOG2E
from . import device_facts, kv_view3d, merge, multicast, strides_bhsd

SMEM_LIMIT = 232448  # bytes of shared memory one sm_90 block may use
SMEM_SM = 233472  # bytes of shared memory on one SM, 1 KB of it reserved for each resident block
REGS_SM = 65536  # 32-bit registers on one SM
CONSUMER_REGS = {2: 240, 3: 160}  # setmaxnreg per consumer thread, by warpgroup count (one program per SM)
PRODUCER_REGS = gl.constexpr(24)
LN2 = gl.constexpr(0.6931471805599453)
# CLUSTER: a barrier of every thread of both CTAs (the first one also publishes the barriers' init), and
# the markers the PTX pass reads (kernels/multicast.py)
CLUSTER_SYNC = gl.constexpr(f"{multicast.KERNEL_MARK}\n\tfence.mbarrier_init.release.cluster; "
                            "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; "
                            "mov.u32 $0, 0;")
BOTH_MARK = gl.constexpr(f"{multicast.BOTH}\n\tmov.u32 $0, 0;")
UNSYNCED_MARK = gl.constexpr(f"{multicast.UNSYNCED}\n\tmov.u32 $0, 0;")
# CLUSTER's layouts: every CTA holds the whole of each tensor and buffer (a broadcast CTA basis)
MMA_128_CLUSTER = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, 128, 16], cga_layout=[[0, 0]]))
BARRIER_CLUSTER = gl.constexpr(mbarrier.MBarrierLayout(cga_layout=[[0]]))
SPARE_CLUSTER = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0], cga_layout=[[0, 0, 0]]))
multicast.install()


@gluon.jit
def _n_items(n_tiles, pieces, Items, PAIRED: gl.constexpr, VARLEN: gl.constexpr, SPLIT: gl.constexpr,
             BALANCE: gl.constexpr):
    """How many work items this program runs: items ``pid, pid + num_programs, ...``, or,
    PAIRED, pairs ``pid, pid + num_programs, ...`` of two items each (the last item alone
    when ``n_tiles`` is odd), or, BALANCE, the whole rounds of pairs but the last one or two
    (``Items[0]`` items) and then its list of the rest (:func:`balanced_tail`), or, VARLEN, one
    item of each round of ``num_programs`` (the last round may be short: its first items in an
    even round, its last in an odd one), or, SPLIT, the whole rounds and then its share of the
    last round's items cut in ``pieces`` (:func:`_work`)."""
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    if SPLIT:
        n = n_tiles // nprog + (n_tiles % nprog * pieces - pid + nprog - 1) // nprog
    elif VARLEN:
        rounds = n_tiles // nprog
        rest = n_tiles % nprog
        mine = gl.where(rounds % 2 == 0, pid < rest, pid >= nprog - rest)
        n = rounds + mine.to(gl.int32)
    elif BALANCE:
        n = gl.load(Items) + gl.load(Items + 2 + pid) - gl.load(Items + 1 + pid)
    elif PAIRED:
        n_pairs = (n_tiles + 1) // 2
        mine = (n_pairs - pid + nprog - 1) // nprog
        n = 2 * mine - ((n_tiles % 2 == 1) & (pid + (mine - 1) * nprog == n_pairs - 1)).to(gl.int32)
    else:
        n = (n_tiles - pid + nprog - 1) // nprog
    return n


@gluon.jit
def _work(k, n_tiles, pieces, Items, PAIRED: gl.constexpr, VARLEN: gl.constexpr, SPLIT: gl.constexpr,
          BALANCE: gl.constexpr):
    """This program's ``k``-th work item -> (item number, piece): :func:`_tile` places the number.
    The piece is -1 for a whole item.  SPLIT: when the items do not fill the last round of
    ``num_programs``, that round's items are cut into ``pieces`` runs of key tiles each
    (:func:`_piece`), dealt out like items, so the programs end within a piece of each other
    instead of a whole item; each piece leaves its partial result to be merged by its LSE.
    BALANCE (PAIRED): past the program's ``Items[0]`` items of whole pair rounds, its own list."""
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    part = -1
    if VARLEN:
        g = k * nprog + gl.where(k % 2 == 0, pid, nprog - 1 - pid)
    elif PAIRED:
        g = 2 * (pid + (k // 2) * nprog) + k % 2
        if BALANCE:
            lead = gl.load(Items)
            if k >= lead:
                g = gl.load(Items + nprog + 2 + gl.load(Items + 1 + pid) + k - lead)
    else:
        g = pid + k * nprog
    if SPLIT:
        full = n_tiles // nprog * nprog
        j = g - full  # this piece's number among the last round's
        if j >= 0:
            g = full + j // pieces
            part = j % pieces
    return g, part


@gluon.jit
def _piece(first, n_iters, part, pieces, SPLIT: gl.constexpr):
    """Piece ``part`` of ``pieces`` of the key tiles ``[first, first + n_iters)`` (all of them
    when ``part`` is -1)."""
    if SPLIT:
        if part >= 0:
            lo = part * n_iters // pieces
            first = first + lo
            n_iters = (part + 1) * n_iters // pieces - lo
    return first, n_iters


@gluon.jit
def _tile(g, n_m, n_bh, head_group, Items, heads, rank, CAUSAL: gl.constexpr, PAIRED: gl.constexpr,
          VARLEN: gl.constexpr, CLUSTER: gl.constexpr):
    """Work item number ``g`` (:func:`_work`) -> (query block, batch*head).  Items are numbered
    in groups of ``head_group`` heads, query block by query block within a group (head-major
    when 1), so the items running together share a few heads' K/V in L2 without every
    program reading the same tile at once.  Causal items differ in length: one program per
    item takes each block's longest first; PAIRED (persistent causal, head-major), a head's
    items are numbered longest, shortest, second longest, ... and a program runs them two by
    two, so every pair costs the same (``n_m + 1`` key tiles, or ``n_m`` across a head
    boundary) and the programs stay balanced.  VARLEN: packed sequences differ in length, so the
    host lists every query block that has rows, longest first (:func:`varlen_items`, ``(b << 16)
    | block``, the heads of each block numbered in turn) and the programs deal the items out
    snake-wise, round by round (forward, then backward), so each program's rounds add up to
    about the same work and none is spent on blocks past a sequence's end.  CLUSTER: an item is
    two neighbouring query blocks, one for each CTA of the cluster (``rank``)."""
    if VARLEN:
        entry = gl.load(Items + g // heads)
        pid_m = entry & 0xFFFF
        bh = (entry >> 16) * heads + g % heads
    elif PAIRED:
        w = g % n_m
        pid_m = gl.where(w % 2 == 0, n_m - 1 - w // 2, w // 2)
        bh = g // n_m
    else:
        first = g // (n_m * head_group) * head_group  # the group's first head
        r = g - first * n_m
        width = gl.minimum(head_group, n_bh - first)  # the last group may be narrower
        pid_m = r // width
        bh = first + r % width
        if CAUSAL:
            pid_m = n_m - 1 - pid_m
        if CLUSTER:
            pid_m = 2 * pid_m + rank
    return pid_m, bh


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty, v_ready, v_empty,
              v_tail, CuQ, CuK, SeqK, Items, heads, group, seqlen_q, seqlen_k, causal_offset, window_offset, n_tiles,
              n_m, head_group, q_rows_b, q_rows_h, q_col_h, kv_seq_b, kv_seq_h, kv_col_h, Pages, pages_b, page, pieces,
              NUM_WG: gl.constexpr, STAGES: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              CAUSAL: gl.constexpr, WINDOW: gl.constexpr, PAIRED: gl.constexpr, VARLEN: gl.constexpr,
              SEQUSED: gl.constexpr, ALIGN_BR: gl.constexpr, PAGED: gl.constexpr, SPLIT: gl.constexpr,
              BALANCE: gl.constexpr, CLUSTER: gl.constexpr):
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
        # K/V boxes [1, BLOCK_N, HEAD] of the 3-D view [batch*kv_heads or batch, seqlen_k, *]: keys past
        # seqlen_k are outside the view, and TMA fills them with zeros (PAGED: [pages, page, *], :func:`_kv_place`)
        kv_seq = b * kv_seq_b + kvh * kv_seq_h
        kv_col = kvh * kv_col_h
        # the first K tile goes out before Q: it may overlap the consumers' previous epilogue
        s = it % STAGES
        kv_s, row = _kv_place(b, kv_seq, k0, first, Pages, pages_b, page, BLOCK_N, PAGED)
        mbarrier.wait(k_empty.index(s), ((it // STAGES) & 1) ^ 1)
        _load_kv(k_desc, [kv_s, row, kv_col], k_ready.index(s), k_bufs, s, rank, CLUSTER)
        # Q in 64-row boxes (TMA boxes are powers of two; 192 rows is three), once every
        # consumer has issued its last Q K^T of the previous item
        mbarrier.wait(q_empty, (tc & 1) ^ 1)
        mbarrier.expect(q_bar, NUM_WG * q_desc.block_type.nbytes)
        for g in gl.static_range(NUM_WG):
            tma.async_copy_global_to_shared(q_desc, [b * q_rows_b + h * q_rows_h + q0 + start_m + 64 * g,
                                                     h * q_col_h], q_bar, q_smem.index(g))
        if VARLEN or SEQUSED:
            # the previous item's last V tile, zeroed past its end only now, once this item's first
            # K and Q are on their way (waiting for it at once measured the same: varlen rows of
            # bench/logs/2026-11-29-s6run1-* against s6run2-*)
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
                _load_kv(k_desc, [kv_s, row, kv_col], k_ready.index(s), k_bufs, s, rank, CLUSTER)
            mbarrier.wait(v_empty.index(s), ph ^ 1)
            if VARLEN or SEQUSED:
                # keys past this sequence's end are another sequence's or unused cache (NaN, maybe):
                # a masked score times a NaN value is NaN, so those rows of V get zeroed (the
                # last tile only; it lands on v_tail, and v_ready waits for the zeros)
                valid = sk - (first + i) * BLOCK_N
                if valid < BLOCK_N:
                    _load(v_desc, [kv_s, row, kv_col], v_tail, v_bufs.index(s))
                    tail = 1
                    tail_slot = s
                    tail_valid = valid
                else:
                    _load(v_desc, [kv_s, row, kv_col], v_ready.index(s), v_bufs.index(s))
            else:
                _load_kv(v_desc, [kv_s, row, kv_col], v_ready.index(s), v_bufs, s, rank, CLUSTER)
            it += 1
        tc += 1
    if VARLEN or SEQUSED:
        if tail:
            _zero_past(v_bufs.index(tail_slot), tail_valid, v_tail, n_tail, v_ready.index(tail_slot))
    _cluster_sync(CLUSTER)


@gluon.jit
def _kv_place(b, kv_seq, k0, tile, Pages, pages_b, page, BLOCK_N: gl.constexpr, PAGED: gl.constexpr):
    """Where key tile ``tile`` of batch ``b`` lies in the K/V descriptors: (first coordinate, row).
    PAGED: a page pool [pages, page, kv_heads * HEAD], the page from row ``b`` of the block table
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
    """One TMA box (``buf``, a 2-D ring slot, as the box of the 3-D descriptor) onto ``ready``."""
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
        half = ring.shape[3]
        tma.async_copy_global_to_shared(desc, [coord[0], coord[1], coord[2] + rank * half], ready,
                                        ring.index(2 * s + rank))
    else:
        _load(desc, coord, ready, ring.index(s))


@gluon.jit
def _cta_rank(CLUSTER: gl.constexpr):
    """This CTA's place in its cluster of two (0 or 1); 0 without clusters."""
    rank = 0
    if CLUSTER:
        rank = gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r", [], dtype=gl.int32, is_pure=True,
                                         pack=1)
    return rank


@gluon.jit
def _cluster_sync(CLUSTER: gl.constexpr):
    """CLUSTER, at each partition's start and end (every warp of a CTA runs one): every thread of
    both CTAs arrives and waits.  At the start the barriers each CTA initialised are then visible to
    the other's multicasts and arrivals; at the end neither CTA touches the other's shared memory any
    more, so neither leaves while the other still might."""
    if CLUSTER:
        gl.inline_asm_elementwise(CLUSTER_SYNC, "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _release(bar, CLUSTER: gl.constexpr):
    """A consumer warpgroup is done with a ring slot (its wgmma on it waited for): it arrives on the
    slot's empty barrier, and with CLUSTER on the other CTA's too (the PTX pass makes the marked
    arrive both, with no warpgroup barrier before it): the next multicast into the slot fills both
    CTAs' copies."""
    if CLUSTER:
        gl.inline_asm_elementwise(BOTH_MARK, "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _wait_ring(bar, phase, CLUSTER: gl.constexpr):
    """A consumer warpgroup waits for a ring slot's tile.  CLUSTER: without the warpgroup barrier
    Triton puts between two waits on one barrier array (the PTX pass drops it; the wgmma between
    them keeps the warps together)."""
    if CLUSTER:
        gl.inline_asm_elementwise(UNSYNCED_MARK, "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    mbarrier.wait(bar, phase)


STORE_32 = gl.constexpr("{ .reg .pred %p; setp.ne.b32 %p, $3, 0; @%p st.global.b32 [$1], $2; mov.u32 $0, 0; }")
STORE_16 = gl.constexpr("{ .reg .pred %p; setp.ne.b32 %p, $3, 0; @%p st.global.b16 [$1], $2; mov.u32 $0, 0; }")


@gluon.jit
def _store(ptrs, values, mask, CLUSTER: gl.constexpr):
    """``gl.store(ptrs, values, mask=mask)`` (``mask`` None for all); CLUSTER: by inline PTX, one
    element at a time.  Triton reads a cluster layout's broadcast CTA basis as the same tensor held
    by both CTAs, so its own store writes from the first CTA only; here each CTA holds rows of its
    own."""
    if CLUSTER:
        if mask is None:
            mask = gl.full(values.shape, 1, gl.int1, values.type.layout)
        else:
            mask, _ = gl.broadcast(mask, values)
        if values.dtype.primitive_bitwidth == 32:
            gl.inline_asm_elementwise(STORE_32, "=r,l,r,r", [ptrs, values.to(gl.int32, bitcast=True),
                                                             mask.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)
        else:
            gl.inline_asm_elementwise(STORE_16, "=r,l,h,r", [ptrs, values.to(gl.int16, bitcast=True),
                                                             mask.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.store(ptrs, values, mask=mask)


@gluon.jit
def _zero_past(buf, valid, landed, n_landed, ready):
    """Once the tile loaded into ``buf`` has landed (the ``n_landed``-th phase of ``landed``), set
    its rows from ``valid`` on to zero, make the zeros visible to the consumers' wgmma (the
    async proxy), then signal ``ready``."""
    mbarrier.wait(landed, n_landed & 1)
    ROWS: gl.constexpr = 8  # the 128-byte swizzle repeats every 8 rows: slices start on its pattern
    COLS: gl.constexpr = 64  # and every 64 16-bit columns (TMA writes a 128-column tile as two)
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])  # one warp, 16 values a thread
    for c in gl.static_range(buf.shape[0] // ROWS):
        if (c + 1) * ROWS > valid:
            rows = c * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
            for d in gl.static_range(buf.shape[1] // COLS):
                chunk = buf.slice(c * ROWS, ROWS, dim=0).slice(d * COLS, COLS, dim=1)
                x = chunk.load(layout)
                chunk.store(gl.where(rows[:, None] < valid, x, gl.zeros_like(x)))
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(ready, count=1)


@gluon.jit
def _box(buf):
    """A [BLOCK_N, HEAD] ring slot as the [1, BLOCK_N, HEAD] box of the 3-D K/V descriptors."""
    return buf.reshape([1, buf.shape[0], buf.shape[1]])


@gluon.jit
def _sequence(b, seqlen_q, seqlen_k, CuQ, CuK, SeqK, VARLEN: gl.constexpr, SEQUSED: gl.constexpr,
              ALIGN_BR: gl.constexpr):
    """Batch ``b``'s sequence: (first query row, query rows, first key, keys, diagonal shift).
    VARLEN: packed sequence b, from ``cu_seqlens``; SEQUSED: the first ``seqused_k[b]`` keys.
    ALIGN_BR (with either): the band's offsets come relative to the diagonal and move by this
    sequence's ``keys - query rows`` (bottom-right); otherwise they are final (shift 0)."""
    q0 = 0
    k0 = 0
    sq = seqlen_q
    sk = seqlen_k
    if VARLEN:
        q0 = gl.load(CuQ + b)
        k0 = gl.load(CuK + b)
        sq = gl.load(CuQ + b + 1) - q0
        sk = gl.load(CuK + b + 1) - k0
    elif SEQUSED:
        sk = gl.minimum(gl.load(SeqK + b), seqlen_k)
    shift = 0
    if ALIGN_BR:
        shift = sk - sq
    return q0, sq, k0, sk, shift


@gluon.jit
def _key_tiles(start_m, seqlen_k, causal_offset, window_offset, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               CAUSAL: gl.constexpr, WINDOW: gl.constexpr):
    """(first key tile, number of key tiles) of the block at ``start_m``: Section 7's early exit
    after its last visible key and, WINDOW, the whole-tile skip before its first (at least
    one tile, fully masked if need be)."""
    stop = seqlen_k
    if CAUSAL:
        stop = gl.minimum(seqlen_k, gl.maximum(start_m + BLOCK_M + causal_offset, 0))
    end = gl.maximum((stop + BLOCK_N - 1) // BLOCK_N, 1)
    first = 0
    if WINDOW:
        first = gl.minimum(gl.maximum(start_m + window_offset, 0) // BLOCK_N, end - 1)
    return first, end - first


@gluon.jit
def _scores(qk, i, mask_from, offs_m, offs_n, seqlen_k, causal_offset, window_offset, align_offset, cap_in, cap_out,
            slope, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr,
            ALIBI: gl.constexpr, RAGGED: gl.constexpr):
    """Step 5.2 on key tile ``i``, in raw ``q.k`` units (the caller scales by ``scale_log2``):
    softcap ``cap_out * tanh(cap_in * qk)`` (``cap_in = scale / softcap``, ``cap_out = softcap /
    scale``), ALiBi ``- slope |row + align_offset - key|`` (``slope`` already over ``scale``),
    then -inf past the upper edge (tiles from ``mask_from``: those crossing it), which is the
    causal diagonal and, RAGGED, the last key (TMA reads zeros past seqlen_k), and before the
    window's lower edge (every tile)."""
    cols = i * BLOCK_N + offs_n
    if SOFTCAP:
        qk = cap_out * (1.0 - 2.0 / (gl.exp2((2.0 / LN2) * cap_in * qk) + 1.0))  # tanh via exp2
    if ALIBI:
        qk = qk - slope * gl.abs((offs_m[:, None] + align_offset - cols[None, :]).to(gl.float32))
    if CAUSAL or RAGGED:
        if i >= mask_from:  # one select per score for both edges (at D=64 the softmax is the bound)
            if CAUSAL and RAGGED:
                edge = gl.minimum(offs_m + causal_offset, seqlen_k - 1)[:, None]
            elif CAUSAL:
                edge = offs_m[:, None] + causal_offset
            else:
                edge = seqlen_k - 1
            qk = gl.where(cols[None, :] <= edge, qk, float("-inf"))
    if WINDOW:
        qk = gl.where(cols[None, :] >= offs_m[:, None] + window_offset, qk, float("-inf"))
    return qk


@gluon.jit
def _mask_from(row0, seqlen_k, causal_offset, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, RAGGED: gl.constexpr):
    """The first key tile :func:`_scores` masks for rows from ``row0``: the first that crosses
    the causal diagonal and, RAGGED, at the latest the one that holds seqlen_k; tiles before it
    are visible to every row (a large number when nothing is masked)."""
    first = 1 << 30
    if CAUSAL:
        first = gl.maximum(row0 + causal_offset + 1, 0) // BLOCK_N
    if RAGGED:
        first = gl.minimum(first, seqlen_k // BLOCK_N)
    return first


@gluon.jit
def _narrow(x, dtype: gl.constexpr):
    """``x.to(dtype)`` for float32 ``x``, two values at a time: one packed ``cvt.rn`` per pair (the
    default lowering converts them one by one, and the pairs come out with their halves swapped,
    a byte permute each to put back)."""
    if dtype == gl.bfloat16:
        return gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=gl.bfloat16,
                                         is_pure=True, pack=2)
    else:
        return gl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=gl.float16,
                                         is_pure=True, pack=2)


@gluon.jit
def _fence(x):
    """``x`` (NaN payloads aside), through a loop that never repeats: ptxas schedules within basic
    blocks, so the softmax that ``x`` sums stays above the wait that follows (in one block with
    it, ptxas moves a ``wgmma.wait_group`` above the exponentials: the wait then stalls the
    softmax for the whole P V product it was meant to overlap)."""
    return gl.inline_asm_elementwise(
        "{ .reg .pred %p; .reg .b32 %c; mov.b32 %c, $1; fence_again: setp.eq.b32 %p, %c, 0x7fc00001; "
        "@%p mov.b32 %c, 0x7fffffff; @%p bra fence_again; mov.b32 $0, %c; }",
        "=r,r", [x], dtype=gl.float32, is_pure=False, pack=1)


def _rescale_asm(values: int) -> str:
    """PTX for one thread's ``values`` accumulator registers (``$0..``, tied to the inputs) times
    their row's alpha (``$2v..``): a branch over the multiplications when both of the thread's rows
    (elements 0 and 2 of each group of 4 in the wgmma accumulator layout) have alpha 1."""
    a = 2 * values
    muls = " ".join(f"mul.f32 ${i}, ${i}, ${a + i};" for i in range(values))
    return ("{ .reg .pred %p, %q; "
            f"setp.neu.f32 %p, ${a}, 0f3F800000; setp.neu.f32 %q, ${a + 2}, 0f3F800000; or.pred %p, %p, %q; "
            f"@!%p bra rescaled; {muls} rescaled: }}")


def _rescale_constraints(values: int) -> str:
    return ",".join(["=f"] * values + [str(i) for i in range(values)] + ["f"] * values)


LAZY_GROWTH = gl.constexpr(8.0)  # log2 units: a stale pivot leaves probabilities of at most 2**8
# STALE: a tile's row sum at most this (so each probability too) keeps the pivot; 2**15 < float16's largest
STALE_SUM = 2.0 ** 15
STALE_SUM_PTX = "0f" + struct.pack(">f", STALE_SUM).hex().upper()  # as a PTX float literal
RESCALE_128 = gl.constexpr(_rescale_asm(64))  # 64 rows x 128 columns over a warpgroup: 64 values a thread
RESCALE_128_C = gl.constexpr(_rescale_constraints(64))
RESCALE_64 = gl.constexpr(_rescale_asm(32))
RESCALE_64_C = gl.constexpr(_rescale_constraints(32))


@gluon.jit
def _rescale_lazy(acc, alpha, HEAD: gl.constexpr):
    """``acc * alpha`` (step 5.5), the multiplications skipped by each thread whose rows kept
    their pivot (FlashAttention-4's conditional rescale: with LAZY a row's pivot moves only
    when its max grows by more than LAZY_GROWTH, so most tiles leave every alpha at 1)."""
    if HEAD == 128:
        return gl.inline_asm_elementwise(RESCALE_128, RESCALE_128_C, [acc, alpha], dtype=gl.float32,
                                         is_pure=True, pack=64)
    else:
        return gl.inline_asm_elementwise(RESCALE_64, RESCALE_64_C, [acc, alpha], dtype=gl.float32,
                                         is_pure=True, pack=32)


@gluon.jit
def _lse(m, l):
    """Section 6's log-sum-exp of a row, natural log (``m`` in base-2 units), -inf for an empty row."""
    return gl.where(l == 0.0, float("-inf"), (m + gl.log2(l)) * LN2)


@gluon.jit
def _store_piece(acc, l, m, W, WL, Rows, g, part, n_tiles, dest0, row0, sq, rank, o_layout: gl.constexpr,
                 row_layout: gl.constexpr, BLOCK_M: gl.constexpr, HEAD: gl.constexpr, WG: gl.constexpr,
                 CLUSTER: gl.constexpr):
    """Piece ``part`` of item ``g`` (:func:`_work`), its rows ``acc`` already over ``l``: float32
    ``W[part, item * BLOCK_M + r, :]`` and the LSE ``WL[part, item * BLOCK_M + r]``, ``item`` being
    ``g``'s place among the last round's items; piece 0 also writes where row ``r`` goes in the
    output's (batch*head, row) order, ``Rows[item * BLOCK_M + r]`` (``dest0 + r``, or -1 past the
    ``sq`` rows).  The merge after the kernel (``kernels/merge.py``) reads them.  CLUSTER: an item
    has ``2 * BLOCK_M`` rows, this CTA's from ``rank * BLOCK_M``."""
    nprog = gl.num_programs(0)
    item = g - n_tiles // nprog * nprog
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, HEAD, layout=gl.SliceLayout(0, o_layout))
    UNIT: gl.constexpr = 2 * BLOCK_M if CLUSTER else BLOCK_M
    w_row = (part * (n_tiles % nprog) + item) * UNIT + rank * BLOCK_M + WG * 64
    _store(W + (w_row + rows).to(gl.int64)[:, None] * HEAD + cols[None, :], acc, None, CLUSTER)
    r = gl.arange(0, 64, layout=row_layout)
    _store(WL + w_row + r, _lse(m, l), None, CLUSTER)
    if part == 0:
        _store(Rows + item * UNIT + rank * BLOCK_M + WG * 64 + r, gl.where(row0 + r < sq, dest0 + r, -1), None,
               CLUSTER)


@triton.constexpr_function
def _vote_asm(wg):
    """STALE's vote for consumer warpgroup ``wg``: named barrier 8 + wg (Triton's own are 0 to 3)
    reduces over the warpgroup's 128 threads whether any of their rows ($2, $3) summed past
    STALE_SUM or to NaN, into a predicate of its own (each partition's code is inlined into the one
    kernel function); :func:`_read_asm` reads it as a scalar.  A reduction in Gluon takes two
    warpgroup barriers and shared memory for the same."""
    return (f".reg .pred %fmha_over{wg};\n\t{{ .reg .pred %p, %q; setp.le.f32 %p, $2, {STALE_SUM_PTX}; "
            f"setp.le.f32 %q, $3, {STALE_SUM_PTX}; and.pred %p, %p, %q; not.pred %p, %p; "
            f"bar.red.or.pred %fmha_over{wg}, {8 + wg}, 128, %p; mov.u32 $0, 0; mov.u32 $1, 0; }}")


@triton.constexpr_function
def _read_asm(wg):
    return f"selp.u32 $0, 1, 0, %fmha_over{wg};"


@gluon.jit
def _any_row_over(l_tile, WG: gl.constexpr):
    """1 if a row of this warpgroup summed past STALE_SUM (or to NaN) in this tile, else 0: the same
    scalar in all 128 threads (the branch it decides holds a wgmma)."""
    gl.inline_asm_elementwise(_vote_asm(WG), "=r,=r,f,f", [l_tile], dtype=gl.int32, is_pure=False, pack=2)
    return gl.inline_asm_elementwise(_read_asm(WG), "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _first_seen(l_tile, m, MASKED: gl.constexpr):
    """STALE's vote input: ``l_tile``, or inf for a row whose first visible keys are in this tile (its
    pivot until now the guard's 0, no maximum: the row takes the tile again for a real one)."""
    if MASKED:
        l_tile = gl.where((m == float("-inf")) & (l_tile > 0.0), float("inf"), l_tile)
    return l_tile


@gluon.jit
def _softmax(qk, m, scale_log2, MASKED: gl.constexpr, LAZY: gl.constexpr):
    """Steps 5.2-5.4 of a key tile after the first: the row's new pivot from the tile's max, the
    tile's probabilities ``p`` and ``alpha``, the factor on what the old pivot summed."""
    m_new = gl.maximum(m, gl.max(qk, axis=1) * scale_log2)
    if LAZY:  # keep the old pivot unless the max grew past it by more than LAZY_GROWTH
        m_new = gl.where(m_new - m > LAZY_GROWTH, m_new, m)
    m_safe = _pivot(m_new, MASKED)
    return gl.exp2(qk * scale_log2 - m_safe[:, None]), gl.exp2(m - m_safe), m_new


@gluon.jit
def _pivot(m, MASKED: gl.constexpr):
    """The exponent pivot: ``m``, or 0 for a row that has seen no visible key (m = -inf)."""
    if MASKED:
        m = gl.where(m == float("-inf"), 0.0, m)
    return m


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
def _consumer(o_desc, O, LSE, Alibi, q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty, v_ready,
              v_empty, turns, CuQ, CuK, SeqK, Items, heads, seqlen_q, seqlen_k, causal_offset, window_offset,
              align_offset, cap_in, cap_out, alibi_scale, scale_log2, n_tiles, n_m, head_group, q_rows_b, q_rows_h,
              q_col_h, o_stride, W, WL, Rows, pieces, STAGES: gl.constexpr, WG: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, HEAD: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
              SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, RAGGED: gl.constexpr, PAIRED: gl.constexpr,
              PINGPONG: gl.constexpr, STORE_LSE: gl.constexpr, VARLEN: gl.constexpr, SEQUSED: gl.constexpr,
              ALIGN_BR: gl.constexpr, O_SMEM: gl.constexpr, Q_REGS: gl.constexpr, FENCE: gl.constexpr,
              LAZY: gl.constexpr, STALE: gl.constexpr, SPLIT: gl.constexpr, BALANCE: gl.constexpr,
              CLUSTER: gl.constexpr):
    _cluster_sync(CLUSTER)
    rank = _cta_rank(CLUSTER)
    ROWS: gl.constexpr = 64
    NUM_WG: gl.constexpr = BLOCK_M // ROWS
    MASKED: gl.constexpr = CAUSAL or WINDOW or RAGGED  # a row may have seen no visible key yet
    dtype: gl.constexpr = o_desc.dtype
    if CLUSTER:  # each CTA of the cluster holds the whole tensor (128-key tiles, head_dim 128)
        s_layout: gl.constexpr = MMA_128_CLUSTER
        o_layout: gl.constexpr = MMA_128_CLUSTER
    else:
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    q_half = q_smem.index(WG)
    it0 = 0  # position in the K/V rings, continued across work items
    tc = 0
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
        co = causal_offset + shift  # the band's offsets on this sequence's diagonal
        wo = window_offset + shift
        ao = align_offset + shift
        first, n_iters = _key_tiles(start_m, sk, co, wo, BLOCK_M, BLOCK_N, CAUSAL, WINDOW)
        first, n_iters = _piece(first, n_iters, part, pieces, SPLIT)
        slope = 0.0
        if ALIBI:
            slope = gl.load(Alibi + h) * alibi_scale
        # tiles before mask_from are visible to every row of this warpgroup: no mask
        mask_from = _mask_from(row0, sk, co, BLOCK_N, CAUSAL, RAGGED)
        offs_m = row0 + gl.arange(0, ROWS, layout=row_layout)
        acc = gl.zeros([ROWS, HEAD], gl.float32, o_layout)

        # tile 0: 5.1-5.4 (no rescale yet)
        s = it0 % STAGES
        mbarrier.wait(q_bar, tc & 1)
        if Q_REGS:  # Q into registers once: its shared slot goes back to the producer at once
            q_op = q_half.load(q_layout)
            mbarrier.arrive(q_empty, count=1)
        else:
            q_op = q_half
        mbarrier.wait(k_ready.index(s), (it0 // STAGES) & 1)
        _take_turn(turns, n_turn, WG, PINGPONG)
        qk = warpgroup_mma(q_op, k_bufs.index(s).permute((1, 0)),
                           gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
        _pass_turn(turns, WG, NUM_WG, PINGPONG)
        n_turn += 1
        qk, _k0 = warpgroup_mma_wait(0, deps=[qk, k_bufs.index(s)])
        _release(k_empty.index(s), CLUSTER)
        qk = _scores(qk, first, mask_from, offs_m, offs_n, sk, co, wo, ao, cap_in, cap_out, slope, BLOCK_N, CAUSAL,
                     WINDOW, SOFTCAP, ALIBI, RAGGED)
        m = gl.max(qk, axis=1) * scale_log2
        p = gl.exp2(qk * scale_log2 - _pivot(m, MASKED)[:, None])
        l = gl.sum(p, axis=1)
        p16 = gl.convert_layout(_narrow(p, dtype), p_layout)
        for i in range(1, n_iters):
            s = (it0 + i) % STAGES
            ph = ((it0 + i) // STAGES) & 1
            sp = (it0 + i - 1) % STAGES
            php = ((it0 + i - 1) // STAGES) & 1
            # 5.1 of tile i issued, then 5.6 of tile i-1; wait for the scores only
            _wait_ring(k_ready.index(s), ph, CLUSTER)
            if PINGPONG:  # both operands in place before the turn is taken
                mbarrier.wait(v_ready.index(sp), php)
                _take_turn(turns, n_turn, WG, PINGPONG)
            qk = warpgroup_mma(q_op, k_bufs.index(s).permute((1, 0)),
                               gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
            if not PINGPONG:
                mbarrier.wait(v_ready.index(sp), php)
            acc = warpgroup_mma(p16, v_bufs.index(sp), acc, is_async=True)
            _pass_turn(turns, WG, NUM_WG, PINGPONG)
            n_turn += 1
            qk = warpgroup_mma_wait(1, deps=[qk])
            if not STALE:
                _release(k_empty.index(s), CLUSTER)
            # 5.2-5.4 of tile i while P V of tile i-1 runs
            qk = _scores(qk, first + i, mask_from, offs_m, offs_n, sk, co, wo, ao, cap_in, cap_out, slope, BLOCK_N,
                         CAUSAL, WINDOW, SOFTCAP, ALIBI, RAGGED)
            if STALE:  # the standing pivot, no row max; a row sum past STALE_SUM: the tile again, with its max
                p = gl.exp2(qk * scale_log2 - _pivot(m, MASKED)[:, None])
                l_tile = gl.sum(p, axis=1)
                alpha = gl.full_like(l_tile, 1.0)
                if _any_row_over(_first_seen(l_tile, m, MASKED), WG) != 0:
                    qk2 = warpgroup_mma(q_op, k_bufs.index(s).permute((1, 0)),
                                        gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
                    qk2 = warpgroup_mma_wait(0, deps=[qk2])
                    qk2 = _scores(qk2, first + i, mask_from, offs_m, offs_n, sk, co, wo, ao, cap_in, cap_out, slope,
                                  BLOCK_N, CAUSAL, WINDOW, SOFTCAP, ALIBI, RAGGED)
                    p, alpha, m = _softmax(qk2, m, scale_log2, MASKED, False)
                    l_tile = gl.sum(p, axis=1)
                _release(k_empty.index(s), CLUSTER)
            else:
                p, alpha, m = _softmax(qk, m, scale_log2, MASKED, LAZY)
                l_tile = gl.sum(p, axis=1)
            l = l * alpha + l_tile
            if FENCE:
                l = _fence(l)
            acc, _ = warpgroup_mma_wait(0, deps=[acc, p16])
            _release(v_empty.index(sp), CLUSTER)
            # 5.5: rescale the accumulator once P V of tile i-1 has landed (under the next Q K^T instead,
            # FlashAttention-3's place, 1-2% slower: run 20261130T010410-gpu1 against T010648-gpu1-old)
            alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            if LAZY or STALE:
                acc = _rescale_lazy(acc, alpha_o, HEAD)
            else:
                acc = acc * alpha_o
            p16 = gl.convert_layout(_narrow(p, dtype), p_layout)
        if not Q_REGS:  # every Q K^T of this item has retired: the producer may load the next item's Q
            mbarrier.arrive(q_empty, count=1)
        last = (it0 + n_iters - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((it0 + n_iters - 1) // STAGES) & 1)
        _take_turn(turns, n_turn, WG, PINGPONG)
        acc = warpgroup_mma(p16, v_bufs.index(last), acc, is_async=True)
        _pass_turn(turns, WG, NUM_WG, PINGPONG)
        n_turn += 1
        acc, _ = warpgroup_mma_wait(0, deps=[acc, p16])
        _release(v_empty.index(last), CLUSTER)

        # Section 6: o = acc / l with 1/l := 0 on an empty row
        inv_l = gl.where(l == 0.0, 0.0, 1.0 / l)
        acc = acc * gl.convert_layout(inv_l, gl.SliceLayout(1, o_layout))[:, None]
        o_row = b * q_rows_b + h * q_rows_h + q0 + row0
        o_col = h * q_col_h
        if SPLIT and part >= 0:  # a piece's float32 result and LSE, merged after the kernel
            _store_piece(acc, l, m, W, WL, Rows, g, part, n_tiles, bh * seqlen_q + row0, row0, sq, rank, o_layout,
                         row_layout, BLOCK_M, HEAD, WG, CLUSTER)
        elif O_SMEM and row0 + ROWS <= sq:
            o_half = o_smem.index(WG)
            o_half.store(acc.to(dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(o_desc, [o_row, o_col], o_half)
            # o_half is read out before the next item writes it.  Waiting only before that next
            # write (the store running under the next key loop) measured 1-4% slower on the short
            # cells (run 20261129T165232, bf16 and fp16, against T164630 and T164454)
            tma.store_wait(0)
        else:  # from registers (O not staged, or the warpgroup straddles the end: only the rows that exist)
            rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
            cols = gl.arange(0, HEAD, layout=gl.SliceLayout(0, o_layout))
            ptrs = O + (o_row + rows).to(gl.int64)[:, None] * o_stride + (o_col + cols)[None, :]
            _store(ptrs, acc.to(dtype), (row0 + rows < sq)[:, None], CLUSTER)
        if STORE_LSE and part < 0:
            lse = _lse(m, l)
            if VARLEN:  # [heads, total_q]
                lse_row0 = h.to(gl.int64) * seqlen_q + q0
            else:  # [batch, heads, seqlen_q]
                lse_row0 = bh.to(gl.int64) * seqlen_q
            _store(LSE + lse_row0 + offs_m, lse, offs_m < sq, CLUSTER)
        it0 += n_iters
        tc += 1
    _cluster_sync(CLUSTER)


@gluon.jit
def hopper_kernel(q_desc, k_desc, v_desc, o_desc, O, LSE, Alibi, CuQ, CuK, SeqK, Items, heads, group, seqlen_q,
                  seqlen_k, causal_offset, window_offset, align_offset, cap_in, cap_out, alibi_scale, scale_log2,
                  n_tiles, n_m, head_group, q_rows_b, q_rows_h, q_col_h, kv_seq_b, kv_seq_h, kv_col_h, o_stride,
                  Pages, pages_b, page, W, WL, Rows, pieces,
                  HEAD: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CONSUMER_REGS: gl.constexpr,
                  CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr,
                  RAGGED: gl.constexpr, PAIRED: gl.constexpr, PINGPONG: gl.constexpr, STORE_LSE: gl.constexpr,
                  VARLEN: gl.constexpr, SEQUSED: gl.constexpr, ALIGN_BR: gl.constexpr, PAGED: gl.constexpr,
                  O_SMEM: gl.constexpr, Q_REGS: gl.constexpr, FENCE: gl.constexpr, LAZY: gl.constexpr,
                  STALE: gl.constexpr, SPLIT: gl.constexpr, BALANCE: gl.constexpr, CLUSTER: gl.constexpr):
    """Each program runs its work items (query block, batch*head), :func:`_n_items` and
    :func:`_tile`; the K/V rings and the barrier phases carry on from one item to the
    next, so the next item's first loads overlap this one's epilogue.  CLUSTER: a program is a
    cluster of two CTAs that share each K/V tile (:mod:`.multicast`); its producer has a whole
    warpgroup, so that every warp runs a partition (the cluster barrier counts every thread)."""
    NUM_WG: gl.constexpr = BLOCK_M // 64
    if CLUSTER:  # each CTA of the cluster holds all of every buffer
        bar_layout: gl.constexpr = BARRIER_CLUSTER
        spare_layout: gl.constexpr = SPARE_CLUSTER
    else:
        bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
        spare_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_WG, 64, HEAD], q_desc.layout)  # a 64-row box per warpgroup
    if O_SMEM:
        o_smem = gl.allocate_shared_memory(o_desc.dtype, [NUM_WG, 64, HEAD], o_desc.layout)
    else:  # never used: a placeholder for the partitions' argument lists
        o_smem = gl.allocate_shared_memory(o_desc.dtype, [1, 8, 8], spare_layout)
    if CLUSTER:  # the rings in column halves, a TMA box each (a CTA loads one, both get it), whole for the wgmma
        k_load = gl.allocate_shared_memory(k_desc.dtype, [2 * STAGES, 1, BLOCK_N, HEAD // 2], k_desc.layout)
        v_load = gl.allocate_shared_memory(v_desc.dtype, [2 * STAGES, 1, BLOCK_N, HEAD // 2], v_desc.layout)
        k_bufs = k_load._reinterpret(k_desc.dtype, [STAGES, BLOCK_N, HEAD], q_desc.layout)
        v_bufs = v_load._reinterpret(v_desc.dtype, [STAGES, BLOCK_N, HEAD], q_desc.layout)
    else:
        k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD], q_desc.layout)  # 2-D slots
        v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD], q_desc.layout)
        k_load = k_bufs
        v_load = v_bufs
    q_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    q_empty = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    turns = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], bar_layout)  # ping-pong
    v_tail = gl.allocate_shared_memory(gl.int64, [1], bar_layout)  # a V tile to zero past the end
    mbarrier.init(q_bar, count=1)
    mbarrier.init(q_empty, count=NUM_WG)  # one arrival per consumer warpgroup
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
            (_consumer, (o_desc, O, LSE, Alibi, q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty,
                         v_ready, v_empty, turns, CuQ, CuK, SeqK, Items, heads, seqlen_q, seqlen_k, causal_offset,
                         window_offset, align_offset, cap_in, cap_out, alibi_scale, scale_log2, n_tiles, n_m,
                         head_group, q_rows_b, q_rows_h, q_col_h, o_stride, W, WL, Rows, pieces, STAGES, 0, BLOCK_M,
                         BLOCK_N, HEAD, CAUSAL, WINDOW, SOFTCAP, ALIBI, RAGGED, PAIRED, PINGPONG, STORE_LSE, VARLEN,
                         SEQUSED, ALIGN_BR, O_SMEM, Q_REGS, FENCE, LAZY, STALE, SPLIT, BALANCE, CLUSTER)),
            (_consumer, (o_desc, O, LSE, Alibi, q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty,
                         v_ready, v_empty, turns, CuQ, CuK, SeqK, Items, heads, seqlen_q, seqlen_k, causal_offset,
                         window_offset, align_offset, cap_in, cap_out, alibi_scale, scale_log2, n_tiles, n_m,
                         head_group, q_rows_b, q_rows_h, q_col_h, o_stride, W, WL, Rows, pieces, STAGES, 1, BLOCK_M,
                         BLOCK_N, HEAD, CAUSAL, WINDOW, SOFTCAP, ALIBI, RAGGED, PAIRED, PINGPONG, STORE_LSE, VARLEN,
                         SEQUSED, ALIGN_BR, O_SMEM, Q_REGS, FENCE, LAZY, STALE, SPLIT, BALANCE, CLUSTER)),
            (_consumer, (o_desc, O, LSE, Alibi, q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty,
                         v_ready, v_empty, turns, CuQ, CuK, SeqK, Items, heads, seqlen_q, seqlen_k, causal_offset,
                         window_offset, align_offset, cap_in, cap_out, alibi_scale, scale_log2, n_tiles, n_m,
                         head_group, q_rows_b, q_rows_h, q_col_h, o_stride, W, WL, Rows, pieces, STAGES, 2, BLOCK_M,
                         BLOCK_N, HEAD, CAUSAL, WINDOW, SOFTCAP, ALIBI, RAGGED, PAIRED, PINGPONG, STORE_LSE, VARLEN,
                         SEQUSED, ALIGN_BR, O_SMEM, Q_REGS, FENCE, LAZY, STALE, SPLIT, BALANCE, CLUSTER)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_load, v_load, q_bar, q_empty, k_ready, k_empty, v_ready,
                         v_empty, v_tail, CuQ, CuK, SeqK, Items, heads, group, seqlen_q, seqlen_k, causal_offset,
                         window_offset, n_tiles, n_m, head_group, q_rows_b, q_rows_h, q_col_h, kv_seq_b, kv_seq_h,
                         kv_col_h, Pages, pages_b, page, pieces, NUM_WG, STAGES, BLOCK_M, BLOCK_N, CAUSAL, WINDOW,
                         PAIRED, VARLEN, SEQUSED, ALIGN_BR, PAGED, SPLIT, BALANCE, CLUSTER)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
    elif NUM_WG == 2:
        gl.warp_specialize([
            (_consumer, (o_desc, O, LSE, Alibi, q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty,
                         v_ready, v_empty, turns, CuQ, CuK, SeqK, Items, heads, seqlen_q, seqlen_k, causal_offset,
                         window_offset, align_offset, cap_in, cap_out, alibi_scale, scale_log2, n_tiles, n_m,
                         head_group, q_rows_b, q_rows_h, q_col_h, o_stride, W, WL, Rows, pieces, STAGES, 0, BLOCK_M,
                         BLOCK_N, HEAD, CAUSAL, WINDOW, SOFTCAP, ALIBI, RAGGED, PAIRED, PINGPONG, STORE_LSE, VARLEN,
                         SEQUSED, ALIGN_BR, O_SMEM, Q_REGS, FENCE, LAZY, STALE, SPLIT, BALANCE, CLUSTER)),
            (_consumer, (o_desc, O, LSE, Alibi, q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty,
                         v_ready, v_empty, turns, CuQ, CuK, SeqK, Items, heads, seqlen_q, seqlen_k, causal_offset,
                         window_offset, align_offset, cap_in, cap_out, alibi_scale, scale_log2, n_tiles, n_m,
                         head_group, q_rows_b, q_rows_h, q_col_h, o_stride, W, WL, Rows, pieces, STAGES, 1, BLOCK_M,
                         BLOCK_N, HEAD, CAUSAL, WINDOW, SOFTCAP, ALIBI, RAGGED, PAIRED, PINGPONG, STORE_LSE, VARLEN,
                         SEQUSED, ALIGN_BR, O_SMEM, Q_REGS, FENCE, LAZY, STALE, SPLIT, BALANCE, CLUSTER)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_load, v_load, q_bar, q_empty, k_ready, k_empty, v_ready,
                         v_empty, v_tail, CuQ, CuK, SeqK, Items, heads, group, seqlen_q, seqlen_k, causal_offset,
                         window_offset, n_tiles, n_m, head_group, q_rows_b, q_rows_h, q_col_h, kv_seq_b, kv_seq_h,
                         kv_col_h, Pages, pages_b, page, pieces, NUM_WG, STAGES, BLOCK_M, BLOCK_N, CAUSAL, WINDOW,
                         PAIRED, VARLEN, SEQUSED, ALIGN_BR, PAGED, SPLIT, BALANCE, CLUSTER)),
        ], [4, 4 if CLUSTER else 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:  # one consumer warpgroup: it is the default partition, with the registers the producer gives up
        gl.warp_specialize([
            (_consumer, (o_desc, O, LSE, Alibi, q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, k_empty,
                         v_ready, v_empty, turns, CuQ, CuK, SeqK, Items, heads, seqlen_q, seqlen_k, causal_offset,
                         window_offset, align_offset, cap_in, cap_out, alibi_scale, scale_log2, n_tiles, n_m,
                         head_group, q_rows_b, q_rows_h, q_col_h, o_stride, W, WL, Rows, pieces, STAGES, 0, BLOCK_M,
                         BLOCK_N, HEAD, CAUSAL, WINDOW, SOFTCAP, ALIBI, RAGGED, PAIRED, PINGPONG, STORE_LSE, VARLEN,
                         SEQUSED, ALIGN_BR, O_SMEM, Q_REGS, FENCE, LAZY, STALE, SPLIT, BALANCE, CLUSTER)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_load, v_load, q_bar, q_empty, k_ready, k_empty, v_ready,
                         v_empty, v_tail, CuQ, CuK, SeqK, Items, heads, group, seqlen_q, seqlen_k, causal_offset,
                         window_offset, n_tiles, n_m, head_group, q_rows_b, q_rows_h, q_col_h, kv_seq_b, kv_seq_h,
                         kv_col_h, Pages, pages_b, page, pieces, NUM_WG, STAGES, BLOCK_M, BLOCK_N, CAUSAL, WINDOW,
                         PAIRED, VARLEN, SEQUSED, ALIGN_BR, PAGED, SPLIT, BALANCE, CLUSTER)),
        ], [1], [PRODUCER_REGS])


KERNEL = hopper_kernel
SMEM_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
KV_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)
# CLUSTER: the same layouts, whole in each CTA of the cluster
SMEM_LAYOUT_2 = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, cga_layout=[[0, 0]])
KV_LAYOUT_2 = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3, cga_layout=[[0, 0, 0]])


def _view2d(t: torch.Tensor, layout: str):
    """The 2-D matrix TMA reads, and how (batch, head) map to its rows and columns."""
    b, d = t.shape[0], t.shape[3]
    if layout == "bhsd":
        h, s = t.shape[1], t.shape[2]
        return t.view(b * h * s, d), h * s, s, 0
    s, h = t.shape[1], t.shape[2]
    return t.view(b * s, h * d), s, 0, d


SMEM_SPARE = 1024  # bytes left for the mbarriers


def o_staged(head_dim: int, cfg) -> bool:
    """Whether O goes out through shared memory (a TMA store) beside Q and the K/V rings; where it
    does not fit (D=128 with 3 stages), each thread stores its part of O from registers."""
    return 2 * head_dim * (2 * cfg.block_m + 2 * cfg.num_stages * cfg.block_n) + SMEM_SPARE <= SMEM_LIMIT


def smem_bytes(head_dim: int, cfg) -> int:
    """Shared memory one program allocates (16-bit elements): Q, the K/V rings and, staged, O."""
    o = cfg.block_m if o_staged(head_dim, cfg) else 0
    return 2 * head_dim * (cfg.block_m + o + 2 * cfg.num_stages * cfg.block_n)


def sm_bytes(head_dim: int, cfg) -> int:
    """Shared memory ``cfg.occupancy`` programs take on one SM (each with its barriers and the 1 KB
    the SM keeps for every resident block)."""
    return max(cfg.occupancy, 1) * (smem_bytes(head_dim, cfg) + SMEM_SPARE + 1024)


def supports(prob, cfg, q, k, v, o, layout: str) -> str | None:
    """None if the hopper kernel takes this call, else the reason it does not."""
    if not q.is_cuda or device_facts(q.device.index)[0] != 9:
        return "needs an sm_90 GPU"
    if prob.head_dim not in (64, 128):
        return f"head_dim {prob.head_dim} (takes 64 and 128)"
    if cfg.block_m not in (64, 128, 192):
        return f"block_m {cfg.block_m} (takes 64, 128 or 192: 1, 2 or 3 consumer warpgroups)"
    if cfg.pingpong and cfg.block_m == 64:
        return "ping-pong takes turns between 2 or 3 consumer warpgroups (block_m 128 or 192)"
    if prob.page % cfg.block_n:
        return f"page_size {prob.page} (takes multiples of its {cfg.block_n}-key tile: a tile must not straddle pages)"
    smem = smem_bytes(prob.head_dim, cfg)
    if smem + SMEM_SPARE > SMEM_LIMIT:
        return f"needs {smem >> 10} KB of shared memory, sm_90 has {SMEM_LIMIT >> 10} KB"
    if sm_bytes(prob.head_dim, cfg) > SMEM_SM:
        return f"{cfg.occupancy} programs of {smem >> 10} KB of shared memory do not fit on one SM ({SMEM_SM >> 10} KB)"
    for t in (q, k, v, o):
        if not t.is_contiguous() or t.data_ptr() % 16:
            return "needs contiguous, 16-byte aligned q, k, v and out"
    if cfg.cluster:
        if prob.causal or prob.window_offset is not None or per_sequence(prob) or prob.page:
            return "clusters take dense non-causal calls without a window"
        if prob.head_dim != 128 or cfg.block_n != 128:
            return "clusters take head_dim 128 in 128-key tiles"
        if cfg.block_m != 128 or cfg.pingpong or cfg.occupancy > 1 or cfg.persistent == 0:
            return "clusters take 128-row persistent programs, one an SM, without ping-pong"
    return None


def descriptors(prob, cfg, q, k, v, o, layout: str) -> tuple:
    """The four TMA descriptors and the row/column strides of (batch, head) in their 2-D views."""
    (q2, qrb, qrh, qch), (o2, *_) = (_view2d(t, layout) for t in (q, o))
    kv_layout = "bshd" if prob.page else layout  # a page pool [pages, page, kv_heads, D] reads as bshd
    (k3, krb, krh, kch), (v3, *_) = (kv_view3d(t, kv_layout) for t in (k, v))
    d = prob.head_dim
    smem, kv, kv_d = (SMEM_LAYOUT_2, KV_LAYOUT_2, d // 2) if cfg.cluster else (SMEM_LAYOUT, KV_LAYOUT, d)
    descs = (TensorDescriptor.from_tensor(q2, [64, d], smem),
             TensorDescriptor.from_tensor(k3, [1, cfg.block_n, kv_d], kv),  # CLUSTER: a column half a CTA
             TensorDescriptor.from_tensor(v3, [1, cfg.block_n, kv_d], kv),
             TensorDescriptor.from_tensor(o2, [64, d], smem))
    return descs, (qrb, qrh, qch, krb, krh, kch, o2.stride(0))


def launch(prob, cfg, q, k, v, o, lse, layout: str, alibi=None, seqs=(None, None, None),
           lengths=None, block_table=None) -> None:
    """Run the kernel on ``prob``.  ``seqs = (cu_seqlens_q, cu_seqlens_k, seqused_k)`` as in
    ``kernels.launch``; packed sequences (``prob.varlen``) also need their ``lengths`` on the host,
    ``(query rows, keys)`` per sequence, for the work list (:func:`varlen_items`).  A paged cache
    (``prob.page``): k and v are the page pools ``[pages, page, kv_heads, D]`` whatever ``layout``
    says of q and o, with ``block_table`` int32 ``[batch, pages per sequence]``."""
    descs, strides = descriptors(prob, cfg, q, k, v, o, layout)
    # per-sequence lengths: the band's offsets go relative to the diagonal, each sequence adds its own
    a = prob.align_offset if per_sequence(prob) else 0
    causal_offset, window_offset = prob.causal_offset - a, (prob.window_offset or 0) - a
    resident = device_facts(q.device.index)[1] * max(cfg.occupancy, 1)  # programs on the SMs at once
    persistent = cfg.persistent != 0  # the default since the causal pairs (configs.HOPPER)
    if prob.varlen:  # one packed sequence: the batch index picks rows through cu_seqlens, not a stride
        qrb, qrh, qch, _, krh, kch, o_stride = strides
        strides = (0, qrh, qch, 0, krh, kch, o_stride)
        items = torch.from_numpy(varlen_items(*lengths, prob, cfg, causal_offset, window_offset)).to(q.device)
        n_m, n_tiles = 1, items.numel() * prob.heads
        if n_tiles == 0:  # every sequence is empty
            return
    else:
        items = o
        n_m = triton.cdiv(prob.seqlen_q, item_rows(cfg))
        n_tiles = n_m * prob.batch * prob.heads
    if cfg.cluster:  # a program is a cluster of two CTAs, on two SMs
        resident //= 2
    # persistent causal with more items than SMs runs them in pairs of equal cost (:func:`_tile`);
    # a window's items cost about the same anyway; packed sequences come longest first instead
    paired = bool(prob.causal and prob.window_offset is None and persistent and n_tiles > resident and not prob.varlen)
    grid = (min(triton.cdiv(n_tiles, 2) if paired else n_tiles, resident) if persistent else n_tiles,)
    balance = paired and bool(cfg.balance)
    if balance:  # the last round or two of pairs dealt out longest item first to the least loaded program
        grid = (min(n_tiles, resident),)
        items = _schedule(q.device, n_m, n_tiles // n_m, grid[0], cfg.block_m, cfg.block_n, prob.seqlen_k,
                          causal_offset)
    pieces = split_pieces(prob, cfg, n_tiles, resident, o.numel() * o.element_size())
    if pieces > 1:  # the last round's items in pieces, each piece's float32 result merged after the kernel
        grid = (min(resident, n_tiles // resident * resident + n_tiles % resident * pieces),)
        rows = n_tiles % grid[0] * item_rows(cfg)
        w = torch.empty(pieces, rows, prob.head_dim, dtype=torch.float32, device=q.device)
        wl = torch.empty(pieces, rows, dtype=torch.float32, device=q.device)
        dest = torch.empty(rows, dtype=torch.int32, device=q.device)
    else:
        w = wl = dest = o
    if cfg.cluster:  # the PTX pass must see the build: again, in case another stages hook replaced it since import
        multicast.install()
    scale = prob.scale_log2 / LOG2E
    cap = prob.softcap or 1.0
    cu_q, cu_k, seqused = (t if t is not None else o for t in seqs)
    hopper_kernel[grid](*descs, o, lse if lse is not None else o, alibi.contiguous() if alibi is not None else o,
                        cu_q, cu_k, seqused, items, prob.heads, prob.heads // prob.kv_heads, prob.seqlen_q,
                        prob.seqlen_k, causal_offset, window_offset, prob.align_offset - a, scale / cap, cap / scale,
                        1.0 / scale, prob.scale_log2, n_tiles, n_m, max(cfg.head_group, 1), *strides,
                        block_table if block_table is not None else o,
                        block_table.stride(0) if block_table is not None else 0, max(prob.page, 1), w, wl, dest,
                        pieces, **constexprs(prob, cfg, lse is not None, paired, alibi is not None, pieces > 1,
                                             balance),
                        num_warps=4, **launch_options(cfg))
    if pieces > 1:
        merge.launch(w, wl, o, lse, strides_bhsd(o, layout), prob.heads, prob.seqlen_q, dest)


ITEM_COST = 3  # what a work item or piece costs beyond its key tiles, in key tiles (its Q load and first
# product, its store): fitted to the split's gains at 8k and 16k keys (configs.HOPPER)


def item_rows(cfg) -> int:
    """Query rows of one work item: a block, or with ``cluster`` two neighbouring blocks (one a CTA)."""
    return cfg.block_m * (2 if cfg.cluster else 1)


def split_pieces(prob, cfg, n_tiles: int, programs: int, out_bytes: int) -> int:
    """How many pieces ``launch`` cuts each item of the last round into (1: none): with
    ``cfg.split_tail``, persistent and non-causal without a window or lengths per sequence (items
    of one cost), and a float32 workspace of pieces x the last round's rows no larger than the
    output (``out_bytes``): the split never more than doubles what the call allocates."""
    if not cfg.split_tail or cfg.persistent == 0 or prob.causal or prob.window_offset is not None \
            or per_sequence(prob):
        return 1
    rest_bytes = n_tiles % programs * item_rows(cfg) * prob.head_dim * 4
    return tail_pieces(n_tiles, programs, triton.cdiv(prob.seqlen_k, cfg.block_n),
                       out_bytes // rest_bytes if rest_bytes else 1)


def tail_pieces(n_tiles: int, programs: int, key_tiles: int, max_pieces: int = 16) -> int:
    """Into how many pieces (runs of key tiles) to cut each item of the last, partly filled round
    of ``programs`` (1: none).  Whole items end the run a whole item's time after the programs
    with one item fewer; ``k`` pieces each end it ``ceil(k * rest / programs)`` pieces later, a
    piece costing its share of the ``key_tiles`` plus :data:`ITEM_COST`; pieces of two tiles
    at least, ``max_pieces`` (at most 16) at most."""
    rest = n_tiles % programs
    best, cost = 1, key_tiles
    for k in range(2, min(16, max_pieces, key_tiles // 2) + 1):
        c = -(-k * rest // programs) * (key_tiles / k + ITEM_COST)
        if rest and c < cost:
            best, cost = k, c
    return best


def block_tiles(start, seqlen_k, causal_offset: int, window_offset: int, block_m: int, block_n: int,
                causal: bool, window: bool):
    """:func:`_key_tiles`'s count on the host: the key tiles of the query blocks at rows ``start``
    (arrays, or ints) against ``seqlen_k`` keys."""
    stop = seqlen_k
    if causal:
        stop = np.minimum(seqlen_k, np.maximum(start + block_m + causal_offset, 0))
    end = np.maximum(-(-stop // block_n), 1)
    first = 0
    if window:
        first = np.minimum(np.maximum(start + window_offset, 0) // block_n, end - 1)
    return end - first


def paired_block(g, n_m: int):
    """:func:`_tile`'s PAIRED numbering on the host: item ``g`` -> its query block (a head's
    blocks longest, shortest, second longest, ...)."""
    w = g % n_m
    return np.where(w % 2 == 0, n_m - 1 - w // 2, w // 2)


def balanced_tail(n_m: int, n_bh: int, programs: int, tiles) -> np.ndarray:
    """The BALANCE schedule of paired causal items (:func:`_tile`'s numbering, ``n_m`` blocks of
    ``n_bh`` heads, ``tiles[j]`` key tiles for block ``j``), int32: ``[lead, offsets (programs + 1),
    lists]``.  Every program first runs ``lead`` items as whole rounds of pairs (all the rounds but
    the last one or two, so a head's items still run together); the rest, 2 to 4 rounds' worth of
    items, go longest first to the least loaded program (LPT), each costing its key tiles plus
    :data:`ITEM_COST`, and program ``p`` then runs ``lists[offsets[p]:offsets[p + 1]]``.  Pairs
    alone end a round of pairs apart when the pairs do not fill the last round (2048 pairs on 132
    programs: 15.5 rounds); this ends within about an item of the mean."""
    n_tiles = n_m * n_bh
    lead = 2 * max((n_tiles + 1) // 2 // programs - 1, 0)
    g = np.arange(lead * programs, n_tiles)
    cost = np.asarray(tiles)[paired_block(g, n_m)] + ITEM_COST
    loads = [(0, p) for p in range(programs)]
    lists = [[] for _ in range(programs)]
    for i in np.argsort(-cost, kind="stable"):
        load, p = heapq.heappop(loads)
        lists[p].append(g[i])
        heapq.heappush(loads, (load + cost[i], p))
    offsets = np.cumsum([0] + [len(x) for x in lists])
    return np.concatenate([[lead], offsets, *lists]).astype(np.int32)


@functools.lru_cache(maxsize=64)
def _schedule(device, n_m: int, n_bh: int, programs: int, block_m: int, block_n: int, seqlen_k: int,
              causal_offset: int) -> torch.Tensor:
    """:func:`balanced_tail` on ``device``, kept for the next call of the same shape."""
    tiles = block_tiles(np.arange(n_m) * block_m, seqlen_k, causal_offset, 0, block_m, block_n, True, False)
    return torch.from_numpy(balanced_tail(n_m, n_bh, programs, tiles)).to(device)


def varlen_items(len_q, len_k, prob, cfg, causal_offset: int, window_offset: int) -> np.ndarray:
    """Packed sequences' work list: every block of ``cfg.block_m`` query rows that has rows, as
    int32 ``(sequence << 16) | block``, longest first (the key tiles :func:`_key_tiles` gives it,
    on the sequence's own diagonal); the kernel numbers each block's heads in turn.  ``len_q``,
    ``len_k``: rows per sequence; the offsets as the kernel gets them (relative to the diagonal)."""
    len_q, len_k = np.asarray(len_q, dtype=np.int64), np.asarray(len_k, dtype=np.int64)
    if len(len_q) >= 1 << 15 or len_q.max(initial=0) > cfg.block_m << 16:
        raise ValueError("the hopper kernel's work list takes fewer than 32768 sequences of fewer than "
                         f"{cfg.block_m << 16} rows")
    blocks = -(-len_q // cfg.block_m)
    seq = np.repeat(np.arange(len(len_q)), blocks)
    block = np.arange(blocks.sum()) - np.repeat(np.cumsum(blocks) - blocks, blocks)
    sk = len_k[seq]
    shift = sk - len_q[seq] if prob.align_br else 0
    tiles = block_tiles(block * cfg.block_m, sk, causal_offset + shift, window_offset + shift, cfg.block_m,
                        cfg.block_n, prob.causal, prob.window_offset is not None)
    order = np.argsort(-tiles, kind="stable")
    return ((seq << 16) | block)[order].astype(np.int32)


def per_sequence(prob) -> bool:
    """Whether the lengths differ by sequence (packed sequences, or per-batch key lengths)."""
    return prob.varlen or prob.seqused


def launch_regs(cfg) -> int:
    """Registers per thread a program launches with (``maxnreg``; 0: Triton's choice, where the
    consumers' ``CONSUMER_REGS`` and the producer's 24 average out over the warpgroups).  The
    producer's one warp is padded to a warpgroup, and the first consumer warpgroup, Gluon's default
    partition, keeps what the others leave of ``warpgroups * maxnreg``: so with ``occupancy``
    programs on an SM, or one consumer warpgroup, the launch count sets the consumers' share of the
    SM's registers (setmaxnreg takes 24 to 256)."""
    groups = cfg.block_m // 64 + 1
    if cfg.block_m >= 128 and cfg.occupancy <= 1:
        return 0
    fair = REGS_SM // (max(cfg.occupancy, 1) * 128 * groups) // 8 * 8
    return min(fair, (256 * (groups - 1) + int(PRODUCER_REGS)) // groups // 8 * 8)


def consumer_regs(cfg) -> int:
    """setmaxnreg of the consumer warpgroups that are workers (all but the first): the table's
    ``maxnreg``, or an even share of what :func:`launch_regs` leaves beside the producer."""
    if cfg.maxnreg:
        return cfg.maxnreg
    regs = launch_regs(cfg)
    if not regs:
        return CONSUMER_REGS[cfg.block_m // 64]
    wgs = cfg.block_m // 64
    return ((wgs + 1) * regs - int(PRODUCER_REGS)) // wgs // 8 * 8


def launch_options(cfg) -> dict:
    """The compile options beyond ``num_warps`` (``maxnreg`` where :func:`launch_regs` sets one)."""
    regs = launch_regs(cfg)
    options = {"maxnreg": regs} if regs else {}
    if cfg.cluster:
        options["num_ctas"] = 2
    return options


def constexprs(prob, cfg, store_lse: bool, paired: bool = False, alibi: bool = False, split: bool = False,
               balance: bool = False) -> dict:
    return dict(HEAD=prob.head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.num_stages,
                CONSUMER_REGS=consumer_regs(cfg), CAUSAL=prob.causal,
                WINDOW=prob.window_offset is not None, SOFTCAP=prob.softcap > 0, ALIBI=alibi,
                RAGGED=per_sequence(prob) or prob.seqlen_k % cfg.block_n != 0, PAIRED=paired,
                PINGPONG=bool(cfg.pingpong), STORE_LSE=store_lse, VARLEN=prob.varlen, SEQUSED=prob.seqused,
                ALIGN_BR=per_sequence(prob) and prob.align_br, PAGED=bool(prob.page),
                O_SMEM=o_staged(prob.head_dim, cfg), Q_REGS=bool(cfg.q_regs),
                FENCE=bool(cfg.fence), LAZY=bool(cfg.lazy), STALE=bool(cfg.stale), SPLIT=split, BALANCE=balance,
                CLUSTER=bool(cfg.cluster))
