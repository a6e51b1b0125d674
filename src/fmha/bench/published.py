"""Peers' figures measured outside our runs, for the goals that name them.

FlashAttention-4 (``flash_attn.cute``, flash-attn-4 4.0.0b36) is not installed on our GPU
machine, so the Hopper issue's FA4 goal compares against the figures in
``shared/BENCH.md`` (one H200, 2026-11-29, TFLOP/s): a ratio across runs, so only
indicative of the 5-10% run-to-run drift.
"""
from __future__ import annotations

import math

# (dtype, batch, heads, seqlen, head_dim, causal) -> TFLOP/s
FA4_H200 = {
    ("bfloat16", 1, 16, 16384, 128, False): 668, ("bfloat16", 1, 16, 16384, 128, True): 636,
    ("float16", 1, 16, 16384, 128, False): 643, ("float16", 1, 16, 16384, 128, True): 602,
    ("bfloat16", 4, 16, 4096, 128, False): 638, ("bfloat16", 4, 16, 4096, 128, True): 566,
    ("bfloat16", 16, 16, 1024, 128, False): 544, ("bfloat16", 16, 16, 1024, 128, True): 409,
    ("bfloat16", 1, 32, 16384, 64, False): 544, ("bfloat16", 1, 32, 16384, 64, True): 513,
    ("bfloat16", 4, 32, 4096, 64, False): 503, ("bfloat16", 4, 32, 4096, 64, True): 436,
    ("bfloat16", 16, 32, 1024, 64, False): 398, ("bfloat16", 16, 32, 1024, 64, True): 261,
}


def fa4_geomean(rows: list[dict], provider: str = "fmha:auto") -> tuple[float, int] | None:
    """(geometric mean of ``provider``'s TFLOP/s over FA4's published figure, shapes matched),
    over the rows' square, non-GQA cells that BENCH.md lists; None when no row matches."""
    logs = []
    for r in rows:
        if r.get("provider") != provider or r.get("tflops") in ("", None):
            continue
        if int(r["seqlen_q"]) != int(r["seqlen_k"]) or int(r["heads"]) != int(r["kv_heads"]) or r.get("features"):
            continue
        key = (r["dtype"], int(r["batch"]), int(r["heads"]), int(r["seqlen_q"]), int(r["head_dim"]),
               bool(int(r["causal"])))
        if key in FA4_H200:
            logs.append(math.log(float(r["tflops"]) / FA4_H200[key]))
    if not logs:
        return None
    return math.exp(sum(logs) / len(logs)), len(logs)
