"""Device-side checks of user indices that steer memory reads, run before the kernel that reads.

A paged cache's block table and key lengths live on the device; reading them on the host would
cost a synchronisation per call (and is not allowed under CUDA-graph capture).  Instead one small
program per sequence checks, in stream order, the entries the attention kernel is about to follow.
On a GPU a failed check stops the stream with a device-side assert that names the argument, so the
attention kernel queued behind it never runs and never reads a page outside the pool.  Triton's
interpreter skips device asserts, so there the check's verdict per sequence comes back in a status
tensor that the host reads (CPU memory: no synchronisation to pay) and turns into a ``ValueError``.

Where the attention kernel is ``tiled`` in tiles that stay off wgmma, it makes the same checks itself
(:func:`program_checks`, :func:`pages_checked`): each program checks the entries it is about to follow
before it reads through them, and the call is one launch, not two (:func:`fmha.forward.self_checked`).
"""
import torch
import triton
import triton.language as tl

from .. import replay

SEQLENS_MESSAGE = tl.constexpr("fmha.attention_paged: cache_seqlens outside [0, pages_per_seq * page_size]")
BLOCK_TABLE_MESSAGE = tl.constexpr("fmha.attention_paged: a block_table entry in use (covering keys below "
                                   "cache_seqlens) outside [0, num_pages)")
# a kernel that makes its own checks is built so: asserts compiled in, no overflow checks on its arithmetic
CHECK_OPTIONS = {"debug": True, "sanitize_overflow": False}


@triton.jit(debug=True)
def _check_pages(BlockTable, SeqLens, Status, stride_bt, pages_per_seq, num_pages, page_size, STATUS: tl.constexpr):
    """Sequence ``program_id(0)``: its key count fits its table row (:func:`program_checks`), and every page its
    keys occupy (entries ``[0, ceil(n / page_size))``) is a page of the pool (:func:`pages_checked`).  STATUS: also
    store the verdict (1: the key count, 2: a page) for the host to read."""
    b = tl.program_id(0)
    keys = pages_per_seq * page_size
    bad_len = program_checks(SeqLens, SeqLens, SeqLens, b, 0, 0, 0, 0, 0, keys, False, True)
    n = tl.minimum(tl.maximum(tl.load(SeqLens + b), 0), keys)
    bad_pages = pages_checked(BlockTable, b, 0, n, stride_bt, num_pages, page_size)
    if STATUS:
        tl.store(Status + b, tl.where(bad_len == 0, 0, 1) + tl.where(bad_pages > 0, 2, 0))


