"""FlashAttention's and torch SDPA's entry points on fmha: their argument names and conventions, for code written
for them.

``fmha.compat.flash_attn_func``, ``flash_attn_varlen_func``, their packed forms (``flash_attn_qkvpacked_func``,
``flash_attn_kvpacked_func`` and the varlen two: the packed tensor read in place through strided views) and
``flash_attn_with_kvcache`` take FlashAttention 2's arguments: tensors ``[batch, seqlen, heads, head_dim]``
(bshd), ``softmax_scale``, ``window_size=(left, right)``, ``softcap``, ``alibi_slopes`` and causal masks aligned
bottom-right (the new queries are the last positions of the keys), as FlashAttention does since 2.1 (an open
window side -1, or None as FlashAttention 4 writes it; FlashAttention 4's ``learnable_sink``, float32 ``[heads]``,
as fmha's ``sinks``; FlashAttention 3's descale factors for float8).  A left-padded cache (``cache_leftpad``) hides
the keys before each sequence's start with a mask (``attn_mask``); rotary embeddings (``rotary_cos``/``rotary_sin``)
and cache batch indices (``cache_batch_idx``) are applied on the device before the call, as FlashAttention places
them.  Dropout (``dropout_p``) runs as :func:`fmha.attention` and :func:`fmha.attention_varlen` take it.  What fmha
cannot do is refused by name rather than ignored: dropout against page pools (``return_attn_probs`` gives None where
FlashAttention 2 returns the probabilities: fmha never forms them).  ``flash_attn_func`` and
``flash_attn_varlen_func`` are differentiable (:mod:`fmha.gradients`).  ``scaled_dot_product_attention`` takes
torch's: bhsd tensors, ``is_causal`` aligned top-left, a boolean or additive ``attn_mask``, ``enable_gqa``.
"""
from __future__ import annotations

import torch

from .api import attention, attention_paged, attention_varlen


def _window(window_size) -> tuple[int, int]:
    """FlashAttention's ``window_size`` as fmha's ``window``: -1 (FlashAttention 2) or None (FlashAttention 4) for an
    open side."""
    left, right = window_size
    return (-1 if left is None else int(left), -1 if right is None else int(right))


def flash_attn_func(q, k, v, dropout_p: float = 0.0, softmax_scale: float | None = None, causal: bool = False,
                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
                    deterministic: bool = False, return_attn_probs: bool = False,
                    return_softmax_lse: bool = False, *, q_descale=None, k_descale=None, v_descale=None,
                    learnable_sink=None):
    """``flash_attn.flash_attn_func``: q ``[batch, seqlen_q, heads, D]``, k/v ``[batch, seqlen_k,
    kv_heads, D]``.  Returns the output, or with ``return_softmax_lse`` (or FlashAttention 2's
    ``return_attn_probs``) ``(out, lse)`` with the LSE ``[batch, heads, seqlen_q]`` (and ``None`` for
    the probabilities FlashAttention 2 returns third: fmha never forms them).  Float8 q, k, v take
    FlashAttention 3's ``q_descale``, ``k_descale``, ``v_descale`` (float32 ``[batch, kv_heads]``), as
    :func:`fmha.attention` does (forward only).  ``dropout_p``: attention dropout, as :func:`fmha.attention`'s."""
    out = attention(q, k, v, causal=causal, scale=softmax_scale, causal_align="bottom_right", layout="bshd",
                    window=_window(window_size), softcap=softcap, alibi_slopes=alibi_slopes,
                    deterministic=deterministic, return_lse=return_softmax_lse or return_attn_probs,
                    q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, sinks=learnable_sink,
                    dropout_p=dropout_p)
    if return_attn_probs:
        return (*out, None)
    return out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                           dropout_p: float = 0.0, softmax_scale: float | None = None, causal: bool = False,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
                           deterministic: bool = False, return_attn_probs: bool = False,
                           return_softmax_lse: bool = False, block_table=None, *, learnable_sink=None):
    """``flash_attn.flash_attn_varlen_func``: packed q ``[total_q, heads, D]``, k/v ``[total_k,
    kv_heads, D]``, int32 ``cu_seqlens``; the LSE (when asked) is ``[heads, total_q]``.  With ``block_table`` (int32
    ``[batch, pages_per_seq]``), k/v are page pools ``[num_pages, page_size, kv_heads, D]`` and sequence b's keys
    the first ``cu_seqlens_k[b + 1] - cu_seqlens_k[b]`` of its pages: each sequence's queries are copied into a
    block of ``max_seqlen_q`` rows, at its end (so the bottom-right band and window keep their places), run by
    :func:`fmha.attention_paged`, and copied back (forward only).  ``dropout_p`` as :func:`fmha.attention_varlen`
    takes it (not with a ``block_table``)."""
    if block_table is not None:
        if dropout_p:
            raise NotImplementedError(f"flash_attn_varlen_func takes no dropout_p (got {dropout_p!r}) with a "
                                      "block_table: attention dropout is for training, not against page pools")
        return _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, block_table,
                             return_softmax_lse or return_attn_probs, return_attn_probs, causal=causal,
                             scale=softmax_scale, window=_window(window_size), softcap=softcap,
                             alibi_slopes=alibi_slopes, sinks=learnable_sink)
    out = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                           scale=softmax_scale, causal_align="bottom_right", window=_window(window_size),
                           softcap=softcap, alibi_slopes=alibi_slopes, deterministic=deterministic,
                           return_lse=return_softmax_lse or return_attn_probs, sinks=learnable_sink,
                           dropout_p=dropout_p)
    if return_attn_probs:
        return (*out, None)
    return out


