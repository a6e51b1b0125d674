"""Merging partial attentions of the same queries through their log-sum-exp.

Two results over disjoint key sets, ``(o_a, lse_a)`` and ``(o_b, lse_b)``, combine as

    lse = logaddexp(lse_a, lse_b),   o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b

(seed Section 3's rescale, applied to whole key blocks).  A row that no key has
reached keeps ``lse = -inf`` and ``o = 0``.  Used by split-key decoding and by
ring attention.
"""
from __future__ import annotations

import torch


def merge_stack(o: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge ``n`` partials stacked on dim 0: ``o`` ``[n, ..., D]`` (float32), ``lse`` ``[n, ...]``."""
    total = torch.logsumexp(lse, dim=0)
    safe = torch.where(torch.isneginf(total), torch.zeros_like(total), total)
    w = torch.exp(lse - safe)
    return (w[..., None] * o).sum(0), total


def merge_pair(o, lse, o_part, lse_part):
    """Merge a new partial into a running one (``o is None``: the first partial)."""
    if o is None:
        return o_part.float(), lse_part
    return merge_stack(torch.stack([o, o_part.float()]), torch.stack([lse, lse_part]))
