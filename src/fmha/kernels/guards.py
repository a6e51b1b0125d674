"""Device-side checks of user indices that steer memory reads, run before the kernel that reads.

A paged cache's block table and key lengths live on the device; reading them on the host would
cost a synchronisation per call (and is not allowed under CUDA-graph capture).  Instead one small
program per sequence checks, in stream order, the entries the attention kernel is about to follow.
On a GPU a failed check stops the stream with a device-side assert that names the argument, so the
attention kernel queued behind it never runs and never reads a page outside the pool.  Triton's
interpreter skips device asserts, so there the check's verdict per sequence comes back in a status
tensor that the host reads (CPU memory: no synchronisation to pay) and turns into a ``ValueError``.
"""
import torch
import triton
import triton.language as tl

from .. import replay

SEQLENS_MESSAGE = tl.constexpr("fmha.attention_paged: cache_seqlens outside [0, pages_per_seq * page_size]")
BLOCK_TABLE_MESSAGE = tl.constexpr("fmha.attention_paged: a block_table entry in use (covering keys below "
                                   "cache_seqlens) outside [0, num_pages)")


@triton.jit(debug=True)
def _check_pages(BlockTable, SeqLens, Status, stride_bt, pages_per_seq, num_pages, page_size, BLOCK: tl.constexpr,
                 STATUS: tl.constexpr):
    """Sequence ``program_id(0)``: its key count fits its table row, and every page its keys
    occupy (entries ``[0, ceil(n / page_size))``) is a page of the pool.  STATUS: also store the
    verdict (1: the key count, 2: a page) for the host to read."""
    b = tl.program_id(0)
    n = tl.load(SeqLens + b)
    len_ok = (n >= 0) & (n <= pages_per_seq * page_size)
    tl.device_assert(len_ok, SEQLENS_MESSAGE)
    used = tl.minimum(tl.cdiv(tl.maximum(n, 0), page_size), pages_per_seq)
    row = BlockTable + b.to(tl.int64) * stride_bt
    bad_pages = 0
    for start in range(0, used, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        page = tl.load(row + idx, mask=idx < used, other=0)
        page_ok = (page >= 0) & (page < num_pages)
        tl.device_assert(page_ok, BLOCK_TABLE_MESSAGE)
        bad_pages += tl.sum((~page_ok).to(tl.int32))
    if STATUS:
        tl.store(Status + b, tl.where(len_ok, 0, 1) + tl.where(bad_pages > 0, 2, 0))


def check_pages(block_table: torch.Tensor, cache_seqlens: torch.Tensor, num_pages: int, page_size: int) -> None:
    """Queue the check of ``block_table`` (int32 ``[batch, pages_per_seq]``) and ``cache_seqlens``
    (int32 ``[batch]``) against a pool of ``num_pages`` pages of ``page_size`` keys; on CPU tensors
    raise the ``ValueError`` at once."""
    batch, pages_per_seq = block_table.shape
    on_host = block_table.device.type == "cpu"
    status = torch.empty(batch, dtype=torch.int32) if on_host else block_table
    replay.launch(_check_pages, (batch,), block_table, cache_seqlens, status, block_table.stride(0), pages_per_seq,
                  num_pages, page_size, BLOCK=128, STATUS=on_host)
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
