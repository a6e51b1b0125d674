"""The checked call, written once for every entry point: allocate the outputs, answer the edges
without a launch, plan, and launch (directly, or split over the keys with the partials merged by
their LSE).  :mod:`fmha.api` calls these after the checks; so does the custom op.  On a GPU the
first call of each kind is recorded and later ones replay its launches (:mod:`fmha.replay`)."""
from __future__ import annotations

import dataclasses
import math

import torch

from . import plan as planning
from . import replay
from .checks import FP8, output_dtype
from .device import device_facts, index_of, on


def output(q: torch.Tensor, head_dim_v: int) -> torch.Tensor:
    """The output of a call on ``q``: q's shape with V's head dimension last, contiguous, q's dtype
    (bfloat16 for float8 q)."""
    return torch.empty((*q.shape[:-1], head_dim_v), dtype=output_dtype(q), device=q.device)


def descale_table(q, k, layout: str, descales) -> torch.Tensor | None:
    """Float8 K/V's descale factors as the tiled kernel reads them: float32 ``[batch * kv_heads, 3]``,
    each (batch, kv head)'s q, k and v factors (1 where not given); None for 16-bit K/V."""
    if k.dtype != FP8:
        return None
    shape = (k.shape[0], k.shape[1] if layout == "bhsd" else k.shape[2])
    return torch.stack([t if t is not None else torch.ones(shape, dtype=torch.float32, device=k.device)
                        for t in descales], dim=-1).reshape(-1, 3)


def dense(q, k, v, *, causal, scale, variant, causal_align, layout, return_lse, out=None, config=None,
          window=(-1, -1), softcap=0.0, alibi_slopes=None, seqused_k=None, num_splits=0, descale=None, checks=None,
          attn_mask=None, dropout=None):
    """:func:`fmha.attention` on checked inputs (or with their ``checks``, run unless the call is
    replayed); ``descale``: float8 K/V's factors (:func:`descale_table`); ``attn_mask``: a boolean
    ``[batch, heads, seqlen_q, seqlen_k]`` view (:func:`fmha.checks.attn_mask_view`); ``dropout = (seed, dropout_p)``:
    attention dropout (:mod:`fmha.kernels.dropout`; the seed an input of the call, so a replay draws with the new
    one).  Returns ``(o, lse or None)``."""
    def call():
        return _dense(q, k, v, causal=causal, scale=scale, variant=variant, causal_align=causal_align,
                      layout=layout, return_lse=return_lse, out=out, config=config, window=window, softcap=softcap,
                      alibi_slopes=alibi_slopes, seqused_k=seqused_k, num_splits=num_splits, descale=descale,
                      attn_mask=attn_mask, dropout=dropout)
    lengths = _lengths(q, k, layout) if attn_mask is None and dropout is None else None
    seed, dropout_p = dropout if dropout is not None else (None, 0.0)
    return replay.through("dense", (q, k, v, out, alibi_slopes, seqused_k, descale, attn_mask, seed), call,
                          *_flags(causal, scale, variant, causal_align, layout, return_lse, config, window, softcap,
                                  num_splits, dropout_p), checks=checks, lengths=lengths)


def _lengths(q, k, layout: str):
    """A decode's length for :func:`fmha.replay.call` (``lengths``), or None: a KV cache one key longer at each call
    makes each call a new kind, which its family may know."""
    seq = 2 if layout == "bhsd" else 1
    return ({1: seq, 2: seq}, k.shape[seq]) if q.dim() == k.dim() == 4 and q.shape[seq] <= 16 else None


def _flags(causal, scale, variant, causal_align, layout, return_lse, config, window, softcap, num_splits, dropout_p):
    """What besides its tensors decides a dense call's launches: its replay key's flags, in their order."""
    return causal, scale, variant, causal_align, layout, return_lse, config, window, softcap, num_splits, dropout_p


_ABSENT = (None,) * 6  # a plain call's out, alibi_slopes, seqused_k, descale, attn_mask and dropout seed


