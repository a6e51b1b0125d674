"""Work items: which (query block, batch, head) each persistent program takes next, on the device
(:func:`_work`, :func:`_tile`, causal items in pairs of equal cost, the last round in pieces), and the
host-built list behind the causal tail (by LPT); packed sequences' list is built on the device (:mod:`.worklist`)."""
from __future__ import annotations

import heapq

import numpy as np
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl



@gluon.jit
def _n_items(n_tiles, pieces, Items, PAIRED: gl.constexpr, VARLEN: gl.constexpr, SPLIT: gl.constexpr,
             BALANCE: gl.constexpr):
    """How many work items this program runs: items ``pid, pid + num_programs, ...``, or,
    PAIRED, pairs ``pid, pid + num_programs, ...`` of two items each (the last item alone
    when ``n_tiles`` is odd), or, BALANCE, the whole rounds of pairs but the last one or two
    (``Items[0]`` items) and then its list of the rest (:func:`balanced_tail`), or, VARLEN, one
    item of each round of ``num_programs`` (the last round may be short: its first items in an
    even round, its last in an odd one), or, SPLIT, the whole rounds and then its share of the
    last round's items cut in ``pieces`` (:func:`_work`)."""
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    if SPLIT:
        n = n_tiles // nprog + (n_tiles % nprog * pieces - pid + nprog - 1) // nprog
    elif VARLEN:  # the work list says how many items it holds
        n_tiles = gl.load(Items)
        rounds = n_tiles // nprog
        rest = n_tiles % nprog
        mine = gl.where(rounds % 2 == 0, pid < rest, pid >= nprog - rest)
        n = rounds + mine.to(gl.int32)
    elif BALANCE:
        n = gl.load(Items) + gl.load(Items + 2 + pid) - gl.load(Items + 1 + pid)
    elif PAIRED:
        n_pairs = (n_tiles + 1) // 2
        mine = (n_pairs - pid + nprog - 1) // nprog
        n = 2 * mine - ((n_tiles % 2 == 1) & (pid + (mine - 1) * nprog == n_pairs - 1)).to(gl.int32)
    else:
        n = (n_tiles - pid + nprog - 1) // nprog
    return n


