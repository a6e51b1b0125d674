"""The checked backward, written once for :func:`fmha.attention` and :func:`fmha.attention_varlen`:
allocate the gradients, then ``delta``, dK/dV and dQ (:mod:`fmha.kernels.backward`) from the
forward's O and LSE.  :mod:`fmha.gradients` calls it from autograd; so does the custom op.  On a GPU the
first call of each kind is recorded and later ones replay its launches (:mod:`fmha.replay`), as the
forward's are: every buffer a launch reads zeroed is zeroed by a launch, and dQ's float32 sum is cast by one."""
from __future__ import annotations

import torch
import triton

from . import plan as planning
from . import replay
from .device import family_of, index_of, interpreting, on, shared_limit
from .kernels.hopper.resources import SMEM_LIMIT
from .kernels import alibi_kind, dropout_args, mask_args, strides_bhsd
from .kernels import backward as kernels
from .sinks import grad as sink_grad


def _t(block_m, block_n, warps, stages, chunks=0, halves=False) -> dict:
    """A kernel's tiles; ``halves``: the dK/dV kernel's columns in two programs a block (``HALVES``)."""
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages, QK_CHUNKS=chunks,
                **({"HALVES": True} if halves else {}))


def tiles(head_dim: int, causal: bool, deterministic: bool, family: str = "nvidia",
          shared: int = SMEM_LIMIT, masked: bool = False, dropout: bool = False,
          head_dim_v: int | None = None) -> tuple[dict, dict | None]:
    """Tiles, warps and stages of ``(dkdv_kernel, dq_kernel)``; ``None`` for the second: dQ added
    atomically by the first.  ``head_dim``: the larger of q/k's and v's (``head_dim_v``: v's, if not that);
    ``family``: :func:`fmha.device.family_of`; ``shared``: the bytes of shared memory a block of the GPU may take
    (:func:`fmha.device.shared_limit`).

    NVIDIA, not ``deterministic``: the faster dQ of bench/backward_tiles.py's sweep on the H200 (ledger): the dQ
    kernel at head_dim 128 (atomics cost more than its two recomputed matmuls), atomics for causal
    head_dim <= 64 and past 128, and at head_dim <= 64 with attention ``dropout`` (the dQ kernel would draw every
    pair a third time: ``bench/backward_tiles.py --dropout 0.1``); past 128 with V's head dim past 128 too, the dK/dV
    kernel in column halves, 128 x 64 (1.24-1.29x the whole rows' 64 x 64 at 256, which spill; at DeepSeek's 192/128,
    whose dV is 128 wide, the whole rows 1.08x the halves).  A GPU with less shared memory than sm_90's (an
    A100's 163 KB, sm_86 and sm_89's 99 KB) takes smaller tiles where the H200's would not fit (:data:`SMALL_SHARED`).
    AMD: the largest tiles whose builds keep every value in registers (:data:`AMD_TILES`; ``masked``, reading an
    attn_mask, and CDNA's with ``dropout``: :data:`AMD_TILES_MASKED`), the same choice of dQ where the atomic build
    spills no more; NVIDIA before Hopper likewise (:data:`SM80_TILES`; with ``dropout`` too, the masked rows: the dQ
    kernel's 128 x 64 tiles at 128 spilled 147 registers drawing its pairs), with the H200's choice of dQ.  Under the
    interpreter, atomics whenever allowed (the CPU tests cover both)."""
    if family == "interpreter":
        small = _t(16, 16, 4, 1)
        return small, small if deterministic else None
    if family in AMD_TILES:
        table = (AMD_TILES_MASKED if masked or dropout and family == "cdna" else AMD_TILES)[family]
        *row, chunks = table[64 if head_dim <= 64 else 128 if head_dim <= 128 else 256]
        dkdv, atomic_dkdv, dq = (_t(*t, 1, chunks) if t else None for t in row)
        atomic = atomic_dkdv is not None and not deterministic and (causal if head_dim <= 64 else head_dim > 128)
        return (atomic_dkdv, None) if atomic else (dkdv, dq)
    if family == "sm80" and head_dim <= 128:
        row = (SM80_TILES_MASKED if masked or dropout else SM80_TILES)[64 if head_dim <= 64 else 128]
        dkdv, atomic_dkdv, dq = (_t(*t) if t else None for t in row)
        atomic = atomic_dkdv is not None and causal and not deterministic
        return (atomic_dkdv, None) if atomic else (dkdv, dq)
    if head_dim <= 64:
        atomic = (causal or dropout) and not deterministic
        return _t(64, 64, 4, 3), None if atomic else _t(128, 64, 8, 2)
    needs, small = SMALL_SHARED[128 if head_dim <= 128 else 256]
    if head_dim <= 128:
        return _t(64, 64, 4, 2), _t(128, 64, 8, 2) if shared >= needs else _t(*small)
    if shared < needs:
        return _t(*small), _t(*small)
    if deterministic:
        return _t(32, 64, 4, 1), _t(64, 32, 4, 2)
    if (head_dim if head_dim_v is None else head_dim_v) > 128:
        return _t(128, 64, 8, 1, halves=True), None
    return _t(64, 64, 8, 1), None


