"""Merging partial attentions of the same queries through their log-sum-exp.

Two results over disjoint key sets, ``(o_a, lse_a)`` and ``(o_b, lse_b)``, combine as

    lse = logaddexp(lse_a, lse_b),   o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b

(seed Section 3's rescale, applied to whole key blocks).  A row that no key has
reached keeps ``lse = -inf`` and ``o = 0``.  Used by ring attention; split-key decoding
calls the same kernel, writing straight into the output.
"""
from __future__ import annotations

import torch


def merge_stack(o: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge ``n`` partials stacked on dim 0: ``o`` ``[n, ..., D]`` (float32), ``lse`` ``[n, ...]``.
    One Triton pass (:mod:`fmha.kernels.combine`); returns float32 ``(o, lse)``."""
    from ..kernels import combine
    o, lse = o.float().contiguous(), lse.float().contiguous()
    out = torch.empty(o.shape[1:], dtype=torch.float32, device=o.device)
    total = torch.empty(lse.shape[1:], dtype=torch.float32, device=o.device)
    combine.launch(o, lse, out, total, (0, 0, out.shape[-1], 1))
    return out, total


def merge_pair(o, lse, o_part, lse_part):
    """Merge a new partial into a running one (``o is None``: the first partial)."""
    if o is None:
        return o_part.float(), lse_part
    return merge_stack(torch.stack([o, o_part.float()]), torch.stack([lse, lse_part]))
