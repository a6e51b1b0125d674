"""How a ``(batch, head, seq, dim)`` tensor of any strides is read and written by TMA.

A TMA descriptor is a strided box over global memory: its last dimension unit-stride, every other
stride a multiple of 16 bytes.  The kernels address Q and O as one 2-D matrix (rows, columns) and
K and V as a 3-D one (a first index, key rows, columns), and put (batch, head) into those
coordinates with three integers each.  The views below derive the matrix and the three integers
from the tensor's real strides, so contiguous bhsd and bshd, transformers' transposed views,
slices of a fused qkv projection and a KV cache with spare capacity all read in place.

Two placements of the heads exist: along the rows (or K/V's first index), when a head's stride is a
multiple of a sequence row's (bhsd-like storage), or along the columns, when the heads of one
sequence row lie side by side within it (bshd-like storage).  The batch stride must then be a
multiple of the row stride (of the head stride, for K/V with heads along the first index).  A
layout that meets neither is not described, and :func:`reason` says why.  The ``tiled`` kernel's K/V
descriptors are these views; the Gluon kernel's are one rank higher (:func:`exact`), heads side by
side becoming a leading index, so that a box padded past head_dim reads zeros.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class View:
    """A descriptor's ``shape`` and ``strides`` over the tensor's storage (elements), and how batch
    ``b`` and head ``h`` place a tile: rows (Q/O) or first index (K/V) ``b * batch + h * head``,
    columns ``h * col``."""
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    batch: int
    head: int
    col: int


def _sizes_strides(shape, st, layout: str):
    """(b, h, s, d) and their strides, the stride of a dimension of size 1 set to 0 (it never moves).  A
    stride of 0 elsewhere is a broadcast (``expand``): a batch or head index that does not move."""
    order = (0, 1, 2, 3) if layout == "bhsd" else (0, 2, 1, 3)
    sizes = tuple(shape[i] for i in order)
    strides = tuple(st[i] if shape[i] > 1 else 0 for i in order)
    return sizes, strides


def _rows_step(s: int, ss: int, sd: int, d: int) -> bool:
    """Whether a sequence's rows and a row's columns are what a TMA box steps through: head_dim unit-stride, and
    one row after another (a sequence broadcast from one row, stride 0, would be read as the rows after it)."""
    return (d == 1 or sd == 1) and (s == 1 or ss != 0)


def _multiple(a: int, b: int) -> bool:
    return b > 0 and a % b == 0


def _views(view):
    """``view(t, layout)`` over a pure function of what it reads of ``t`` (shape, strides, element size, whether
    the pointer is 16-byte aligned), memoized: a call's plan and launch ask for the same views."""
    cached = functools.lru_cache(maxsize=1024)(view)

    def of(t: torch.Tensor, layout: str) -> View | None:
        return cached(tuple(t.shape), t.stride(), t.element_size(), t.data_ptr() % 16 == 0, layout)
    of.__doc__ = view.__doc__
    return of


@_views
def rows_view(shape, st, size: int, aligned: bool, layout: str) -> View | None:
    """Q or O as the 2-D matrix ``[rows, columns]``; None if its strides do not allow one."""
    (b, h, s, d), (sb, sh, ss, sd) = _sizes_strides(shape, st, layout)
    if not _rows_step(s, ss, sd, d):
        return None
    row = ss or sh or sb or d  # a row's stride: a sequence position's, else whatever moves next
    if row < d or not _multiple(sb, row) and sb:
        return None
    if _multiple(sh, row) or not sh:  # heads along the rows
        rb, rh, ch = sb // row, sh // row, 0
    elif sh >= d and (h - 1) * sh + d <= row:  # heads side by side within a row
        rb, rh, ch = sb // row, 0, sh
    else:
        return None
    if not (aligned and row * size % 16 == 0 and ch * size % 16 == 0):  # (a head's first column: boxes start
        return None  # on 16 bytes)
    shape = ((b - 1) * rb + (h - 1) * rh + s, (h - 1) * ch + d)
    return View(shape, (row, 1), rb, rh, ch)