# NVIDIA GPUs whose blocks take less shared memory than sm_90's: per head dim up to 128 and 256, (the bytes a block
# must take for the H200's tiles, as sm_80 builds took them; the tiles, (BLOCK_M, BLOCK_N, warps, stages), of the
# kernels that take their place below that).  At 128 the dQ kernel's 128 x 64 tiles took 104 KB beside an attn_mask
# (sm_86, sm_89 and sm_120 have 99; the first two take :data:`SM80_TILES` up to 128): 64 x 64 take 72 KB.  Past 128
# the H200's tiles took 168 KB (the dK/dV kernel adding dQ atomically; an A100 has 163) or 100 KB and spilled 2.9 KB
# of registers (deterministic): 32 x 32 tiles in one stage take 66 KB in both kernels, dQ apart, with at most 6
# registers spilled.  Read from builds, not timed on those GPUs.
SMALL_SHARED = {128: (107520, (64, 64, 8, 2)), 256: (SMEM_LIMIT, (32, 32, 4, 1))}


# NVIDIA before Hopper (sm_80, sm_86, sm_89: mma.sync, no wgmma), up to head_dim 64 and 128: (BLOCK_M, BLOCK_N, warps,
# stages) of the dK/dV kernel, of the dK/dV kernel adding dQ atomically (causal, as on the H200; None: dQ takes its own
# kernel, as at 128 on the H200) and of the dQ kernel, chosen from sm_80 builds by their spills (tests/test_targets.py),
# not timed.  The H200's tiles spilled there: the dK/dV kernel's 64 x 64 in 4 warps 23-103 registers at 64 and 278-409
# at 128, the dQ kernel's 128 x 64 at 128 506 beside a boolean mask and 101 with a bias's gradient.  Eight warps and one
# stage hold dK's and dV's accumulators in registers; every kernel of these, causal or not, deterministic or not, with a
# boolean mask, a bias or its gradient or none, spills none, in at most 96 KB of shared memory (sm_86's and sm_89's 99
# KB hold them).
SM80_TILES = {64: ((64, 64, 8, 1), (64, 32, 8, 1), (128, 64, 8, 2)),
              128: ((64, 64, 8, 1), None, (128, 64, 8, 2))}
SM80_TILES_MASKED = {64: ((64, 32, 8, 1), (32, 64, 8, 1), (128, 32, 8, 2)),
                     128: ((64, 64, 8, 1), None, (64, 64, 8, 2))}