def replayed_dense(q, k, v, causal, scale, variant, causal_align, layout, return_lse, config, window, softcap,
                   num_splits):
    """:func:`dense`'s outputs for a plain call (no ``out``, ALiBi, seqused_k, float8 factors, mask or dropout) whose
    kind the replay table holds (or whose decode's family knows its length), or None (:func:`fmha.replay.replayed`):
    its key made first, nothing else."""
    flags = _flags(causal, scale, variant, causal_align, layout, return_lse, config, window, softcap, num_splits, 0.0)
    return replay.replayed("dense", (q, k, v, *_ABSENT), *flags, lengths=lambda: _lengths(q, k, layout))


def _dense(q, k, v, *, causal, scale, variant, causal_align, layout, return_lse, out, config, window, softcap,
           alibi_slopes, seqused_k, num_splits, descale, attn_mask, dropout=None):
    batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim = planning.sizes(q, k, layout)
    o = replay.buffer(output(q, v.shape[3])) if out is None else out
    lse = replay.buffer(torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)) \
        if return_lse else None
    if o.numel() == 0:
        return o, lse
    if seqlen_k == 0:
        return _no_keys(o, lse)
    seq = 2 if layout == "bhsd" else 1
    growing = replay.growing()

    def plan(k, v):
        prob = planning.problem(batch, heads, kv_heads, seqlen_q, k.shape[seq], head_dim, causal=causal, scale=scale,
                                window=window, causal_align=causal_align, softcap=softcap,
                                seqused=seqused_k is not None, head_dim_v=v.shape[3], fp8=descale is not None,
                                attn_mask=planning.mask_kind(attn_mask), dropout=dropout is not None)
        return planning.plan(prob, q, k, v, o, layout, variant, config, alibi_slopes, num_splits, growing=growing)

    def plan_at(n: int) -> tuple:
        """The plan's outcome at another length, over stand-ins for K and V (their shapes at ``n``, contiguous,
        as a decode's family holds them)."""
        stand_ins = (torch.empty((*t.shape[:seq], n, *t.shape[seq + 1:]), dtype=t.dtype, device="meta") for t in (k, v))
        return plan(*stand_ins).by_length()

    p = plan(k, v)
    replayed = replay.lengthwise(p.by_length(), plan_at)  # (a decode's family: dense())
    if replayed is not None:
        return tuple(replayed)
    run(p, q, k, v, o, lse, layout, alibi_slopes, (None, None, seqused_k), descale=descale, attn_mask=attn_mask,
        dropout=dropout)
    return o, lse


def packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, scale, variant,
           causal_align, return_lse, window, softcap, alibi_slopes, config, checks=None, dropout=None):
    """:func:`fmha.attention_varlen` on checked shapes (or with their ``checks``, as :func:`dense`); the
    cu_seqlens are checked on the device, in stream order, before any kernel reads through them
    (:mod:`fmha.kernels.guards`; ``hopper`` checks them as it builds its work list, ``tiled`` where
    :func:`self_checked` as it starts); ``dropout`` as :func:`dense`'s.  Returns ``(o, lse or None)``."""
    def call():
        return _packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                       scale=scale, variant=variant, causal_align=causal_align, return_lse=return_lse, window=window,
                       softcap=softcap, alibi_slopes=alibi_slopes, config=config, dropout=dropout)
    seed, dropout_p = dropout if dropout is not None else (None, 0.0)
    return replay.through("packed", (q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, seed), call,
                          *_packed_flags(max_seqlen_q, max_seqlen_k, causal, scale, variant, causal_align, return_lse,
                                         window, softcap, config, dropout_p), checks=checks)


def _packed_flags(max_seqlen_q, max_seqlen_k, causal, scale, variant, causal_align, return_lse, window, softcap, config,
                  dropout_p):
    """What besides its tensors decides a packed call's launches: its replay key's flags, in their order."""
    return (int(max_seqlen_q), int(max_seqlen_k), causal, scale, variant, causal_align, return_lse, window, softcap,
            config, dropout_p)


def replayed_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, variant,
                    causal_align, return_lse, window, softcap, config):
    """:func:`packed`'s outputs for a call without ALiBi or dropout whose kind the replay table holds, or None
    (:func:`fmha.replay.replayed`): its key made first, nothing else."""
    flags = _packed_flags(max_seqlen_q, max_seqlen_k, causal, scale, variant, causal_align, return_lse, window, softcap,
                          config, 0.0)
    return replay.replayed("packed", (q, k, v, cu_seqlens_q, cu_seqlens_k, None, None), *flags)


