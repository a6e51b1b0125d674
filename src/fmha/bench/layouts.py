"""The memory arrangements real programs hand to attention, built from bhsd q, k, v.

Every arrangement returns bhsd-shaped tensors holding the same values; only the strides differ:

- ``contiguous``: bhsd, contiguous.
- ``hf-view``: transformers' ``[batch, seq, heads, dim]`` projections transposed to bhsd views.
- ``fused-qkv``: slices of one ``[batch, seq, (heads + 2 kv_heads) * dim]`` projection.
- ``kv-cache``: q contiguous; k and v the first ``seqlen_k`` rows of a bhsd cache with spare capacity.
- ``latent``: MLA's absorbed form: v is k's first columns (one latent cache; v's own values are dropped).
"""
from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "hf-view", "fused-qkv", "kv-cache", "latent")


def arrange(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str):
    """``q, k, v`` (bhsd) copied into ``layout``; returned as bhsd views."""
    if layout == "contiguous":
        return q.contiguous(), k.contiguous(), v.contiguous()
    if layout == "hf-view":
        return tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    if layout == "fused-qkv":
        b, h, s, d = q.shape
        kvh = k.shape[1]
        if k.shape[2] != s:
            raise ValueError("a fused qkv projection has as many keys as queries")
        qkv = torch.cat([t.transpose(1, 2).reshape(b, s, -1) for t in (q, k, v)], dim=-1)
        parts = qkv.split([h * d, kvh * d, kvh * d], dim=-1)
        return tuple(p.view(b, s, n, d).transpose(1, 2) for p, n in zip(parts, (h, kvh, kvh)))
    if layout == "kv-cache":
        b, kvh, s, d = k.shape
        spare = max(s // 2, 64)

        def cached(t):
            cache = torch.zeros(b, kvh, s + spare, d, dtype=t.dtype, device=t.device)
            cache[:, :, :s] = t
            return cache[:, :, :s]
        return q.contiguous(), cached(k), cached(v)
    if layout == "latent":
        k = k.contiguous()
        return q.contiguous(), k, k[..., :v.shape[3]]
    raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