def _paged_varlen(q, k_pool, v_pool, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, block_table, return_lse: bool,
                  probs: bool, **kw):
    """Packed queries against paged keys (:func:`flash_attn_varlen_func` with a block table): sequence b's queries
    as the last rows of its ``[max_seqlen_q]`` block (the rows before are computed and dropped), the lengths taken
    from the cu_seqlens on the device."""
    from .kernels import guards
    total, heads, d = q.shape
    batch = cu_seqlens_q.shape[0] - 1
    # the queries' cu_seqlens checked first, in stream order (the keys' lengths by attention_paged, as cache_seqlens)
    guards.check_cu_seqlens(cu_seqlens_q, cu_seqlens_q, total, total, max_seqlen_q, max_seqlen_q)
    row = torch.arange(total, device=q.device)
    seq = torch.searchsorted(cu_seqlens_q[1:].to(torch.int64), row, right=True).clamp_(max=max(batch - 1, 0))
    lens_q = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).to(torch.int64)
    at = seq * max_seqlen_q + (max_seqlen_q - lens_q[seq]) + (row - cu_seqlens_q.to(torch.int64)[seq])
    block = q.new_zeros(batch * max_seqlen_q, heads, d)
    block[at] = q
    lens_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    out = attention_paged(block.view(batch, max_seqlen_q, heads, d), k_pool, v_pool, block_table, lens_k,
                          causal_align="bottom_right", layout="bshd", return_lse=return_lse, **kw)
    o, lse = out if return_lse else (out, None)
    o = o.reshape(batch * max_seqlen_q, heads, -1)[at]
    if not return_lse:
        return o
    lse = lse.permute(1, 0, 2).reshape(heads, batch * max_seqlen_q)[:, at]
    return (o, lse, None) if probs else (o, lse)


def flash_attn_qkvpacked_func(qkv, *args, **kwargs):
    """``flash_attn.flash_attn_qkvpacked_func``: ``qkv`` ``[batch, seqlen, 3, heads, D]`` (one projection's output),
    read in place as three strided bshd views; the rest as :func:`flash_attn_func` (gradients reach ``qkv``)."""
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], *args, **kwargs)


def flash_attn_kvpacked_func(q, kv, *args, **kwargs):
    """``flash_attn.flash_attn_kvpacked_func``: ``kv`` ``[batch, seqlen_k, 2, kv_heads, D]``, read in place; the rest as
    :func:`flash_attn_func`."""
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], *args, **kwargs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen: int, *args, **kwargs):
    """``flash_attn.flash_attn_varlen_qkvpacked_func``: packed ``qkv`` ``[total, 3, heads, D]`` with one int32
    ``cu_seqlens`` for queries and keys; the rest as :func:`flash_attn_varlen_func`."""
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  *args, **kwargs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *args,
                                    **kwargs):
    """``flash_attn.flash_attn_varlen_kvpacked_func``: ``kv`` ``[total_k, 2, kv_heads, D]``, read in place; the rest as
    :func:`flash_attn_varlen_func`."""
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  *args, **kwargs)


