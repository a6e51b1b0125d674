"""Peers' figures measured outside our runs, for the goals that name them.

FlashAttention-4 (``flash_attn.cute``, flash-attn-4 4.0.0b36) is not installed on our GPU
machine, so the Hopper issue's FA4 goal compares against the figures in
``shared/BENCH.md`` (one H200, 2026-11-29, TFLOP/s): a ratio across runs, which moves with the
GPU's state by 5-10% (the same kernels have given 1.025x and 0.992x in two runs, cuDNN 2-4% slower
in the second alike).  BENCH.md also gives cuDNN's figure from FA4's run, so each shape's FA4/cuDNN
ratio there can meet our/cuDNN ratio here: a ratio of ratios measured within each run (1.038x in
both of those runs).
"""
from __future__ import annotations

import math

# (dtype, batch, heads, seqlen, head_dim, causal) -> (FA4's TFLOP/s, cuDNN's in the same run)
FA4_H200 = {
    ("bfloat16", 1, 16, 16384, 128, False): (668, 603), ("bfloat16", 1, 16, 16384, 128, True): (636, 559),
    ("float16", 1, 16, 16384, 128, False): (643, 587), ("float16", 1, 16, 16384, 128, True): (602, 535),
    ("bfloat16", 4, 16, 4096, 128, False): (638, 598), ("bfloat16", 4, 16, 4096, 128, True): (566, 509),
    ("bfloat16", 16, 16, 1024, 128, False): (544, 606), ("bfloat16", 16, 16, 1024, 128, True): (409, 416),
    ("bfloat16", 1, 32, 16384, 64, False): (544, 455), ("bfloat16", 1, 32, 16384, 64, True): (513, 440),
    ("bfloat16", 4, 32, 4096, 64, False): (503, 451), ("bfloat16", 4, 32, 4096, 64, True): (436, 414),
    ("bfloat16", 16, 32, 1024, 64, False): (398, 421), ("bfloat16", 16, 32, 1024, 64, True): (261, 330),
}


def _key(r: dict):
    """A row's BENCH.md shape key, or None for a cell BENCH.md cannot list (GQA, seqlen_q != seqlen_k,
    modifiers, no timing)."""
    if r.get("tflops") in ("", None) or r.get("seqlen_q") in ("", None) or r.get("features"):
        return None
    if int(r["seqlen_q"]) != int(r["seqlen_k"]) or int(r["heads"]) != int(r["kv_heads"]):
        return None
    return (r["dtype"], int(r["batch"]), int(r["heads"]), int(r["seqlen_q"]), int(r["head_dim"]),
            bool(int(r["causal"])))


def fa4_geomean(rows: list[dict], provider: str = "fmha:auto") -> tuple[float, int, float | None] | None:
    """(geometric mean of ``provider``'s TFLOP/s over FA4's published figure, shapes matched, and the
    geometric mean of ``provider``/cuDNN in these rows over FA4/cuDNN in BENCH.md, over the shapes
    whose cuDNN row is here too, else None), over the rows' square, non-GQA cells that BENCH.md
    lists; None when no row matches."""
    cudnn = {_key(r): float(r["tflops"]) for r in rows if r.get("provider") == "sdpa:cudnn" and _key(r)}
    logs, within = [], []
    for r in rows:
        key = _key(r)
        if r.get("provider") != provider or key not in FA4_H200:
            continue
        fa4, fa4_cudnn = FA4_H200[key]
        logs.append(math.log(float(r["tflops"]) / fa4))
        if cudnn.get(key):
            within.append(math.log(float(r["tflops"]) / cudnn[key] / (fa4 / fa4_cudnn)))
    if not logs:
        return None
    return (math.exp(sum(logs) / len(logs)), len(logs),
            math.exp(sum(within) / len(within)) if within else None)
