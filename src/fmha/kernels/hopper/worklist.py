"""Packed sequences' work list, built on the device from ``cu_seqlens``: every block of ``BLOCK_M``
query rows that has rows, costliest first, so the call never reads the lengths on the host (no
synchronisation, CUDA-graph safe).

One program of :func:`_build` writes ``Items``: ``Items[0]`` the work items (blocks times heads),
then the blocks as int32 ``(sequence << 16) | block``, ordered by their key tiles (the count
:func:`..mask._key_tiles` gives, on the sequence's own diagonal), most first: a counting sort, each
block's place taken by an atomic increment of its count's slot (blocks of equal cost in any order).
The same program checks the cu_seqlens first (:func:`..guards.cu_seqlens_bad`); lengths that fail
give an empty list, so even where device asserts are compiled out no block is read past the tensors.
"""
import torch
import triton
import triton.language as tl

from ... import replay
from .. import guards


@triton.jit
def _block(i, Start, CuQ, CuK, batch, steps, causal_offset, window_offset, n_costs, BLOCK_M: tl.constexpr,
           BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, ALIGN_BR: tl.constexpr):
    """Block numbers ``i`` -> (their entries ``(sequence << 16) | block``, their cost slots: 0 for the
    most key tiles).  ``Start[s]``: sequence s's first block number; the sequence of block i is the last
    one starting at or before it (a binary search of ``steps`` halvings)."""
    seq = tl.zeros_like(i)
    step = 1 << (steps - 1)
    for _ in range(steps):
        cand = seq + step
        take = (cand < batch) & (tl.load(Start + tl.minimum(cand, batch), cache_modifier=".cg") <= i)
        seq = tl.where(take, cand, seq)
        step = step // 2
    block = i - tl.load(Start + seq, cache_modifier=".cg")
    sq = tl.load(CuQ + seq + 1) - tl.load(CuQ + seq)
    sk = tl.load(CuK + seq + 1) - tl.load(CuK + seq)
    shift = sk - sq if ALIGN_BR else 0
    start_m = block * BLOCK_M
    stop = sk
    if CAUSAL:  # as mask._key_tiles counts them
        stop = tl.minimum(sk, tl.maximum(start_m + BLOCK_M + causal_offset + shift, 0))
    end = tl.maximum((stop + BLOCK_N - 1) // BLOCK_N, 1)
    first = tl.zeros_like(end)
    if WINDOW:
        first = tl.minimum(tl.maximum(start_m + window_offset + shift, 0) // BLOCK_N, end - 1)
    slot = tl.maximum(n_costs - (end - first), 0)
    return (seq << 16) | block, slot


@triton.jit(debug=True)
def _build(CuQ, CuK, Items, Scratch, n, total_q, total_k, max_q, max_k, capacity, heads, steps, causal_offset,
           window_offset, n_costs, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
           WINDOW: tl.constexpr, ALIGN_BR: tl.constexpr, BLOCK: tl.constexpr):
    """``n`` entries of each cu_seqlens (``batch + 1``); ``Scratch``: ``batch + 1`` block starts, then
    ``n_costs`` counters (one per key-tile count, most first); ``capacity``: the room in ``Items``."""
    batch = n - 1
    bad = guards.cu_seqlens_bad(CuQ, CuK, n, total_q, total_k, max_q, max_k, BLOCK)
    Start = Scratch
    Count = Scratch + n
    offs = tl.arange(0, BLOCK)
    for c in range(0, n_costs, BLOCK):
        tl.store(Count + c + offs, tl.zeros_like(offs), mask=c + offs < n_costs)
    total = 0
    for s0 in range(0, batch, BLOCK):  # each sequence's first block number
        s = s0 + offs
        rows = tl.load(CuQ + s + 1, mask=s < batch, other=0) - tl.load(CuQ + s, mask=s < batch, other=0)
        blocks = (tl.maximum(rows, 0) + BLOCK_M - 1) // BLOCK_M
        tl.store(Start + s, total + tl.cumsum(blocks, 0) - blocks, mask=s < batch)
        total += tl.sum(blocks, 0)
    total = tl.where(bad == 0, tl.minimum(total, capacity), 0)
    tl.store(Items, total * heads)
    tl.debug_barrier()
    for i0 in range(0, total, BLOCK):  # how many blocks of each cost
        i = i0 + offs
        _, slot = _block(i, Start, CuQ, CuK, batch, steps, causal_offset, window_offset, n_costs, BLOCK_M, BLOCK_N,
                         CAUSAL, WINDOW, ALIGN_BR)
        tl.atomic_add(Count + slot, tl.zeros_like(i) + 1, mask=i < total)
    tl.debug_barrier()
    before = 0
    for c in range(0, n_costs, BLOCK):  # counts -> each cost's first place
        here = tl.load(Count + c + offs, mask=c + offs < n_costs, other=0, cache_modifier=".cg")
        tl.store(Count + c + offs, before + tl.cumsum(here, 0) - here, mask=c + offs < n_costs)
        before += tl.sum(here, 0)
    tl.debug_barrier()
    for i0 in range(0, total, BLOCK):  # each block to the next place of its cost
        i = i0 + offs
        entry, slot = _block(i, Start, CuQ, CuK, batch, steps, causal_offset, window_offset, n_costs, BLOCK_M,
                             BLOCK_N, CAUSAL, WINDOW, ALIGN_BR)
        place = tl.atomic_add(Count + slot, tl.zeros_like(i) + 1, mask=i < total)
        tl.store(Items + 1 + place, entry, mask=i < total)


def capacity(total_q: int, batch: int, max_seqlen_q: int, block_m: int) -> int:
    """The most blocks that have rows: each sequence's last block may be partial."""
    return max(min(total_q // block_m + batch, batch * -(-max_seqlen_q // block_m)), 0)


def build(cu_seqlens_q, cu_seqlens_k, total_q: int, total_k: int, max_seqlen_q: int, max_seqlen_k: int, heads: int,
          prob, cfg, causal_offset: int, window_offset: int) -> torch.Tensor:
    """Queue the work list's build (and the cu_seqlens' check) for ``hopper``: int32 ``[1 + capacity]``, with
    ``causal_offset`` and ``window_offset`` relative to each sequence's diagonal as the kernel takes them."""
    batch = cu_seqlens_q.shape[0] - 1
    if batch >= 1 << 15 or max_seqlen_q > cfg.block_m << 16:
        raise ValueError("the hopper kernel's work list takes fewer than 32768 sequences of fewer than "
                         f"{cfg.block_m << 16} rows")
    room = capacity(total_q, batch, max_seqlen_q, cfg.block_m)
    n_costs = -(-max(max_seqlen_k, 1) // cfg.block_n)
    items = replay.buffer(torch.empty(1 + room, dtype=torch.int32, device=cu_seqlens_q.device))
    scratch = replay.buffer(torch.empty(batch + 1 + n_costs, dtype=torch.int32, device=cu_seqlens_q.device))
    replay.launch(_build, (1,), cu_seqlens_q, cu_seqlens_k, items, scratch, batch + 1, total_q, total_k,
                  max_seqlen_q, max_seqlen_k, room, heads, max(batch - 1, 1).bit_length(), causal_offset,
                  window_offset, n_costs, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=prob.causal,
                  WINDOW=prob.window_offset is not None, ALIGN_BR=prob.align_br, BLOCK=256, num_warps=4)
    return items