@_views
def kv_view(shape, st, size: int, aligned: bool, layout: str) -> View | None:
    """K or V as the 3-D tensor ``[first, seqlen, columns]`` (a box past seqlen is filled with zeros,
    never the next head's keys); None if its strides do not allow one."""
    (b, h, s, d), (sb, sh, ss, sd) = _sizes_strides(shape, st, layout)
    if not _rows_step(s, ss, sd, d):
        return None
    row = ss or max(d, 8)  # one key: any aligned stride does, past it is outside the view
    if h > 1 and 0 < sh < row and sh >= d and (h - 1) * sh + d <= row:  # heads side by side within a row
        first, fb = (sb, 1) if sb else (row * s, 0)  # (a batch broadcast from one: one first index for all)
        shape, strides, fh, ch = ((b - 1) * fb + 1, s, (h - 1) * sh + d), (first, row, 1), 0, sh
    else:  # heads along the first index
        first = sh or sb or row * s
        if sb and not _multiple(sb, first):
            return None
        fb, fh = sb // first, 1 if sh else 0
        shape, strides, ch = ((b - 1) * fb + (h - 1) * fh + 1, s, d), (first, row, 1), 0
    if row < d or not (aligned and all(x * size % 16 == 0 for x in (first, row, ch))):
        return None
    return View(shape, strides, fb, fh, ch)


def exact(t: torch.Tensor, view: View, layout: str) -> tuple[list[int], list[int]]:
    """``view`` (of :func:`rows_view` or :func:`kv_view`) as a descriptor one rank higher whose last
    dimension is exactly head_dim: the heads that lie side by side within a row get a leading
    dimension of their own (of size 1 where heads lie along the rows), so a box wider than head_dim
    (a head_dim padded to a power of two) reads zeros past it and writes nothing there.  (shape,
    strides); a tile of head ``h`` starts at ``h`` along the leading dimension when ``view.col``,
    else at 0."""
    h, d = _sizes_strides(t.shape, t.stride(), layout)[0][1::2]
    lead = (h, view.col) if view.col else (1, view.strides[0])  # (any aligned stride for a dimension of one)
    return [lead[0], *view.shape[:-1], d], [lead[1], *view.strides[:-1], 1]


def reason(tensors, layout: str, kv_layout: str | None = None, exact: bool = False) -> str | None:
    """None if TMA can read ``q, k, v, out`` in place, else why not (``exact``: through :func:`exact`'s
    descriptors)."""
    q, k, v, o = tensors
    kv_layout = kv_layout or layout
    for name, t, view in (("q", q, rows_view), ("k", k, kv_view), ("v", v, kv_view), ("out", o, rows_view)):
        if view(t, kv_layout if name in "kv" else layout) is None:
            return (f"{name} with strides {tuple(t.stride())}: TMA needs a unit-stride last dimension, 16-byte "
                    f"aligned pointer and strides, and heads either along the rows or side by side within one")
    return kv_reason(k, v, kv_layout, exact)


def kv_reason(k: torch.Tensor, v: torch.Tensor, layout: str, exact: bool = False) -> str | None:
    """None if K and V have views that place (batch, head) alike (the kernels compute one place for both;
    through :func:`exact`'s descriptors a head side by side in a row is a leading index, whatever its
    column stride, so K and V of different head dims place theirs alike)."""
    kw, vw = kv_view(k, layout), kv_view(v, layout)
    if kw is None or vw is None:
        return "K/V by TMA need a unit-stride head_dim, 16-byte aligned pointers and strides"
    if (kw.batch, kw.head, bool(kw.col) if exact else kw.col) != (vw.batch, vw.head, bool(vw.col) if exact else vw.col):
        return f"k and v place their heads differently (strides {tuple(k.stride())} and {tuple(v.stride())})"
    return None