# (BLOCK_M, BLOCK_N, warps) of the dK/dV kernel, of the dK/dV kernel adding dQ atomically (None: it spills
# where the other does not, so dQ takes its own kernel) and of the dQ kernel, per head dim up to 64, 128, 256,
# then the column chunks of their S and dP products (``QK_CHUNKS``, :func:`fmha.kernels.common.dot_t`; 0: one
# product); chosen from builds for gfx1151 (RDNA) and gfx942 (CDNA) by their spills (tests/test_targets.py), not
# timed.  RDNA's WMMA holds an operand twice (both half-waves), so a whole row of head_dim 128-256 in every warp
# fills the 256 registers a thread has (at 256 every tile spilled, 200 registers at the least; at 128 the dQ kernel
# kept one in scratch): there S and dP run over column chunks of 16, a chunk a warp, and no build spills.
AMD_TILES = {
    "rdna": {64: ((32, 32, 8), (32, 16, 8), (64, 32, 8), 0),
             128: ((32, 16, 16), None, (16, 16, 8), 8),
             256: ((16, 32, 16), None, (32, 16, 16), 16)},
    "cdna": {64: ((64, 64, 8), (64, 32, 8), (128, 64, 8), 0),
             128: ((64, 32, 8), (64, 32, 8), (64, 32, 8), 0),
             256: ((64, 16, 8), (64, 16, 8), (64, 16, 8), 0)},
}
# the same beside an attn_mask (boolean or a bias), whose tile each kernel reads as well: smaller tiles where those
# above spilled (gfx1151 10-50 registers from head_dim 64 to 256, gfx942 15-40 at 64 and 128); none spill, in either
# kernel, causal or not, deterministic or not.  CDNA takes them with attention dropout too, whose draws spilled the
# dK/dV kernel above (gfx942: 20-92 registers at 64, 22-25 at 128; RDNA's tiles above spill none with it)
AMD_TILES_MASKED = {
    "rdna": {64: ((32, 16, 8), (16, 16, 8), (32, 16, 8), 0),
             128: ((16, 16, 16), None, (16, 16, 8), 8),
             256: ((16, 16, 16), None, (32, 16, 16), 16)},
    "cdna": {64: ((64, 16, 8), (64, 16, 8), (128, 32, 8), 0),
             128: ((64, 16, 8), (64, 16, 8), (64, 32, 8), 0),
             256: ((64, 16, 8), (64, 16, 8), (64, 16, 8), 0)},
}


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def dense(do, q, k, v, o, lse, *, causal, scale, causal_align, layout, window=(-1, -1), softcap=0.0,
          alibi_slopes=None, seqused_k=None, sinks=None, deterministic=False, attn_mask=None, mask_grad=False,
          dropout=None):
    """Gradients ``(dq, dk, dv, dsinks or None, dmask or None)`` of :func:`fmha.attention` (``lse``: its float32
    ``[batch, heads, seqlen_q]``, the sinks included), each in the layout and strides order of its input.
    ``attn_mask``: the forward's ``[batch, heads, seqlen_q, seqlen_k]`` view, boolean or a float bias (the Triton
    kernels); ``mask_grad``: also the bias's gradient, float32 and contiguous in that shape (autograd sums it
    over the dimensions the view broadcast).
    ``deterministic``: dQ bit for bit the same every run (the Triton kernels: dQ from its own kernel; the Gluon
    kernel: its adds in one fixed order); else, on the Triton kernels, that or dQ added up atomically by the
    dK/dV kernel, whichever :func:`tiles` finds faster (:mod:`fmha.kernels.backward`).  ``dropout = (seed,
    dropout_p)``: the forward's attention dropout (the Triton kernels draw its pairs again)."""
    def call():
        batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim = planning.sizes(q, k, layout)
        prob = planning.problem(batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, causal=causal, scale=scale,
                                window=window, causal_align=causal_align, softcap=softcap,
                                seqused=seqused_k is not None, head_dim_v=v.shape[3],
                                attn_mask=planning.mask_kind(attn_mask), dropout=dropout is not None)
        return _run(prob, do, q, k, v, o, lse, layout, alibi_slopes, (None, None, seqused_k), seqlen_q, seqlen_k,
                    sinks, deterministic, attn_mask, mask_grad, dropout)
    seed, dropout_p = dropout if dropout is not None else (None, 0.0)
    return replay.through("backward dense", (do, q, k, v, o, lse, alibi_slopes, seqused_k, sinks, attn_mask, seed),
                          call, causal, scale, causal_align, layout, window, softcap, deterministic, mask_grad,
                          dropout_p, *_tables(q))