def _packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, scale, variant,
            causal_align, return_lse, window, softcap, alibi_slopes, config, dropout=None):
    batch = cu_seqlens_q.shape[0] - 1
    heads, kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[2]
    longest = (int(max_seqlen_q), int(max_seqlen_k))
    o = replay.buffer(output(q, v.shape[2]))
    lse = replay.buffer(torch.empty((heads, q.shape[0]), dtype=torch.float32, device=q.device)) if return_lse else None
    q4, k4, v4, o4 = q[None], k[None], v[None], o[None]
    p = None
    if batch and q.shape[0] and heads:
        prob = planning.problem(batch, heads, kv_heads, q.shape[0], k.shape[0], head_dim, causal=causal, scale=scale,
                                window=window, causal_align=causal_align, softcap=softcap, varlen=True,
                                head_dim_v=v.shape[2], dropout=dropout is not None)
        p = planning.plan(prob, q4, k4, v4, o4, "bshd", variant, config, alibi_slopes, 1, longest=longest)
    checked = p is not None and self_checked(p, q)
    if not checked and (p is None or p.variant != "hopper"):  # hopper's work-list build checks them itself
        from .kernels import guards
        guards.check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], *longest)
    if p is None:
        return o, lse
    from . import kernels
    with on(q.device):
        kernels.launch(p.variant, p.config, p.problem, q4, k4, v4, o4, lse, "bshd", alibi_slopes,
                       (cu_seqlens_q, cu_seqlens_k, None), grid_m=max(longest[0], 1), longest=longest,
                       checks=(0, *longest) if checked else None, dropout=dropout)
    return o, lse


def paged(q, k_cache, v_cache, block_table, cache_seqlens, *, causal, scale, causal_align, layout, return_lse,
          window, softcap, alibi_slopes, num_splits, variant, config, checks=None):
    """:func:`fmha.attention_paged` on checked inputs (or with ``checks``, as :func:`dense`): the block
    table and lengths checked on the device first (:mod:`fmha.kernels.guards`; by ``tiled`` itself where
    :func:`self_checked`).  Returns ``(o, lse or None)``."""
    def call():
        return _paged(q, k_cache, v_cache, block_table, cache_seqlens, causal=causal, scale=scale,
                      causal_align=causal_align, layout=layout, return_lse=return_lse, window=window, softcap=softcap,
                      alibi_slopes=alibi_slopes, num_splits=num_splits, variant=variant, config=config)
    return replay.through("paged", (q, k_cache, v_cache, block_table, cache_seqlens, alibi_slopes), call, causal,
                          scale, causal_align, layout, return_lse, window, softcap, num_splits, variant, config,
                          checks=checks)


