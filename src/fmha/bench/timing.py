"""Timing on the GPU: median of triton's do_bench after a warm-up."""
from __future__ import annotations

from typing import Callable


def median_ms(fn: Callable[[], object], warmup_ms: int = 25, rep_ms: int = 100) -> float:
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def graph_median_ms(fn: Callable[[], object], rep_ms: int = 100) -> float:
    """Median over CUDA-graph replays of ``fn``: the GPU time without the host's launch cost
    (BENCH.md's protocol for tiny launches)."""
    import triton.testing
    return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))


def tflops(flops: int, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12