def packed(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, scale,
           causal_align, window=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None, deterministic=False,
           dropout=None):
    """Gradients ``(dq, dk, dv, dsinks or None)`` of :func:`fmha.attention_varlen` (``lse`` ``[heads,
    total_q]``); ``deterministic`` and ``dropout`` as in :func:`dense`."""
    def call():
        batch = cu_seqlens_q.shape[0] - 1
        heads, kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[2]
        prob = planning.problem(batch, heads, kv_heads, q.shape[0], k.shape[0], head_dim, causal=causal,
                                scale=scale, window=window, causal_align=causal_align, softcap=softcap, varlen=True,
                                head_dim_v=v.shape[2], dropout=dropout is not None)
        return _run(prob, do[None], q[None], k[None], v[None], o[None], lse, "bshd", alibi_slopes,
                    (cu_seqlens_q, cu_seqlens_k, None), int(max_seqlen_q), int(max_seqlen_k), sinks,
                    deterministic, dropout=dropout)[:4]
    seed, dropout_p = dropout if dropout is not None else (None, 0.0)
    dq, dk, dv, dsinks = replay.through("backward packed", (do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k,
                                                             alibi_slopes, sinks, seed), call, int(max_seqlen_q),
                                        int(max_seqlen_k), causal, scale, causal_align, window, softcap, deterministic,
                                        dropout_p, *_tables(q))
    return dq[0], dk[0], dv[0], dsinks  # (the buffers as the kernels saw them, one sequence of all the rows)


def _tables(q) -> tuple:
    """What picks a backward's kernels besides its kind (:mod:`fmha.replay`'s key): the tile tables in force and
    the device's family."""
    return id(GLUON_ROWS), id(GLUON_ROWS_DETERMINISTIC), family_of(q.device), _shared(q.device)


def _shared(device: torch.device) -> int:
    """The shared memory a block of ``device`` may take (sm_90's off a CUDA GPU: the interpreter's tiles ignore it)."""
    return shared_limit(index_of(device)) if device.type == "cuda" and not torch.version.hip else SMEM_LIMIT


def _zeros(shape, dtype, device) -> torch.Tensor:
    """A buffer of the call, zeroed by a launch (a replayed call zeroes its own again)."""
    t = replay.buffer(torch.empty(shape, dtype=dtype, device=device))
    replay.launch(kernels.zero_kernel, (max(triton.cdiv(t.numel(), 1024), 1),), t, t.numel(), BLOCK=1024)
    return t


def _cast(src, src_strides, dst, dst_strides, batch: int, heads: int, rows: int, head_dim: int, cu_q=None,
          gap: int = 0) -> None:
    """``dst = src`` in dst's dtype over (batch, head, row, head_dim), strides in (batch, head, row) order.
    ``cu_q``: packed sequences (``rows`` the longest), sequence b's rows ``b * gap`` further on in ``src``."""
    block_d = triton.next_power_of_2(head_dim)
    replay.launch(kernels.cast_kernel, (triton.cdiv(rows, 64), batch * heads), src, dst, *src_strides, *dst_strides,
                  heads, rows, src if cu_q is None else cu_q, gap, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=64,
                  VARLEN=cu_q is not None, num_warps=4)


# the shortest walk (query rows) on which the Gluon backward beats the Triton kernels on the H200, by tile width
# and causal: 512 rows (bf16, backward kernels' GPU time a call, one program a key block: 527 us against 689 at
# head_dim 128 without causal, 450 against 494 causal, 641 against 707 at 64 without causal; at 64 causal 525
# against 509, and the counter's deal of causal blocks 0.933x one program a block's in a later run: about 490
# against 509); below 512 not timed
GLUON_ROWS = {(64, False): 512, (64, True): 512, (128, False): 512, (128, True): 512, (256, False): 512,
              (256, True): 512}
# the same when deterministic, against the Triton kernels' separate dQ pass (bf16, backward kernels' GPU time a call):
# at head_dim 128 from 512 rows (613 us against 694 without causal, 491 against 493 causal; at 1k 927 against 1167
# and 660 against 752), at 64 from 1k (1086 against 1250, 780 against 873; at 512 703 against 710, 575 against 558)
GLUON_ROWS_DETERMINISTIC = {(64, False): 1024, (64, True): 1024, (128, False): 512, (128, True): 512,
                            (256, False): 512, (256, True): 512}


