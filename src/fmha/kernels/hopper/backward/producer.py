"""The backward's producer warp: a key block's K and V once, each query tile's Q, dO, LSE and delta by TMA into
a ring, the rows past a packed sequence's end zeroed."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from ..producer import _zero_rows
from .walks import _active, _extent, _finish, _grab, _hand_over, _program, _query_tile, _walk

ID_1 = gl.constexpr(gl.BlockedLayout([1], [32], [1], [0]))  # a key block's number in the producer's warp


@gluon.jit
def _stats_row(q0, b):
    """Where packed sequence ``b`` (its first row ``q0``) starts in the statistics' rows: ``q0 + 3 b`` rounded up to
    4 (:func:`fmha.kernels.backward.stats_row`, which lays them out), as a TMA box starts on 16 bytes."""
    return (q0 + 3 * b + 3) // 4 * 4


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
