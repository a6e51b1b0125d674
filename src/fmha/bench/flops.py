"""FLOP and byte counts of the attention forward, exact under causal masking."""
from __future__ import annotations


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool, causal_align: str = "top_left",
                  window: int = -1) -> int:
    """Number of (query, key) pairs the mask lets through: row i sees keys
    ``0 .. min(seqlen_k, i + offset + 1) - 1`` under causal masking, and with a window only
    those from ``i + offset - window`` on."""
    if window >= 0:
        import numpy as np
        offset = 0 if causal_align == "top_left" else seqlen_k - seqlen_q
        diag = np.arange(seqlen_q, dtype=np.int64) + offset
        hi = np.minimum(diag, seqlen_k - 1) if causal else np.full_like(diag, seqlen_k - 1)
        return int(np.maximum(hi - np.maximum(diag - window, 0) + 1, 0).sum())
    if not causal:
        return seqlen_q * seqlen_k
    offset = 0 if causal_align == "top_left" else seqlen_k - seqlen_q
    # sum over i of clamp(i + offset + 1, 0, seqlen_k), in closed form by pieces
    total = 0
    lo = max(0, -offset - 1 + 1)            # first row that sees at least one key
    full = max(lo, seqlen_k - offset - 1)   # first row that sees every key
    full = min(full, seqlen_q)
    if lo < full:  # rows lo..full-1 see i + offset + 1 keys
        a, b = lo + offset + 1, full - 1 + offset + 1
        total += (a + b) * (full - lo) // 2
    total += max(0, seqlen_q - max(full, lo)) * seqlen_k
    return total


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
                    causal: bool, causal_align: str = "top_left", window: int = -1, head_dim_v: int = 0) -> int:
    """2 * B * H * (visible pairs) * (D + Dv): two matmuls (QK^T over q/k's D, PV over v's Dv, Dv = D unless
    given) of 2 FLOPs per multiply-add."""
    pairs = visible_pairs(seqlen_q, seqlen_k, causal, causal_align, window)
    return 2 * batch * heads * pairs * (head_dim + (head_dim_v or head_dim))


def attention_bytes(batch: int, heads: int, kv_heads: int, seqlen_q: int, seqlen_k: int,
                    head_dim: int, elem_bytes: int = 2, head_dim_v: int = 0) -> int:
    """Fewest bytes moved: Q, K (head_dim), V (head_dim_v, default head_dim) read once, O written once."""
    return elem_bytes * batch * (head_dim + (head_dim_v or head_dim)) * (heads * seqlen_q + kv_heads * seqlen_k)