def kernel(prob, q, k, v, do, layout: str, alibi, deterministic: bool = False, rows: int | None = None) -> str:
    """Which backward runs: ``"hopper"`` (the Gluon kernel, :mod:`fmha.kernels.hopper.backward`) where it
    takes the call and measured faster (:data:`GLUON_ROWS`, :data:`GLUON_ROWS_DETERMINISTIC`, by tile width and
    causal) on walks of ``rows`` query rows (seqlen_q; packed, the longest sequence's), else ``"triton"``
    (:mod:`fmha.kernels.backward`, which alone reads an attn_mask and draws attention dropout)."""
    if interpreting() or not q.is_cuda or prob.attn_mask or prob.dropout:
        return "triton"
    from .kernels.hopper import backward as hopper
    if hopper.supports(prob, q, k, v, do, layout, alibi_kind(alibi)):
        return "triton"
    least = (GLUON_ROWS_DETERMINISTIC if deterministic else GLUON_ROWS)[hopper.tile_width(prob.head_dim), prob.causal]
    return "hopper" if least is not None and (prob.seqlen_q if rows is None else rows) >= least else "triton"


def describe(q, k, v, *, causal: bool = False, layout: str = "bhsd", deterministic: bool = False,
             window=(-1, -1), softcap: float = 0.0, alibi_slopes=None, dropout_p: float = 0.0) -> str:
    """Which backward :func:`dense` runs for these q, k, v (and modifiers) and its tiles, in words (the ledger's
    config of a backward row)."""
    prob = planning.problem(*planning.sizes(q, k, layout), causal=causal, scale=None, window=window,
                            softcap=softcap, head_dim_v=v.shape[3], dropout=dropout_p > 0)
    order = ", deterministic" if deterministic else ""
    if kernel(prob, q, k, v, q, layout, alibi_slopes, deterministic) == "hopper":
        from .kernels.hopper import backward as hopper
        cut = hopper.cut_of(prob, deterministic)
        return (f"hopper backward BLOCK_M={cut.rows} BLOCK_N={cut.block_n} stages={cut.stages} "
                f"ds_bufs={cut.ds_bufs} rs={int(cut.rs)} dq_rows={cut.dq_rows} dq_cols={cut.dq_cols}"
                f"{' dk_dv in column halves' if cut.cols else ''}{' early_free' if cut.early_free else ''}"
                f"{f' v_tiles={cut.head_v}' if cut.head_v else ''}{order}")
    kv_tiles, q_tiles = tiles(max(prob.head_dim, prob.dv), prob.causal, deterministic, family_of(q.device),
                              _shared(q.device), dropout=prob.dropout, head_dim_v=prob.dv)

    def shape(t):
        chunks = f" qk_chunks={t['QK_CHUNKS']}" if t["QK_CHUNKS"] else ""
        halves = " in column halves" if t.get("HALVES") else ""
        return f"{t['BLOCK_M']}x{t['BLOCK_N']} warps={t['num_warps']} stages={t['num_stages']}{chunks}{halves}"
    dq = f"dQ {shape(q_tiles)}" if q_tiles else "dQ added atomically"
    return f"triton backward dK/dV {shape(kv_tiles)}, {dq}{order}"


def _delta(prob, o, do, lse, layout, cu_q, rows, delta=None, lse_out=None):
    """``delta`` (float32, laid out as the LSE, into ``delta`` if given: its heads' rows may lie further apart):
    the row sums of dO * O.  ``lse_out`` (packed): delta and a copy of the LSE beside it laid out for the Gluon
    backward's TMA (:func:`fmha.kernels.backward.stats_row`)."""
    delta = replay.buffer(torch.empty_like(lse)) if delta is None else delta
    so, sg = (list(strides_bhsd(t, layout)[:3]) for t in (o, do))
    if prob.varlen:
        so[0] = sg[0] = 0
    replay.launch(kernels.delta_kernel, (triton.cdiv(rows, 64), prob.batch * prob.heads),
                  o, do, delta, *so, *sg, prob.heads, prob.seqlen_q, delta.stride(-2), cu_q, lse,
                  delta if lse_out is None else lse_out, lse.stride(-2), HEAD_DIM=prob.dv, BLOCK_D=prob.block_dv,
                  BLOCK_M=64, VARLEN=prob.varlen, ALIGNED=lse_out is not None, num_warps=4)
    return delta