def _append(k_cache, v_cache, k, v, cache_seqlens, block_table, rows) -> None:
    """Write the new keys and values into the cache in place, sequence b's at positions
    ``cache_seqlens[b] ...`` of cache row ``rows[b]`` (through the block table for a paged cache), on the device."""
    new = k.shape[1]
    pos = cache_seqlens.to(torch.int64)[:, None] + torch.arange(new, device=k.device)[None, :]  # [batch, new]
    if block_table is None:
        at = rows.to(torch.int64)[:, None].expand(-1, new)
        k_cache[at, pos], v_cache[at, pos] = k, v
    else:
        page = k_cache.shape[1]
        pages = torch.gather(block_table.to(torch.int64), 1, pos // page)
        k_cache[pages, pos % page], v_cache[pages, pos % page] = k, v


def _rotated(x, cos, sin, pos, interleaved: bool):
    """``x`` ``[batch, seqlen, heads, D]`` with rotary embeddings on its first ``2 * cos.shape[1]`` columns, token t
    of sequence b at position ``pos[b, t]`` (rows of ``cos``/``sin``): pairs (0, 1), (2, 3) ... with ``interleaved``
    (GPT-J), else column i with ``i + rotary_dim / 2`` (GPT-NeoX); computed in float32, as x's dtype."""
    half = cos.shape[1]
    c, s = (t[pos.to(torch.int64)][:, :, None, :].float() for t in (cos, sin))  # [batch, seqlen, 1, half]
    head, tail = x[..., :2 * half].float(), x[..., 2 * half:]
    if interleaved:
        x1, x2 = head[..., 0::2], head[..., 1::2]
        turned = torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)
    else:
        x1, x2 = head[..., :half], head[..., half:]
        turned = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    return torch.cat([turned.to(x.dtype), tail], dim=-1)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale: float | None = None, causal: bool = False,
                            window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes=None, num_splits: int = 0,
                            return_softmax_lse: bool = False, *, q_descale=None, k_descale=None, v_descale=None,
                            learnable_sink=None):
    """``flash_attn.flash_attn_with_kvcache``: q ``[batch, seqlen_q, heads, D]`` against a cache
    ``[batch_cache, seqlen_cache, kv_heads, D]``, or a page pool ``[num_pages, page_size, kv_heads, D]``
    with an int32 ``block_table [batch, pages_per_seq]``.  ``cache_seqlens`` (int32 ``[batch]`` or an
    int; default: the whole cache) are the keys in use; new ``k``/``v`` ``[batch, seqlen_new,
    kv_heads, D]`` are first written into the cache after them (in place, as FlashAttention does),
    and attention then runs over ``cache_seqlens + seqlen_new`` keys.  ``cache_batch_idx`` (int32 ``[batch]``, not
    with a block table): sequence b's cache is row ``cache_batch_idx[b]`` (default: row b); read in place as a pool
    of one page a row where seqlen_cache is a multiple of 16 and no ``cache_leftpad`` is given, else the rows are
    gathered (a copy).  ``cache_leftpad`` (int32 ``[batch]``, not with a block table): sequence b's keys start at
    ``cache_leftpad[b]``, the slots before it hidden (the band and window keep their places: a position is its
    slot).  ``rotary_cos``/``rotary_sin`` (``[seqlen_ro, rotary_dim / 2]``, with the new ``k``): rotary embeddings on
    the first rotary_dim columns of the new keys, key t at position ``cache_seqlens + t`` (written into the cache
    rotated), and of q, query t at ``cache_seqlens + t`` when causal or windowed, else every query at
    ``cache_seqlens``, as FlashAttention places them; ``rotary_interleaved`` pairs columns (0, 1), (2, 3) ...,
    else i with ``i + rotary_dim / 2``.  ``num_splits`` as in :func:`fmha.attention` (0: decide).  A float8 cache
    takes FlashAttention 3's ``k_descale``/``v_descale`` (and float8 q its ``q_descale``), float32 ``[batch,
    kv_heads]``, where the cache is read whole (no block table, no ``cache_batch_idx``)."""
    if cache_leftpad is not None and block_table is not None:
        raise NotImplementedError("flash_attn_with_kvcache: cache_leftpad with a block_table (as FlashAttention, "
                                  "fmha takes left padding in a contiguous cache only)")
    descales = dict(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    if any(t is not None for t in descales.values()) and (block_table is not None or cache_batch_idx is not None):
        raise NotImplementedError("flash_attn_with_kvcache: descale factors (a float8 cache) with a block_table or "
                                  "cache_batch_idx; fmha's paged call reads 16-bit caches")
    if cache_batch_idx is not None and block_table is not None:
        raise NotImplementedError("flash_attn_with_kvcache: cache_batch_idx with a block_table (as FlashAttention: "
                                  "the block table already says where each sequence's keys lie)")
    batch, local = q.shape[0], _window(window_size) != (-1, -1)
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    if (k is None) != (v is None):
        raise ValueError("flash_attn_with_kvcache: give both k and v to append, or neither")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("flash_attn_with_kvcache: give both rotary_cos and rotary_sin, or neither")
    if rotary_cos is not None:
        if k is None:
            raise ValueError("flash_attn_with_kvcache: rotary embeddings apply to new keys: pass k and v with "
                             "rotary_cos and rotary_sin, as FlashAttention asks")
        if rotary_cos.dim() != 2 or rotary_sin.shape != rotary_cos.shape or 2 * rotary_cos.shape[1] > q.shape[3]:
            raise ValueError(f"flash_attn_with_kvcache: rotary_cos and rotary_sin are [seqlen_ro, rotary_dim / 2] "
                             f"with rotary_dim at most head_dim {q.shape[3]}, got {tuple(rotary_cos.shape)} and "
                             f"{tuple(rotary_sin.shape)}")
    rows = torch.arange(batch, device=q.device) if cache_batch_idx is None else cache_batch_idx.to(q.device)
    if k is not None:
        if cache_seqlens is None:
            raise ValueError("flash_attn_with_kvcache: appending k/v needs cache_seqlens (where they go)")
        if rotary_cos is not None:
            steps = torch.arange(max(q.shape[1], k.shape[1]), device=q.device)[None, :]
            at = cache_seqlens.to(q.device, torch.int64)[:, None] + steps
            k = _rotated(k, rotary_cos, rotary_sin, at[:, :k.shape[1]], rotary_interleaved)
            q = _rotated(q, rotary_cos, rotary_sin, at[:, :q.shape[1]] if causal or local else at[:, :1].expand(
                -1, q.shape[1]), rotary_interleaved)
        _append(k_cache, v_cache, k, v, cache_seqlens, block_table, rows)
        cache_seqlens = cache_seqlens + k.shape[1]
    kw = dict(causal=causal, scale=softmax_scale, causal_align="bottom_right", layout="bshd",
              window=_window(window_size), softcap=softcap, alibi_slopes=alibi_slopes, num_splits=num_splits,
              return_lse=return_softmax_lse, sinks=learnable_sink)
    slots = k_cache.shape[1]
    if cache_batch_idx is not None and cache_leftpad is None and slots % 16 == 0:
        block_table = rows.to(torch.int32).reshape(batch, 1).contiguous()  # each cache row one page of the pool
    elif cache_batch_idx is not None:
        k_cache, v_cache = k_cache[rows.to(torch.int64)], v_cache[rows.to(torch.int64)]
    if block_table is not None:
        if cache_seqlens is None:
            cache_seqlens = torch.full((batch,), block_table.shape[1] * slots, dtype=torch.int32, device=q.device)
        return attention_paged(q, k_cache, v_cache, block_table, cache_seqlens, **kw)
    if cache_leftpad is not None:  # [batch, 1, 1, slots]: a slot before the sequence's start is hidden
        kw["attn_mask"] = (torch.arange(slots, device=q.device)[None, :] >= cache_leftpad.to(q.device)[:, None]
                           )[:, None, None, :]
    return attention(q, k_cache, v_cache, seqused_k=cache_seqlens, **kw, **descales)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, enable_gqa: bool = False):
    """``torch.nn.functional.scaled_dot_product_attention``: ``[..., heads, seq, head_dim]`` tensors (as SDPA, any
    leading dimensions: ``[heads, seq, head_dim]``, ``[batch, heads, seq, head_dim]`` or more, one batch of them
    all), ``is_causal`` aligned top-left (query i sees keys ``j <= i``), an ``attn_mask`` broadcastable to
    ``[..., heads, seqlen_q, seqlen_k]`` (boolean, True where the key takes part, or a float one added to the
    scores), query heads a multiple of the key's with ``enable_gqa``.  A row that sees no key gives 0 where SDPA's
    math gives NaN; ``is_causal`` and a mask may come together (joined).  ``dropout_p`` as SDPA's (applied whenever
    given); differentiable, a float mask's gradient included."""
    tensors = (query, key, value)
    if all(isinstance(t, torch.Tensor) and t.dim() >= 3 for t in tensors) and query.dim() != 4:
        lead = query.shape[:-3]  # SDPA's leading dimensions, as one batch
        if not key.shape[:-3] == value.shape[:-3] == lead:
            raise ValueError(f"query, key and value must share their leading dimensions, got {tuple(query.shape)}, "
                             f"{tuple(key.shape)}, {tuple(value.shape)}")
        if isinstance(attn_mask, torch.Tensor):
            full = (*query.shape[:-1], key.shape[-2])
            try:
                attn_mask = attn_mask.expand(full).reshape(-1, *full[-3:])
            except RuntimeError:
                raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to {list(full)}") \
                    from None
        query, key, value = (t.reshape(-1, *t.shape[-3:]) for t in tensors)
        out = scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        return out.reshape(*lead, *out.shape[1:])
    if query.dim() == 4 and key.dim() == 4 and query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: grouped-query attention asks for "
                         "enable_gqa=True, as SDPA does")
    return attention(query, key, value, causal=is_causal, scale=scale, attn_mask=attn_mask, dropout_p=dropout_p)
