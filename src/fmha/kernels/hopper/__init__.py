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

Shapes it takes (:func:`supports`): sm_90, head_dim a multiple of 8 from 32 to 256 and
V's no larger than q/k's (DeepSeek's 192/128), any seqlen_q and seqlen_k, q/k/v/out in
any strides TMA can read (:mod:`..tma`), packed sequences (``VARLEN``,
one packed bshd tensor; the work items come from a list built on the device from the
lengths, :mod:`.worklist`, so none lies past a sequence's end) and per-batch
key lengths (``SEQUSED``), also against a paged K/V cache (``PAGED``: pages of a
multiple of ``BLOCK_N`` keys, each key tile's page read from the block table by the
producer).  A head dim runs in tiles of the next power of two, 32 at least
(:func:`padded`; a 32-wide tile is swizzled by 64 bytes): Q and O go through 3-D descriptors and K and V
through 4-D ones whose last dimension ends at head_dim (:func:`tma.exact`), so the columns of a box past
it read zeros and are never written, Q K^T skips them where Q stays in shared memory
(:func:`qk_slices`) and P V's wgmma always (:mod:`.narrow_pass`: 96 columns of a 128-column tile, one
``m64n96k16``); ``KernelConfig.split_qk`` holds a 192 head dim's Q and K as a 128- and a 64-column tile
instead (a quarter less shared memory: room for 128-key tiles at DeepSeek's 192/128).  Rows of the last
query block past the sequence's end are computed on
whatever TMA reads there and never stored (a warpgroup that straddles the end, or
every warpgroup where O cannot be staged in shared memory, stores from registers).  K and V
hold one sequence per (batch, head) in their descriptors, so a last key tile past
seqlen_k holds zeros (never the next head's keys, which could hold anything, NaN
included: a masked score times a NaN value is NaN) and is masked (``RAGGED``).
Past a packed sequence's end or a seqused_k length the tile holds real memory
(the next sequence's keys, or the cache's unused part): the scores are masked
and the producer zeroes those rows of V in shared memory before the consumers
see it (:func:`_zero_past`).  Anything else goes to ``tiled``.  Gluon
kernels do not run in the interpreter.

The backward on sm_90 is :mod:`.backward` (FlashAttention-3's shape, its dQ added by TMA reduce-adds that
:mod:`.reduce_pass` writes into the PTX).
"""
from __future__ import annotations

from dataclasses import replace

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.errors import PTXASError

from ... import replay
from .. import combine, strides_bhsd, tma
from . import multicast, narrow_pass, transpose, worklist
from ...checks import FP8, HOPPER_HEAD_DIMS
from ...constants import LOG2E
from ...device import device_facts
from .kernel import KERNEL, hopper_kernel  # noqa: F401
from .resources import (MIN_SCALE, REGS_SM, SMEM_LIMIT, SMEM_SM, SMEM_SPARE, SPLIT_QK_DIM, consumer_regs,  # noqa: F401
                        launch_options, launch_regs, o_stage, o_staged, o_via_q_reason, p_smem_reason, padded, sm_bytes,
                        smem_bytes, tile_layout)
from .schedule import (ITEM_COST, _schedule, balanced_tail, block_tiles, item_rows, paired_item,  # noqa: F401
                       per_sequence, split_pieces, tail_pieces)


# the TMA boxes: Q and O [1, 64, HEAD] of a 3-D descriptor, K and V [1, 1, BLOCK_N, HEAD] of a 4-D one
# (:func:`descriptors`), in ``resources.tile_layout`` of their width; the buffers they land in are 2-D tiles of
# the same swizzle


# CLUSTER: the same layouts, whole in each CTA of the cluster
ROWS_LAYOUT_2 = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3, cga_layout=[[0, 0, 0]])

KV_LAYOUT_2 = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=4, cga_layout=[[0, 0, 0, 0]])


HEAD_DIMS_SAID = "a multiple of 8 from 32 to 256"  # :data:`fmha.checks.HOPPER_HEAD_DIMS`


def _in_bytes(prob) -> int:
    """Bytes an element of q, k and v (1: float8)."""
    return 1 if prob.fp8 else 2


def supports(prob, cfg, q, k, v, o, layout: str) -> str | None:
    """None if the hopper kernel takes this call, else the reason it does not."""
    if prob.head_dim not in HOPPER_HEAD_DIMS or prob.dv not in HOPPER_HEAD_DIMS or prob.dv > prob.head_dim:
        v_dim = f" with V's {prob.dv}" if prob.head_dim_v else ""
        return f"head_dim {prob.head_dim}{v_dim} (takes {HEAD_DIMS_SAID}, V's no larger than q/k's)"
    if not prob.scale_log2 >= MIN_SCALE:
        return f"scale {prob.scale_log2 / LOG2E}: the kernel divides by it (takes scale * log2(e) >= 2^-60)"
    if not q.is_cuda or device_facts(q.device.index)[0] != 9:
        return "needs an sm_90 GPU"
    if cfg.block_m not in (64, 128, 192):
        return f"block_m {cfg.block_m} (takes 64, 128 or 192: 1, 2 or 3 consumer warpgroups)"
    if cfg.pingpong and cfg.block_m == 64:
        return "ping-pong takes turns between 2 or 3 consumer warpgroups (block_m 128 or 192)"
    if prob.page % cfg.block_n:
        return f"page_size {prob.page} (takes multiples of its {cfg.block_n}-key tile: a tile must not straddle pages)"
    if cfg.split_qk and prob.head_dim != SPLIT_QK_DIM:
        return f"split_qk takes q/k head_dim {SPLIT_QK_DIM} (not {prob.head_dim})"
    if cfg.split_qk and (cfg.cluster or prob.fp8):
        return "split_qk takes no clusters and no float8"
    if cfg.p_smem:
        why = p_smem_reason(cfg)
        if why:
            return why
    in_bytes = _in_bytes(prob)
    if cfg.o_via_q:
        why = o_via_q_reason(prob.head_dim, cfg, prob.dv, in_bytes)
        if why:
            return why
    smem = smem_bytes(prob.head_dim, cfg, prob.dv, in_bytes)
    if smem + SMEM_SPARE > SMEM_LIMIT:
        return f"needs {smem >> 10} KB of shared memory, sm_90 has {SMEM_LIMIT >> 10} KB"
    if sm_bytes(prob.head_dim, cfg, prob.dv, in_bytes) > SMEM_SM:
        return f"{cfg.occupancy} programs of {smem >> 10} KB of shared memory do not fit on one SM ({SMEM_SM >> 10} KB)"
    why = tma.reason((q, k, v, o), layout, "bshd" if prob.page else layout, exact=True)
    if why:
        return why
    if prob.fp8:
        why = fp8_reason(prob, cfg, q)
        if why:
            return why
    if cfg.cluster:
        if prob.causal or prob.window_offset is not None or per_sequence(prob) or prob.page:
            return "clusters take dense non-causal calls without a window"
        if padded(prob.head_dim) != 128 or padded(prob.dv) != 128 or cfg.block_n != 128:
            return "clusters take q/k and V head dims of 128-column tiles (72 to 128) in 128-key tiles"
        if cfg.block_m != 128 or cfg.pingpong or cfg.occupancy > 1 or cfg.persistent == 0:
            return "clusters take 128-row persistent programs, one an SM, without ping-pong"
    return None


def fp8_head_dim_reason(head_dim: int, head_dim_v: int) -> str | None:
    """Why the float8 kernel does not take these head dims, or None: 64, 96 or 128 (a 64- or 128-column tile), V's
    alike."""
    if head_dim not in (64, 96, 128) or head_dim_v != head_dim:
        return f"float8 on hopper takes head_dim 64, 96 or 128 (V's alike), not {head_dim}"
    return None


def fp8_reason(prob, cfg, q) -> str | None:
    """Why the float8 forward cannot take this call, or None: float8 q too (the wgmma multiplies two float8
    operands), a dense call (no packed sequences, per-batch lengths or pages), head_dim 64, 96 or 128 alike for V,
    no softcap, 64- or 128-key tiles (256 with P in shared memory: in registers beside S's 128 registers a thread it
    spilled 475 registers at head_dim 128, sm_90 build) without clusters, pieces or Q in registers, and the exact
    pivot."""
    if q.dtype != FP8:
        return f"float8 K/V with {q.dtype} q (the float8 wgmma takes float8 q; tiled dequantizes K/V instead)"
    if per_sequence(prob) or prob.page:
        return "float8 on hopper takes dense calls (no packed sequences, seqused_k or pages)"
    why = fp8_head_dim_reason(prob.head_dim, prob.dv)
    if why:
        return why
    if prob.softcap:
        return "float8 on hopper takes no softcap"
    if cfg.block_n not in ((64, 128, 256) if cfg.p_smem else (64, 128)) or cfg.cluster or cfg.split_tail or cfg.q_regs:
        return ("float8 on hopper runs 64- or 128-key tiles (256 with P in shared memory, p_smem) without clusters, "
                "pieces or Q in registers")
    if cfg.stale:  # a pivot that stands would let P past float8's largest value, 448 (the lazy one lags 0.75 at most)
        return "float8 on hopper takes no standing pivot (stale)"
    return None


def descriptors(prob, cfg, q, k, v, o, layout: str, vt=None) -> tuple:
    """The four TMA descriptors over q, k, v and out as they lie (:mod:`..tma`), each one rank above
    its view with head_dim a dimension of its own (:func:`tma.exact`), and how (batch, head) place a
    tile in each: Q's rows and leading index (0 or the head), K/V's first index and leading index,
    O's rows, columns (elements, for stores from registers) and row stride.  ``vt`` (float8,
    :func:`.transpose.transposed`): V's descriptor is over V^T, ``[1, batch * kv_heads, head_dim, keys]`` in
    ``[1, 1, HEAD_V, BLOCK_N]`` boxes."""
    kv_layout = "bshd" if prob.page else layout  # a page pool [pages, page, kv_heads, D] reads as bshd
    views = [(q, tma.rows_view(q, layout), layout), (k, tma.kv_view(k, kv_layout), kv_layout),
             (v, tma.kv_view(v, kv_layout), kv_layout), (o, tma.rows_view(o, layout), layout)]
    d, dv = padded(prob.head_dim), padded(prob.dv)
    if cfg.cluster:  # each CTA loads a column half of every K/V tile
        split, layouts = 2, (ROWS_LAYOUT_2, KV_LAYOUT_2, KV_LAYOUT_2, ROWS_LAYOUT_2)
    else:
        split, layouts = 1, (tile_layout(d, 3), tile_layout(d, 4), tile_layout(dv, 4), tile_layout(dv, 3))
    boxes = ([1, 64, d], [1, 1, cfg.block_n, d // split], [1, 1, cfg.block_n, dv // split], [1, 64, dv])
    if cfg.split_qk:  # Q and K in 64-column boxes, three a tile (:mod:`.kernel`)
        boxes = ([1, 64, 64], [1, 1, cfg.block_n, 64], *boxes[2:])
        layouts = (tile_layout(64, 3), tile_layout(64, 4), *layouts[2:])
    if vt is not None:  # float8 Q, K and V^T: one-byte elements (O stays 16-bit); V^T's rows are BLOCK_N keys
        layouts = (tile_layout(d, 3, 8), tile_layout(d, 4, 8), tile_layout(cfg.block_n, 4, 8), layouts[3])
    descs = [TensorDescriptor(t, *tma.exact(t, w, lay), box, how)
             for (t, w, lay), box, how in zip(views, boxes, layouts)]
    if vt is not None:
        n, _, row = vt.shape
        descs[2] = TensorDescriptor(vt, [1, n, prob.dv, row], [n * prob.dv * row, prob.dv * row, row, 1],
                                    [1, 1, dv, cfg.block_n], layouts[2])
    descs = tuple(descs)
    qw, kw, ow = views[0][1], views[1][1], views[3][1]
    return descs, (qw.batch, qw.head, int(qw.col > 0), kw.batch, kw.head, int(kw.col > 0), ow.batch, ow.head,
                   ow.col, ow.strides[0])


def launch(prob, cfg, q, k, v, o, lse, layout: str, alibi=None, seqs=(None, None, None),
           longest=None, block_table=None, descale=None) -> None:
    """Run the kernel on ``prob``.  ``seqs = (cu_seqlens_q, cu_seqlens_k, seqused_k)`` as in
    ``kernels.launch``; packed sequences (``prob.varlen``) also need their ``longest`` (max_seqlen_q,
    max_seqlen_k): the room of the work list built on the device (:mod:`.worklist`).  A paged cache
    (``prob.page``): k and v are the page pools ``[pages, page, kv_heads, D]`` whatever ``layout``
    says of q and o, with ``block_table`` int32 ``[batch, pages per sequence]``.  Float8 (``prob.fp8``):
    ``descale`` float32 ``[batch * kv_heads, 3]``, and V goes to the kernel transposed
    (:mod:`.transpose`)."""
    vt = transpose.transposed(v, layout) if prob.fp8 else None
    descs, strides = descriptors(prob, cfg, q, k, v, o, layout, vt)
    # per-sequence lengths: the band's offsets go relative to the diagonal, each sequence adds its own
    a = prob.align_offset if per_sequence(prob) else 0
    causal_offset, window_offset = prob.causal_offset - a, (prob.window_offset or 0) - a
    resident = device_facts(q.device.index)[1] * max(cfg.occupancy, 1)  # programs on the SMs at once
    persistent = cfg.persistent != 0  # the default since the causal pairs (configs.HOPPER)
    if prob.varlen:  # one packed sequence: the batch index picks rows through cu_seqlens, not a stride
        qrb, qrh, q_lead, _, krh, kv_lead, orb, orh, och, o_stride = strides
        strides = (0, qrh, q_lead, 0, krh, kv_lead, 0, orh, och, o_stride)
        items = worklist.build(*seqs[:2], prob.seqlen_q, prob.seqlen_k, *longest, prob.heads, prob, cfg,
                               causal_offset, window_offset)
        n_m, n_tiles = 1, (items.numel() - 1) * prob.heads  # room for every block; Items[0] says how many there are
    else:
        items = o
        n_m = -(-prob.seqlen_q // item_rows(cfg))
        n_tiles = n_m * prob.batch * prob.heads
    if cfg.cluster:  # a program is a cluster of two CTAs, on two SMs
        resident //= 2
    # persistent causal with more items than SMs runs them in pairs of equal cost (:func:`_tile`);
    # a window's items cost about the same anyway; packed sequences come longest first instead
    paired = bool(prob.causal and prob.window_offset is None and persistent and n_tiles > resident and not prob.varlen)
    grid = (min(-(-n_tiles // 2) if paired else n_tiles, resident) if persistent else n_tiles,)
    if paired and n_m % 2:  # pairs across head_group heads take an even number of blocks a head (:func:`_tile`)
        cfg = replace(cfg, head_group=0)
    balance = paired and bool(cfg.balance)
    if balance:  # the last round or two of pairs dealt out longest item first to the least loaded program (a list
        # built on the host; where a call may keep nothing and none is kept yet, the pairs alone)
        schedule = _schedule(q.device, n_m, n_tiles // n_m, min(n_tiles, resident), cfg.block_m, cfg.block_n,
                             prob.seqlen_k, causal_offset, max(cfg.head_group, 1), build=replay.holding(q.device))
        balance = schedule is not None
    if balance:
        grid = (min(n_tiles, resident),)
        items = replay.constant(schedule)
    pieces = split_pieces(prob, cfg, n_tiles, resident, o.numel() * o.element_size())
    if pieces > 1:  # the last round's items in pieces, each piece's float32 result merged after the kernel
        grid = (min(resident, n_tiles // resident * resident + n_tiles % resident * pieces),)
        rows = n_tiles % grid[0] * item_rows(cfg)
        w = replay.buffer(torch.empty(pieces, rows, prob.dv, dtype=torch.float32, device=q.device))
        wl = replay.buffer(torch.empty(pieces, rows, dtype=torch.float32, device=q.device))
        dest = replay.buffer(torch.empty(rows, dtype=torch.int32, device=q.device))
    else:
        w = wl = dest = o
    # the PTX passes must see the build: again, in case another stages hook replaced them since import
    if cfg.cluster:
        multicast.install()
    consts = constexprs(prob, cfg, lse is not None, paired, alibi is not None, pieces > 1, balance)
    if consts["NARROW"]:
        narrow_pass.install()
    scale = prob.scale_log2 / LOG2E
    cap = prob.softcap or 1.0
    cu_q, cu_k, seqused = (t if t is not None else o for t in seqs)
    try:
        replay.launch(hopper_kernel, grid, *descs, o, lse if lse is not None else o,
                      alibi.contiguous() if alibi is not None else o,
                      cu_q, cu_k, seqused, items, prob.heads, prob.heads // prob.kv_heads, prob.seqlen_q,
                      prob.seqlen_k, causal_offset, window_offset, prob.align_offset - a, scale / cap, cap / scale,
                      1.0 / scale, prob.scale_log2, n_tiles, n_m, max(cfg.head_group, 1), *strides,
                      block_table if block_table is not None else o,
                      block_table.stride(0) if block_table is not None else 0, max(prob.page, 1), w, wl, dest,
                      pieces, descale if descale is not None else o,
                      **consts, num_warps=4, **launch_options(cfg))
    except PTXASError as e:  # (its message carries the whole PTX)
        raise ValueError(f"variant 'hopper' cannot take this call: config {cfg} does not build for sm_90 "
                         f"({ptxas_says(e)})") from None
    if pieces > 1:
        combine.launch(w, wl, o, lse, strides_bhsd(o, layout), prob.heads, prob.seqlen_q, dest)


def ptxas_says(error: Exception) -> str:
    """ptxas's own verdict in a failed build's message (which goes on with the whole PTX): its first fatal or error
    line, else the message's first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("ptxas") and ("fatal" in line or "error" in line)]
    return (said or lines or ["ptxas failed"])[0]


def qk_slices(head_dim: int, cfg) -> tuple[int, int]:
    """(QK_HI, QK_LO): Q K^T over a padded head dim's own columns, in two slices of powers of two (192 as
    128 + 64, 96 as 64 + 32, 80 as 64 + 16, 40 as 32 + 16: the second slice 16 columns at least, a wgmma's
    k-step, reading TMA's zeros past head_dim); (0, 0): over the whole tile (a head dim of its own tile's width,
    two slices that would cover it (112 as 64 + 64), Q in registers, whose operand does not slice, or a cluster,
    whose shared tiles Gluon 3.6 does not slice).  ``split_qk``
    holds the two slices as tiles of their own, in registers too with ``q_regs``."""
    tile = padded(head_dim)
    if head_dim == tile or (cfg.q_regs and not cfg.split_qk) or cfg.cluster:
        return 0, 0
    hi = 1 << (head_dim.bit_length() - 1)
    lo = max(16, 1 << (head_dim - hi - 1).bit_length())  # a wgmma's k-step at least
    return (hi, lo) if hi + lo < tile else (0, 0)


def constexprs(prob, cfg, store_lse: bool, paired: bool = False, alibi: bool = False, split: bool = False,
               balance: bool = False) -> dict:
    qk_hi, qk_lo = qk_slices(prob.head_dim, cfg)
    return dict(HEAD=padded(prob.head_dim), HEAD_V=padded(prob.dv), DV=prob.dv, QK_HI=qk_hi, QK_LO=qk_lo,
                BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n, STAGES=cfg.num_stages,
                CONSUMER_REGS=consumer_regs(cfg), CAUSAL=prob.causal,
                WINDOW=prob.window_offset is not None, SOFTCAP=prob.softcap > 0, ALIBI=alibi,
                RAGGED=per_sequence(prob) or prob.seqlen_k % cfg.block_n != 0,
                PAIRED=(2 if cfg.head_group > 1 else 1) if paired else 0,
                PINGPONG=bool(cfg.pingpong), STORE_LSE=store_lse, VARLEN=prob.varlen, SEQUSED=prob.seqused,
                ALIGN_BR=per_sequence(prob) and prob.align_br, PAGED=bool(prob.page),
                O_SMEM=o_stage(prob.head_dim, cfg, prob.dv, _in_bytes(prob)), Q_REGS=bool(cfg.q_regs),
                FENCE=bool(cfg.fence), LAZY=bool(cfg.lazy), STALE=bool(cfg.stale), SPLIT=split, BALANCE=balance,
                CLUSTER=bool(cfg.cluster), FP8=prob.fp8, SPLIT_QK=bool(cfg.split_qk),
                NARROW=0 if cfg.wide else narrow_pass.width(prob.dv, padded(prob.dv)), P_SMEM=bool(cfg.p_smem))
