"""``hopper``'s backward: FlashAttention-3's shape in Gluon (TMA, wgmma, warp specialization), with
the math of :mod:`..backward` (docs/BACKWARD.md).

A program takes blocks of ``BLOCK_N`` keys (128; 64 past head_dim 128) of one (batch, KV head) in turn
(:func:`_program`; one program an SM, the blocks in a fixed deal or, ``DYNAMIC``, from a counter as programs free;
deterministic, one block a program: :func:`schedule`) and for each walks the query tiles (``BLOCK_M`` rows,
:func:`tiles`) of every query head of its group that see those keys (causal: from the first tile at or past the
block's diagonal; with a sliding window, to the last tile the window reaches, :func:`_walk`), each key block
starting at its own tile (:func:`_query_tile`). A one-warp producer loads a block's K and V once (the next block's
as soon as both consumers have arrived on ``kv_empty``, done with the last one's) and streams each tile's Q, dO and
its rows' LSEs and deltas by TMA into a ``STAGES``-deep ring (the statistics read from shared memory straight into
the layout a product needs: loaded from global memory by the consumers instead, and spread through shared memory at
head_dim 64, the backward ran 0.91-0.94x as fast at head_dim 128 and as fast at 64); two consumer warpgroups own half
the keys each, with dK and dV in registers (wgmma accumulators) for the whole walk. Per tile a consumer computes, its
query rows the rows (so a row's LSE and delta are two registers a thread):

* ``S = Q K^T`` and ``dP = dO V^T`` over its keys;
* ``P = exp2(scale_log2 S - lse2)`` from the forward's LSE, zero above the causal diagonal, S capped and biased
  first as the forward's where SOFTCAP and ALIBI (:func:`.mask._modified`);
* ``dS = scale P (dP - delta)``, times the cap's derivative ``1 - tanh^2`` where capped;
* P and dS into shared memory (a tile's query rows by the block's 128 keys, each warpgroup its column
  half; two buffers of each, ``DS_BUFS``), then ``dV += P^T dO`` and ``dK += dS^T Q`` with P^T and dS^T
  read transposed; or, in tiles 64 wide (``RS``, :func:`tiles`), FlashAttention-3's form:
  ``S^T = K Q^T`` and ``dP^T = V dO^T``, keys the rows, so that P^T and dS^T are dV's and dK's A operands
  straight from registers and only dS^T goes to shared memory (for dQ).  There the query rows are the
  columns, and a thread would hold a quarter of a 128-row tile's LSEs and deltas (64 registers) through the
  tile; instead the products start from them: S^T's accumulator from ``-LSE / scale`` (and ``-inf`` above
  the causal diagonal), dP^T's from ``-delta``, so ``P^T = exp2(scale_log2 S^T)`` and ``dS^T = scale P^T
  dP^T`` (the statistics are read in the accumulators' column layout as the products are issued);
* past head_dim 128 (``COLS``, :func:`tiles`: 256-column tiles, 64-key blocks, one stage, or two where V and dO
  take 128-wide tiles) whole key rows of dK and dV do not fit a warpgroup's registers, so each warpgroup holds
  their columns' share over all 64 keys (at 256 two 64 x 128 float32 accumulators), FlashAttention-3's cut at 256:
  S and dP over its 32 keys as above, then, both halves of P and dS in place, ``dV += P^T dO`` and ``dK += dS^T
  Q`` over the block's keys and its columns, the columns shared in whole 64-column steps (:func:`_span`,
  :func:`_col0`);
* a head dim between two tile widths (96 or 80 in 128, 32 in 64, 160 in 256) multiplies its own columns, not TMA's
  zeros past them: S and dP reduce over them in 16-column steps (:func:`_over`), and dK's, dV's and dQ's products are
  one wgmma as wide as the columns that exist (:func:`.narrow_pass.narrowed`: ``m64n96k16`` at 96);
* ``dQ += dS K`` over all 128 keys: at head_dim 128 the two warpgroups take a column half each, at 64 a
  row half each (:func:`tiles`; a barrier pair between them: both halves of dS in place, and both done with
  them).  The float32 half goes to shared memory and is added into a float32 dQ buffer as wide as the head dim
  (a tile's columns past it fall outside, so nothing is added there) by a TMA reduce-add
  (``cp.reduce.async.bulk.tensor``: Gluon 3.6 has only the TMA store, so the build marks itself and
  :mod:`.reduce_pass` turns its stores into reduce-adds), in an order that varies from run to run; or,
  ``DETERMINISTIC``, in one fixed order (:func:`_turn`): each half of a dQ tile has a counter in global memory,
  a warpgroup spins until the counter says its turn has come, adds, and counts the add once it has completed.

Q and dO are read through 4-D descriptors that hold one (batch, head) sequence each (the K/V views of
:mod:`..tma`), so the rows of a last tile past seqlen_q are TMA's zeros, never the next head's rows, which
could hold NaN; their LSE and delta are TMA's zeros too (read from ``[batch * heads, seqlen_q]`` boxes), so
their P is 1 but dO's rows and dS are 0 and nothing reaches dK or dV. Keys past seqlen_k are zeros too, masked
(their score 0 can lie far above a row's LSE, where P would overflow and dQ turn NaN), and their dK/dV rows are
not stored. A row that sees no key (LSE ``-inf``) is masked wherever it meets a key block: a tile holding it
holds an unseen pair, so it is one of the tiles masked (:func:`_crossed`), and its P is 0. Takes (:func:`supports`):
sm_90, head_dim a multiple of 8 from 32 to 256 with V's one of those no wider (DeepSeek-V3's 192/128; tiles of 64,
128 or 256 columns, zeros past head_dim), a scale of at least :data:`MIN_SCALE`, causal in either alignment,
sliding windows with an upper edge (causal, or a right side), packed sequences (``VARLEN``), softcap, ALiBi with one
slope a head, no seqused_k; anything else runs on the Triton kernels.

Packed sequences (``VARLEN``): a program's (batch, KV head) is a sequence's, its bounds read from cu_seqlens
(:func:`_extent`), blocks past a shorter sequence's end idle, the band moved to each sequence's diagonal.  The
descriptors span every packed row, so a last block's keys and a last tile's rows past the end are the next
sequence's: the producer zeroes them (K, V, Q, dO and the deltas) before signalling, the consumers mask them.
The LSE and delta are laid out with each sequence's rows starting 16 bytes apart (a TMA box's inner coordinate
must: from the packed rows as they lie, a box at an odd row faulted with "illegal instruction"), and dQ's float32
rows leave a tile's room after each sequence (:func:`dq_gap`), so no add reaches the next one's rows.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_init, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ... import replay
from ...constants import LOG2E as LOG2E_VALUE
from ...device import device_facts, l2_bytes
from .. import tma as views
from . import narrow_pass, reduce_pass
from .mask import _modified, _sequence
from .narrow_pass import narrowed
from .producer import _zero_rows
from .resources import MIN_SCALE, padded

HEAD_DIMS = tuple(range(32, 257, 8))  # in tiles of 64, 128 or 256 columns, zeros past head_dim
LOG2E = gl.constexpr(LOG2E_VALUE)
WARPS = gl.constexpr(4)  # a consumer warpgroup's

TILE = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
TILE_F32 = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
REDUCE_MARK = gl.constexpr(f"{reduce_pass.KERNEL_MARK}\n\tmov.u32 $0, 0;")

IN_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=4)
DQ_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=3)
STAT_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
ROW_LAYOUT = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
ID_1 = gl.constexpr(gl.BlockedLayout([1], [32], [1], [0]))  # a key block's number in the producer's warp
ID_4 = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))  # ... in a consumer warpgroup


@gluon.jit
def _walk(pid_n, n_m, causal_offset, window_offset, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
          CAUSAL: gl.constexpr, WINDOW: gl.constexpr):
    """The query tiles ``first .. end - 1`` that see a key of block ``pid_n``: query i sees key j when
    ``j <= i + causal_offset`` (CAUSAL: the band's upper edge) and ``j >= i + window_offset`` (WINDOW: its lower
    edge), so the walk starts at the block's diagonal and ends past the window's reach."""
    first = 0
    if CAUSAL:
        first = gl.maximum(pid_n * BLOCK_N - causal_offset, 0) // BLOCK_M
    end = n_m
    if WINDOW:
        end = gl.minimum((gl.maximum(pid_n * BLOCK_N + BLOCK_N - window_offset, 0) + BLOCK_M - 1) // BLOCK_M, n_m)
    return first, end


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
def _program(pid, order, CAUSAL: gl.constexpr, DETERMINISTIC: gl.constexpr):
    """Work item ``pid``'s key block and (batch, KV head), of ``order = (section, blocks, pairs)``: the ``pairs``
    (batch, KV head)s go in sections of ``section`` (the last one may be narrower), and inside a section key
    block-major, every pair's block 0, then every pair's block 1, ... (:func:`section`).  Deterministic causal
    calls run the last block first: blocks start in the order of their numbers (one a program), and a
    deterministic block waits only for blocks of its own pair that start before it (:func:`_turn`), so a waiting
    block never holds the SM one it waits for needs."""
    section, blocks, pairs = order
    first = pid // (section * blocks) * section
    width = gl.minimum(section, pairs - first)
    r = pid - first * blocks
    n = r // width
    if CAUSAL and DETERMINISTIC:
        n = blocks - 1 - n
    return n, first + r % width  # (key block, batch * kv_heads + KV head)


@gluon.jit
def _extent(pair, kv_heads, seqlen_q, seqlen_k, n_m, blocks, chunk, causal_offset, window_offset, CuQ, CuK,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, VARLEN: gl.constexpr, ALIGN_BR: gl.constexpr):
    """What a program of (batch, KV head) ``pair`` walks: (batch, KV head, the sequence's first query row and
    first key in the tensors, its query rows, keys, query tiles and key blocks, the chunk of :func:`_turn`, the
    band's offsets).  VARLEN: packed sequence ``batch`` from ``cu_seqlens``, its band moved to its own diagonal
    (ALIGN_BR: bottom-right), its chunk at most its own blocks and tiles; else the call's own."""
    b = pair // kv_heads
    kvh = pair % kv_heads
    q0, sq, k0, sk, shift = _sequence(b, seqlen_q, seqlen_k, CuQ, CuK, CuK, VARLEN, False, ALIGN_BR)
    if VARLEN:
        n_m = (sq + BLOCK_M - 1) // BLOCK_M
        blocks = (sk + BLOCK_N - 1) // BLOCK_N
        chunk = gl.minimum(gl.minimum(chunk, blocks), n_m)
    return b, kvh, q0, sq, k0, sk, n_m, blocks, chunk, causal_offset + shift, window_offset + shift


@gluon.jit
def _stats_row(q0, b):
    """Where packed sequence ``b`` (its first row ``q0``) starts in the statistics' rows: ``q0 + 3 b`` rounded up to
    4 (:func:`fmha.kernels.backward.stats_row`, which lays them out), as a TMA box starts on 16 bytes."""
    return (q0 + 3 * b + 3) // 4 * 4


@gluon.jit
def _active(pid_n, seqlen_k, BLOCK_N: gl.constexpr, VARLEN: gl.constexpr):
    """Whether key block ``pid_n`` holds keys: VARLEN, the blocks past a shorter sequence's end have no work."""
    active = True
    if VARLEN:
        active = pid_n * BLOCK_N < seqlen_k
    return active


@gluon.jit
def _query_tile(j, first, n_m, pid_n, blocks, chunk, CAUSAL: gl.constexpr, DETERMINISTIC: gl.constexpr):
    """The ``j``-th query tile a program of key block ``pid_n`` visits.  Without causal, its tiles rotated by
    the block's share of them, so that the key blocks of one head, running side by side, add their dQ into
    different tiles at any time instead of all into the same one (B32 S512 D128: 161 TFLOP/s in order, 270
    rotated).  Causal walks start at their own diagonals already; rotated as well, they ran 4-6% slower from
    1k to 16k keys (1.6x faster at 512).  Deterministic, without causal: rotated by the block's place in its
    ``chunk`` of blocks, one tile each, so that the blocks of a chunk reach each tile one after another in the
    order of their turns there (:func:`_turn`)."""
    m = first + j
    if not CAUSAL:
        if DETERMINISTIC:
            m = (j + pid_n % chunk) % n_m
        else:
            m = (j + pid_n * n_m // blocks) % n_m
    return m


@gluon.jit
def _turn(m, pid_n, blocks, causal_offset, chunk, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
          CAUSAL: gl.constexpr):
    """Key block ``pid_n``'s place among the blocks that add into query tile ``m``, deterministic: the order in
    which the walks reach the tile (:func:`_query_tile`).

    Causal walks start at their diagonals, so a later block reaches a tile sooner: the last block that sees the
    tile goes first (key j is seen by query i when j <= i + offset, so block n sees tile m when
    n * BLOCK_N < (m + 1) * BLOCK_M + offset), and programs run the last block first (:func:`_program`).  A
    window's lower edge only ends the earlier blocks' walks before the tile: the blocks that see it are still
    the last one and those just before it, each turn counted from the last.
    Without causal the blocks go in chunks of ``chunk`` (at most the SMs and the query tiles): a chunk after the
    chunk before it, and inside one, block k starts at tile k, so of blocks 0..size-1 block k reaches tile m
    at step (m - k) mod n_m: for m >= size - 1 the later block first, below it block m first, then the blocks
    before it down to 0, then the last down to m + 1.  Either way a block waits only for blocks whose programs
    start before it or in its own chunk, whose programs start before any later one: the earliest unfinished
    chunk always gets its SMs."""
    if CAUSAL:
        last = gl.minimum(((m + 1) * BLOCK_M + causal_offset - 1) // BLOCK_N, blocks - 1)
        turn = last - pid_n
    else:
        k = pid_n % chunk
        start = pid_n - k
        size = gl.minimum(chunk, blocks - start)
        turn = gl.minimum(m, size - 1) - k
        if turn < 0:
            turn += size
        turn += start
    return turn


@gluon.jit
def _load_acquire(lock):
    """The counter at ``lock``, read with acquire semantics at GPU scope."""
    return gl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [lock], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def _take_turn(lock, turn):
    """Spin until the counter at ``lock`` reads ``turn`` (every thread: the one that issues the add is among
    them); the add that follows is ordered after it."""
    seen = _load_acquire(lock)
    while seen != turn:
        seen = _load_acquire(lock)
    gl.inline_asm_elementwise("fence.proxy.async.global;\n\tmov.u32 $0, 0;", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _pass_turn(lock):
    """Count this warpgroup's add at ``lock`` once it has completed (not only read its shared memory): every
    thread waits for its own bulk copies (the one that issued the add waits for it), its warp meets, and the
    warp's first thread adds 1 with release semantics (a warpgroup's turn ends at :data:`WARPS` counts)."""
    gl.inline_asm_elementwise(
        "cp.async.bulk.wait_group 0;\n\tbar.warp.sync -1;\n\t{\n\t.reg .pred lead;\n\t.reg .b32 lane;\n\t"
        "mov.u32 lane, %laneid;\n\tsetp.eq.u32 lead, lane, 0;\n\t@lead red.release.gpu.global.add.s32 [$1], 1;\n\t"
        "}\n\tmov.u32 $0, 0;", "=r,l", [lock], dtype=gl.int32, is_pure=False, pack=1)


GRAB_ASM = gl.constexpr(
    "{\n\t.reg .pred lead;\n\t.reg .b32 lane, v;\n\tmov.u32 v, 0;\n\tmov.u32 lane, %laneid;\n\t"
    "setp.eq.u32 lead, lane, 0;\n\t@lead atom.relaxed.gpu.global.add.u32 v, [$1], 1;\n\t"
    "shfl.sync.idx.b32 $0, v, 0, 31, -1;\n\t}")
FINISH_ASM = gl.constexpr(
    "{\n\t.reg .pred lead, last;\n\t.reg .b32 lane, v;\n\tmov.u32 v, -1;\n\tmov.u32 lane, %laneid;\n\t"
    "setp.eq.u32 lead, lane, 0;\n\t@lead atom.acq_rel.gpu.global.add.u32 v, [$1+4], 1;\n\t"
    "setp.eq.u32 last, v, $2;\n\t@last st.relaxed.gpu.global.u32 [$1], 0;\n\t"
    "@last st.relaxed.gpu.global.u32 [$1+4], 0;\n\tmov.u32 $0, 0;\n\t}")


@gluon.jit
def _grab(deal):
    """DYNAMIC: the next key block to walk, counted past the first turn's (a program's first block is its own
    number): one atomic add on ``deal[0]`` by the warp's first thread, read by every thread of the warp."""
    return gl.inline_asm_elementwise(GRAB_ASM, "=r,l", [deal], dtype=gl.int32, is_pure=False, pack=1) + \
        gl.num_programs(0)


@gluon.jit
def _finish(deal):
    """DYNAMIC, the producer done: count this program out at ``deal[1]``; the last one sets both counters back to 0
    for the next launch on the stream (every producer's last add on ``deal[0]`` is before its count)."""
    gl.inline_asm_elementwise(FINISH_ASM, "=r,l,r", [deal, gl.num_programs(0) - 1], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def _hand_over(item, n, ids, id_ready, id_free, layout: gl.constexpr):
    """The producer tells the consumers the ``n``-th key block this program walks (two slots in turn)."""
    s = n % 2
    mbarrier.wait(id_free.index(s), ((n // 2) & 1) ^ 1)
    ids.index(s).store(gl.full([1], item, gl.int32, layout))
    mbarrier.arrive(id_ready.index(s), count=1)


@gluon.jit
def _receive(n, ids, id_ready, id_free, layout: gl.constexpr):
    """A consumer reads the ``n``-th key block this program walks, and frees its slot."""
    s = n % 2
    mbarrier.wait(id_ready.index(s), (n // 2) & 1)
    item = gl.max(ids.index(s).load(layout), axis=0)
    mbarrier.arrive(id_free.index(s), count=1)
    return item


@gluon.jit
def _box(buf):
    """A [rows, HEAD] tile as the [1, 1, rows, HEAD] box of a 4-D descriptor."""
    return buf.reshape([1, 1, buf.shape[0], buf.shape[1]])


@gluon.jit
def _producer(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, k_smem,
              v_smem, kv_ready, kv_empty, q_ready, q_empty, landed, CuQ, CuK, heads, kv_heads, group, seqlen_q,
              seqlen_k, n_m, causal_offset, window_offset, chunk, order, place, deal, ids, id_ready, id_free,
              CAUSAL: gl.constexpr, WINDOW: gl.constexpr, DETERMINISTIC: gl.constexpr, VARLEN: gl.constexpr,
              ALIGN_BR: gl.constexpr, DYNAMIC: gl.constexpr):
    """For each key block the program walks (in turn; DYNAMIC: taken from the counter and its number handed to the
    consumers): its K and V once (once the consumers are done with the last block's), then Q, dO and the rows'
    LSE and delta of each (head, query tile) into the ring.  VARLEN: the descriptors span every packed row, so a
    block's keys and a tile's rows past the sequence's end are the next sequence's (NaN, maybe, which a masked
    pair's zero would still carry into the sums): they land on ``landed`` first and are zeroed here (K, V, Q, dO
    and the deltas; the LSEs are masked) before the consumers are signalled."""
    BLOCK_M: gl.constexpr = q_bufs.shape[1]
    BLOCK_N: gl.constexpr = k_smem.shape[0]
    STAGES: gl.constexpr = q_bufs.shape[0]
    n_landed = 0  # tails zeroed so far (the phase of ``landed``)
    n_kv = 0  # K/V blocks loaded so far (the phases of ``kv_ready`` and ``kv_empty``)
    it = 0
    total = order[1] * order[2]
    item = gl.program_id(0)
    n_given = 0  # DYNAMIC: key blocks handed to the consumers
    if DYNAMIC:
        _hand_over(item, n_given, ids, id_ready, id_free, ID_1)
        n_given += 1
    while item < total:
        pid_n, pair = _program(item, order, CAUSAL, DETERMINISTIC)
        b, kvh, q0, sq, k0, sk, n_m_b, blocks, chunk_b, causal_b, window_b = _extent(
            pair, kv_heads, seqlen_q, seqlen_k, n_m, order[1], chunk, causal_offset, window_offset, CuQ, CuK, BLOCK_M,
            BLOCK_N, VARLEN, ALIGN_BR)
        at = b  # the batch coordinate of the descriptors (packed: one sequence of every row)
        if VARLEN:
            at = 0
        first, end = _walk(pid_n, n_m_b, causal_b, window_b, BLOCK_M, BLOCK_N, CAUSAL, WINDOW)
        if _active(pid_n, sk, BLOCK_N, VARLEN):
            kv_valid = sk - pid_n * BLOCK_N
            kv_at = (kvh * place[3], at * place[4] + kvh * place[5], kvh * place[6], at * place[7] + kvh * place[8],
                     k0 + pid_n * BLOCK_N)
            kv_tail = False
            if VARLEN:
                kv_tail = kv_valid < BLOCK_N
            mbarrier.wait(kv_empty, (n_kv & 1) ^ 1)  # the previous block's products are done with K and V
            if kv_tail:
                _load_kv(k_desc, v_desc, kv_at, landed, k_smem, v_smem)
                mbarrier.wait(landed, n_landed & 1)
                _zero_rows(k_smem, kv_valid)
                _zero_rows(v_smem, kv_valid)
                fence_async_shared()
                gl.thread_barrier()
                mbarrier.arrive(kv_ready, count=1)
                n_landed += 1
            else:
                _load_kv(k_desc, v_desc, kv_at, kv_ready, k_smem, v_smem)
            n_kv += 1
        else:
            end = first
        for gi in range(group):
            h = kvh * group + gi
            stat = b * heads + h  # the statistics' row and first column (packed: [heads, rows], :func:`_stats_row`)
            stat0 = 0
            if VARLEN:
                stat = h
                stat0 = _stats_row(q0, b)
            for j in range(end - first):
                m = _query_tile(j, first, n_m_b, pid_n, blocks, chunk_b, CAUSAL, DETERMINISTIC)
                s = it % STAGES
                valid = sq - m * BLOCK_M
                q_at = (h * place[0], at * place[1] + h * place[2], h * place[9], at * place[10] + h * place[11],
                        stat, q0 + m * BLOCK_M, stat0 + m * BLOCK_M)
                tail = False
                if VARLEN:
                    tail = valid < BLOCK_M
                mbarrier.wait(q_empty.index(s), ((it // STAGES) & 1) ^ 1)
                if tail:
                    _load_tile(q_desc, do_desc, lse_desc, delta_desc, q_at, landed, q_bufs, do_bufs, lse_bufs,
                               delta_bufs, s)
                    mbarrier.wait(landed, n_landed & 1)
                    _zero_rows(q_bufs.index(s), valid)
                    _zero_rows(do_bufs.index(s), valid)
                    _zero_stats(delta_bufs.index(s), valid)
                    fence_async_shared()
                    gl.thread_barrier()
                    mbarrier.arrive(q_ready.index(s), count=1)
                    n_landed += 1
                else:
                    _load_tile(q_desc, do_desc, lse_desc, delta_desc, q_at, q_ready.index(s), q_bufs, do_bufs,
                               lse_bufs, delta_bufs, s)
                it += 1
        if DYNAMIC:  # the next block, as soon as this one's loads are issued (past the last: the consumers stop)
            item = _grab(deal)
            _hand_over(item, n_given, ids, id_ready, id_free, ID_1)
            n_given += 1
        else:
            item += gl.num_programs(0)
    if DYNAMIC:
        _finish(deal)


@gluon.jit
def _zero_stats(buf, valid):
    """Entries ``valid..`` of a landed [1, rows] box of row statistics set to zero, by one warp (the caller
    fences and signals)."""
    ROWS: gl.constexpr = buf.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, ROWS // 32], [1, 32], [1, 1], [1, 0])
    x = buf.load(layout)
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(0, layout))
    buf.store(gl.where(rows[None, :] < valid, x, gl.zeros_like(x)))


@gluon.jit
def _load_kv(k_desc, v_desc, at, bar, k_smem, v_smem):
    """The block's K and V onto ``bar``; ``at``: K's and V's first two coordinates, then the first key."""
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [at[0], at[1], at[4], 0], bar, _box(k_smem))
    tma.async_copy_global_to_shared(v_desc, [at[2], at[3], at[4], 0], bar, _box(v_smem))


@gluon.jit
def _load_tile(q_desc, do_desc, lse_desc, delta_desc, at, bar, q_bufs, do_bufs, lse_bufs, delta_bufs, s):
    """A query tile's Q, dO, LSEs and deltas into stage ``s`` onto ``bar``; ``at``: Q's and dO's first two
    coordinates, the statistics' row, the tile's first row, and its first column in the statistics."""
    mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes + lse_desc.block_type.nbytes
                    + delta_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [at[0], at[1], at[5], 0], bar, _box(q_bufs.index(s)))
    tma.async_copy_global_to_shared(do_desc, [at[2], at[3], at[5], 0], bar, _box(do_bufs.index(s)))
    tma.async_copy_global_to_shared(lse_desc, [at[4], at[6]], bar, lse_bufs.index(s))
    tma.async_copy_global_to_shared(delta_desc, [at[4], at[6]], bar, delta_bufs.index(s))


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


def supports(prob, q, k, v, do, layout: str, alibi: int) -> str | None:
    """None if the Gluon backward takes this call, else why not (``alibi``: the slopes' :func:`..alibi_kind`)."""
    if not q.is_cuda or device_facts(q.device.index)[0] != 9:
        return "needs an sm_90 GPU"
    if prob.head_dim not in HEAD_DIMS or prob.dv not in HEAD_DIMS or prob.dv > prob.head_dim:
        return f"head_dim {prob.head_dim} (V's {prob.dv}): takes a multiple of 8 from 32 to 256, V's no wider"
    if alibi == 2 or prob.seqused:
        return "ALiBi slopes per (batch, head) and seqused_k run on the Triton kernels"
    if prob.window_offset is not None and not prob.causal:
        return "a window open to the right (no upper edge) runs on the Triton kernels"
    if not prob.scale_log2 >= MIN_SCALE:
        return f"scale {prob.scale_log2 / LOG2E_VALUE}: the kernel's LSE / scale needs scale * log2(e) >= 2^-60"
    for name, t in (("q", q), ("k", k), ("v", v), ("dO", do)):
        if _place(t, layout) is None:
            return f"{name} with strides {tuple(t.stride())}: TMA cannot read it"
    return None


def _place(t: torch.Tensor, layout: str):
    """A 4-D descriptor over one (batch, head) sequence per index of ``t`` as it lies, and its placement
    (leading index per head, first index per batch and per head); None where TMA cannot read it."""
    view = views.kv_view(t, layout)
    if view is None:
        return None
    shape, strides = views.exact(t, view, layout)
    return shape, strides, (int(view.col > 0), view.batch, view.head)


class Tiles(NamedTuple):
    """How the kernel cuts a call of one tile width (:func:`tiles`)."""
    rows: int  # query rows a tile (``BLOCK_M``)
    rs: bool  # S^T and dP^T, keys the rows: P^T and dS^T are dV's and dK's A operands in registers
    ds_bufs: int  # buffers of P and dS: with two, a warpgroup writes the next tile's while the other reads these
    dq_rows: int  # the dQ rows a warpgroup adds (over all keys): half the tile's, or all of them
    dq_cols: int  # the dQ columns a warpgroup adds: half the head's, or all of them
    block_n: int = 128  # keys a program owns (``BLOCK_N``): S's and dP's columns half a warpgroup
    stages: int = 2  # Q/dO tiles in flight (``STAGES``)
    cols: bool = False  # each warpgroup holds dK and dV of every key over a column half (``COLS``), not its keys'
    # Q's and dO's stage freed once dV's and dK's products are done, while dQ's run (``EARLY``; the P/dS buffer then
    # freed by its own barrier): at one stage the next tile's loads overlap dQ's products and adds
    early_free: bool = False
    head_v: int = 0  # V's and dO's tile width, where narrower than Q's and K's (0: as wide)


def tiles(head: int, deterministic: bool = False, dv: int = 0) -> Tiles:
    """The tiles of a call ``head`` columns wide, V's head dim ``dv`` (0: q/k's).

    At 128: P and dS through shared memory in two buffers (224 KB), dQ in column halves over all 128 keys (a whole-width
    dQ accumulator beside dK's and dV's does not fit). S^T's registers form there spilled 392-504 bytes beside dK's and
    dV's accumulators holding the statistics through the tile (12-14% slower), and 28-40 with the products started from
    them (2-4% slower without causal, no faster causal; docs/PERF.md, "The Gluon backward"; timed again beside the
    narrower products: 0.97-1.03x at 128 and 0.95-0.99x at 96, a third stage of Q and dO no better, "Head dims off the
    tile"). At 64: FlashAttention-3's 128-row tiles in S^T's registers form, the products started from the statistics:
    1.21-1.27x the 64-row tiles from 1k tokens without causal, 1.04-1.10x causal (holding the statistics through the
    tile spilled 752-792 bytes and ran 24-33% slower); dQ in row halves over all 128 keys, as FlashAttention-3 cuts it
    there (each warpgroup's own keys over the whole tile adds twice the bytes). At 256 (``COLS``): 64-key blocks whose
    dK and dV each warpgroup holds in column halves, one stage of Q and dO and one buffer of P and dS (K, V, Q and dO
    take 128 KB; with two stages they would not fit beside dQ's staging), dQ's column half in two 64-column pieces (the
    products over the columns that exist, shared between the warpgroups: :func:`_col0`), Q's and dO's one stage freed
    for the next tile's loads as soon as dV's and dK's products are done, while dQ's run (1.13-1.46x holding it through
    dQ's; docs/PERF.md, "Past head_dim 128"). Where V's head dim fits 128 columns (DeepSeek-V3's 192/128) V and dO take
    128-wide tiles, and two stages of Q and dO fit. Either way each warpgroup adds its own half of a dQ tile, so
    deterministic, each half takes its own turns."""
    if head <= 64:
        return Tiles(rows=128, rs=True, ds_bufs=2, dq_rows=64, dq_cols=head)
    if head <= 128:
        return Tiles(rows=64, rs=False, ds_bufs=2, dq_rows=64, dq_cols=head // 2)
    narrow = 0 < dv <= 128
    return Tiles(rows=64, rs=False, ds_bufs=1, dq_rows=64, dq_cols=64, block_n=64, stages=2 if narrow else 1, cols=True,
                 early_free=True, head_v=128 if narrow else 0)


def cut_of(prob, deterministic: bool = False) -> Tiles:
    """The tiles of ``prob``: :func:`tiles`'s, but with a softcap where they are S^T's registers form (head dims up to
    64) the 64-row tiles with P and dS in shared memory.  The cap's derivative meets dP^T there beside the 128-row
    tile's S^T, dP^T, dK and dV in registers, and ptxas spilled 424-604 bytes: 0.76-0.80x the Triton kernels (one
    H100, bf16, causal, 1k and 4k tokens, softcap 50), where the 64-row tiles spill 0-24 and ran 1.05-1.12x them."""
    head = tile_width(prob.head_dim)
    cut = tiles(head, deterministic, prob.dv)
    if prob.softcap > 0 and cut.rs:
        cut = Tiles(rows=64, rs=False, ds_bufs=2, dq_rows=64, dq_cols=head // 2)
    return cut


def descriptors(q, k, v, do, dq, lse, delta, layout: str, head: int, cut: Tiles) -> tuple[list, list[int]]:
    """The TMA descriptors of q, k, v, dO (a box of one (batch, head) sequence's rows, ``head`` columns), of
    the float32 ``dq`` buffer (a warpgroup's share of a tile) and of the LSE and delta (``[batch * heads,
    seqlen_q]``, a tile's rows a box), and the (batch, head) placements of the first four."""
    descs, place = [], []
    for t, rows, width in ((q, cut.rows, head), (k, cut.block_n, head), (v, cut.block_n, cut.head_v or head),
                           (do, cut.rows, cut.head_v or head)):
        shape, st, p = _place(t, layout)
        descs.append(TensorDescriptor(t, shape, st, [1, 1, rows, width], IN_LAYOUT))
        place += p
    box = [1, cut.dq_rows, cut.dq_cols]
    descs.append(TensorDescriptor(dq, list(dq.shape), list(dq.stride()), box, DQ_LAYOUT))
    for stat in (lse, delta):
        descs.append(TensorDescriptor(stat, list(stat.shape), list(stat.stride()), [1, cut.rows], STAT_LAYOUT))
    return descs, place


def packed_stats_rows(prob) -> int:
    """The rows a head of packed sequences' LSE and delta take for the kernel (each sequence's rows starting 16
    bytes apart, :func:`fmha.kernels.backward.stats_row`), a multiple of 4."""
    return -(-(prob.seqlen_q + 3 * prob.batch) // 4) * 4


def stats_rows(seqlen_q: int) -> int:
    """The row stride of the LSE and delta the kernel reads (``[batch * heads, seqlen_q]`` boxes by TMA, whose
    strides are whole 16 bytes): seqlen_q rounded up to 4."""
    return -(-seqlen_q // 4) * 4


def row_stats(t: torch.Tensor, rows: int) -> torch.Tensor:
    """The LSE or delta (``[batch, heads, seqlen_q]``) as the ``[batch * heads, seqlen_q]`` view the kernel reads,
    copied into rows of ``rows`` floats where its own are not (seqlen_q not a multiple of 4, or not 16-byte
    aligned; the backward lays delta out so, :func:`fmha.backward._hopper`)."""
    flat = t.reshape(-1, t.shape[-1])
    if flat.stride(0) == rows and flat.data_ptr() % 16 == 0:
        return flat
    out = torch.empty(flat.shape[0], rows, dtype=flat.dtype, device=flat.device)[:, :flat.shape[1]]
    return out.copy_(flat)


def tile_width(head_dim: int) -> int:
    """The tile width a head dim runs in here: its power of two, 64 at least (the 128-byte swizzled tiles)."""
    return padded(head_dim, 64)


def section(prob, head: int, itemsize: int, index: int, deterministic: bool) -> int:
    """How many (batch, KV head)s the programs take in turn, key block-major (:func:`_program`).  A causal
    block's walk starts at its diagonal, so block 0's is the longest: dispatched head by head, the last heads'
    long walks start last and hold the tail (a list-scheduling model of 132 SMs left 1-7% of their time idle
    on the default grid's causal cells).  Every head's block 0 first instead streams each head's Q and dO from
    memory once for each of its blocks (1-18% slower from 4k tokens, deterministic up to 37%), so the heads go
    in sections whose Q, dO and float32 dQ fit the L2 cache (a power of two of them), key block-major inside
    one: FlashAttention's schedule for its deterministic backward, 1-3% faster here from 2k to 8k tokens.
    Without causal every walk is as long, as with a window nearly, and deterministic causal walks ran 1-5%
    slower in sections (their turns come later), so there one head's blocks go side by side (a section of
    one)."""
    if not prob.causal or deterministic or prob.window_offset is not None:
        return 1
    one = prob.seqlen_q * (prob.heads // prob.kv_heads) * head * (2 * itemsize + 4)
    fit = max(l2_bytes(index) // one, 1)
    return 1 << (fit.bit_length() - 1)


def dq_gap(prob, deterministic: bool) -> int:
    """The float32 dQ rows :func:`launch` leaves after each packed sequence (a tile's: a last tile's rows past the
    end are added there, not into the next sequence's)."""
    return cut_of(prob, deterministic).rows if prob.varlen else 0


def schedule(blocks: int, sms: int, causal: bool, packed: bool, deterministic: bool) -> tuple[int, bool]:
    """How many programs walk ``blocks`` key blocks (:func:`_program`), and whether they take them as they free
    (``DYNAMIC``).  Deterministic: one program a block (a block's turns wait only for blocks whose programs start
    before it).  Else one program an SM, each taking blocks in turn, the next block's K and V loading while the
    last one's tiles finish: walks of one length (dense, without causal) in a fixed deal, a turn of the SMs at a
    time (bf16, B*S 16k, the backward's kernels: 1.4-4% faster than one program a block from 512 to 2k tokens at
    head_dim 64 and 128, -1.5% at 4k and 128); uneven walks (causal, packed) each program's next block from a
    counter as it frees, as the GPU deals programs to free SMs (a fixed deal ran 7-31% slower causal at 128)."""
    if deterministic:
        return blocks, False
    return min(blocks, sms), causal or packed


def launch(prob, q, k, v, do, lse, delta, dk, dv, layout: str, strides, zeros, deterministic: bool = False,
           packed=None, alibi=None) -> torch.Tensor:
    """dK and dV into ``dk``, ``dv``; returns dQ (float32, ``[batch * heads, seqlen_q, head_dim]``: the tile's
    columns past head_dim, which the dQ boxes reach, are past the buffer's edge, so TMA adds nothing there), its adds
    in one fixed order when ``deterministic``.  ``zeros(shape, dtype)``: a zeroed buffer (dQ's, the counters).
    ``packed``: ``(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)`` of packed sequences (q, k, v, dO
    one sequence of every row, ``[1, total, heads, head_dim]``; the LSE and delta ``[heads, total_q]``); dQ is
    then ``[heads, total_q + batch * gap, head_dim]``, sequence b's rows from ``cu_seqlens_q[b] + b * gap``
    (:func:`dq_gap`), and the LSE and delta ``[heads, packed_stats_rows]``, laid out for TMA
    (:func:`fmha.kernels.backward.stats_row`).  ``alibi``: float32 slopes ``[heads]``, as the forward took them."""
    head = tile_width(prob.head_dim)
    cut = cut_of(prob, deterministic)
    if packed:
        cu_q, cu_k, seqlen_q, seqlen_k = packed
        dq = zeros((prob.heads, prob.seqlen_q + prob.batch * dq_gap(prob, deterministic), prob.head_dim),
                   torch.float32)
    else:
        seqlen_q, seqlen_k = prob.seqlen_q, prob.seqlen_k
        dq = zeros((prob.batch * prob.heads, seqlen_q, prob.head_dim), torch.float32)
        cu_q = cu_k = dq  # (unread)
    if not packed:  # (packed: laid out for TMA already, :func:`packed_stats_rows`)
        rows = stats_rows(prob.seqlen_q)
        lse, delta = row_stats(lse, rows), row_stats(delta, rows)
    descs, place = descriptors(q, k, v, do, dq, lse, delta, layout, head, cut)
    reduce_pass.install()
    narrow_pass.install()
    n_m = triton.cdiv(seqlen_q, cut.rows)
    locks = zeros((prob.batch * prob.heads * n_m * 2,), torch.int32) if deterministic else dq
    blocks, pairs = triton.cdiv(seqlen_k, cut.block_n), prob.batch * prob.kv_heads
    # deterministic: the blocks that walk side by side (:func:`_turn`: a chunk's programs fit the SMs; packed, the
    # kernel cuts it to each sequence's); unused else
    sms = device_facts(q.device.index)[1]
    chunk = (sms if packed else min(blocks, n_m, sms)) if deterministic else 1
    scale = prob.scale_log2 / LOG2E_VALUE
    heads_in_turn = 1 if packed else section(prob, head, q.element_size(), q.device.index, deterministic)
    programs, dynamic = schedule(blocks * pairs, sms, prob.causal, bool(packed), deterministic)
    deal = locks  # (unread)
    if dynamic:  # a stream's counters, left at zero; where a call may hold nothing (a CUDA graph's capture), its own
        deal = replay.tickets(q.device, 2) if replay.holding(q.device) else zeros((2,), torch.int32)
    cap = prob.softcap or 1.0
    replay.launch(backward_kernel, (programs,), *descs, dk, dv, locks, deal, cu_q, cu_k,
                  alibi.contiguous() if alibi is not None else delta, prob.heads, prob.kv_heads,
                  prob.heads // prob.kv_heads, prob.seqlen_q, prob.seqlen_k, n_m, prob.causal_offset,
                  prob.window_offset or 0, prob.align_offset, chunk, heads_in_turn, blocks, pairs, prob.scale_log2,
                  scale, scale / cap, cap / scale, 1.0 / scale, *place, *strides["dk"], *strides["dv"],
                  HEAD=head, D=prob.head_dim, D_V=prob.dv, CAUSAL=bool(prob.causal),
                  WINDOW=prob.window_offset is not None,
                  RAGGED=bool(packed) or prob.seqlen_k % cut.block_n != 0, RS=cut.rs, DS_BUFS=cut.ds_bufs,
                  DETERMINISTIC=deterministic, VARLEN=bool(packed), ALIGN_BR=bool(packed) and prob.align_br,
                  DYNAMIC=dynamic, STAGES=cut.stages, COLS=cut.cols, EARLY=cut.early_free, SOFTCAP=prob.softcap > 0,
                  ALIBI=alibi is not None, num_warps=4)
    return dq