@gluon.jit
def _work(k, n_tiles, pieces, Items, PAIRED: gl.constexpr, VARLEN: gl.constexpr, SPLIT: gl.constexpr,
          BALANCE: gl.constexpr):
    """This program's ``k``-th work item -> (item number, piece): :func:`_tile` places the number.
    The piece is -1 for a whole item.  SPLIT: when the items do not fill the last round of
    ``num_programs``, that round's items are cut into ``pieces`` runs of key tiles each
    (:func:`_piece`), dealt out like items, so the programs end within a piece of each other
    instead of a whole item; each piece leaves its partial result to be merged by its LSE.
    BALANCE (PAIRED): past the program's ``Items[0]`` items of whole pair rounds, its own list."""
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    part = -1
    if VARLEN:
        g = k * nprog + gl.where(k % 2 == 0, pid, nprog - 1 - pid)
    elif PAIRED:
        g = 2 * (pid + (k // 2) * nprog) + k % 2
        if BALANCE:
            lead = gl.load(Items)
            if k >= lead:
                g = gl.load(Items + nprog + 2 + gl.load(Items + 1 + pid) + k - lead)
    else:
        g = pid + k * nprog
    if SPLIT:
        full = n_tiles // nprog * nprog
        j = g - full  # this piece's number among the last round's
        if j >= 0:
            g = full + j // pieces
            part = j % pieces
    return g, part


@gluon.jit
def _piece(first, n_iters, part, pieces, SPLIT: gl.constexpr):
    """Piece ``part`` of ``pieces`` of the key tiles ``[first, first + n_iters)`` (all of them
    when ``part`` is -1)."""
    if SPLIT:
        if part >= 0:
            lo = part * n_iters // pieces
            first = first + lo
            n_iters = (part + 1) * n_iters // pieces - lo
    return first, n_iters


@gluon.jit
def _tile(g, n_m, n_bh, head_group, Items, heads, rank, CAUSAL: gl.constexpr, PAIRED: gl.constexpr,
          VARLEN: gl.constexpr, CLUSTER: gl.constexpr):
    """Work item number ``g`` (:func:`_work`) -> (query block, batch*head).  Items are numbered
    in groups of ``head_group`` heads, query block by query block within a group (head-major
    when 1), so the items running together share a few heads' K/V in L2 without every
    program reading the same tile at once.  Causal items differ in length: one program per
    item takes each block's longest first; PAIRED (persistent causal), a head's items are
    numbered longest, shortest, second longest, ... and a program runs them two by two, so
    every pair costs the same (``n_m + 1`` key tiles, or ``n_m`` across a head boundary) and
    the programs stay balanced; PAIRED 2, the pairs are numbered pair by pair across ``head_group``
    heads (which takes an even ``n_m``: every pair within one head).  VARLEN: packed sequences differ in length, so a
    list built on the device holds every query block that has rows, longest first (:mod:`.worklist`,
    ``(b << 16) | block`` after its count, the heads of each block numbered in turn) and the programs deal the items out
    snake-wise, round by round (forward, then backward), so each program's rounds add up to
    about the same work and none is spent on blocks past a sequence's end.  CLUSTER: an item is
    two neighbouring query blocks, one for each CTA of the cluster (``rank``)."""
    if VARLEN:
        entry = gl.load(Items + 1 + g // heads)
        pid_m = entry & 0xFFFF
        bh = (entry >> 16) * heads + g % heads
    elif PAIRED == 2:  # pairs across head_group heads
        first = g // (n_m * head_group) * head_group  # the group's first head
        r = g - first * n_m
        width = gl.minimum(head_group, n_bh - first)
        w = 2 * (r // 2 // width) + r % 2  # the item's place in its head's longest, shortest, ... order
        pid_m = gl.where(w % 2 == 0, n_m - 1 - w // 2, w // 2)
        bh = first + r // 2 % width
    elif PAIRED:
        w = g % n_m
        pid_m = gl.where(w % 2 == 0, n_m - 1 - w // 2, w // 2)
        bh = g // n_m
    else:
        first = g // (n_m * head_group) * head_group  # the group's first head
        r = g - first * n_m
        width = gl.minimum(head_group, n_bh - first)  # the last group may be narrower
        pid_m = r // width
        bh = first + r % width
        if CAUSAL:
            pid_m = n_m - 1 - pid_m
        if CLUSTER:
            pid_m = 2 * pid_m + rank
    return pid_m, bh


ITEM_COST = 3  # what a work item or piece costs beyond its key tiles, in key tiles (its Q load and first


def item_rows(cfg) -> int:
    """Query rows of one work item: a block, or with ``cluster`` two neighbouring blocks (one a CTA)."""
    return cfg.block_m * (2 if cfg.cluster else 1)


def split_pieces(prob, cfg, n_tiles: int, programs: int, out_bytes: int) -> int:
    """How many pieces ``launch`` cuts each item of the last round into (1: none): with
    ``cfg.split_tail``, persistent and non-causal without a window or lengths per sequence (items
    of one cost), and a float32 workspace of pieces x the last round's rows no larger than the
    output (``out_bytes``): the split never more than doubles what the call allocates; and a head
    dim of its own tile width, q/k's and v's alike (the merge reads whole rows)."""
    if not cfg.split_tail or cfg.persistent == 0 or prob.causal or prob.window_offset is not None \
            or per_sequence(prob) or prob.head_dim_v or prob.head_dim & (prob.head_dim - 1) or prob.head_dim < 64:
        return 1
    rest_bytes = n_tiles % programs * item_rows(cfg) * prob.head_dim * 4
    return tail_pieces(n_tiles, programs, -(-prob.seqlen_k // cfg.block_n),
                       out_bytes // rest_bytes if rest_bytes else 1)


def tail_pieces(n_tiles: int, programs: int, key_tiles: int, max_pieces: int = 16) -> int:
    """Into how many pieces (runs of key tiles) to cut each item of the last, partly filled round
    of ``programs`` (1: none).  Whole items end the run a whole item's time after the programs
    with one item fewer; ``k`` pieces each end it ``ceil(k * rest / programs)`` pieces later, a
    piece costing its share of the ``key_tiles`` plus :data:`ITEM_COST`; pieces of two tiles
    at least, ``max_pieces`` (at most 16) at most."""
    rest = n_tiles % programs
    best, cost = 1, key_tiles
    for k in range(2, min(16, max_pieces, key_tiles // 2) + 1):
        c = -(-k * rest // programs) * (key_tiles / k + ITEM_COST)
        if rest and c < cost:
            best, cost = k, c
    return best


def block_tiles(start, seqlen_k, causal_offset: int, window_offset: int, block_m: int, block_n: int,
                causal: bool, window: bool):
    """:func:`_key_tiles`'s count on the host: the key tiles of the query blocks at rows ``start``
    (arrays, or ints) against ``seqlen_k`` keys."""
    stop = seqlen_k
    if causal:
        stop = np.minimum(seqlen_k, np.maximum(start + block_m + causal_offset, 0))
    end = np.maximum(-(-stop // block_n), 1)
    first = 0
    if window:
        first = np.minimum(np.maximum(start + window_offset, 0) // block_n, end - 1)
    return end - first


def paired_item(g, n_m: int, n_bh: int, head_group: int = 1):
    """:func:`_tile`'s PAIRED numbering on the host: item ``g`` -> (its query block, its batch*head); a head's
    blocks longest, shortest, second longest, ..., the pairs numbered across ``head_group`` heads."""
    first = g // (n_m * head_group) * head_group
    r = g - first * n_m
    width = np.minimum(head_group, n_bh - first)
    w = 2 * (r // 2 // width) + r % 2
    return np.where(w % 2 == 0, n_m - 1 - w // 2, w // 2), first + r // 2 % width


def balanced_tail(n_m: int, n_bh: int, programs: int, tiles, head_group: int = 1) -> np.ndarray:
    """The BALANCE schedule of paired causal items (:func:`_tile`'s numbering, ``n_m`` blocks of
    ``n_bh`` heads, ``tiles[j]`` key tiles for block ``j``), int32: ``[lead, offsets (programs + 1),
    lists]``.  Every program first runs ``lead`` items as whole rounds of pairs (all the rounds but
    the last one or two, so a head's items still run together); the rest, 2 to 4 rounds' worth of
    items, go longest first to the least loaded program (LPT), each costing its key tiles plus
    :data:`ITEM_COST`, and program ``p`` then runs ``lists[offsets[p]:offsets[p + 1]]``.  Pairs
    alone end a round of pairs apart when the pairs do not fill the last round (2048 pairs on 132
    programs: 15.5 rounds); this ends within about an item of the mean."""
    n_tiles = n_m * n_bh
    lead = 2 * max((n_tiles + 1) // 2 // programs - 1, 0)
    g = np.arange(lead * programs, n_tiles)
    cost = np.asarray(tiles)[paired_item(g, n_m, n_bh, head_group)[0]] + ITEM_COST
    loads = [(0, p) for p in range(programs)]
    lists = [[] for _ in range(programs)]
    for i in np.argsort(-cost, kind="stable"):
        load, p = heapq.heappop(loads)
        lists[p].append(g[i])
        heapq.heappush(loads, (load + cost[i], p))
    offsets = np.cumsum([0] + [len(x) for x in lists])
    return np.concatenate([[lead], offsets, *lists]).astype(np.int32)


_SCHEDULES: dict = {}  # (device, shape) -> balanced_tail's list on the device


def _schedule(device, n_m: int, n_bh: int, programs: int, block_m: int, block_n: int, seqlen_k: int,
              causal_offset: int, head_group: int = 1, build: bool = True) -> torch.Tensor | None:
    """:func:`balanced_tail` on ``device``, kept for the next call of the same shape; None where it is not kept yet
    and ``build`` is false: a call that may keep nothing past its end (``replay.holding``) must not leave it in a
    CUDA graph's memory pool (cudagraph trees refuse a live block there that no graph owns), and a stream being
    captured cannot copy it from the host."""
    key = (device, n_m, n_bh, programs, block_m, block_n, seqlen_k, causal_offset, head_group)
    items = _SCHEDULES.get(key)
    if items is None and build:
        if len(_SCHEDULES) >= 64:
            _SCHEDULES.clear()
        tiles = block_tiles(np.arange(n_m) * block_m, seqlen_k, causal_offset, 0, block_m, block_n, True, False)
        items = _SCHEDULES[key] = torch.from_numpy(balanced_tail(n_m, n_bh, programs, tiles, head_group)).to(device)
    return items


def per_sequence(prob) -> bool:
    """Whether the lengths differ by sequence (packed sequences, or per-batch key lengths)."""
    return prob.varlen or prob.seqused