def _paged(q, k_cache, v_cache, block_table, cache_seqlens, *, causal, scale, causal_align, layout, return_lse,
           window, softcap, alibi_slopes, num_splits, variant, config):
    from .kernels import guards
    batch, heads = q.shape[0], (q.shape[1] if layout == "bhsd" else q.shape[2])
    seqlen_q, head_dim = (q.shape[2] if layout == "bhsd" else q.shape[1]), q.shape[3]
    page, kv_heads, num_pages = k_cache.shape[1], k_cache.shape[2], k_cache.shape[0]
    o = replay.buffer(output(q, v_cache.shape[3]))
    lse = replay.buffer(torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)) \
        if return_lse else None
    if o.numel() == 0 or block_table.shape[1] == 0:
        if batch:
            guards.check_pages(block_table, cache_seqlens, num_pages, page)
        return _no_keys(o, lse)
    prob = planning.problem(batch, heads, kv_heads, seqlen_q, block_table.shape[1] * page, head_dim, causal=causal,
                            scale=scale, window=window, causal_align=causal_align, softcap=softcap, seqused=True,
                            page=page, head_dim_v=v_cache.shape[3])
    seqs = (None, None, cache_seqlens)
    p = planning.plan(prob, q, k_cache, v_cache, o, layout, variant, config, alibi_slopes, num_splits)
    checked = self_checked(p, q)
    if not checked:
        guards.check_pages(block_table, cache_seqlens, num_pages, page)
    if p.variant == "hopper":  # the page pools as they are: the kernel reads them through one descriptor each
        run(p, q, k_cache, v_cache, o, lse, layout, alibi_slopes, seqs, block_table)
        return o, lse
    block_n = p.config.block_n
    while page % block_n:  # a key tile must not straddle two pages
        block_n //= 2
    split_len = -(-p.split_len // page) * page if p.split_len else 0
    p = dataclasses.replace(p, config=dataclasses.replace(p.config, block_n=block_n), split_len=split_len)
    kv = (k_cache, v_cache) if layout == "bshd" else (k_cache.permute(0, 2, 1, 3), v_cache.permute(0, 2, 1, 3))
    run(p, q, *kv, o, lse, layout, alibi_slopes, seqs, block_table, checks=(num_pages, 0, 0) if checked else None)
    return o, lse


def _no_keys(o, lse):
    """The answer of rows that see no key: O = 0, LSE = -inf (written here, not by a launch: the call is not
    replayed, :func:`replay.host_work`)."""
    replay.host_work()
    o.zero_()
    if lse is not None:
        lse.fill_(-math.inf)
    return o, lse


def self_checked(p: planning.Plan, q: torch.Tensor) -> bool:
    """Whether ``tiled`` checks a paged or packed call's indices itself (:func:`fmha.kernels.guards.program_checks`):
    one launch, not the check's and the kernel's.  On sm_90, in tiles below 64 rows (a decode's), where it was
    timed (docs/PERF.md, "Beyond the default grid"): from 64 rows the tiles take wgmma, and a build with asserts
    calls ``__assertfail``, after which ptxas serializes every wgmma of the kernel.  Elsewhere the separate check:
    on sm_80 the builds with asserts spill where the plain ones do not (8 bytes in 16-row tiles at head_dim 64,
    180 in 128-row tiles at 128, paged), not timed.  Not in the interpreter, which skips device asserts (there
    the separate check's verdict is read on the host); nor where the grid is split over launches
    (:data:`fmha.replay.GRID_STEP`), whose programs would each see only their launch's sequences."""
    return (p.variant == "tiled" and q.is_cuda and not torch.version.hip and p.config.block_m < 64
            and device_facts(index_of(q.device))[0] == 9 and p.problem.grid(p.config.block_m)[1] <= replay.GRID_STEP)


def merge_in_split(device: torch.device) -> bool:
    """Whether a split launch of ``tiled`` merges its own partials (the split that ends a row block last
    merges it): one launch fewer, 6-8 us of an eager call's host time, for about 0.4 us more on the GPU at
    1k keys (docs/PERF.md, decoding).  Not while the stream is captured into a CUDA graph, where the host's
    launch costs nothing and the separate merge is the faster, nor where a call may hold no buffer past its end
    (:func:`fmha.replay.holding`: the merge's counters are held)."""
    return replay.holding(device)


def run(p: planning.Plan, q, k, v, o, lse, layout, alibi, seqs, block_table=None, descale=None,
        attn_mask=None, checks=None, dropout=None) -> None:
    """Launch ``p``: directly, or split over the keys into float32 partials merged by their LSE, inside
    the split launch (:func:`merge_in_split`) or in a second kernel (stream-K and a programmatic dependent
    launch of the merge measured slower: docs/PERF.md, decoding)."""
    from . import kernels
    prob = p.problem
    with on(q.device):
        if not p.split_len:
            kernels.launch(p.variant, p.config, prob, q, k, v, o, lse, layout, alibi, seqs, block_table=block_table,
                           descale=descale, attn_mask=attn_mask, checks=checks, dropout=dropout)
            return
        from .kernels import combine
        shape = (-(-prob.seqlen_k // p.split_len), prob.batch, prob.heads, prob.seqlen_q)
        o_parts = replay.buffer(torch.empty((*shape, prob.dv), dtype=torch.float32, device=q.device))
        lse_parts = replay.buffer(torch.empty(shape, dtype=torch.float32, device=q.device))
        merge = (o, lse) if p.variant == "tiled" and merge_in_split(q.device) else None
        kernels.launch(p.variant, p.config, prob, q, k, v, o_parts, lse_parts, layout, alibi, seqs,
                       split_len=p.split_len, block_table=block_table, descale=descale, merge=merge,
                       attn_mask=attn_mask, checks=checks)
        if merge is None:
            combine.launch(o_parts, lse_parts, o, lse, kernels.strides_bhsd(o, layout), prob.heads, prob.seqlen_q)