def _hopper(prob, do, q, k, v, o, lse, dk, dv, layout, alibi, sinks, deterministic, seqs, rows, keys):
    """The Gluon backward: dK, dV in place, dQ through its float32 buffer (its adds in one order when
    ``deterministic``), cast into q's layout.  Packed (``prob.varlen``): ``seqs`` the cu_seqlens, ``rows`` and
    ``keys`` the longest sequence's."""
    from .kernels.hopper import backward as hopper
    strides = {name: list(strides_bhsd(t, layout)[:3]) for name, t in (("dk", dk), ("dv", dv))}
    packed = None
    if prob.varlen:  # one sequence of every row; sequence b from cu_seqlens, not a batch stride
        packed = (*seqs[:2], rows, keys)
        for st in strides.values():
            st[0] = 0
    with on(q.device):
        if packed:  # the LSE and delta of each sequence from a row 16 bytes apart, for their TMA boxes
            stats = replay.buffer(torch.empty(2, prob.heads, hopper.packed_stats_rows(prob), dtype=torch.float32,
                                              device=q.device))
            delta = _delta(prob, o, do, lse, layout, seqs[0], rows, stats[1], lse_out=stats[0])
            lse = stats[0]
        else:
            padded = replay.buffer(torch.empty(*lse.shape[:-1], hopper.stats_rows(prob.seqlen_q),
                                               dtype=torch.float32, device=q.device))
            delta = _delta(prob, o, do, lse, layout, lse, rows, padded[..., :prob.seqlen_q])
        acc = hopper.launch(prob, q, k, v, do, lse, delta, dk, dv, layout, strides,
                            lambda shape, dtype: _zeros(shape, dtype, q.device), deterministic, packed, alibi)
        dq = replay.buffer(torch.empty_like(q, memory_format=torch.contiguous_format))
        dst = list(strides_bhsd(dq, layout)[:3])
        if packed:
            dst[0] = 0
        _cast(acc, (0 if packed else prob.heads * acc.stride(0), acc.stride(0), acc.stride(1)), dq, dst, prob.batch,
              prob.heads, rows, prob.head_dim, seqs[0] if packed else None, hopper.dq_gap(prob, deterministic))
    return dq, dk, dv, None if sinks is None else sink_grad(sinks, lse, delta)


