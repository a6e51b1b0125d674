"""Which keys a block of rows sees: its sequence's lengths, the key-tile range (the causal early exit and
the window's first tile), the tiles that need a mask (those crossing the diagonal, the ragged end or the window's
lower edge), and the scores with softcap, ALiBi and masks."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .softmax import LN2


@gluon.jit
def _sequence(b, seqlen_q, seqlen_k, CuQ, CuK, SeqK, VARLEN: gl.constexpr, SEQUSED: gl.constexpr,
              ALIGN_BR: gl.constexpr):
    """Batch ``b``'s sequence: (first query row, query rows, first key, keys, diagonal shift).
    VARLEN: packed sequence b, from ``cu_seqlens``; SEQUSED: the first ``seqused_k[b]`` keys.
    ALIGN_BR (with either): the band's offsets come relative to the diagonal and move by this
    sequence's ``keys - query rows`` (bottom-right); otherwise they are final (shift 0)."""
    q0 = 0
    k0 = 0
    sq = seqlen_q
    sk = seqlen_k
    if VARLEN:
        q0 = gl.load(CuQ + b)
        k0 = gl.load(CuK + b)
        sq = gl.load(CuQ + b + 1) - q0
        sk = gl.load(CuK + b + 1) - k0
    elif SEQUSED:
        sk = gl.minimum(gl.load(SeqK + b), seqlen_k)
    shift = 0
    if ALIGN_BR:
        shift = sk - sq
    return q0, sq, k0, sk, shift


@gluon.jit
def _key_tiles(start_m, seqlen_k, causal_offset, window_offset, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               CAUSAL: gl.constexpr, WINDOW: gl.constexpr):
    """(first key tile, number of key tiles) of the block at ``start_m``: Section 7's early exit
    after its last visible key and, WINDOW, the whole-tile skip before its first (at least
    one tile, fully masked if need be)."""
    stop = seqlen_k
    if CAUSAL:
        stop = gl.minimum(seqlen_k, gl.maximum(start_m + BLOCK_M + causal_offset, 0))
    end = gl.maximum((stop + BLOCK_N - 1) // BLOCK_N, 1)
    first = 0
    if WINDOW:
        first = gl.minimum(gl.maximum(start_m + window_offset, 0) // BLOCK_N, end - 1)
    return first, end - first


@gluon.jit
def _scores(qk, i, mask_from, window_until, offs_m, offs_n, seqlen_k, causal_offset, window_offset, align_offset,
            cap_in, cap_out, slope, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
            SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, RAGGED: gl.constexpr):
    """Step 5.2 on key tile ``i``, in raw ``q.k`` units (the caller scales by ``scale_log2``):
    :func:`_modified`'s softcap (``cap_in = scale / softcap``, ``cap_out = softcap / scale``) and ALiBi
    (``slope`` already over ``scale``), then -inf past the upper edge (tiles from ``mask_from``: those
    crossing it), which is the causal diagonal and, RAGGED, the last key (TMA reads zeros past seqlen_k),
    and before the window's lower edge (tiles before ``window_until``: those crossing it)."""
    cols = i * BLOCK_N + offs_n
    qk, _ = _modified(qk, offs_m[:, None], cols[None, :], align_offset, cap_in, cap_out, slope, SOFTCAP, ALIBI)
    if CAUSAL or RAGGED or WINDOW:
        if (i >= mask_from) | (i < window_until):  # one branch, one select per score for every edge
            qk = gl.where(_visible(cols, offs_m, seqlen_k, causal_offset, window_offset, CAUSAL, WINDOW, RAGGED), qk,
                          float("-inf"))
    return qk


@gluon.jit
def _modified(qk, rows, keys, align_offset, cap_in, cap_out, slope, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr):
    """Scores of query ``rows`` by ``keys`` (broadcast against each other) before any mask: softcap ``cap_out *
    tanh(cap_in * qk)``, then ALiBi ``- slope |row + align_offset - key|``; and SOFTCAP the cap's derivative ``1 -
    tanh^2`` that the backward's dS takes (a capped score's gradient with respect to the raw one), else 1."""
    dcap = 1.0
    if SOFTCAP:
        th = 1.0 - 2.0 / (gl.exp2((2.0 / LN2) * cap_in * qk) + 1.0)  # tanh via exp2
        qk = cap_out * th
        dcap = 1.0 - th * th
    if ALIBI:
        qk = qk - slope * gl.abs((rows + align_offset - keys).to(gl.float32))
    return qk, dcap


@gluon.jit
def _visible(cols, offs_m, seqlen_k, causal_offset, window_offset, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
             RAGGED: gl.constexpr):
    """Which keys ``cols`` each row ``offs_m`` sees: those up to the causal diagonal and, RAGGED, the last
    key; WINDOW, those from the window's lower edge."""
    if CAUSAL and RAGGED:
        keep = cols[None, :] <= gl.minimum(offs_m + causal_offset, seqlen_k - 1)[:, None]
    elif CAUSAL:
        keep = cols[None, :] <= offs_m[:, None] + causal_offset
    elif RAGGED:
        keep = cols[None, :] <= seqlen_k - 1
    if WINDOW:
        lower = cols[None, :] >= offs_m[:, None] + window_offset
        if CAUSAL or RAGGED:
            keep = keep & lower
        else:
            keep = lower
    return keep


@gluon.jit
def _mask_from(row0, seqlen_k, causal_offset, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, RAGGED: gl.constexpr):
    """The first key tile :func:`_scores` masks for rows from ``row0``: the first that crosses
    the causal diagonal and, RAGGED, at the latest the one that holds seqlen_k; tiles before it
    are visible to every row (a large number when nothing is masked)."""
    first = 1 << 30
    if CAUSAL:
        first = gl.maximum(row0 + causal_offset + 1, 0) // BLOCK_N
    if RAGGED:
        first = gl.minimum(first, seqlen_k // BLOCK_N)
    return first


@gluon.jit
def _window_until(row0, window_offset, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, WINDOW: gl.constexpr):
    """The first key tile wholly inside the window's lower edge for rows ``row0 .. row0 + ROWS - 1`` (its
    first key at or past the last row's edge): :func:`_scores` masks the window on the tiles before it only."""
    until = 0
    if WINDOW:
        until = (gl.maximum(row0 + ROWS - 1 + window_offset, 0) + BLOCK_N - 1) // BLOCK_N
    return until
