"""The online softmax on a warpgroup's registers: the pivot (exact, lazy, or standing with its vote),
P narrowed for P V, the fence that keeps the exponentials under P V, the lazy rescale of O, the LSE."""
from __future__ import annotations

import struct

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ...constants import LN2 as LN2_VALUE


LN2 = gl.constexpr(LN2_VALUE)


@gluon.jit
def _narrow(x, dtype: gl.constexpr):
    """``x.to(dtype)`` for float32 ``x``, 16-bit types two values at a time: one packed ``cvt.rn`` per pair (the
    default lowering converts them one by one, and the pairs come out with their halves swapped,
    a byte permute each to put back); float8 four at a time, two pairs packed into one register as the
    operand's register holds them."""
    if dtype == gl.bfloat16:
        return gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=gl.bfloat16,
                                         is_pure=True, pack=2)
    elif dtype == gl.float8e4nv:  # FP8's P, up to 256 (the pivot's shift), rounded to float8 (saturating)
        return gl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; "
            "mov.b32 $0, {lo, hi}; }", "=r,r,r,r,r", [x], dtype=gl.float8e4nv, is_pure=True, pack=4)
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


@triton.constexpr_function
def _rescale_asm(values):
    """PTX for one thread's ``values`` accumulator registers (``$0..``, tied to the inputs) times
    their row's alpha (``$2v..``): a branch over the multiplications when both of the thread's rows
    (elements 0 and 2 of each group of 4 in the wgmma accumulator layout) have alpha 1."""
    a = 2 * values
    muls = " ".join(f"mul.f32 ${i}, ${i}, ${a + i};" for i in range(values))
    return ("{ .reg .pred %p, %q; "
            f"setp.neu.f32 %p, ${a}, 0f3F800000; setp.neu.f32 %q, ${a + 2}, 0f3F800000; or.pred %p, %p, %q; "
            f"@!%p bra rescaled; {muls} rescaled: }}")


@triton.constexpr_function
def _rescale_constraints(values):
    return ",".join(["=f"] * values + [str(i) for i in range(values)] + ["f"] * values)


LAZY_GROWTH = gl.constexpr(8.0)  # log2 units: a stale pivot leaves probabilities of at most 2**8
# float8's P: its pivot sits 8 below the max already (P up to 2**8), so a pivot may lag by 0.75 more, P then up to
# 2**8.75 (430), below float8 e4m3's largest value (448)
LAZY_GROWTH_FP8 = gl.constexpr(0.75)


# STALE: a tile's row sum at most this (so each probability too) keeps the pivot; 2**15 < float16's largest
STALE_SUM = 2.0 ** 15


STALE_SUM_PTX = "0f" + struct.pack(">f", STALE_SUM).hex().upper()  # as a PTX float literal


@gluon.jit
def _rescale_lazy(acc, alpha, HEAD: gl.constexpr):
    """``acc * alpha`` (step 5.5), the multiplications skipped by each thread whose rows kept
    their pivot (FlashAttention-4's conditional rescale: with LAZY a row's pivot moves only
    when its max grows by more than LAZY_GROWTH, so most tiles leave every alpha at 1).  64 rows x ``HEAD``
    columns over a warpgroup: ``HEAD / 2`` values a thread, all in one asm block."""
    return gl.inline_asm_elementwise(_rescale_asm(HEAD // 2), _rescale_constraints(HEAD // 2), [acc, alpha],
                                     dtype=gl.float32, is_pure=True, pack=HEAD // 2)


@gluon.jit
def _lse(m, l):
    """Section 6's log-sum-exp of a row, natural log (``m`` in base-2 units), -inf for an empty row."""
    return gl.where(l == 0.0, float("-inf"), (m + gl.log2(l)) * LN2)


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
def _softmax(qk, m, scale_log2, MASKED: gl.constexpr, LAZY: gl.constexpr, SHIFT: gl.constexpr = 0.0):
    """Steps 5.2-5.4 of a key tile after the first: the row's new pivot from the tile's max, the
    tile's probabilities ``p`` and ``alpha``, the factor on what the old pivot summed.  ``SHIFT``: the
    pivot sits that far below the max, so ``p`` runs up to ``2**SHIFT`` (l and the LSE carry it alike)."""
    m_new = gl.maximum(m, gl.max(qk, axis=1) * scale_log2 - SHIFT)
    if LAZY:  # keep the old pivot unless the max grew past it by more than LAZY_GROWTH (float8's P: less)
        GROWTH: gl.constexpr = LAZY_GROWTH_FP8 if SHIFT > 0.0 else LAZY_GROWTH
        m_new = gl.where(m_new - m > GROWTH, m_new, m)
    m_safe = _pivot(m_new, MASKED)
    return gl.exp2(qk * scale_log2 - m_safe[:, None]), gl.exp2(m - m_safe), m_new


@gluon.jit
def _pivot(m, MASKED: gl.constexpr):
    """The exponent pivot: ``m``, or 0 for a row that has seen no visible key (m = -inf)."""
    if MASKED:
        m = gl.where(m == float("-inf"), 0.0, m)
    return m