def _run(prob, do, q, k, v, o, lse, layout, alibi, seqs, rows, keys, sinks, deterministic, attn_mask=None,
         mask_grad=False, dropout=None):
    """The launches over ``rows`` query rows and ``keys`` keys per sequence (the longest, when
    packed); the sinks' gradient from ``delta`` (:mod:`fmha.sinks`); with ``mask_grad`` the attn_mask's, each
    score's ``dZ`` stored by the dQ kernel.  Returns ``(dq, dk, dv, dsinks or None, dmask or None)``."""
    do, q, k, v, o = (_unit_last(t) for t in (do, q, k, v, o))
    dk, dv = (replay.buffer(torch.empty_like(t, memory_format=torch.contiguous_format)) for t in (k, v))
    if 0 in (prob.batch, prob.heads, rows, keys) or q.numel() == 0:
        return (torch.zeros_like(q, memory_format=torch.contiguous_format), dk.zero_(), dv.zero_(),
                None if sinks is None else torch.zeros_like(sinks),
                torch.zeros(attn_mask.shape, dtype=torch.float32, device=q.device) if mask_grad else None)
    # (packed with sinks on the Triton kernels: the sinks' gradient reads delta laid out as the forward's LSE)
    if (kernel(prob, q, k, v, do, layout, alibi, deterministic, rows) == "hopper"
            and not (prob.varlen and sinks is not None)):
        return (*_hopper(prob, do, q, k, v, o, lse, dk, dv, layout, alibi, sinks, deterministic, seqs, rows, keys),
                None)
    # a bias's gradient comes from the dQ pass, which visits each score of the band once (deterministic's tiles)
    kv_tiles, q_tiles = tiles(max(prob.head_dim, prob.dv), prob.causal, deterministic or mask_grad,
                              family_of(q.device), _shared(q.device), prob.attn_mask, prob.dropout, prob.dv)
    atomic = q_tiles is None
    # atomically: a float32 dQ the key blocks add into, cast once at the end
    with on(q.device):
        dq = (_zeros(q.shape, torch.float32, q.device) if atomic
              else replay.buffer(torch.empty_like(q, memory_format=torch.contiguous_format)))
    cu_q, cu_k, seqused = (t if t is not None else lse for t in seqs)
    strides = {name: list(strides_bhsd(t, layout)[:3]) for name, t in
               (("q", q), ("k", k), ("v", v), ("do", do), ("o", o), ("dq", dq), ("dk", dk), ("dv", dv))}
    if prob.varlen:  # the batch index picks a sequence through cu_seqlens, not a stride
        for st in strides.values():
            st[0] = 0
    a = prob.align_offset  # the kernels add each sequence's own diagonal back
    band = (prob.causal_offset - a, (prob.window_offset or 0) - a, 0, prob.scale_log2, prob.softcap or 1.0,
            alibi.contiguous() if alibi is not None else lse, cu_q, cu_k, seqused)
    flags = dict(HEAD_DIM=prob.head_dim, BLOCK_D=prob.block_d, CAUSAL=prob.causal,
                 WINDOW=prob.window_offset is not None, SOFTCAP=prob.softcap > 0, ALIBI=alibi_kind(alibi),
                 VARLEN=prob.varlen, SEQUSED=prob.seqused, ALIGN_BR=prob.align_br, HEAD_V=prob.dv,
                 BLOCK_DV=prob.block_dv, **mask_args(attn_mask, lse),
                 **dropout_args(dropout))
    group = prob.heads // prob.kv_heads
    with on(q.device):
        delta = _delta(prob, o, do, lse, layout, cu_q, rows)
        dmask = _zeros(attn_mask.shape, torch.float32, q.device) if mask_grad else None
        sizes = (prob.heads, group, prob.seqlen_q, prob.seqlen_k)
        programs = 2 if kv_tiles.get("HALVES") else 1  # a key block's
        replay.launch(kernels.dkdv_kernel, (triton.cdiv(keys, kv_tiles["BLOCK_N"]) * programs,
                                            prob.batch * prob.kv_heads),
                      q, k, v, do, lse, delta, dk, dv, dq, *strides["q"], *strides["k"], *strides["v"],
                      *strides["do"], *strides["dk"], *strides["dv"], *strides["dq"], *sizes, *band, **flags,
                      **kv_tiles, ATOMIC_DQ=atomic)
        if not atomic:
            replay.launch(kernels.dq_kernel, (triton.cdiv(rows, q_tiles["BLOCK_M"]), prob.batch * prob.heads),
                          q, k, v, do, lse, delta, dq, *strides["q"], *strides["k"], *strides["v"], *strides["do"],
                          *strides["dq"], *sizes, *band, **flags, **q_tiles, DMask=lse if dmask is None else dmask,
                          MASK_GRAD=mask_grad)
        else:
            acc, dq = dq, replay.buffer(torch.empty_like(q, memory_format=torch.contiguous_format))
            seq = 2 if layout == "bhsd" else 1  # (packed: one sequence of every row, as the tensors lie)
            _cast(acc, strides_bhsd(acc, layout)[:3], dq, strides_bhsd(dq, layout)[:3], q.shape[0], prob.heads,
                  q.shape[seq], prob.head_dim)
    return dq, dk, dv, None if sinks is None else sink_grad(sinks, lse, delta), dmask
