"""Context parallelism: ring attention over ``torch.distributed``.

Each rank holds a shard of the sequence (``q``, ``k``, ``v`` along the seq axis).
The K/V shards travel around the ring; each rank computes its queries against
every K/V shard with :func:`fmha.attention` (``return_lse=True``) and merges the
partial results with their log-sum-exp:

    lse = logaddexp(lse_a, lse_b),   o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b

which is the seed's Section 3 rescale applied to whole shards.  The next
shard's send/receive is posted before the current shard's compute, so
communication overlaps compute.  Causal attention uses zigzag sharding (rank r
holds chunks r and 2N-1-r of 2N equal chunks, :func:`zigzag_shard`), so every
rank does the same work, and fully masked chunk pairs are skipped.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..api import attention
from .merge import merge_pair as _merge


def _seq_dim(layout: str) -> int:
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    return 2 if layout == "bhsd" else 1


def zigzag_shard(x: torch.Tensor, rank: int, world: int, layout: str = "bhsd") -> torch.Tensor:
    """This rank's zigzag shard of a full sequence: chunks ``rank`` and ``2*world-1-rank``."""
    dim = _seq_dim(layout)
    if x.shape[dim] % (2 * world):
        raise ValueError(f"zigzag sharding needs seqlen divisible by 2 x world size ({2 * world}), "
                         f"got {x.shape[dim]}")
    chunks = x.chunk(2 * world, dim)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim)


def zigzag_unshard(shards: list[torch.Tensor], layout: str = "bhsd") -> torch.Tensor:
    """The full sequence from every rank's zigzag shard (in rank order)."""
    dim = _seq_dim(layout)
    world = len(shards)
    chunks: list = [None] * (2 * world)
    for r, s in enumerate(shards):
        a, b = s.chunk(2, dim)
        chunks[r], chunks[2 * world - 1 - r] = a, b
    return torch.cat(chunks, dim)


def _to_bhsd(t, layout):
    return t if layout == "bhsd" else t.transpose(1, 2)


def _partial(q, k, v, causal, scale, variant, layout):
    """Attention of q against one K/V block: (o in bhsd float32-ready, lse)."""
    o, lse = attention(q, k, v, causal=causal, scale=scale, variant=variant, layout=layout, return_lse=True)
    return _to_bhsd(o, layout), lse


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group=None, causal: bool = False,
                   scale: float | None = None, variant: str = "auto", layout: str = "bhsd") -> torch.Tensor:
    """Attention over a sequence sharded across the ranks of ``group``.

    ``q``, ``k``, ``v``: this rank's shard, ``[batch, heads, shard_len, head_dim]``
    (``layout="bhsd"``) or ``[batch, shard_len, heads, head_dim]``, the same
    ``shard_len`` on every rank.  Non-causal: any contiguous sharding in rank
    order.  Causal: zigzag shards (:func:`zigzag_shard`); the result is
    then ``zigzag_shard(fmha.attention(Q, K, V, causal=True))`` for the gathered
    Q, K, V.  Returns this rank's output shard in q's layout and dtype.
    """
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    dim = _seq_dim(layout)
    n = q.shape[dim]
    if k.shape[dim] != n:
        raise ValueError(f"ring_attention needs q, k and v shards of one length, got {n} and {k.shape[dim]}")
    # gloo moves CPU tensors only: with CUDA shards (several ranks sharing a GPU) the K/V blocks
    # travel through host copies; NCCL sends device memory directly
    wire = torch.device("cpu") if dist.get_backend(group) == "gloo" else q.device
    lengths = [torch.zeros(1, dtype=torch.int64, device=wire) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([n], dtype=torch.int64, device=wire), group=group)
    lengths = [int(x.item()) for x in lengths]
    if len(set(lengths)) != 1:
        raise ValueError(f"ring_attention needs the same shard length on every rank, got {lengths}")
    if causal and n % 2:
        raise ValueError(f"causal ring_attention takes zigzag shards (two equal chunks), got length {n}")

    nxt = dist.get_global_rank(group, (rank + 1) % world) if group is not None else (rank + 1) % world
    prv = dist.get_global_rank(group, (rank - 1) % world) if group is not None else (rank - 1) % world
    k_cur, v_cur = k.contiguous(), v.contiguous()
    k_wire, v_wire = k_cur.to(wire), v_cur.to(wire)  # what this rank sends on (the same tensors under NCCL)
    o = lse = None
    for step in range(world):
        src = (rank - step) % world
        pending = None
        if step < world - 1:  # post the next exchange first: it runs while this block computes
            k_next, v_next = torch.empty_like(k_wire), torch.empty_like(v_wire)
            ops = [dist.P2POp(dist.isend, k_wire, nxt, group), dist.P2POp(dist.irecv, k_next, prv, group),
                   dist.P2POp(dist.isend, v_wire, nxt, group), dist.P2POp(dist.irecv, v_next, prv, group)]
            pending = dist.batch_isend_irecv(ops)
        if not causal:
            o, lse = _merge(o, lse, *_partial(q, k_cur, v_cur, False, scale, variant, layout))
        else:
            o, lse = _causal_block(o, lse, q, k_cur, v_cur, rank, src, world, scale, variant, layout)
        if pending is not None:
            for w in pending:
                w.wait()
            k_wire, v_wire = k_next, v_next
            k_cur, v_cur = k_wire.to(q.device), v_wire.to(q.device)
    if o is None:  # causal with nothing visible cannot happen (chunk r sees itself); kept for clarity
        raise RuntimeError("no key block reached this rank")
    out = o.to(q.dtype)
    return out if layout == "bhsd" else out.transpose(1, 2).contiguous()


def _causal_block(o, lse, q, k, v, rank, src, world, scale, variant, layout):
    """Zigzag causal: this rank's query chunks (rank, 2N-1-rank) against src's key chunks
    (src, 2N-1-src).  Chunk pairs: query chunk after key chunk -> full, the same chunk ->
    causal diagonal, before -> skipped (fully masked)."""
    dim = _seq_dim(layout)
    q_chunks = zip((rank, 2 * world - 1 - rank), q.chunk(2, dim))
    kv_chunks = list(zip((src, 2 * world - 1 - src), k.chunk(2, dim), v.chunk(2, dim)))
    parts_o, parts_lse = [], []
    for qi, qc in q_chunks:
        oc = lc = None
        for kj, kc, vc in kv_chunks:
            if qi < kj:
                continue
            oc, lc = _merge(oc, lc, *_partial(qc, kc, vc, qi == kj, scale, variant, layout))
        if oc is None:  # this query chunk sees nothing from src: an empty partial
            b, h = qc.shape[0], qc.shape[1] if layout == "bhsd" else qc.shape[2]
            length = qc.shape[dim]
            oc = torch.zeros(b, h, length, qc.shape[-1], dtype=torch.float32, device=qc.device)
            lc = torch.full((b, h, length), float("-inf"), device=qc.device)
        parts_o.append(oc)
        parts_lse.append(lc)
    return _merge(o, lse, torch.cat(parts_o, 2), torch.cat(parts_lse, 2))
