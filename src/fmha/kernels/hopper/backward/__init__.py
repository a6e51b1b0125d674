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
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .... import replay
from ....constants import LOG2E as LOG2E_VALUE
from ....device import device_facts, l2_bytes
from ... import tma as views
from .. import narrow_pass, reduce_pass
from ..resources import MIN_SCALE, padded
from .kernel import backward_kernel

HEAD_DIMS = tuple(range(32, 257, 8))  # in tiles of 64, 128 or 256 columns, zeros past head_dim
IN_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=4)
DQ_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=3)
STAT_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


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
