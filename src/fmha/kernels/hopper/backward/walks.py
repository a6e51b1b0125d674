"""The backward's schedule on the device: the key blocks a program walks and in what order (a fixed deal, or
from a counter as programs free), the query tiles each walk visits, and the turns deterministic walks take at a dQ
tile (the package's docstring tells the whole)."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from ..mask import _sequence


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
