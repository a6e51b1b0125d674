"""What Gluon 3.6 cannot say for a padded head dim, said in the PTX: a product over its own columns.

Gluon's tensors are powers of two, so a V of 96 columns (or 192) runs in a tile of 128 (or 256), and P V's wgmma,
``m64n128k16``, spends a quarter of its work on the columns past 96, which hold TMA's zeros and are never stored; so
do the backward's dK, dV and dQ products past a padded head dim. The wgmma itself takes any multiple of 8 columns up
to 256 (FlashAttention-3 and -4 issue ``m64n96k16``). :func:`narrowed` brackets such a product (the forward's P V,
the backward's dK, dV and dQ) with two :func:`mark` (the first names the width); this pass, run on the PTX between
Triton's ``ptx`` and ``cubin`` stages (:mod:`.ptx_passes`), turns every wgmma between a pair into that width with
the first ``width / 2`` accumulator registers: a thread's accumulator registers run column group by column group
(four registers each 8 columns), so those are the columns the product keeps, and the rest hold what they held. V's
tile is read as before: its swizzle atoms run along the columns, and the narrower product stops within them. It
checks what it found (a wgmma it cannot read, an unpaired mark, a pair with nothing between), and the marks carry a
version so that a changed pass cannot meet a kernel cached under the old one.
"""
from __future__ import annotations

import re

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma

from . import ptx_passes

BEGIN = "// fmha.narrow-pv v1 n="
END = "// fmha.narrow-pv-end v1"

_WGMMA = re.compile(r"^(\s*)(@%p\d+ )?wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k(\d+)\.(\S+) \{([^}]*)\}, (.*)$")
_BEGIN = re.compile(re.escape(BEGIN) + r"(\d+)")


@gluon.constexpr_function
def mark(width):
    """The inline assembly before a product meant ``width`` columns wide, or (``width`` 0) after it."""
    return f"{BEGIN}{width}\n\tmov.u32 $0, 0;" if width else f"{END}\n\tmov.u32 $0, 0;"


@gluon.constexpr_function
def width(cols, tile):
    """The columns a product over ``cols`` real columns of a ``tile``-column operand runs over (P V over V's, the
    backward's dK, dV and dQ over theirs): ``cols`` rounded up to a multiple of 8 (the wgmma's step), or 0 where that
    is the whole tile (nothing to narrow)."""
    n = -(-cols // 8) * 8
    return n if n < tile else 0


@gluon.jit
def narrowed(a, b, acc, N: gl.constexpr, USE_ACC: gl.constexpr = True):
    """``a b`` into ``acc``, issued, over ``b``'s first N columns only (0: all of them): one wgmma that wide, between
    the two marks this pass reads; the accumulator's columns past N are left as they were."""
    if N:
        gl.inline_asm_elementwise(mark(N), "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    acc = warpgroup_mma(a, b, acc, use_acc=USE_ACC, is_async=True)
    if N:
        gl.inline_asm_elementwise(mark(0), "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    return acc


def rewrite(ptx: str) -> str:
    """The PTX with every wgmma between a pair of marks narrowed to the pair's width; PTX without marks
    unchanged."""
    if BEGIN not in ptx:
        return ptx
    lines = ptx.split("\n")
    cols = None  # inside a pair: its width
    inside = 0
    for i, line in enumerate(lines):
        m = _BEGIN.search(line)
        if m:
            if cols is not None:
                raise RuntimeError("narrow pass: a mark opened inside another")
            cols, inside = int(m.group(1)), 0
        elif END in line:
            if cols is None or not inside:
                raise RuntimeError("narrow pass: a closing mark without its opening, or nothing between")
            cols = None
        elif cols is not None and "wgmma.mma_async" in line:
            w = _WGMMA.match(line)
            if not w:
                raise RuntimeError(f"narrow pass: a wgmma it cannot read: {line.strip()}")
            indent, pred, n, k, types, acc, rest = w.groups()
            regs = [r.strip() for r in acc.split(",")]
            if not types.startswith("f32.") or len(regs) != int(n) // 2 or cols % 8 or not 8 <= cols <= int(n):
                raise RuntimeError(f"narrow pass: m64n{n} ({len(regs)} accumulator registers) to {cols}: "
                                   f"{line.strip()}")
            lines[i] = (f"{indent}{pred or ''}wgmma.mma_async.sync.aligned.m64n{cols}k{k}.{types} "
                        f"{{{','.join(regs[:cols // 2])}}}, {rest}")
            inside += 1
    if cols is not None:
        raise RuntimeError("narrow pass: a mark left open")
    return "\n".join(lines)


def install() -> None:
    """Run :func:`rewrite` on every build from now on (:mod:`.ptx_passes`)."""
    ptx_passes.install("narrow", rewrite)