def check_pages(block_table: torch.Tensor, cache_seqlens: torch.Tensor, num_pages: int, page_size: int) -> None:
    """Queue the check of ``block_table`` (int32 ``[batch, pages_per_seq]``) and ``cache_seqlens``
    (int32 ``[batch]``) against a pool of ``num_pages`` pages of ``page_size`` keys; on CPU tensors
    raise the ``ValueError`` at once."""
    batch, pages_per_seq = block_table.shape
    on_host = block_table.device.type == "cpu"
    status = torch.empty(batch, dtype=torch.int32) if on_host else block_table
    replay.launch(_check_pages, (batch,), block_table, cache_seqlens, status, block_table.stride(0), pages_per_seq,
                  num_pages, page_size, STATUS=on_host)
    if on_host and status.any():
        b = int(status.nonzero()[0, 0])
        n = int(cache_seqlens[b])
        if int(status[b]) & 1:
            raise ValueError(f"{SEQLENS_MESSAGE.value}: cache_seqlens[{b}] = {n}, the table holds "
                             f"{pages_per_seq} pages of {page_size} keys")
        used = block_table[b, :-(-n // page_size)]
        bad = ((used < 0) | (used >= num_pages)).nonzero()[:, 0].tolist()
        raise ValueError(f"{BLOCK_TABLE_MESSAGE.value}: block_table[{b}, {bad[0]}] = {int(used[bad[0]])} with "
                         f"num_pages = {num_pages} ({len(bad)} such entries in row {b})")


CU_SEQLENS_MESSAGE = tl.constexpr("fmha.attention_varlen: cu_seqlens must start at 0, never decrease and end at "
                                  "the packed length")
MAX_SEQLEN_MESSAGE = tl.constexpr("fmha.attention_varlen: a sequence is longer than its max_seqlen")


@triton.jit
def cu_seqlens_bad(CuQ, CuK, n, total_q, total_k, max_q, max_k, BLOCK: tl.constexpr):
    """How many entries of the two cu_seqlens (``n`` each) break the rules: start at 0, never decrease,
    end at the totals, no sequence longer than its max_seqlen.  In a ``debug`` kernel a failure also
    asserts, naming the rule."""
    bad = 0
    for which in tl.static_range(2):
        cu = CuQ if which == 0 else CuK
        total = total_q if which == 0 else total_k
        longest = max_q if which == 0 else max_k
        for start in range(0, n, BLOCK):
            idx = start + tl.arange(0, BLOCK)
            here = tl.load(cu + idx, mask=idx < n, other=0)
            after = tl.load(cu + idx + 1, mask=idx + 1 < n, other=0)
            step = after - here
            shape_ok = ((idx != 0) | (here == 0)) & ((idx != n - 1) | (here == total)) & ((idx + 1 >= n) | (step >= 0))
            tl.device_assert(shape_ok | (idx >= n), CU_SEQLENS_MESSAGE)
            long_ok = (idx + 1 >= n) | (step <= longest)
            tl.device_assert(long_ok, MAX_SEQLEN_MESSAGE)
            bad += tl.sum((~shape_ok & (idx < n)).to(tl.int32)) + tl.sum((~long_ok).to(tl.int32))
    return bad


@triton.jit(debug=True)
def _check_cu_seqlens(CuQ, CuK, Status, n, total_q, total_k, max_q, max_k, BLOCK: tl.constexpr,
                      STATUS: tl.constexpr):
    """:func:`cu_seqlens_bad`; STATUS: also store the verdict (nonzero: a failure)."""
    bad = cu_seqlens_bad(CuQ, CuK, n, total_q, total_k, max_q, max_k, BLOCK)
    if STATUS:
        tl.store(Status, bad)


def check_cu_seqlens(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int, total_k: int,
                     max_seqlen_q: int, max_seqlen_k: int) -> None:
    """Queue the check of packed sequences' cu_seqlens (int32 ``[batch + 1]`` each) against the packed
    lengths and the max_seqlens, in stream order; on CPU tensors raise :func:`fmha.checks.check_cu_seqlens`'s
    ``ValueError`` at once."""
    on_host = cu_seqlens_q.device.type == "cpu"
    status = torch.zeros(1, dtype=torch.int32) if on_host else cu_seqlens_q
    replay.launch(_check_cu_seqlens, (1,), cu_seqlens_q, cu_seqlens_k, status, cu_seqlens_q.shape[0], total_q,
                  total_k, max_seqlen_q, max_seqlen_k, BLOCK=256, STATUS=on_host)
    if on_host and int(status[0]):
        from ..checks import check_cu_seqlens as on_the_host
        on_the_host(torch.stack([cu_seqlens_q, cu_seqlens_k]).numpy(), total_q, total_k, max_seqlen_q, max_seqlen_k)


@triton.jit
def program_checks(CuQ, CuK, SeqK, b, batch, total_q, total_k, max_q, max_k, pages_end, VARLEN: tl.constexpr,
                   PAGED: tl.constexpr):
    """The checks of the separate launches above, made by one program of an attention kernel over its own
    sequence ``b`` (of ``batch``) before it reads through them.  VARLEN: its two entries of each cu_seqlens
    in order, within the packed lengths ``total_q`` / ``total_k`` and no further apart than ``max_q`` /
    ``max_k``, the first entry 0 and the last the total (every sequence's program checks its own: together
    :func:`cu_seqlens_bad`'s rules).  PAGED: its cache_seqlens within ``[0, pages_end]`` (its table row's keys).
    Returns the verdict (0: passed; 1: cu_seqlens out of order or range, 2: a sequence past its max_seqlen, 4:
    cache_seqlens, summed), which the asserts act on (and the interpreter, skipping them, returns for the tests)."""
    bad = 0
    if VARLEN:
        for which in tl.static_range(2):
            cu = CuQ if which == 0 else CuK
            total = total_q if which == 0 else total_k
            here = tl.load(cu + b)
            after = tl.load(cu + b + 1)
            shape_ok = (here >= 0) & (here <= after) & (after <= total) & ((b != 0) | (here == 0)) & \
                ((b != batch - 1) | (after == total))
            long_ok = after - here <= (max_q if which == 0 else max_k)
            tl.device_assert(shape_ok, CU_SEQLENS_MESSAGE)
            tl.device_assert(long_ok, MAX_SEQLEN_MESSAGE)
            bad |= tl.where(shape_ok, 0, 1) | tl.where(long_ok, 0, 2)
    if PAGED:
        n = tl.load(SeqK + b)
        len_ok = (n >= 0) & (n <= pages_end)
        tl.device_assert(len_ok, SEQLENS_MESSAGE)
        bad |= tl.where(len_ok, 0, 4)
    return bad


@triton.jit
def pages_checked(BlockTable, b, lo, hi, stride_bt, num_pages, page_size):
    """The block table's entries for keys ``[lo, hi)`` of sequence ``b`` (keys the caller reads: below its
    cache_seqlens), checked to be pages of the pool before any read through them: once, ahead of the key loop
    (an assert inside the loop keeps Triton from pipelining its loads); ``page_size`` keys a page.  Returns how many
    failed."""
    row = BlockTable + b.to(tl.int64) * stride_bt
    end = tl.cdiv(hi, page_size)
    bad = 0
    for start in range(lo // page_size, end, 64):
        idx = start + tl.arange(0, 64)
        page = tl.load(row + idx, mask=idx < end, other=0)
        page_ok = (page >= 0) & (page < num_pages)
        tl.device_assert(page_ok, BLOCK_TABLE_MESSAGE)
        bad += tl.sum((~page_ok).to(tl.int32))
    return bad
