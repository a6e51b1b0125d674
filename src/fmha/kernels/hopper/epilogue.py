"""The end of an item or piece: O and the LSE stored (staged through shared memory by TMA, or from
registers), or a piece's partial for the merge."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .cluster import _store
from .softmax import _lse


@gluon.jit
def _store_piece(acc, l, m, PieceO, PieceLSE, Rows, g, part, n_tiles, dest0, row0, sq, rank, o_layout: gl.constexpr,
                 row_layout: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_V: gl.constexpr, WG: gl.constexpr,
                 CLUSTER: gl.constexpr):
    """Piece ``part`` of item ``g`` (:func:`_work`), its rows ``acc`` already over ``l``: float32
    ``PieceO[part, item * BLOCK_M + r, :]`` and the LSE ``PieceLSE[part, item * BLOCK_M + r]``, ``item`` being
    ``g``'s place among the last round's items; piece 0 also writes where row ``r`` goes in the
    output's (batch*head, row) order, ``Rows[item * BLOCK_M + r]`` (``dest0 + r``, or -1 past the
    ``sq`` rows).  The merge after the kernel (``kernels/combine.py``) reads them.  CLUSTER: an item
    has ``2 * BLOCK_M`` rows, this CTA's from ``rank * BLOCK_M``."""
    nprog = gl.num_programs(0)
    item = g - n_tiles // nprog * nprog
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, HEAD_V, layout=gl.SliceLayout(0, o_layout))
    UNIT: gl.constexpr = 2 * BLOCK_M if CLUSTER else BLOCK_M
    w_row = (part * (n_tiles % nprog) + item) * UNIT + rank * BLOCK_M + WG * 64
    _store(PieceO + (w_row + rows).to(gl.int64)[:, None] * HEAD_V + cols[None, :], acc, None, CLUSTER)
    r = gl.arange(0, 64, layout=row_layout)
    _store(PieceLSE + w_row + r, _lse(m, l), None, CLUSTER)
    if part == 0:
        _store(Rows + item * UNIT + rank * BLOCK_M + WG * 64 + r, gl.where(row0 + r < sq, dest0 + r, -1), None,
               CLUSTER)
